"""What adopting the agent adds to a pod template: one transform, used by `topology-agent inject` (manifests)
and the admission webhook (Pods at CREATE).

The transform edits the template in place, so a round-trip YAML document keeps its comments and key order. It
adds only what carries the agent's exact names (containers ``topology-agent`` and ``topology-sidecar``, volumes
``topology-agent-shared``, ``-token``, ``-ssh`` and ``-state``) and the shared mount in the user's containers.
In a template the agent injected before (it carries ``topology-agent.io/injected``) it first takes those pieces
out, so a second run, or a run over an older injection, gives what one run over the user's own template gives. Nothing
else is ever taken out: a volume such as ``topology-agent-data`` is the user's, and a template the agent did not
inject that uses one of the exact names is refused (removing or replacing it would drop the user's data). The
user's containers keep their command, image, user and security context; pod-level settings that would change
them (runAsUser, fsGroup, shareProcessNamespace, ...) are never set.

Settings are ``topology-agent.io/<key>`` annotations: a namespace's, then the job's, then the pod template's,
each overriding the one before. Keys named like a command-line flag of init or the sidecar pass that flag.
"""

from __future__ import annotations

import copy
import posixpath
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from agent.core.controllers import CONTROLLERS, Controller, PodTemplate, job_resources, templates_owner
from agent.core.model import STATE_DIR, parse_owner
from agent.core.pods.validation import is_dns1123_subdomain
from agent.errors import InputError

PREFIX = "topology-agent.io/"
INJECT_LABEL = PREFIX + "inject"  # "enabled": the webhook's objectSelector / namespaceSelector
INJECTED = PREFIX + "injected"  # the version that injected the template (an upgrade replaces it)
INIT, SIDECAR = "topology-agent", "topology-sidecar"
SHARED, TOKEN, SSH = "topology-agent-shared", "topology-agent-token", "topology-agent-ssh"
STATE = "topology-agent-state"  # the agent's containers' own volume (core/model.STATE_DIR), never the trainer's
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
SSH_PATH = "/etc/topology/ssh"
AGENT_UID = 65532
SERVICE_ACCOUNT = "topology-agent"
HEALTH_PORT = 8090

# The flags a setting may pass, by the commands that take them (agent/cli.py's parsers check the values).
COMMON_FLAGS = ("roles", "master-port", "nproc-per-node", "container", "address", "cluster-domain", "elastic",
                "rdzv-port", "controller", "selector", "index-label", "rank-order", "topology-levels", "ssh-port",
                "view", "frameworks", "replica-groups", "world-size", "jax-port", "tf-port", "xgboost-port",
                "paddle-port", "mlx-port", "ray-port")
INIT_FLAGS = ("timeout", "expect", "wait-dns", "source", "lease-seconds")
SIDECAR_FLAGS = ("debounce", "signal", "trainer-match", "lease-seconds", "probe-every", "stuck-after")
# Settings that shape the pod rather than pass a flag.
POD_KEYS = ("image", "out", "service-account", "ssh-secret", "ssh-owner", "sidecar", "inject", "injected")
KEYS = frozenset(COMMON_FLAGS + INIT_FLAGS + SIDECAR_FLAGS + POD_KEYS)
FLAG_VALUES_OFF = ("false", "off", "no", "0", "")


# Every setting's value is at most this long. The longest legitimate values are an image reference (a name of at
# most 255 characters, a tag of 128, a sha256 digest of 71: about 460) and a selector or topology-levels naming a
# few label keys (each at most 317); 1024 holds twice the longest of them. The bound is checked before any value
# reaches a parser: a trainer-match regex is compiled (and kept in re's cache of 512 patterns: at most 512 KB of
# them here) only once it passed, where callers fed the webhook 200 KB patterns.
MAX_VALUE = 1024

# An image reference, after the distribution project's grammar (reference/regexp.go, the one container runtimes
# parse pulls with): [host[:port]/]path[:tag][@algorithm:hex], the path's parts lower-case alphanumerics joined
# by '.', '_', '__' or dashes, a tag of at most 128 word characters, '.' or '-'.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])"
IMAGE = re.compile(rf"(?:{_HOST}(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?"
                   r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?", re.ASCII)
IMAGE_NAME_MAX = 255  # the name (host and path) of a reference, as distribution bounds it


def check_setting(key: str, value: str, label: str) -> None:
    """A setting's value before it shapes the pod or reaches a parser: bounded in length, and for the keys that
    become pod fields, of the grammar the API server (or the runtime) takes, so nothing is admitted whose pods
    are all refused later. ``label`` names where the value came from."""
    if len(value) > MAX_VALUE:
        raise InputError(f"{label} is {len(value)} characters long; a setting is at most {MAX_VALUE}")
    if key in ("service-account", "ssh-secret") and value and not is_dns1123_subdomain(value):
        what = "ServiceAccount" if key == "service-account" else "Secret"
        raise InputError(f"{label} {shown(value)} is not a {what} name: lower-case letters, digits, '-' and '.', "
                         "starting and ending with a letter or digit, at most 253 characters")
    if key == "image" and value:
        name = value.split("@", 1)[0]
        last = name.rsplit("/", 1)[-1]
        if ":" in last:  # a tag (a registry's port sits before a '/')
            name = name[:len(name) - len(last) + last.index(":")]
        if IMAGE.fullmatch(value) is None or len(name) > IMAGE_NAME_MAX:
            raise InputError(f"{label} {shown(value)} is not an image reference ([registry/]path[:tag][@digest], "
                             "the path in lower case, no spaces); e.g. ghcr.io/acme/topology-agent:0.1.0")
    if key == "out" and value and (not value.startswith("/") or value == "/" or posixpath.normpath(value) != value
                                   or "//" in value or ".." in value.split("/") or value != value.strip()
                                   or not value.isprintable()):
        raise InputError(f"{label} {shown(value)} is not a directory the agent can share: give an absolute, "
                         "normalised path other than /, with no '..', e.g. /shared")


@dataclass(frozen=True)
class Settings:
    """The merged settings of one pod template (keys without the prefix)."""

    values: Mapping[str, str] = field(default_factory=dict)

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def over(self, annotations: Any, where: str) -> Settings:
        """These settings overridden by an object's ``topology-agent.io/*`` annotations; an unknown key is an
        error (a misspelt setting would otherwise be ignored without a word). Annotations are a map of strings;
        a number or a boolean written unquoted counts as its text, a null as empty, a list or a map is refused."""
        if annotations is not None and not isinstance(annotations, Mapping):
            raise InputError(f"{where}: metadata.annotations is {shown(annotations)}, not a map of strings; write "
                             "it as key: value lines")
        merged = dict(self.values)
        for name, value in (annotations or {}).items():
            if not isinstance(name, str) or not name.startswith(PREFIX):
                continue
            key = name[len(PREFIX):]
            if key not in KEYS:
                known = ", ".join(sorted(KEYS - {"inject", "injected"}))
                raise InputError(f"{where}: annotation {name!r} is not a setting of the agent; known: {known}")
            if isinstance(value, (Mapping, list)):
                raise InputError(f"{where}: annotation {name!r} is {shown(value)}, not a string; quote the value")
            merged[key] = "" if value is None else str(value)
            check_setting(key, merged[key], f"{where}: annotation {name!r}")
        merged.pop("injected", None)
        return Settings(merged)


def shown(value: object) -> str:
    """A value as a message shows it: on one line, at most 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass
class Template:
    """One pod template found in a manifest: where it is, and what the job says about it."""

    where: str
    template: dict[str, Any]
    settings: Settings
    elastic: str | None = None  # MIN:MAX from the job (PyTorchJob elasticPolicy)
    wait_dns: bool = False  # the controller names pods by DNS (hostname + subdomain)
    pods: int | None = None  # the most pods the job runs at once (None: not known here, as for a lone Pod)
    pointer: str = ""  # where the template is in its document, as a JSON Pointer (RFC 6901): the webhook's patch
    # why no pod of its job would train (Controller.untrained): inject refuses it, the webhook warns
    untrained: str | None = None


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _name(obj: Mapping[str, Any]) -> str:
    meta = _metadata(obj)
    name = meta.get("name") or (f"{meta['generateName']}*" if meta.get("generateName") else "?")
    return f"{obj.get('kind', '?')} {name}"


def _is_list(doc: Mapping[str, Any]) -> bool:
    kind = doc.get("kind")
    return kind == "List" or (isinstance(kind, str) and kind.endswith("List") and "items" in doc)


def templates(doc: Mapping[str, Any], defaults: Settings = Settings()) -> Iterator[Template]:
    """Every pod template of a supported kind in one document (a kubectl List's items included, Lists in Lists
    too), each with its JSON Pointer in the document. Each object is visited once: YAML aliases can make one List
    appear in another many times over (10^10 templates from 1 KB), and the same object needs the agent only once.
    No recursion: the nesting is the input's to choose."""
    for obj, at in _objects(doc):
        yield from _templates_of(obj, defaults, at)


def _objects(doc: Mapping[str, Any]) -> Iterator[tuple[Mapping[str, Any], str]]:
    """The objects of one document that are not Lists (a List's items, Lists in Lists too), each once, with its
    JSON Pointer in the document."""
    pending: list[tuple[Mapping[str, Any], str]] = [(doc, "")]
    seen: set[int] = set()
    while pending:
        obj, at = pending.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if _is_list(obj):
            items = obj.get("items")
            found = [(item, f"{at}/items/{i}") for i, item in enumerate(items if isinstance(items, list) else [])
                     if isinstance(item, Mapping)]
            pending.extend(reversed(found))
        else:
            yield obj, at


def left_alone(doc: Mapping[str, Any]) -> list[str]:
    """The objects of one document (a List's items too) that hold no pod template the agent adds itself to, each
    as "Kind name": inject passes them through unchanged and names them."""
    return [_name(obj) for obj, _ in _objects(doc) if not _is_pod(obj) and not _holds_templates(obj)]


def _holds_templates(obj: Mapping[str, Any]) -> bool:
    controller = templates_owner(obj)
    return controller is not None and any(isinstance(t.template, dict) for t in controller.pod_templates(obj))


def template_kinds() -> str:
    """The kinds whose pod templates the agent adds itself to, as a message lists them."""
    return ", ".join(["Pod", *(f"{r.kind} ({r.group})" for r in job_resources() if r.templates)])


def _is_pod(obj: Mapping[str, Any]) -> bool:
    return obj.get("kind") == "Pod" and "/" not in str(obj.get("apiVersion", "")) and isinstance(obj, dict)


def _templates_of(doc: Mapping[str, Any], defaults: Settings, at: str) -> Iterator[Template]:
    """The pod templates of one object that is not a List: a Pod's own, or those of a controller's job object
    (``Controller.pod_templates``), each sized by the job (the most pods it runs at once, as it may grow)."""
    where = _name(doc)
    settings = defaults.over(_metadata(doc).get("annotations"), where)
    if _is_pod(doc) and isinstance(doc, dict):
        # A Pod is its own template (metadata + spec); what the job said is read from what its controller put in
        # the Pod (an elastic range, naming by DNS), as each controller knows it.
        # Naming by DNS is the rule of the controller that made the Pod: an MPIJob's launcher is a Job's pod
        # too, and the Job's rule is not the MPI operator's.
        known = CONTROLLERS.values()
        elastic = next((said for c in known if (said := c.elastic_in_pod(doc)) is not None), None)
        labelled = isinstance(doc.get("metadata"), Mapping) and isinstance(doc["metadata"].get("labels"), Mapping)
        makers = {c.key for c in known if labelled and c.claims(doc)}  # type: ignore[arg-type]  # labels read
        for key in list(makers):
            makers -= CONTROLLERS[key].supersedes
        yield Template(where, doc, settings, elastic=elastic,
                       wait_dns=any(CONTROLLERS[key].names_by_dns(doc) for key in makers), pointer=at)
        return
    controller = templates_owner(doc)
    found = list(controller.pod_templates(doc)) if controller is not None else []
    pods = _job_size(found)
    untrained = _untrained(controller, doc, settings, where) if controller is not None else None
    for t in found:
        if isinstance(t.template, dict):
            yield Template(f"{where} {t.place}" if t.place else where, t.template, settings, elastic=t.elastic,
                           wait_dns=t.by_dns, pods=pods, pointer=at + "".join(f"/{escape(key)}" for key in t.path),
                           untrained=untrained)


def _untrained(controller: Controller, doc: Mapping[str, Any], settings: Settings, where: str) -> str | None:
    """The line that says no pod of the job object ``doc`` would train, and how to name the ones that do."""
    given = tuple(r.strip() for r in (settings.get("roles") or "").split(",") if r.strip()) or None
    why = controller.untrained(doc, given)
    if why is None:
        return None
    return (f"{where}: {why}; name the training tasks in rank order in annotation {PREFIX}roles (init's --roles) "
            "or in the plugin's flags, or the agent writes an empty hostfile and no rank")


def _job_size(found: list[PodTemplate]) -> int | None:
    """The most pods a job runs at once, as it may grow (an elastic job, to its maximum); None when the object does
    not say (a training runtime: each TrainJob sizes it)."""
    if any(t.replicas is None for t in found):
        return None
    return max([sum(t.replicas or 0 for t in found), *(t.grows_to for t in found)]) or None


def escape(token: Any) -> str:
    """One JSON Pointer reference token (RFC 6901: ``~`` is ``~0``, ``/`` is ``~1``)."""
    return str(token).replace("~", "~0").replace("/", "~1")


# The agent's own pieces, by their exact names: each volume with the one source inject gives it. Every release
# of inject gives these names and sets INJECTED on the template, so an earlier injection is
# recognised by the annotation and its pieces by name and source.
AGENT_CONTAINERS = (INIT, SIDECAR)
AGENT_VOLUMES = {SHARED: "emptyDir", TOKEN: "projected", SSH: "secret", STATE: "emptyDir"}


def _mappings(items: Any) -> list[Mapping[str, Any]]:
    return [i for i in items if isinstance(i, Mapping)] if isinstance(items, list) else []


def _source(volume: Mapping[str, Any]) -> str:
    """A volume's source (emptyDir, persistentVolumeClaim, ...): its one key besides the name."""
    return next((str(k) for k in volume if k != "name"), "?")


def refuse_reserved(where: str, spec: Mapping[str, Any], *, injected: bool) -> None:
    """A user's piece that uses one of the agent's exact names is refused, never replaced: in a template the
    agent did not inject, any such container or volume; in one it did, such a container among the user's
    ``containers``, or such a volume of another source than the agent gives (a PVC named topology-agent-shared)."""
    not_ours = f"is in a template the agent did not inject (no {INJECTED} annotation)"
    for key in ("containers",) if injected else ("initContainers", "containers"):
        for container in _mappings(spec.get(key)):
            name = container.get("name")
            if name in AGENT_CONTAINERS:
                what = "init container" if key == "initContainers" else "container"
                hint = "" if injected else (" (if it is the agent written in by hand, as in manifests/examples, "
                                            "apply the job without inject and the webhook's label)")
                raise InputError(f"{where}: {what} {name!r} {'is not the agent' if injected else not_ours}, and "
                                 f"the agent keeps that name for its own containers; rename it{hint}")
    for volume in _mappings(spec.get("volumes")):
        name = volume.get("name")
        if not isinstance(name, str) or name not in AGENT_VOLUMES:
            continue
        why = not_ours if not injected else (
            f"is a {_source(volume)} volume, not the agent's {AGENT_VOLUMES[name]}"
            if set(volume) != {"name", AGENT_VOLUMES[name]} else "")
        if why:
            suggestion = name.removeprefix("topology-agent-")
            raise InputError(f"{where}: volume {name!r} {why}, and the agent keeps that name for its own volumes; "
                             f"rename the volume and its volumeMounts, e.g. to {suggestion!r}")


def check_shape(where: str, pod: Mapping[str, Any]) -> None:
    """The fields the transform edits or reads have the types the API has: a field of another type is refused
    with one line, never replaced (it is the user's) and never left to a traceback."""
    meta = pod.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise InputError(f"{where}: metadata is {shown(meta)}, not an object; fix the manifest")
    spec = pod["spec"]
    _check_list(where, "spec.volumes", spec.get("volumes"), "a volume")
    for key in ("initContainers", "containers"):
        _check_list(where, f"spec.{key}", spec.get(key), "a container")
        for i, container in enumerate(spec.get(key) or []):
            _check_list(where, f"spec.{key}[{i}].volumeMounts", container.get("volumeMounts"), "a volume mount")


def _check_list(where: str, path: str, value: Any, item: str) -> None:
    """A list of objects, or absent."""
    if value is None:
        return
    if not isinstance(value, list):
        raise InputError(f"{where}: {path} is {shown(value)}, not a list; fix the manifest")
    for i, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise InputError(f"{where}: {path}[{i}] is {shown(entry)}, not {item}; fix the manifest")


def _agent_out(spec: Mapping[str, Any]) -> str | None:
    """Where the agent's init container mounts the shared volume: the directory it mounted in the user's
    containers (None: no such init container)."""
    return next((str(m.get("mountPath")) for c in _mappings(spec.get("initContainers")) if c.get("name") == INIT
                 for m in _mappings(c.get("volumeMounts")) if m.get("name") == SHARED), None)


def _drop(items: Any, agents: Callable[[Mapping[str, Any]], bool]) -> None:
    """Delete the agent's entries from a list in place, one by one from the end: a round-trip YAML list moves
    the comments of the entries that stay along with them (rebuilding the list would drop every comment)."""
    if isinstance(items, list):
        for i in reversed(range(len(items))):
            if isinstance(items[i], Mapping) and agents(items[i]):
                del items[i]


def remove(spec: dict[str, Any], where: str = "the pod template") -> None:
    """Take out what an earlier injection added to a template that carries INJECTED: the agent's containers
    and volumes by their exact names (each volume only of the source the agent gives it, else refused), and
    the shared mount it put in the user's containers. Lists it empties stay where they are, so that injecting
    again puts every key back in the same place."""
    refuse_reserved(where, spec, injected=True)
    out = _agent_out(spec)
    _drop(spec.get("initContainers"), lambda c: c.get("name") in AGENT_CONTAINERS)
    _drop(spec.get("volumes"), lambda v: isinstance(v.get("name"), str) and v["name"] in AGENT_VOLUMES)
    for container in _mappings(spec.get("containers")):  # a mount of the shared volume elsewhere is the user's
        _drop(container.get("volumeMounts"),
              lambda m: m.get("name") == SHARED and (out is None or str(m.get("mountPath")) == out))


MAX_ID = 2**31 - 1  # runAsUser and runAsGroup: the API server takes 0 to 2147483647 (IsValidUserID, IsValidGroupID)


def _id(where: str, field: str, value: Any) -> int | None:
    """A user or group ID as the manifest gives it: None when not given, else a whole number the API server
    takes (YAML reads 1.5e400 as a float, true as a boolean: neither is an ID)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
        raise InputError(f"{where}: {field} is {shown(value)}, not a user or group ID (a whole number from 0 to "
                         f"{MAX_ID}); fix the manifest")
    return int(value)


def _uid_gid(where: str, container: Mapping[str, Any], pod: Mapping[str, Any]) -> tuple[int, int | None] | None:
    """The user a container runs as, when the manifest says (else the image decides: unknown here)."""
    own, shared = container.get("securityContext") or {}, pod.get("securityContext") or {}
    mine = f"securityContext of container {container.get('name')!r}"
    for path, context in ((mine, own), ("spec.securityContext", shared)):
        if not isinstance(context, Mapping):
            raise InputError(f"{where}: {path} is {shown(context)}, not an object; fix the manifest")
    ids = []
    for key in ("runAsUser", "runAsGroup"):  # the container's own, else the pod's
        path, value = (f"{mine}: {key}", own[key]) if key in own else (f"spec.securityContext.{key}", shared.get(key))
        ids.append(_id(where, path, value))
    uid, gid = ids
    return (uid, gid) if uid is not None else None


def _restricted(uid: int, gid: int | None = None) -> dict[str, Any]:
    context: dict[str, Any] = {"runAsUser": uid, "runAsGroup": uid if gid is None else gid,
                               "runAsNonRoot": uid != 0, "allowPrivilegeEscalation": False,
                               "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
                               "seccompProfile": {"type": "RuntimeDefault"}}
    return context


def _flags(settings: Settings, names: tuple[str, ...]) -> list[str]:
    args: list[str] = []
    for name in names:
        value = settings.get(name)
        if value is None:
            continue
        if name == "wait-dns":
            if value.strip().lower() not in FLAG_VALUES_OFF:
                args.append("--wait-dns")
            continue
        args += [f"--{name}", value]
    return args


def _downward_env() -> list[dict[str, Any]]:
    return [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]


SIZED_FROM = 4096  # pods: up to here 64Mi requested / 128Mi limit; above, per 16384 pods 128Mi / 256Mi
SIZE_STEP = 16384


def resources_for(pods: int | None) -> dict[str, Any]:
    """Memory by the job's size, from what the agent's processes were measured to use (docs/benchmarks.md,
    "Memory"): at 4096 pods every process peaks under 80 MB (128Mi limit, 64Mi asked); at 16384 the leader's
    init and sidecar peak near 150 MB, past a 128Mi limit (134 MB), and a follower's sidecar holds ~127 MB. A
    size not known here (a lone Pod, a training runtime) gets the small job's."""
    steps = 0 if pods is None or pods <= SIZED_FROM else -(-pods // SIZE_STEP)
    request, limit = (f"{128 * steps}Mi", f"{256 * steps}Mi") if steps else ("64Mi", "128Mi")
    return {"requests": {"cpu": "50m", "memory": request}, "limits": {"cpu": "500m", "memory": limit}}


def _volumes(ssh_secret: str | None) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": SHARED, "emptyDir": {}},
        {"name": TOKEN, "projected": {"sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                                        "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}}]
    if ssh_secret:
        # Only the init container mounts it; 0444 because it runs as the trainer's user without fsGroup.
        volumes.append({"name": SSH, "secret": {"secretName": ssh_secret, "defaultMode": 0o444}})
    return volumes


def mount_shared(where: str, containers: list[dict[str, Any]], out: str) -> bool:
    """Mount the shared volume at ``out`` in each container that lacks it; whether any changed. A container
    that already has another volume there is refused (the agent's files would be hidden from it)."""
    changed = False
    for container in containers:
        mounts = [m for m in container.get("volumeMounts") or [] if isinstance(m, Mapping)]
        if any(m.get("name") == SHARED for m in mounts):
            continue
        taken = next((m for m in mounts if m.get("mountPath") == out), None)
        if taken is not None:
            raise InputError(f"{where}: container {container.get('name')!r} already mounts "
                             f"{taken.get('name')!r} at {out}; set annotation {PREFIX}out to another directory")
        if not isinstance(container.get("volumeMounts"), list):
            container["volumeMounts"] = []
        container["volumeMounts"].append({"name": SHARED, "mountPath": out})
        changed = True
    return changed


def complete(template: Template) -> bool:
    """An injected template that gained containers since (another admission webhook added them after ours):
    mount the shared volume in those, and change nothing else, so the settings the injection was made with
    (the job's, which a Pod no longer carries) stay. Whether anything changed."""
    spec = template.template.get("spec")
    if not isinstance(spec, dict):
        return False
    out = next((str(m.get("mountPath")) for c in spec.get("initContainers") or [] if isinstance(c, Mapping)
                and c.get("name") == INIT for m in c.get("volumeMounts") or []
                if isinstance(m, Mapping) and m.get("name") == SHARED), None)
    if out is None:
        return False
    return mount_shared(template.where, [c for c in spec.get("containers") or [] if isinstance(c, dict)], out)


def is_injected(template: Template) -> bool:
    annotations = _metadata(template.template).get("annotations")
    return isinstance(annotations, Mapping) and INJECTED in annotations


def _trainer_user(template: Template, user_containers: list[dict[str, Any]], spec: Mapping[str, Any],
                  settings: Settings, *, why: str) -> tuple[int, int | None]:
    """The trainer's UID:GID: annotation ssh-owner, else the trainer container's (or the pod's) runAsUser."""
    owner = settings.get("ssh-owner")
    if owner:
        label = f"{template.where}: annotation {PREFIX}ssh-owner"
        uid, gid = parse_owner(owner, label=label) or (0, 0)  # never None: owner is set
        for what, value in (("its UID", uid), ("its GID", gid)):  # they become runAsUser and runAsGroup
            _id(label, what, value)
        return uid, gid
    user = _uid_gid(template.where, user_containers[0], spec)
    if user is None:
        raise InputError(f"{template.where}: {why}, which the manifest does not say; set securityContext.runAsUser "
                         f"on container {user_containers[0].get('name')!r} (or the pod), or annotate "
                         f"{PREFIX}ssh-owner with UID:GID")
    return user


def elastic_of(template: Template) -> str | None:
    """MIN:MAX when the job is elastic: the setting first ("false" turns it off), then the job's own policy."""
    value = template.settings.get("elastic")
    if value is not None:
        return None if value.strip().lower() in FLAG_VALUES_OFF else value
    return template.elastic


def _injectable_spec(template: Template) -> dict[str, Any]:
    """The template's pod spec, checked and cleared of an earlier injection (or of names reserved for the agent)."""
    spec = template.template.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list) or not spec["containers"]:
        raise InputError(f"{template.where}: the pod template has no spec.containers; nothing to add the agent "
                         "to")
    check_shape(template.where, template.template)
    if is_injected(template):
        remove(spec, template.where)
    else:
        refuse_reserved(template.where, spec, injected=False)
    return spec


def _common_args(settings: Settings, elastic: str | None) -> list[str]:
    """The flags init and the sidecar share; an elastic job's range replaces any --elastic setting."""
    common = _flags(settings, COMMON_FLAGS)
    if elastic is not None:
        common = [a for i, a in enumerate(common) if a != "--elastic" and (i == 0 or common[i - 1] != "--elastic")]
        common += ["--elastic", elastic]
        if settings.get("address") is None:
            common += ["--address", "ip"]  # elastic pods come and go faster than their DNS records
    return common


def _agent_mounts(out: str) -> list[dict[str, Any]]:
    return [{"name": SHARED, "mountPath": out}, {"name": TOKEN, "mountPath": TOKEN_PATH, "readOnly": True}]


def _init_container(template: Template, user_containers: list[dict[str, Any]], *, image: str, out: str,
                    common: list[str], elastic: str | None) -> dict[str, Any]:
    settings, spec = template.settings, template.template["spec"]
    init_args = ["init", "--out", out]
    init_context = _restricted(AGENT_UID)
    ssh_secret = settings.get("ssh-secret")
    if ssh_secret:
        init_args += ["--ssh-secret-dir", SSH_PATH]
        user = _trainer_user(template, user_containers, spec, settings,
                             why="the SSH files must belong to the user the trainer runs as")
        # init writes the files as the trainer's own user: no chown, so no capability (sshd's StrictModes).
        init_context = _restricted(*user)
    wait_dns = ["--wait-dns"] if template.wait_dns and settings.get("wait-dns") is None and elastic is None else []
    return {
        "name": INIT, "image": image,
        "args": init_args + wait_dns + _flags(settings, INIT_FLAGS) + common,
        "env": _downward_env(),
        "volumeMounts": _agent_mounts(out) + ([{"name": SSH, "mountPath": SSH_PATH, "readOnly": True}]
                                              if ssh_secret else []),
        "securityContext": init_context, "resources": resources_for(template.pods)}


def _sidecar_container(template: Template, user_containers: list[dict[str, Any]], *, image: str, out: str,
                       common: list[str]) -> dict[str, Any]:
    settings, spec = template.settings, template.template["spec"]
    sidecar_context = _restricted(AGENT_UID)
    if settings.get("trainer-match") and (settings.get("signal") or "").strip().lower() != "none":
        # kill(2) needs the same user or CAP_KILL, and the sidecar has no capability: it runs as the trainer.
        user = _trainer_user(template, user_containers, spec, settings, why=f"the sidecar signals the trainer "
                                                                              f"({PREFIX}trainer-match)")
        sidecar_context = _restricted(*user)
        if spec.get("shareProcessNamespace") is not True:
            raise InputError(f"{template.where}: the sidecar signals the trainer ({PREFIX}trainer-match), so it must "
                             "see the trainer's processes; set spec.shareProcessNamespace: true in the pod template")
    return {
        "name": SIDECAR, "image": image, "restartPolicy": "Always",
        "args": ["sidecar", "--out", out, *_flags(settings, SIDECAR_FLAGS), *common],
        "env": _downward_env(),
        "ports": [{"name": "topology-health", "containerPort": HEALTH_PORT}],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "topology-health"}},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "topology-health"}, "periodSeconds": 30},
        "volumeMounts": _agent_mounts(out), "securityContext": sidecar_context,
        "resources": resources_for(template.pods)}


def _add_to_spec(spec: dict[str, Any], added: list[dict[str, Any]], settings: Settings) -> None:
    """The agent's containers first among the init containers, its volumes, and the account its token is for."""
    if isinstance(spec.get("initContainers"), list):
        spec["initContainers"][:0] = added
    else:
        spec["initContainers"] = added
    if not isinstance(spec.get("volumes"), list):
        spec["volumes"] = []
    spec["volumes"].extend(_volumes(settings.get("ssh-secret")))
    account = settings.get("service-account")
    if account:
        spec["serviceAccountName"] = account
    elif not spec.get("serviceAccountName") and not spec.get("serviceAccount"):
        spec["serviceAccountName"] = SERVICE_ACCOUNT
    if spec.get("serviceAccountName") == SERVICE_ACCOUNT or account:
        # The agent's token goes to the agent's containers only (the projected volume), never the trainer's.
        spec["automountServiceAccountToken"] = False


def image_of(settings: Settings, *, version: str) -> str:
    """The agent's image for a template: its ``image`` setting (annotation ``topology-agent.io/image``, inject's
    ``--set image=``, the webhook's ``--set image=``), else the image this version is built as."""
    return settings.get("image") or f"topology-agent:{version}"


def names_registry(image: str) -> bool:
    """Whether an image reference names the registry to pull from. As the distribution reference grammar
    normalises a name (distribution/reference, normalize.go ``splitDockerDomain``), the part before the first '/'
    is a registry host only if it holds a '.' or a ':', is ``localhost``, or has an upper-case letter; otherwise
    the runtime pulls from Docker Hub (``topology-agent:0.1.0`` is ``docker.io/library/topology-agent:0.1.0``)."""
    first, sep, _ = image.partition("/")
    return bool(sep) and ("." in first or ":" in first or first == "localhost" or first != first.lower())


def _mark_injected(pod: dict[str, Any], version: str) -> None:
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        meta = pod["metadata"] = {}
    annotations = meta.get("annotations")
    if not isinstance(annotations, dict):
        annotations = meta["annotations"] = {}
    annotations[INJECTED] = version


def inject(template: Template, *, version: str) -> dict[str, Any]:
    """Add the agent to one pod template (in place) and return the template. Refuses, with one line, what it
    cannot make work: a template with no container, or SSH files for a user it cannot know."""
    spec = _injectable_spec(template)
    settings = template.settings
    elastic = elastic_of(template)
    sidecar = elastic is not None or (settings.get("sidecar") or "").strip().lower() not in FLAG_VALUES_OFF
    out = settings.get("out") or "/shared"
    image = image_of(settings, version=version)
    user_containers = [c for c in spec["containers"] if isinstance(c, dict)]
    mount_shared(template.where, user_containers, out)
    common = _common_args(settings, elastic)
    added = [_init_container(template, user_containers, image=image, out=out, common=common, elastic=elastic)]
    if sidecar:
        added.append(_sidecar_container(template, user_containers, image=image, out=out, common=common))
    _add_to_spec(spec, added, settings)
    if sidecar:  # what init read, for its sidecar, where the trainer cannot write it (runtime/publication/handoff.py)
        for container in added:
            container["volumeMounts"].append({"name": STATE, "mountPath": STATE_DIR})
        spec["volumes"].append({"name": STATE, "emptyDir": {}})
    _mark_injected(template.template, version)
    return template.template


class Adopted(NamedTuple):
    """A pod template inject gave the agent, and whether that changed it: a template this version injected with
    the same settings comes out as it went in."""

    where: str
    changed: bool
    image: str  # the agent's image in it


def adopt_document(doc: dict[str, Any], defaults: Settings, *, version: str) -> list[Adopted]:
    """Add the agent to every pod template of one manifest document (in place); each template, changed or not."""
    done = []
    injected: dict[int, bool] = {}  # a template shared by YAML aliases (tasks: [{template: *t}, ...]) gets it once
    for template in templates(doc, defaults):
        if template.untrained is not None:
            raise InputError(template.untrained)
        template.settings = template.settings.over(_metadata(template.template).get("annotations"),
                                                   template.where)
        if id(template.template) not in injected:
            before = copy.deepcopy(template.template)
            inject(template, version=version)
            injected[id(template.template)] = template.template != before
        done.append(Adopted(template.where, injected[id(template.template)],
                            image_of(template.settings, version=version)))
    return done


def inject_document(doc: dict[str, Any], defaults: Settings, *, version: str) -> list[str]:
    """Add the agent to every pod template of one manifest document (in place); the templates it holds."""
    return [adopted.where for adopted in adopt_document(doc, defaults, version=version)]
