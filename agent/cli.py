"""The ``topology-agent`` command line: a thin shell that reads input, calls the core, and writes or prints.

Every option can also come from an environment variable ``TOPOLOGY_<NAME>`` (``--master-port`` ->
``TOPOLOGY_MASTER_PORT``), so a manifest can configure the agent without touching its command line. An
``AgentError`` becomes one line on stderr and its exit code; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import re
import socket
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from agent import __version__
from agent.core import Options, Rendered, render_pod
from agent.core.controllers import CONTROLLERS, parse_selector
from agent.core.model import RawPod, is_whole_number, parse_owner
from agent.core.placement import DEFAULT_LEVELS, RANK_ORDERS, parse_levels
from agent.core.validation import DNS_NAME, is_dns1123_label, is_dns1123_subdomain, is_label_value
from agent.core.variables import explain_exclusions, warnings_for
from agent.errors import AgentError, ApiConflict, InputError, OutputError

DEFAULT_OUT = "/shared"


def _env_name(name: str) -> str:
    return f"TOPOLOGY_{name.upper().replace('-', '_')}"


def _env(name: str) -> str | None:
    value = os.environ.get(_env_name(name))
    return value if value not in (None, "") else None


@dataclass(frozen=True)
class Knob:
    """One option's value and the name the user gave it by (``--master-port`` or ``TOPOLOGY_MASTER_PORT``), so
    a message names the knob the user actually turned."""

    value: str | None
    label: str


def knob(args: argparse.Namespace, name: str, default: str | None = None) -> Knob:
    """The flag if given, else ``TOPOLOGY_<NAME>``, else ``default`` (labelled with the flag)."""
    value = getattr(args, name.replace("-", "_"), None)
    if value is not None:
        return Knob(str(value), f"--{name}")
    from_env = _env(name)
    if from_env is not None:
        return Knob(from_env, _env_name(name))
    return Knob(default, f"--{name}")


def _int(option: str, raw: str | None, *, low: int = 1, high: int = 65535) -> int | None:
    if raw is None:
        return None
    # Length first: int() of thousands of digits is refused by Python (and slow before that).
    if not is_whole_number(raw) or len(raw.strip()) > len(str(high)) or not low <= int(raw) <= high:
        shown = raw if len(raw) <= 40 else raw[:37] + "..."
        raise InputError(f"{option} '{shown}' must be a whole number from {low} to {high}")
    return int(raw)


def _int_knob(k: Knob, *, low: int = 1, high: int = 65535) -> int | None:
    return _int(k.label, k.value, low=low, high=high)


def _choice(option: str, raw: str, allowed: Sequence[str]) -> str:
    if raw not in allowed:
        raise InputError(f"{option} '{raw}' must be one of: {', '.join(allowed)}")
    return raw


def _choice_knob(k: Knob, allowed: Sequence[str]) -> str:
    return _choice(k.label, k.value or allowed[0], allowed)


def _float(option: str, raw: str | None, default: float, *, high: float = 86_400.0) -> float:
    """Seconds: a finite number from 0 to ``high`` (float('nan') and 'inf' parse, and must not pass)."""
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= high:  # also false for NaN
        raise InputError(f"{option} '{raw}' must be a number of seconds from 0 to {high:g}")
    return value


def _container(k: Knob) -> str | None:
    if k.value is not None and not is_dns1123_label(k.value):
        raise InputError(f"{k.label} '{k.value}' is not a container name (lower-case letters, digits and '-'); "
                         "give the name of the trainer container")
    return k.value


def options_from_args(args: argparse.Namespace) -> Options:
    """Flags first, then ``TOPOLOGY_*`` variables; values are checked here so the core sees only good ones."""
    roles_k = knob(args, "roles")
    roles = tuple(r.strip() for r in roles_k.value.split(",") if r.strip()) if roles_k.value is not None else None
    if roles_k.value is not None and not roles:
        raise InputError(f"{roles_k.label} is empty; give the training roles in rank order, e.g. master,worker")

    nproc_k = knob(args, "nproc-per-node")
    nproc: int | str | None = None
    if nproc_k.value is not None:
        nproc = "auto" if nproc_k.value == "auto" else _int(nproc_k.label, nproc_k.value, high=1_000_000)

    elastic_k = knob(args, "elastic")
    elastic = None
    if elastic_k.value is not None:
        low, sep, high = elastic_k.value.partition(":")
        ok = sep and is_whole_number(low) and is_whole_number(high) and len(low.strip()) <= 7 \
            and len(high.strip()) <= 7 and 1 <= int(low) <= int(high)
        if not ok:
            raise InputError(f"{elastic_k.label} '{elastic_k.value}' must be MIN:MAX with 1 <= MIN <= MAX, e.g. 2:8")
        elastic = (int(low), int(high))

    controller_k = knob(args, "controller")
    if controller_k.value is not None and controller_k.value not in CONTROLLERS:
        known = ", ".join(CONTROLLERS)
        raise InputError(f"{controller_k.label} '{controller_k.value}' is unknown; use one of: {known}")
    selector_k = knob(args, "selector")
    index_k = knob(args, "index-label")
    if index_k.value and not selector_k.value:
        raise InputError(f"{index_k.label} needs --selector (the labels that pick the job's pods)")
    if selector_k.value and controller_k.value not in (None, "selector"):
        raise InputError(f"{selector_k.label} and {controller_k.label} {controller_k.value} contradict: the selector "
                         f"picks pods by your labels, the controller by its own; give one of them")
    if selector_k.value:
        parse_selector(selector_k.value, label=selector_k.label)
        if not index_k.value:
            raise InputError(f"{selector_k.label} needs --index-label KEY (the label holding each pod's index)")

    address_k = knob(args, "address")
    address = _choice_knob(Knob(address_k.value or "dns", address_k.label), ("dns", "ip"))
    domain_k = knob(args, "cluster-domain")
    if domain_k.value is not None:
        if not DNS_NAME.fullmatch(domain_k.value.strip(".")):
            raise InputError(f"{domain_k.label} '{domain_k.value}' is not a DNS domain; use e.g. cluster.local")
        if address == "ip":
            raise InputError(f"{domain_k.label} and {address_k.label} ip contradict: domain names are not written "
                             "when peers are named by IP; drop one of them")

    order_k = knob(args, "rank-order")
    rank_order = _choice_knob(Knob(order_k.value or "index", order_k.label), RANK_ORDERS)
    levels_k = knob(args, "topology-levels")
    levels = parse_levels(levels_k.value, option=levels_k.label) if levels_k.value is not None else None
    if levels is None and (rank_order == "topology" or getattr(args, "nodes", None)):
        levels = DEFAULT_LEVELS

    view_k = knob(args, "view")
    view = _choice_knob(Knob(view_k.value or "full", view_k.label), ("full", "own"))

    given = (roles_k, nproc_k, elastic_k, controller_k, selector_k, index_k, address_k, domain_k, view_k)
    return Options(
        labels=tuple((k.label.removeprefix("TOPOLOGY_").lower(), k.label) for k in given
                     if k.label.startswith("TOPOLOGY_")),
        roles=roles,
        master_port=_int_knob(knob(args, "master-port")),
        nproc_per_node=nproc,  # type: ignore[arg-type]
        container=_container(knob(args, "container")),
        address=address,  # type: ignore[arg-type]
        cluster_domain=domain_k.value,
        elastic=elastic,
        rdzv_port=_int_knob(knob(args, "rdzv-port")),
        controller=controller_k.value,
        selector=selector_k.value,
        index_label=index_k.value,
        levels=levels,
        rank_order=rank_order,  # type: ignore[arg-type]
        view=view,  # type: ignore[arg-type]
    )


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
        from agent.core.validation import check_pod

        selector = detect_controller(check_pod(pod), Options()).selector(pod, Options())  # type: ignore[arg-type]
    except (InputError, KeyError):
        selector = "<the job's label>"
    where = f" -n {namespace}" if namespace and namespace.isprintable() and len(namespace) <= 63 else ""
    return f"kubectl get pods{where} -l {selector} -o json"


def read_nodes_file(source: str | None) -> dict[str, dict[str, str] | None] | None:
    """``kubectl get nodes -o json`` output (a List, an array, or one Node) -> labels by node name."""
    if source is None:
        return None
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
    for position, item in enumerate(items if isinstance(items, list) else [None]):
        meta = item.get("metadata") if isinstance(item, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        labels = meta.get("labels", {}) if isinstance(meta, dict) else None
        if not isinstance(name, str) or not isinstance(labels, dict) or item.get("kind", "Node") != "Node" or \
                not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise InputError(f"--nodes {source}: item {position} is not a Node (metadata.name and a map of string "
                             "labels); produce it with kubectl get nodes -o json")
        nodes[name] = labels
    return nodes


def _self_name(args: argparse.Namespace) -> str:
    name = args.self or os.environ.get("POD_NAME")
    if not name:
        raise InputError("which pod is this? pass --self POD_NAME or set POD_NAME (downward API)")
    return name


def _add_common(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("topology options (each also read from TOPOLOGY_<NAME>)")
    group.add_argument("--roles", help="training roles in rank order, comma-separated (default: the controller's)")
    group.add_argument("--master-port", help="MASTER_PORT (default: port 'pytorchjob-port', else 29500)")
    group.add_argument("--nproc-per-node", help="processes per pod: an integer or 'auto' (default auto)")
    group.add_argument("--container", help="the trainer container (default: first container that is not the agent)")
    group.add_argument("--address", help="how peers are named in files: dns (default) or ip")
    group.add_argument("--cluster-domain", help="write fully qualified names under this domain, e.g. cluster.local")
    group.add_argument("--elastic", help="MIN:MAX nodes: torchrun elastic rendezvous (c10d)")
    group.add_argument("--rdzv-port", help="c10d rendezvous port (default 29400)")
    group.add_argument("--controller", help="force a controller: volcano, pytorchjob, trainjob, jobset, lws, "
                                            "indexed-job, selector")
    group.add_argument("--selector", help="generic: equality label selector of the job's pods, e.g. app=x,job=y")
    group.add_argument("--index-label", help="generic: the label that holds each pod's index")
    group.add_argument("--rank-order", help="index (default: the controller's order) or topology (pods of each "
                                            "network domain contiguous, rank 0 kept; reads Node labels)")
    group.add_argument("--view", help="full (default: every pod reads every member) or own (a training pod of a large "
                       "job reads the published summary: rank 0, the job's size and its own ranks; it writes "
                       "torch.env without the long host lists, and no hostfile; docs/sidecar.md)")
    group.add_argument("--topology-levels", help="Node label keys outermost first, comma-separated, or 'default' "
                                                 "(zone, region, GKE, EKS, NVLink clique): TOPOLOGY_<LEVEL> vars")
    ssh = parser.add_argument_group("SSH for DeepSpeed/MPI (written when the job's Secret is mounted)")
    ssh.add_argument("--ssh-secret-dir", help="the mounted Secret from 'topology-agent keygen', e.g. /etc/topology/ssh")
    ssh.add_argument("--ssh-port", help="port the trainers' sshd listens on (default 2222: non-root)")
    ssh.add_argument("--ssh-owner", help="UID:GID that owns the SSH files (the trainer's user; sshd checks it)")


def _add_offline(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pods", required=True, help="kubectl get pods -o json output, or '-' for stdin")
    parser.add_argument("--nodes", help="kubectl get nodes -o json output: the Nodes' labels give each pod's "
                                        "domains (--topology-levels, --rank-order topology)")
    parser.add_argument("--self", help="this pod's name (default: $POD_NAME)")


def _add_in_cluster(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None, help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account, else $KUBECONFIG)")
    parser.add_argument("--log-format", help="text (default) or json")
    parser.add_argument("--watch-idle", help="seconds a watch may show no event or bookmark before it counts as "
                                             "dead and the list is read again (default 60; init: at most a third "
                                             "of --timeout)")


class UsageError(Exception):
    """argparse's complaint, as one line (argparse itself prints the whole usage first)."""


class _Parser(argparse.ArgumentParser):
    """No abbreviations (``--pod`` is not ``--pods``), and an unknown option is named before a missing one: argparse
    checks required options first, so ``--podz x`` said that ``--pods`` was required."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        argv = list(sys.argv[1:] if args is None else args)
        required = [a for a in self._actions if a.required and a.option_strings]
        for action in required:
            action.required = False
        try:
            parsed, extra = super().parse_known_args(argv, namespace)
        finally:
            for action in required:
                action.required = True
        unknown = [a for a in extra if a.startswith("-")]
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        missing = [a for a in required if getattr(parsed, a.dest, None) is None]
        if missing:
            self.error(f"the following arguments are required: {', '.join(a.option_strings[0] for a in missing)}")
        return parsed, extra

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="topology-agent",
        description="Configure a multi-pod training job from its pods: torch.env, hostfile, host files.",
    )
    parser.add_argument("--version", action="version", version=f"topology-agent {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    render = commands.add_parser("render", help="write the files for one pod from a pods JSON file (offline)")
    _add_offline(render)
    render.add_argument("--out", default=None, help=f"output directory (default {DEFAULT_OUT})")
    _add_common(render)

    explain = commands.add_parser("explain", help="print every variable, its value and the rule behind it")
    _add_offline(explain)
    _add_common(explain)

    init = commands.add_parser("init", help="init container: wait for the job's pods, then write the files")
    _add_in_cluster(init)
    init.add_argument("--expect", help="number of training pods to wait for (default: read from the owner object)")
    init.add_argument("--timeout", help="seconds to wait for the gang (default 600)")
    init.add_argument("--wait-dns", action="store_true", default=None,
                      help="also wait until every peer's DNS name resolves")
    init.add_argument("--source", help="where peers come from: pods (every pod lists the job's pods), published "
                                       "(the leader publishes a compact topology), auto (default: published from "
                                       "256 training pods)")
    _add_common(init)

    sidecar = commands.add_parser("sidecar", help="elastic jobs: follow membership, rewrite files, signal the trainer")
    _add_in_cluster(sidecar)
    sidecar.add_argument("--debounce", help="longest wait to gather a burst of changes into one rewrite (default 1; "
                                            "a lone change waits 50 ms; 0: rewrite at once)")
    sidecar.add_argument("--signal", help="signal for the trainer after a rewrite: SIGUSR1 (default when a trainer is "
                                          "named), ..., none (default otherwise)")
    sidecar.add_argument("--trainer-pid-file", help="file holding the trainer's pid")
    sidecar.add_argument("--trainer-match", help="regular expression over the trainer's command line")
    sidecar.add_argument("--health-port", help="port of /healthz /readyz /metrics /topology (default 8090; 0: off)")
    sidecar.add_argument("--health-host", help="address to bind the health server (default 0.0.0.0: the kubelet's "
                                               "probes come from the node)")
    sidecar.add_argument("--health-topology", action="store_true", default=None,
                         help="also serve topology.json at /topology on the health port (default off)")
    sidecar.add_argument("--stuck-after", help="seconds without watch progress before /healthz fails (default 600)")
    sidecar.add_argument("--lease-seconds", help="large jobs: duration of the Lease that elects the pod publishing the "
                                                 "topology; a crashed publisher is replaced after it (default 15)")
    sidecar.add_argument("--probe-every", help="large jobs: seconds between a follower's looks at the publisher's "
                                               "Lease; a publisher that stopped is left for the pods (default 300)")
    _add_common(sidecar)

    sandbox = commands.add_parser("sandbox", help="run the sandbox API server (for kubectl and the agent, no cluster)")
    sandbox.add_argument("--port", default="0", help="port on 127.0.0.1 (default: any free port)")
    sandbox.add_argument("--state-dir", help="where to write the kubeconfig and TLS files (default: a temp dir)")
    sandbox.add_argument("--bookmark-interval", default="1.0", help="seconds between watch BOOKMARKs")
    sandbox.add_argument("--service", action="append", default=[], metavar="NAMESPACE/NAME=HOST:PORT",
                         help="where a webhook's Service answers (the sandbox has no cluster network; repeatable)")

    keygen = commands.add_parser("keygen", help="print (or --apply) the job's SSH Secret: user key pair and host CA")
    keygen.add_argument("--job", required=True, help="job name; the Secret is <job>-ssh")
    keygen.add_argument("--namespace", default="default", help="namespace of the Secret (default: default)")
    keygen.add_argument("--apply", action="store_true", help="create the Secret through the API instead of printing")
    keygen.add_argument("--kubeconfig", help="kubeconfig file for --apply")

    inject = commands.add_parser("inject", help="add the agent to the pod templates of manifests: "
                                                "topology-agent inject -f job.yaml | kubectl apply -f -")
    inject.add_argument("-f", "--filename", action="append", help="manifest file (YAML, multi-document, JSON or a "
                                                                   "kubectl List); '-' or none: stdin")
    inject.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="a default for every job, as annotation topology-agent.io/KEY would give it (the "
                             "job's own annotations win), e.g. --set image=registry/topology-agent:0.1.0")

    webhook = commands.add_parser("webhook", help="mutating admission webhook: adds the agent to Pods and jobs at "
                                                  "CREATE, as inject does (manifests/webhook)")
    webhook.add_argument("--port", default="8443", help="HTTPS port (default 8443)")
    webhook.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    webhook.add_argument("--namespace", help="the webhook's namespace, where its TLS Secret is (default: "
                                             "$POD_NAMESPACE, else topology-agent-system)")
    webhook.add_argument("--service", default="topology-agent-webhook", help="its Service: the certificate "
                                                                            "covers <service>.<namespace>.svc")
    webhook.add_argument("--cert-host", action="append", default=[], metavar="NAME_OR_IP",
                         help="another name or IP address the certificate covers (repeatable)")
    webhook.add_argument("--secret", default="topology-agent-webhook-tls",
                         help="the Secret holding its CA and serving certificate (default topology-agent-webhook-tls)")
    webhook.add_argument("--config", default="topology-agent", help="the MutatingWebhookConfiguration whose caBundle "
                                                                    "it keeps (default topology-agent)")
    webhook.add_argument("--tls-dir", help="serve tls.crt and tls.key from this directory (cert-manager) instead "
                                           "of managing a Secret and the caBundle")
    webhook.add_argument("--check-every", default="3600", help="seconds between certificate checks (default 3600)")
    webhook.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    webhook.add_argument("--log-format", help="text or json (default text)")
    webhook.add_argument("--reviewer", action="store_true", help=argparse.SUPPRESS)  # its reviewing process

    demo = commands.add_parser("demo", help="show the agent at work on an example Volcano job in the sandbox")
    demo.add_argument("--out", default="demo-out", help="where each pod's files go (default ./demo-out)")
    return parser


def ssh_settings(args: argparse.Namespace) -> Any:
    """``SshSettings`` when --ssh-secret-dir (or TOPOLOGY_SSH_SECRET_DIR) is given, else None. The SSH options
    are checked either way: a bad value is a mistake even where it is not used yet."""
    port, owner = _ssh_values(args)
    secret_dir = knob(args, "ssh-secret-dir")
    if not secret_dir.value:
        return None
    if not Path(secret_dir.value).is_dir():
        raise InputError(f"{secret_dir.label} {secret_dir.value}: directory not found; mount the job's SSH Secret "
                         "(topology-agent keygen) there, or drop the option")
    from agent.ssh.material import SshSettings  # asyncssh: 0.2 s and 20 MB, paid only with SSH

    return SshSettings(secret_dir=Path(secret_dir.value), port=port, owner=owner)


def _ssh_values(args: argparse.Namespace) -> tuple[int, tuple[int, int] | None]:
    port = _int_knob(knob(args, "ssh-port")) or 2222
    owner_k = knob(args, "ssh-owner")
    return port, parse_owner(owner_k.value, label=owner_k.label)


def _out_dir(args: argparse.Namespace, *, check: bool = False) -> Path:
    """The output directory; with ``check``, made and proven writable now (init would otherwise find out only
    after waiting for the whole gang)."""
    k = knob(args, "out", DEFAULT_OUT)
    out = Path(k.value or DEFAULT_OUT)
    if check:
        try:
            out.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=out, prefix=".topology-agent-probe-"):
                pass
        except OSError as err:
            raise OutputError(f"{k.label} {out}: cannot write there ({err.strerror or err}); mount a writable "
                              "volume (an emptyDir) there") from None
    return out


def _render(args: argparse.Namespace) -> int:
    from agent.runtime.output import write_generation

    options = options_from_args(args)
    ssh = ssh_settings(args)
    out = _out_dir(args)
    rendered = render_pod(read_pods(args.pods), _self_name(args), options, files_dir=str(out.absolute()),
                          nodes=read_nodes_file(args.nodes))
    names = write_generation(out, rendered, options, ssh)
    me = rendered.plan.topology.me
    print(f"wrote {', '.join(names)} to {out} for pod '{me.name}' (role {me.role})")
    return 0


def format_explanation(rendered: Rendered) -> str:
    plan = rendered.plan
    topo = plan.topology
    me = topo.me
    lines = [
        f"pod '{me.name}' of {plan.controller.title} '{topo.job}' in namespace '{topo.namespace}': role "
        f"'{me.role}' ({'training' if me.training else 'not training'}), address {me.address}",
        "",
        "variables (torch.env):",
    ]
    width = min(48, max((len(f"{v.name}={v.value}") for v in rendered.variables), default=0))
    for var in rendered.variables:
        text = f"unset {var.name}" if var.unset else f"{var.name}={var.value}"
        mark = "  " if var.written else "- "
        lines.append(f"  {mark}{text.ljust(width)}  # {var.source}")
    warnings = warnings_for(plan, rendered.variables)
    if warnings:
        lines += ["", "warnings:", *[f"  {w}" for w in warnings]]
    notes = explain_exclusions(plan)
    if notes:
        lines += ["", "notes:", *[f"  {n}" for n in notes]]
    order = f" ({topo.rank_order} order)" if topo.levels else ""
    lines += ["", f"members in rank order{order}:"]
    where = "  NODE: DOMAINS" if topo.levels else ""
    lines.append(f"  {'NODE_RANK':>9}  {'RANK':>5}  {'SLOTS':>5}  {'ROLE':<12} {'POD':<32} {'ADDRESS':<16}{where}")
    for m in topo.members:
        node_rank = "-" if m.node_rank is None else str(m.node_rank)
        rank = "-" if m.first_rank is None else str(m.first_rank)
        place = ""
        if topo.levels:
            domains = "unknown" if m.domains is None else ",".join(
                f"{level.name.lower()}={value}" for level, value in zip(topo.levels, m.domains, strict=True) if value)
            place = f"  {m.node or '-'}: {domains}"
        lines.append(f"  {node_rank:>9}  {rank:>5}  {m.slots:>5}  {m.role:<12} {m.name:<32} {m.address:<16}{place}")
    lines += ["", f"files: {', '.join(rendered.files)}", "('- ' marks a variable that is not written)"]
    return "\n".join(lines)


def _explain(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    ssh_settings(args)
    rendered = render_pod(read_pods(args.pods), _self_name(args), options, nodes=read_nodes_file(args.nodes))
    print(format_explanation(rendered))
    return 0


def _log_format(args: argparse.Namespace) -> str:
    return _choice_knob(Knob(knob(args, "log-format").value or "text", knob(args, "log-format").label),
                        ("text", "json"))


def _kubeconfig(args: argparse.Namespace) -> str | None:
    k = knob(args, "kubeconfig")
    if k.value is not None and not Path(k.value).expanduser().is_file():
        raise InputError(f"{k.label} {k.value}: file not found; give the path of a kubeconfig file")
    return k.value


def _init(args: argparse.Namespace) -> int:
    from agent.k8s.client import Client
    from agent.runtime.init import InitSettings, run_init

    start = _pod_start(args, _init_values)
    v, options, ssh, out_dir, config = start.values, start.options, start.ssh, start.out_dir, start.config
    namespace, pod_name = start.namespace, start.pod_name
    settings = InitSettings(
        namespace=namespace, pod_name=pod_name, options=options, out_dir=out_dir, expect=v.expect,
        timeout=float(v.timeout if v.timeout is not None else 600), wait_dns=v.wait_dns, source=v.source,
        watch_idle=v.watch_idle,
    )
    api = Client(config, user_agent=f"topology-agent/{__version__} init ({namespace}/{pod_name})")
    try:
        _kept.append(run_init(api, settings, ssh=ssh))
    finally:
        api.close()  # its connections; the rest of what it held is kept (console)
    return 0


@dataclass(frozen=True)
class PodStart:
    """What init and the sidecar know before their first request."""

    options: Options
    values: argparse.Namespace  # the command's own flags, checked
    ssh: Any
    out_dir: Path
    config: Any
    namespace: str
    pod_name: str


def _pod_start(args: argparse.Namespace, own: Any) -> PodStart:
    """Every option checked first (a bad value is one line, before anything runs or is written), then logging,
    the API's configuration and the pod's identity: the start of init and of the sidecar alike."""
    from agent.k8s.config import load_config
    from agent.runtime.logs import setup_logging

    log_format = _log_format(args)
    options = options_from_args(args)
    values = own(args)
    ssh = ssh_settings(args)
    kubeconfig = _kubeconfig(args)
    out_dir = _out_dir(args, check=True)
    setup_logging(log_format)
    config = load_config(kubeconfig)
    namespace, pod_name = _pod_identity(config)
    return PodStart(options, values, ssh, out_dir, config, namespace, pod_name)


def _init_values(args: argparse.Namespace) -> argparse.Namespace:
    """init's own flags, checked (inject and the webhook check every command line they write with it)."""
    timeout = _int_knob(knob(args, "timeout"), high=86_400)
    expect = _int_knob(knob(args, "expect"), high=1_000_000)
    source = _choice_knob(Knob(knob(args, "source").value or "auto", knob(args, "source").label),
                          ("auto", "pods", "published"))
    wait_dns = args.wait_dns if args.wait_dns is not None else (_env("wait-dns") or "").lower() in ("1", "true")
    return argparse.Namespace(timeout=timeout, expect=expect, source=source, wait_dns=wait_dns,
                              watch_idle=_watch_idle(args))


def _watch_idle(args: argparse.Namespace) -> float | None:
    k = knob(args, "watch-idle")
    if k.value is None:
        return None
    idle = _float(k.label, k.value, 60.0, high=3600)
    if idle < 1:
        raise InputError(f"{k.label} '{k.value}' must be a number of seconds from 1 to 3600")
    return idle


def _pod_identity(config: Any) -> tuple[str, str]:
    from agent.k8s.config import serviceaccount_dir

    pod_name = os.environ.get("POD_NAME") or socket.gethostname()
    namespace = os.environ.get("POD_NAMESPACE")
    if not namespace:
        ns_file = serviceaccount_dir() / "namespace"
        namespace = ns_file.read_text().strip() if ns_file.is_file() else (config.namespace or "default")
    return namespace, pod_name


def _sidecar(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from agent.k8s.async_client import AsyncClient
    from agent.k8s.reflector import Settings as ReflectorSettings
    from agent.runtime.sidecar import SidecarSettings, run_sidecar
    from agent.runtime.signalling import TrainerFinder

    start = _pod_start(args, _sidecar_values)
    v, options, ssh, out_dir, config = start.values, start.options, start.ssh, start.out_dir, start.config
    namespace, pod_name = start.namespace, start.pod_name
    settings = SidecarSettings(
        namespace=namespace, pod_name=pod_name, options=options, out_dir=out_dir, debounce=v.debounce,
        signal=v.signal, finder=TrainerFinder(pid_file=Path(v.pid_file) if v.pid_file else None, match=v.match),
        stuck_after=v.stuck_after, lease_seconds=int(v.lease_seconds), ssh=ssh,
        reflecting=ReflectorSettings.with_idle(v.idle) if v.idle is not None else ReflectorSettings(),
        probe_every=v.probe,
    )
    port, health_host = v.port, v.health_host

    async def main_async() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        user_agent = f"topology-agent/{__version__} sidecar ({namespace}/{pod_name})"
        async with AsyncClient(config, user_agent=user_agent) as api:
            await run_sidecar(api, settings, stop=stop, health_port=port or None, health_host=health_host,
                              health_label=f"{knob(args, 'health-port').label} {port} on {health_host}",
                              health_topology=v.health_topology)

    asyncio.run(main_async())
    return 0


def _sidecar_values(args: argparse.Namespace) -> argparse.Namespace:
    """The sidecar's own flags, checked (inject and the webhook check every command line they write with it)."""
    from agent.runtime.signalling import parse_signal

    match_k = knob(args, "trainer-match")
    try:
        match = re.compile(match_k.value) if match_k.value else None
    except re.error as err:
        raise InputError(f"{match_k.label} '{match_k.value}' is not a regular expression ({err})") from None
    pid_k = knob(args, "trainer-pid-file")
    pid_file = pid_k.value
    if pid_file is not None and Path(pid_file).is_dir():
        raise InputError(f"{pid_k.label} {pid_file} is a directory; give the file the trainer writes its pid to")
    debounce_k, stuck_k, signal_k = knob(args, "debounce"), knob(args, "stuck-after"), knob(args, "signal")
    debounce = _float(debounce_k.label, debounce_k.value, 1.0, high=3600)
    stuck_after = _float(stuck_k.label, stuck_k.value, 600.0)
    lease_k = knob(args, "lease-seconds")
    lease_seconds = _float(lease_k.label, lease_k.value, 15.0, high=3600)
    if lease_seconds < 2 or lease_seconds != int(lease_seconds):
        raise InputError(f"{lease_k.label} '{lease_k.value}' must be a whole number of seconds from 2 to 3600 "
                         "(a Lease counts whole seconds)")
    # No signal unless a trainer is named: a signal nobody asked for kills torchrun and DeepSpeed's launcher.
    trainer_signal = parse_signal(signal_k.value or ("SIGUSR1" if pid_file or match else "none"),
                                  label=signal_k.label)
    if trainer_signal is not None and not (pid_file or match):
        raise InputError(f"{signal_k.label} {signal_k.value} names a signal but no process to send it to; add "
                         f"{pid_k.label} FILE or {match_k.label} REGEX, or drop {signal_k.label}")
    port = _int_knob(knob(args, "health-port"), low=0)
    port = 8090 if port is None else port
    host_k = knob(args, "health-host", "0.0.0.0")
    health_host = _address_knob(host_k)
    idle = _watch_idle(args)
    probe_k = knob(args, "probe-every")
    probe = _float(probe_k.label, probe_k.value, 300.0, high=86_400) if probe_k.value is not None else None
    if probe is not None and probe < 1:
        raise InputError(f"{probe_k.label} '{probe_k.value}' must be a number of seconds from 1 to 86400")
    health_topology = args.health_topology if args.health_topology is not None else \
        (_env("health-topology") or "").lower() in ("1", "true")
    return argparse.Namespace(health_topology=health_topology, match=match, pid_file=pid_file, debounce=debounce,
                              stuck_after=stuck_after,
                              lease_seconds=lease_seconds, signal=trainer_signal, port=port,
                              health_host=health_host, idle=idle, probe=probe)


def _address_knob(k: Knob) -> str:
    """An IP address to bind: a host name here would bind whatever it resolves to today."""
    import ipaddress

    try:
        return str(ipaddress.ip_address(k.value or ""))
    except ValueError:
        raise InputError(f"{k.label} '{k.value}' is not an IP address; use e.g. 0.0.0.0, 127.0.0.1 or ::") from None


def _sandbox(args: argparse.Namespace) -> int:
    import asyncio

    from agent.sandbox.server import Sandbox, serve

    port = _int("--port", args.port, low=0)
    interval = _float("--bookmark-interval", args.bookmark_interval, 1.0, high=3600)
    if interval == 0:
        raise InputError(f"--bookmark-interval '{args.bookmark_interval}' must be more than 0 seconds")
    try:
        state = Path(args.state_dir) if args.state_dir else Path(tempfile.mkdtemp(prefix="topology-sandbox-"))
        state.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"--state-dir {args.state_dir}: cannot create it ({err.strerror or err}); "
                          "give a writable directory") from None

    def ready(sandbox: Sandbox) -> None:
        print(f"sandbox API server at {sandbox.url}", flush=True)
        print(f"export KUBECONFIG={sandbox.kubeconfig}", flush=True)

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(state, port=port or 0, ready=ready, bookmark_interval=interval,
                              services=_services(args.service)))
    except OSError as err:
        raise InputError(f"--port {port}: cannot listen on 127.0.0.1 ({err.strerror or err}); choose another "
                         "port, or 0 for any free one") from None
    return 0


def _services(items: list[str]) -> dict[str, str]:
    services = {}
    for item in items:
        name, sep, address = item.partition("=")
        host, colon, port = address.rpartition(":")
        namespace, slash, service = name.partition("/")
        if not (sep and slash and colon and is_dns1123_label(namespace) and is_dns1123_label(service)
                and _is_ip(host.strip("[]")) and port.isdigit() and 0 < int(port) < 65536):
            raise InputError(f"--service {item!r}: give NAMESPACE/NAME=IP:PORT, e.g. "
                             "--service topology-agent-system/topology-agent-webhook=127.0.0.1:8443")
        services[name] = address
    return services


def _keygen(args: argparse.Namespace) -> int:
    import yaml

    from agent.ssh.material import generate_secret_manifest

    # The Secret is named <job>-ssh (an object name) and labelled with the job (a label value), in a namespace.
    for option, value, ok in (("--job", args.job, is_dns1123_subdomain(f"{args.job}-ssh") and is_label_value(args.job)),
                              ("--namespace", args.namespace, is_dns1123_label(args.namespace))):
        if not ok:
            raise InputError(f"{option} '{value}' is not a valid Kubernetes name: lower-case letters, digits and "
                             "'-' (and '.' in a job name), starting and ending with a letter or digit, at most 63 "
                             "characters")
    kubeconfig = _kubeconfig(args) if args.apply else None
    manifest = generate_secret_manifest(args.job, args.namespace)
    if not args.apply:
        print(manifest, end="")
        return 0
    from agent.k8s.client import Client
    from agent.k8s.config import load_config

    api = Client(load_config(kubeconfig))
    try:
        created = api.create(f"/api/v1/namespaces/{args.namespace}/secrets", yaml.safe_load(manifest))
    except ApiConflict as err:
        raise ApiConflict(f"secrets '{args.job}-ssh' already exists in namespace '{args.namespace}'; delete it "
                          "first to rotate keys", status=409) from err
    print(f"secret/{created['metadata']['name']} created in namespace {args.namespace}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from agent.runtime.demo import run_demo

    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".topology-agent-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise OutputError(f"--out {out}: cannot write there ({err.strerror or err}); give a writable directory, "
                          "e.g. --out ./demo-out") from None
    return run_demo(out)


def check_agent_args(argv: list[str], where: str) -> None:
    """An injected command line must parse and give valid options, or nothing is written (agent/cli.py's own
    parser decides, so inject and the agent cannot disagree). The environment's TOPOLOGY_* play no part."""
    try:
        args = build_parser().parse_args(argv)
    except UsageError as err:
        raise InputError(f"{where}: {err}; fix the topology-agent.io/ annotation that gave it") from None
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("TOPOLOGY_")}
    try:
        options_from_args(args)
        if args.command == "init":
            _init_values(args)
        elif args.command == "sidecar":
            _sidecar_values(args)
        _ssh_values(args)
    except InputError as err:
        raise InputError(f"{where}: {err} (from a topology-agent.io/ annotation or --set)") from None
    finally:
        os.environ.update(saved)


def _inject(args: argparse.Namespace) -> int:
    from agent.core.injection import PREFIX, Settings
    from agent.runtime.adoption import inject_text

    defaults = {}
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--set {item!r}: give KEY=VALUE, e.g. --set elastic=2:4")
        defaults[PREFIX + key.strip()] = value
    settings = Settings().over(defaults, "--set")
    outputs = []
    for name in args.filename or ["-"]:
        # Bytes, decoded without newline translation: inject writes CRLF back where it read CRLF.
        try:
            if name == "-":
                stdin = getattr(sys.stdin, "buffer", None)
                text = stdin.read().decode("utf-8") if stdin is not None else sys.stdin.read()
            else:
                text = Path(name).read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise InputError(f"-f {name}: cannot read it ({getattr(err, 'strerror', None) or err})") from None
        out, changed = inject_text(text, settings, version=__version__, check=check_agent_args)
        outputs.append(out)
        print(f"topology-agent inject: {name}: added the agent to {len(changed)} pod template(s)"
              + (f": {'; '.join(changed)}" if changed else ""), file=sys.stderr)
    sys.stdout.write("".join((("---\r\n" if out.endswith("\r\n") else "---\n") if i else "") + out
                             for i, out in enumerate(outputs)))
    return 0


def _webhook(args: argparse.Namespace) -> int:
    if args.reviewer:  # the process webhook.py starts for large reviews: it loads only the decision's modules
        from agent.runtime.reviewing import serve

        serve(sys.stdin.buffer, sys.stdout.buffer, version=__version__, check=check_agent_args)
        return 0
    import asyncio
    import signal

    from agent.k8s.async_client import AsyncClient
    from agent.k8s.config import load_config
    from agent.runtime.certs import service_hosts
    from agent.runtime.logs import setup_logging
    from agent.runtime.webhook import WebhookSettings, run_webhook

    log_format = _log_format(args)
    port = _int("--port", args.port, low=1) or 8443
    host = _address_knob(Knob(args.host, "--host"))
    check_every = _float("--check-every", args.check_every, 3600.0, high=86_400 * 30)
    if check_every < 1:
        raise InputError(f"--check-every '{args.check_every}' must be a number of seconds from 1 to 2592000")
    namespace = args.namespace or os.environ.get("POD_NAMESPACE") or "topology-agent-system"
    for option, value in (("--namespace", namespace), ("--service", args.service)):
        if not is_dns1123_label(value):
            raise InputError(f"{option} '{value}' is not a valid Kubernetes name (a DNS-1123 label)")
    for option, value in (("--secret", args.secret), ("--config", args.config)):
        if not is_dns1123_subdomain(value):
            raise InputError(f"{option} '{value}' is not a valid Kubernetes object name")
    for value in args.cert_host:
        if not (is_dns1123_subdomain(value) or _is_ip(value)):
            raise InputError(f"--cert-host '{value}' is neither a DNS name nor an IP address")
    tls_dir = Path(args.tls_dir) if args.tls_dir else None
    if tls_dir is not None and not tls_dir.is_dir():
        raise InputError(f"--tls-dir {tls_dir}: not a directory; mount the certificate's Secret there")
    kubeconfig = _kubeconfig(args)
    setup_logging(log_format)
    config = load_config(kubeconfig)
    settings = WebhookSettings(host=host, port=port, namespace=namespace, service=args.service,
                               secret=args.secret, config=args.config, tls_dir=tls_dir, check_every=check_every,
                               hosts=(*service_hosts(args.service, namespace), *args.cert_host))

    async def main_async() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        # Namespace GETs: as many connections as reviews can be open, each answered or given up in 5 s, so a hung
        # read never holds a slot a healthy namespace's review needs.
        async with AsyncClient(config, user_agent=f"topology-agent/{__version__} webhook", timeout=5.0,
                               connections=settings.limits.connections) as api:
            await run_webhook(api, settings, version=__version__, check=check_agent_args, stop=stop)

    asyncio.run(main_async())
    return 0


def _is_ip(value: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


COMMANDS = {"render": _render, "explain": _explain, "init": _init, "sidecar": _sidecar, "sandbox": _sandbox,
            "demo": _demo, "keygen": _keygen, "inject": _inject, "webhook": _webhook}


BUG_EXIT = 70  # EX_SOFTWARE
ONE_SHOT = ("render", "explain", "init")
_ran: list[str] = []  # the command main() ran, for console()
_kept: list[object] = []  # what the last one-shot command held: console() ends the process without freeing it


def main(argv: Sequence[str] | None = None, *, ending: bool = False) -> int:
    """Run one command. ``ending``: the process ends right after (console), so a one-shot command's heap is never
    collected; otherwise (a caller that goes on, such as a test) the cyclic collector is running again on return."""
    try:
        args = build_parser().parse_args(argv)
    except UsageError as err:
        print(str(err), file=sys.stderr)
        return 2
    _ran.append(args.command)
    _kept.clear()  # a caller that runs main() again (tests) frees the last command's objects here
    collecting = gc.isenabled()
    if args.command in ONE_SHOT:
        # One-shot processes that parse up to millions of small objects and create no garbage cycles worth
        # collecting: the cyclic collector's passes over them made parsing super-linear (16384 pods: 3.0 s,
        # 1.5 s without; init at 4096: 0.45 of 1.6 s). Memory is returned when the process ends.
        gc.disable()
    try:
        return COMMANDS[args.command](args)
    except AgentError as err:
        print(f"topology-agent {args.command}: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        # A bug, not bad input: still one line, so a log shows what broke; the traceback on request.
        if os.environ.get("TOPOLOGY_DEBUG"):
            raise
        first = (str(err).splitlines() or [""])[0][:200]
        print(f"topology-agent {args.command}: internal error: {type(err).__name__}: {first} (a bug in the agent; "
              "run again with TOPOLOGY_DEBUG=1 for the traceback and report it)", file=sys.stderr)
        return BUG_EXIT
    finally:
        if collecting and not ending:
            gc.enable()


def console() -> NoReturn:
    """The ``topology-agent`` command. A one-shot command ends without tearing down its heap: freeing a
    4096-pod job's objects one by one took 0.25 s after the files were in place, on every pod's start-up path
    (the files are renamed into place and the logs flushed first; nothing is left to clean up)."""
    code = main(ending=True)
    if _ran and _ran[-1] in ONE_SHOT:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    console()
