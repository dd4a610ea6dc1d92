"""Reading the topology labels of the Nodes a job's pods run on (metadata only: labels are all that is used).

Only the agent that reads the pods for the job reads Nodes: the leader's init, and in an elastic job the
sidecars that watch the pods (the publisher, a standby taking over), each new node once. The others receive the labels
inside the published rows, or, in their own view, read their own Node alone (``own_domains``). A handful of nodes
costs one GET each; more cost one paged LIST of every Node's metadata (a 4096-pod job on 512 nodes: one or two
requests, not 512). Nodes are cluster-scoped, so reading them needs a ClusterRole, an optional component
(manifests/rbac/nodes): without it the agent says so once and keeps index order.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote

from agent.core.model import Options, RawPod
from agent.core.pods.lost import NodeState, lost_nodes, node_state, why_node_lost
from agent.core.pods.placement import Level, node_domains
from agent.core.pods.pod import node_name
from agent.errors import ApiError, ApiNotFound, ApiUnavailable, InputError
from agent.k8s.core import PAGE

if TYPE_CHECKING:  # the protocol's module imports aiohttp, which init does not load (k8s/blocking.py)
    from agent.k8s.async_client import AsyncApi

log = logging.getLogger("topology_agent.nodes")
NODE_GETS = 16  # distinct nodes read with one GET each; more are read with one LIST
NODES_PATH = "/api/v1/nodes"
NodeMap = dict[str, "dict[str, str] | None"]


def wanted_nodes(pods: Iterable[RawPod], options: Options, known: Mapping[str, object]) -> list[str]:
    """The nodes the job's pods run on whose labels are not held yet (none when no levels are asked for)."""
    if options.levels is None:
        return []
    names = set(map(node_name, pods))
    return sorted(name for name in names if name and name not in known)


def _labels(obj: dict[str, Any], levels: tuple[Level, ...]) -> dict[str, str]:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    wanted = {level.label for level in levels}
    return {k: v for k, v in labels.items() if k in wanted} if isinstance(labels, dict) else {}


def _keep_labels(names: list[str], levels: tuple[Level, ...]) -> Any:
    """What a LIST page keeps of the Nodes asked for: the name and the levels' labels, not the metadata (at 16384
    Nodes their metadata held until the last page would be ~60 MB of the reader's peak). The Nodes of one rack
    share one dict of labels across the pages: a job on thousands of Nodes holds a few hundred label sets."""
    wanted = set(names)
    distinct: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}

    def shared(labels: dict[str, str]) -> dict[str, str]:
        return distinct.setdefault(tuple(sorted(labels.items())), labels)

    return lambda page: [(name, shared(_labels(item, levels))) for item in page
                         if (name := (item.get("metadata") or {}).get("name")) in wanted]


def forbidden_line(err: ApiError) -> str:
    """One line when Nodes cannot be read (RBAC, most often)."""
    return (f"cannot read Nodes ({err}); ranks stay in index order and no TOPOLOGY_<LEVEL> variables are written: "
            "apply the optional RBAC component manifests/rbac/nodes (get/list on nodes)")


async def read_nodes(api: AsyncApi, names: list[str], options: Options, *, transient: bool = False) -> NodeMap:
    """Labels (of the asked levels) per node; None for a node that is gone or cannot be read. An API server that
    is away raises ``ApiUnavailable`` with ``transient`` (init retries until its deadline); otherwise it is said
    in one line and nothing is returned (the sidecar tries again shortly)."""
    levels = options.levels or ()
    if not names:
        return {}
    try:
        if len(names) <= NODE_GETS:
            out: NodeMap = {}
            for name in names:
                try:
                    node = await api.get_object(f"/api/v1/nodes/{quote(name)}", metadata_only=True)
                    out[name] = _labels(node, levels)
                except ApiNotFound:
                    out[name] = None
            return out
        items, _ = await api.list_objects("/api/v1/nodes", limit=PAGE, metadata_only=True,
                                          keep=_keep_labels(names, levels))
        found = dict(cast("list[tuple[str, dict[str, str]]]", items))  # the pairs ``keep`` made
        return {name: found.get(name) for name in names}
    except ApiUnavailable as err:
        if transient:
            raise
        log.warning("cannot read Nodes now (%s); trying again", err)
        return {}
    except ApiError as err:
        log.warning("%s", forbidden_line(err))
    return dict.fromkeys(names)


async def own_domains(api: AsyncApi, own: RawPod, options: Options) -> tuple[str, ...] | None:
    """This pod's Node's value per level (``--topology-levels``), for its own view: one metadata-only GET. None
    when no levels are asked for, or the Node cannot be read or its labels are not label values (said in one
    line: the pod then reads the whole topology)."""
    levels = options.levels
    node = node_name(own)
    if levels is None or not node:
        return None
    labels = (await read_nodes(api, [node], options)).get(node)
    if labels is None:
        return None
    try:
        return node_domains(node, labels, levels)
    except InputError as err:
        log.warning("%s", err)
        return None


def _lost(page: list[Any]) -> list[tuple[str, str]]:
    """What a LIST page of Nodes keeps: each lost Node's name, with why."""
    return [(state.name, why) for state in map(node_state, page)
            if state is not None and (why := why_node_lost(state)) is not None]


def _doubtful(page: list[Any]) -> list[tuple[str, str | None]]:
    """What a Table page of Nodes keeps: the name of each Node whose Status cell is not Ready (``printNode``:
    Ready, NotReady, or Unknown without a Ready condition, each maybe followed by ``,SchedulingDisabled``), to be
    read whole; from a server that sent the Nodes themselves, each lost Node with why."""
    kept: list[tuple[str, str | None]] = []
    for row in page:
        if "metadata" in row:
            kept.extend(_lost([row]))
            continue
        name, status = row.get("Name"), row.get("Status")
        if isinstance(name, str) and name and not (isinstance(status, str) and status.split(",")[0] == "Ready"):
            kept.append((name, None))
    return kept


async def list_lost_nodes(api: AsyncApi) -> tuple[list[tuple[str, str]], str]:
    """Every lost Node with why, and the resourceVersion to watch the Nodes from, without every Node's status
    (one is ~12 KB as the kubelet keeps it, most of it its images): one paged LIST of the API server's Table of
    Nodes without the objects (a Status cell per Node, ~100 B), then one GET of each
    Node that is not Ready, for why (False, or Unknown: the kubelet stopped reporting) and its taints; more than
    ``NODE_GETS`` such Nodes are read in one LIST of the Nodes whole. The node lifecycle controller taints a Node
    only while it is not Ready; a lost taint put by hand on a Ready Node is seen at the Node's next write (its
    kubelet writes its status every few minutes), which the watch brings."""
    doubtful, version = await api.list_objects(NODES_PATH, limit=PAGE, table=True, keep=_doubtful)
    pairs = cast("list[tuple[str, str | None]]", doubtful)
    unread = [name for name, why in pairs if why is None]
    if len(unread) > NODE_GETS:
        items, version = await api.list_objects(NODES_PATH, limit=PAGE, keep=_lost)
        return cast("list[tuple[str, str]]", items), version
    lost = [(name, why) for name, why in pairs if why is not None]
    for name in unread:
        with contextlib.suppress(ApiNotFound):  # gone since: its pods go with it
            lost.extend(_lost([await api.get_object(f"{NODES_PATH}/{quote(name)}")]))
    return lost, version


async def read_lost_nodes(api: AsyncApi, names: list[str]) -> dict[str, str] | None:
    """The lost Nodes among ``names`` (core/pods/lost.py), each with why, as ``status`` shows them: one GET each for a
    handful, else one paged LIST, each page cut to what says a Node is lost. None: the Nodes cannot be read (said
    in one line)."""
    if not names:
        return {}
    states: list[NodeState] = []
    try:
        if len(names) <= NODE_GETS:
            for name in names:
                try:
                    state = node_state(await api.get_object(f"/api/v1/nodes/{quote(name)}"))
                except ApiNotFound:
                    continue
                if state is not None:
                    states.append(state)
        else:
            wanted = set(names)
            items, _ = await api.list_objects(
                "/api/v1/nodes", limit=PAGE,
                keep=lambda page: [s for s in map(node_state, page) if s is not None and s.name in wanted])
            states = items  # type: ignore[assignment]
    except ApiError as err:
        log.warning("cannot read Nodes (%s): a member on a lost Node is shown lost only once the control plane marks "
                    "its pod", err)
        return None
    return lost_nodes(states)
