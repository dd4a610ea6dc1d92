"""The ``topology-agent`` command line: a thin shell that reads input, calls the core, and writes or prints.

Every option can also come from an environment variable ``TOPOLOGY_<NAME>`` (``--master-port`` ->
``TOPOLOGY_MASTER_PORT``), so a manifest can configure the agent without touching its command line. An
``AgentError`` becomes one line on stderr and its exit code; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent import __version__
from agent.core import Options, Rendered, render_pod
from agent.core.model import RawPod, is_whole_number
from agent.core.variables import explain_exclusions
from agent.errors import AgentError, ApiConflict, InputError

DEFAULT_OUT = "/shared"


def _env(name: str) -> str | None:
    value = os.environ.get(f"TOPOLOGY_{name.upper().replace('-', '_')}")
    return value if value not in (None, "") else None


def _int(option: str, raw: str | None, *, low: int = 1, high: int = 65535) -> int | None:
    if raw is None:
        return None
    if not is_whole_number(raw) or not low <= int(raw) <= high:
        raise InputError(f"{option} '{raw}' must be a whole number from {low} to {high}")
    return int(raw)


def _choice(option: str, raw: str, allowed: Sequence[str]) -> str:
    if raw not in allowed:
        raise InputError(f"{option} '{raw}' must be one of: {', '.join(allowed)}")
    return raw


def options_from_args(args: argparse.Namespace) -> Options:
    """Flags first, then ``TOPOLOGY_*`` variables; values are checked here so the core sees only good ones."""

    def pick(name: str) -> Any:
        value = getattr(args, name.replace("-", "_"), None)
        return value if value is not None else _env(name)

    roles_raw = pick("roles")
    roles = tuple(r.strip() for r in roles_raw.split(",") if r.strip()) if roles_raw else None
    if roles_raw is not None and not roles:
        raise InputError("--roles is empty; give the training roles in rank order, e.g. --roles master,worker")

    nproc_raw = pick("nproc-per-node")
    nproc: int | str | None = None
    if nproc_raw is not None:
        nproc = "auto" if nproc_raw == "auto" else _int("--nproc-per-node", nproc_raw, high=1_000_000)

    elastic_raw = pick("elastic")
    elastic = None
    if elastic_raw is not None:
        low, sep, high = elastic_raw.partition(":")
        lo = _int("--elastic MIN", low.strip() or None, high=1_000_000) if sep else None
        hi = _int("--elastic MAX", high.strip() or None, high=1_000_000) if sep else None
        if lo is None or hi is None or lo > hi:
            raise InputError(f"--elastic '{elastic_raw}' must be MIN:MAX with 1 <= MIN <= MAX, e.g. --elastic 2:8")
        elastic = (lo, hi)

    selector = pick("selector")
    index_label = pick("index-label")
    if index_label and not selector:
        raise InputError("--index-label needs --selector (the labels that pick the job's pods)")

    return Options(
        roles=roles,
        master_port=_int("--master-port", pick("master-port")),
        nproc_per_node=nproc,  # type: ignore[arg-type]
        container=pick("container"),
        address=_choice("--address", pick("address") or "dns", ("dns", "ip")),  # type: ignore[arg-type]
        cluster_domain=pick("cluster-domain"),
        elastic=elastic,
        rdzv_port=_int("--rdzv-port", pick("rdzv-port")) or 29400,
        controller=pick("controller"),
        selector=selector,
        index_label=index_label,
    )


def read_pods(source: str) -> list[RawPod]:
    """``kubectl get pods -o json`` output (a List), a JSON array of pods, or one Pod; ``-`` is stdin."""
    where = "stdin" if source == "-" else source
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
    except OSError as err:
        raise InputError(f"cannot read --pods {where}: {err.strerror or err}") from err
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
        items = [data]
    else:
        raise InputError(f"--pods {where} holds no pods: expected a List with 'items' or a JSON array of Pods")
    for position, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("metadata"), dict) \
                or not item["metadata"].get("name"):
            raise InputError(f"--pods {where}: item {position} is not a Pod (no metadata.name)")
    return items


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
    ssh = parser.add_argument_group("SSH for DeepSpeed/MPI (written when the job's Secret is mounted)")
    ssh.add_argument("--ssh-secret-dir", help="the mounted Secret from 'topology-agent keygen', e.g. /etc/topology/ssh")
    ssh.add_argument("--ssh-port", help="port the trainers' sshd listens on (default 2222: non-root)")
    ssh.add_argument("--ssh-owner", help="UID:GID that owns the SSH files (the trainer's user; sshd checks it)")


def _add_offline(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pods", required=True, help="kubectl get pods -o json output, or '-' for stdin")
    parser.add_argument("--self", help="this pod's name (default: $POD_NAME)")


def _add_in_cluster(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None, help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account, else $KUBECONFIG)")
    parser.add_argument("--log-format", help="text (default) or json")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="topology-agent",
        description="Configure a multi-pod training job from its pods: torch.env, hostfile, host files.",
    )
    parser.add_argument("--version", action="version", version=f"topology-agent {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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
    sidecar.add_argument("--debounce", help="seconds to gather changes before rewriting (default 1, 0 allowed)")
    sidecar.add_argument("--signal", help="signal for the trainer after a rewrite: SIGUSR1 (default), ..., none")
    sidecar.add_argument("--trainer-pid-file", help="file holding the trainer's pid")
    sidecar.add_argument("--trainer-match", help="regular expression over the trainer's command line")
    sidecar.add_argument("--health-port", help="port of /healthz /readyz /metrics /topology (default 8090; 0: off)")
    sidecar.add_argument("--health-host", help="address to bind the health server (default 0.0.0.0)")
    sidecar.add_argument("--stuck-after", help="seconds without watch progress before /healthz fails (default 600)")
    _add_common(sidecar)

    sandbox = commands.add_parser("sandbox", help="run the sandbox API server (for kubectl and the agent, no cluster)")
    sandbox.add_argument("--port", default="0", help="port on 127.0.0.1 (default: any free port)")
    sandbox.add_argument("--state-dir", help="where to write the kubeconfig and TLS files (default: a temp dir)")
    sandbox.add_argument("--bookmark-interval", default="1.0", help="seconds between watch BOOKMARKs")

    keygen = commands.add_parser("keygen", help="print (or --apply) the job's SSH Secret: user key pair and host CA")
    keygen.add_argument("--job", required=True, help="job name; the Secret is <job>-ssh")
    keygen.add_argument("--namespace", default="default", help="namespace of the Secret (default: default)")
    keygen.add_argument("--apply", action="store_true", help="create the Secret through the API instead of printing")
    keygen.add_argument("--kubeconfig", help="kubeconfig file for --apply")

    demo = commands.add_parser("demo", help="show the agent at work on an example Volcano job in the sandbox")
    demo.add_argument("--out", default="demo-out", help="where each pod's files go (default ./demo-out)")
    return parser


def ssh_settings(args: argparse.Namespace) -> Any:
    """``SshSettings`` when --ssh-secret-dir (or TOPOLOGY_SSH_SECRET_DIR) is given, else None."""
    secret_dir = getattr(args, "ssh_secret_dir", None) or _env("ssh-secret-dir")
    if not secret_dir:
        return None
    from agent.ssh.material import SshSettings, parse_owner

    port = _int("--ssh-port", getattr(args, "ssh_port", None) or _env("ssh-port")) or 2222
    owner = parse_owner(getattr(args, "ssh_owner", None) or _env("ssh-owner"))
    return SshSettings(secret_dir=Path(secret_dir), port=port, owner=owner)


def _render(args: argparse.Namespace) -> int:
    from agent.runtime.output import write_generation

    options = options_from_args(args)
    rendered = render_pod(read_pods(args.pods), _self_name(args), options)
    out = Path(args.out or _env("out") or DEFAULT_OUT)
    names = write_generation(out, rendered, options, ssh_settings(args))
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
    notes = explain_exclusions(plan)
    if notes:
        lines += ["", "notes:", *[f"  {n}" for n in notes]]
    lines += ["", "members in rank order:"]
    lines.append(f"  {'NODE_RANK':>9}  {'RANK':>5}  {'SLOTS':>5}  {'ROLE':<12} {'POD':<32} ADDRESS")
    for m in topo.members:
        node_rank = "-" if m.node_rank is None else str(m.node_rank)
        rank = "-" if m.first_rank is None else str(m.first_rank)
        lines.append(f"  {node_rank:>9}  {rank:>5}  {m.slots:>5}  {m.role:<12} {m.name:<32} {m.address}")
    lines += ["", f"files: {', '.join(rendered.files)}", "('- ' marks a variable that is not written)"]
    return "\n".join(lines)


def _explain(args: argparse.Namespace) -> int:
    rendered = render_pod(read_pods(args.pods), _self_name(args), options_from_args(args))
    print(format_explanation(rendered))
    return 0


def _init(args: argparse.Namespace) -> int:
    from agent.k8s.client import ApiClient
    from agent.k8s.config import load_config
    from agent.runtime.init import InitSettings, run_init
    from agent.runtime.logs import setup_logging

    log_format = _choice("--log-format", args.log_format or _env("log-format") or "text", ("text", "json"))
    setup_logging(log_format)
    options = options_from_args(args)
    config = load_config(args.kubeconfig or _env("kubeconfig"))
    namespace, pod_name = _pod_identity(config)
    timeout = _int("--timeout", args.timeout or _env("timeout"), high=86_400)
    wait_dns = args.wait_dns if args.wait_dns is not None else (_env("wait-dns") or "").lower() in ("1", "true")
    settings = InitSettings(
        namespace=namespace, pod_name=pod_name, options=options,
        out_dir=Path(args.out or _env("out") or DEFAULT_OUT),
        expect=_int("--expect", args.expect or _env("expect"), high=1_000_000),
        timeout=float(timeout if timeout is not None else 600), wait_dns=wait_dns,
        source=_choice("--source", args.source or _env("source") or "auto", ("auto", "pods", "published")),
    )
    api = ApiClient(config, user_agent=f"topology-agent/{__version__} init ({namespace}/{pod_name})")
    run_init(api, settings, ssh=ssh_settings(args))
    return 0


def _pod_identity(config: Any) -> tuple[str, str]:
    from agent.k8s.config import serviceaccount_dir

    pod_name = os.environ.get("POD_NAME") or socket.gethostname()
    namespace = os.environ.get("POD_NAMESPACE")
    if not namespace:
        ns_file = serviceaccount_dir() / "namespace"
        namespace = ns_file.read_text().strip() if ns_file.is_file() else (config.namespace or "default")
    return namespace, pod_name


def _float(option: str, raw: str | None, default: float) -> float:
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        raise InputError(f"{option} '{raw}' must be a number of seconds >= 0")
    return value


def _sidecar(args: argparse.Namespace) -> int:
    import asyncio
    import re
    import signal

    from agent.k8s.async_client import AsyncApiClient
    from agent.k8s.config import load_config
    from agent.runtime.logs import setup_logging
    from agent.runtime.sidecar import SidecarSettings, run_sidecar
    from agent.runtime.signalling import TrainerFinder, parse_signal

    setup_logging(_choice("--log-format", args.log_format or _env("log-format") or "text", ("text", "json")))
    options = options_from_args(args)
    config = load_config(args.kubeconfig or _env("kubeconfig"))
    namespace, pod_name = _pod_identity(config)
    pattern = args.trainer_match or _env("trainer-match")
    try:
        match = re.compile(pattern) if pattern else None
    except re.error as err:
        raise InputError(f"--trainer-match '{pattern}' is not a regular expression ({err})") from None
    pid_file = args.trainer_pid_file or _env("trainer-pid-file")
    settings = SidecarSettings(
        namespace=namespace, pod_name=pod_name, options=options,
        out_dir=Path(args.out or _env("out") or DEFAULT_OUT),
        debounce=_float("--debounce", args.debounce or _env("debounce"), 1.0),
        signal=parse_signal(args.signal or _env("signal") or "SIGUSR1"),
        finder=TrainerFinder(pid_file=Path(pid_file) if pid_file else None, match=match),
        stuck_after=_float("--stuck-after", args.stuck_after or _env("stuck-after"), 600.0),
    )
    port = _int("--health-port", args.health_port or _env("health-port"), low=0)
    port = 8090 if port is None else port

    async def main_async() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        user_agent = f"topology-agent/{__version__} sidecar ({namespace}/{pod_name})"
        async with AsyncApiClient(config, user_agent=user_agent) as api:
            await run_sidecar(api, settings, stop=stop, health_port=port or None,
                              health_host=args.health_host or _env("health-host") or "0.0.0.0")

    asyncio.run(main_async())
    return 0


def _sandbox(args: argparse.Namespace) -> int:
    import asyncio
    import tempfile

    from agent.sandbox.server import Sandbox, serve

    state = Path(args.state_dir or tempfile.mkdtemp(prefix="topology-sandbox-"))
    port = _int("--port", args.port, low=0)

    def ready(sandbox: Sandbox) -> None:
        print(f"sandbox API server at {sandbox.url}", flush=True)
        print(f"export KUBECONFIG={sandbox.kubeconfig}", flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(state, port=port or 0, ready=ready, bookmark_interval=float(args.bookmark_interval)))
    return 0


def _keygen(args: argparse.Namespace) -> int:
    import yaml

    from agent.ssh.material import generate_secret_manifest

    manifest = generate_secret_manifest(args.job, args.namespace)
    if not args.apply:
        print(manifest, end="")
        return 0
    from agent.k8s.client import ApiClient
    from agent.k8s.config import load_config

    api = ApiClient(load_config(args.kubeconfig))
    try:
        created = api.create(f"/api/v1/namespaces/{args.namespace}/secrets", yaml.safe_load(manifest))
    except ApiConflict as err:
        raise ApiConflict(f"secrets '{args.job}-ssh' already exists in namespace '{args.namespace}'; delete it "
                          "first to rotate keys", status=409) from err
    print(f"secret/{created['metadata']['name']} created in namespace {args.namespace}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from agent.runtime.demo import run_demo

    return run_demo(Path(args.out))


COMMANDS = {"render": _render, "explain": _explain, "init": _init, "sidecar": _sidecar, "sandbox": _sandbox,
            "demo": _demo, "keygen": _keygen}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except AgentError as err:
        print(f"topology-agent {args.command}: error: {err}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
