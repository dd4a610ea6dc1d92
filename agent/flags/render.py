"""`topology-agent render` and `explain`, the dry run of init: their flags, the pods and Nodes they read, and
what they give (``RenderSettings``)."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from agent.core.model import Options, RawPod
from agent.core.pods.claims import CLAIM, TEMPLATE, Claims, read_claims
from agent.core.pods.lost import lost_nodes, node_state, on_lost_nodes
from agent.errors import InputError
from agent.flags.common import add_topology_arguments, env, knob, options_from_args, out_dir, ssh_settings

if TYPE_CHECKING:
    from agent.ssh.files import SshSettings


def add_arguments(parser: argparse.ArgumentParser, *, out: bool = True) -> None:
    """render's (with ``out``) or explain's arguments."""
    parser.add_argument("--pods", required=True, help="kubectl get pods -o json output, or '-' for stdin")
    parser.add_argument("--nodes", help="kubectl get nodes -o json output: the Nodes' labels give each pod's "
                                        "domains (--topology-levels, --rank-order topology); a pod on a lost Node "
                                        "(NotReady, Unknown, tainted unreachable or not-ready) is left out")
    parser.add_argument("--claims", help="kubectl get resourceclaims,resourceclaimtemplates -o json output: the "
                                         "devices the pods' DRA claims give (NPROC_PER_NODE)")
    parser.add_argument("--self", help="this pod's name (default: $POD_NAME)")
    if out:
        parser.add_argument("--out", default=None, help="output directory (required: render is offline and writes "
                                                        "only where told; explain prints the same without writing)")
    add_topology_arguments(parser)


class RenderSettings(NamedTuple):
    """What render and explain read and how: the job's pods, this pod's name, the Nodes' labels."""

    pods: list[RawPod]
    me: str
    nodes: dict[str, dict[str, str] | None] | None
    options: Options
    ssh: SshSettings | None
    out: Path  # where render writes (explain writes nothing)
    from_pod: tuple[str, ...] = ()  # the options taken from the pod's own init container, as flags


# What render and explain never take from a pod's init container: their own inputs, and paths inside the pod.
NOT_FROM_POD = frozenset({"pods", "nodes", "self", "out", "ssh_secret_dir", "state_dir", "claims"})


def settings_from(args: argparse.Namespace) -> RenderSettings:
    """Every option checked, then the pods and the Nodes read. render has no default output directory: init's
    (/shared) is a volume in a pod, and on a workstation it would be a new directory at the filesystem root.

    An option given neither here nor by ``TOPOLOGY_<NAME>`` is taken from the pod's own init container, as
    ``status`` reads it: what the pod was given (by inject, the webhook or by hand) is what its init used, so the
    dry run shows the files the pod got."""
    options_from_args(args)  # this command line's own options first, each checked
    ssh_settings(args)
    if args.command == "render" and knob(args, "out").value is None:
        raise InputError("render needs --out DIR, the directory to write the files to (e.g. --out ./shared); "
                         "explain prints the same plan without writing")
    out = out_dir(args)
    pods, me = read_pods(args.pods), _self_name(args)
    args, from_pod = _take_from_pod(args, pods, me)
    options = options_from_args(args)
    if args.claims is not None:
        options = dataclasses.replace(options, processes=dataclasses.replace(options.processes,
                                                                       claims=read_claims_file(args.claims)))
    nodes, lost = read_nodes_file(args.nodes)
    return RenderSettings(pods=on_lost_nodes(pods, lost, own=me), me=me, nodes=nodes, options=options,
                          ssh=ssh_settings(args), out=out, from_pod=from_pod)


def _take_from_pod(args: argparse.Namespace, pods: list[RawPod], me: str) -> tuple[argparse.Namespace,
                                                                                  tuple[str, ...]]:
    """``args`` with each option the init container of pod ``me`` was given and this command did not, and the
    flags taken. A pod whose command line or options the agent refuses gives nothing (its init refused them)."""
    from agent.flags.parser import UsageError, parse_command_line
    from agent.flags.status import init_args

    pod = next((p for p in pods if p["metadata"].get("name") == me), None)
    argv = init_args(pod) if pod is not None else None
    if argv is None:
        return args, ()
    try:
        given = vars(parse_command_line(argv))
    except UsageError:
        return args, ()
    merged = copy.copy(args)
    taken: list[tuple[str, str]] = []
    for dest, value in given.items():
        flag = dest.replace("_", "-")
        if dest in NOT_FROM_POD or value is None or not hasattr(args, dest) or getattr(args, dest) is not None \
                or env(flag) is not None:
            continue
        setattr(merged, dest, value)
        taken.append((f"--{flag}", str(value)))
    # named in the order the pod gives them (--flag value, or --flag=value)
    taken.sort(key=lambda pair: next((i for i, a in enumerate(argv) if a.partition("=")[0] == pair[0]), len(argv)))
    try:
        options_from_args(merged)
        ssh_settings(merged)
    except InputError:
        return args, ()
    return merged, tuple(word for pair in taken for word in pair)


def read_pods(source: str) -> list[RawPod]:
    """``kubectl get pods -o json`` output (a List), a JSON array of pods, or one Pod; ``-`` is stdin."""
    where = "stdin" if source == "-" else source
    try:
        raw = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    except OSError as err:
        reason = "file not found" if isinstance(err, FileNotFoundError) else (err.strerror or str(err))
        raise InputError(f"--pods {where}: {reason}; give the output of kubectl get pods -o json") from err
    try:
        text = raw.decode()
    except UnicodeDecodeError as err:
        raise InputError(f"--pods {where} is not text (byte {err.start} is not UTF-8); give the output of kubectl "
                         "get pods -o json") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(
            f"--pods {where} is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg}); "
            "produce it with kubectl get pods -o json"
        ) from err
    if isinstance(data, dict) and isinstance(data.get("items"), list):
        items = data["items"]
    elif isinstance(data, list):
        items = data
    elif isinstance(data, dict) and data.get("kind") == "Pod":
        raise InputError(f"--pods {where} holds one Pod (kubectl get pod NAME), not the job's pods: a world of one "
                         f"would be written; list them all, e.g. {_list_command(data)}")
    else:
        raise InputError(f"--pods {where} holds no pods: expected a List with 'items' or a JSON array of Pods")
    if not items:
        raise InputError(f"--pods {where}: the pod list is empty; check the namespace and label selector of the "
                         "kubectl get pods that made it")
    for position, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("metadata"), dict) \
                or not item["metadata"].get("name"):
            raise InputError(f"--pods {where}: item {position} is not a Pod (no metadata.name)")
    return items


def _list_command(pod: dict[str, Any]) -> str:
    """The kubectl command that lists the job of ``pod``, from its controller's labels when it has them."""
    meta = pod.get("metadata")
    namespace = meta.get("namespace") if isinstance(meta, dict) and isinstance(meta.get("namespace"), str) else None
    try:
        from agent.core.controllers import detect_controller
        from agent.core.pods.validation import check_pod

        selector = detect_controller(check_pod(pod), Options()).selector(pod, Options())  # type: ignore[arg-type]
    except (InputError, KeyError):
        selector = "<the job's label>"
    where = f" -n {namespace}" if namespace and namespace.isprintable() and len(namespace) <= 63 else ""
    return f"kubectl get pods{where} -l {selector} -o json"


def read_nodes_file(source: str | None) -> tuple[dict[str, dict[str, str] | None] | None, dict[str, str]]:
    """``kubectl get nodes -o json`` output (a List, an array, or one Node) -> labels by node name, and the lost
    Nodes with why (core/pods/lost.py: their Ready condition and taints, as the sidecar that watches Nodes reads
    them)."""
    if source is None:
        return None, {}
    try:
        data = json.loads(Path(source).read_text())
    except OSError as err:
        reason = "file not found" if isinstance(err, FileNotFoundError) else (err.strerror or str(err))
        raise InputError(f"--nodes {source}: {reason}; give the output of kubectl get nodes -o json") from err
    except json.JSONDecodeError as err:
        raise InputError(f"--nodes {source} is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg}); "
                         "produce it with kubectl get nodes -o json") from err
    items = data.get("items") if isinstance(data, dict) and "items" in data else \
        [data] if isinstance(data, dict) else data
    nodes: dict[str, dict[str, str] | None] = {}
    states = []
    for position, item in enumerate(items if isinstance(items, list) else [None]):
        meta = item.get("metadata") if isinstance(item, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        labels = meta.get("labels", {}) if isinstance(meta, dict) else None
        if not isinstance(name, str) or not isinstance(labels, dict) or item.get("kind", "Node") != "Node" or \
                not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise InputError(f"--nodes {source}: item {position} is not a Node (metadata.name and a map of string "
                             "labels); produce it with kubectl get nodes -o json")
        nodes[name] = labels
        states.append(node_state(item))
    return nodes, lost_nodes(state for state in states if state is not None)


def read_claims_file(source: str) -> Claims:
    """``kubectl get resourceclaims,resourceclaimtemplates -o json`` output (a List, an array, or one object)."""
    try:
        data = json.loads(Path(source).read_text())
    except OSError as err:
        reason = "file not found" if isinstance(err, FileNotFoundError) else (err.strerror or str(err))
        raise InputError(f"--claims {source}: {reason}; give the output of kubectl get "
                         "resourceclaims,resourceclaimtemplates -o json") from err
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"--claims {source} is not JSON text ({err}); give the output of kubectl get "
                         "resourceclaims,resourceclaimtemplates -o json") from None
    items = data.get("items") if isinstance(data, dict) and "items" in data else \
        [data] if isinstance(data, dict) else data
    for position, item in enumerate(items if isinstance(items, list) else [None]):
        meta = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) \
                or item.get("kind") not in (CLAIM, TEMPLATE):
            raise InputError(f"--claims {source}: item {position} is not a ResourceClaim or ResourceClaimTemplate "
                             "(kind and metadata.name); give the output of kubectl get "
                             "resourceclaims,resourceclaimtemplates -o json")
    return read_claims(items)  # type: ignore[arg-type]  # a list: each item was checked above


def _self_name(args: argparse.Namespace) -> str:
    name = args.self or os.environ.get("POD_NAME")
    if not name:
        raise InputError("which pod is this? pass --self POD_NAME or set POD_NAME (downward API)")
    return name

