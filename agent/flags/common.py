"""The knobs every command reads, the checks of their values, and the topology options (``options_from_args``).

Every option can also come from an environment variable ``TOPOLOGY_<NAME>`` (``--master-port`` ->
``TOPOLOGY_MASTER_PORT``), so a manifest can configure the agent without touching its command line; a message
names the knob the user actually turned. Values are checked here, so the core sees only good ones.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeVar

from agent.core.controllers import CONTROLLERS, parse_selector
from agent.core.escaping import shown
from agent.core.files.frameworks import FRAMEWORKS, PORTED
from agent.core.model import (
    ADDRESS_MODES,
    STATE_DIR,
    AddressMode,
    ControllerChoice,
    FrameworkOptions,
    Options,
    Ports,
    Processes,
    is_whole_number,
    parse_owner,
)
from agent.core.plan.grouping import parse_rule
from agent.core.pods.placement import DEFAULT_LEVELS, RANK_ORDERS, parse_levels
from agent.core.pods.validation import DNS_NAME, is_dns1123_label
from agent.errors import InputError

if TYPE_CHECKING:
    from agent.core.adoption.injection import Settings
    from agent.ssh.files import SshSettings

DEFAULT_OUT = "/shared"
VIEWS: tuple[Literal["auto", "full", "own"], ...] = ("auto", "full", "own")  # --view
Allowed = TypeVar("Allowed", bound=str)


class FrameworkPort(argparse.Action):
    """``--<framework>-port``. Its help is the framework's own words, read when help is shown: the parser is built
    at every start, and a framework's module is imported only when it is first used (core/frameworks)."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, framework: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.framework = framework

    @property
    def help(self) -> str:
        framework = FRAMEWORKS[self.framework]
        return f"{framework.title}: {framework.port_meaning} (default: the controller's, else {framework.default_port})"

    @help.setter
    def help(self, _given: str | None) -> None:
        """argparse's ``Action`` sets a help; this one's is the property's."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)


def env_name(name: str) -> str:
    return f"TOPOLOGY_{name.upper().replace('-', '_')}"


def env(name: str) -> str | None:
    value = os.environ.get(env_name(name))
    return value if value not in (None, "") else None


def env_flag(args: argparse.Namespace, name: str) -> bool:
    """A flag without a value (``--wait-dns``), else ``TOPOLOGY_<NAME>`` set to 1 or true."""
    given = getattr(args, name.replace("-", "_"))
    return bool(given) if given is not None else (env(name) or "").lower() in ("1", "true")


class Knob(NamedTuple):
    """One option's value and the name the user gave it by (``--master-port`` or ``TOPOLOGY_MASTER_PORT``), so
    a message names the knob the user actually turned."""

    value: str | None
    label: str


def knob(args: argparse.Namespace, name: str, default: str | None = None) -> Knob:
    """The flag if given, else ``TOPOLOGY_<NAME>``, else ``default`` (labelled with the flag)."""
    value = getattr(args, name.replace("-", "_"), None)
    if value is not None:
        return Knob(str(value), f"--{name}")
    from_env = env(name)
    if from_env is not None:
        return Knob(from_env, env_name(name))
    return Knob(default, f"--{name}")


def whole(option: str, raw: str | None, *, low: int = 1, high: int = 65535) -> int | None:
    if raw is None:
        return None
    # Length first: int() of thousands of digits is refused by Python (and slow before that).
    if not is_whole_number(raw) or len(raw.strip()) > len(str(high)) or not low <= int(raw) <= high:
        raise InputError(f"{option} '{shown(raw, 37)}' must be a whole number from {low} to {high}")
    return int(raw)


def whole_knob(k: Knob, *, low: int = 1, high: int = 65535) -> int | None:
    return whole(k.label, k.value, low=low, high=high)


def choice(option: str, raw: str, allowed: Sequence[Allowed]) -> Allowed:
    """``raw`` as the one of ``allowed`` it spells (typed as they are: a Literal's values give that Literal)."""
    for value in allowed:
        if value == raw:
            return value
    raise InputError(f"{option} '{shown(raw)}' must be one of: {', '.join(allowed)}")


def choice_knob(k: Knob, allowed: Sequence[Allowed]) -> Allowed:
    """The knob's value among ``allowed``; the first when it is not given."""
    return choice(k.label, k.value or allowed[0], allowed)


def seconds(option: str, raw: str | None, default: float, *, high: float = 86_400.0) -> float:
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


def at_least_one_second(k: Knob, default: float, *, high: float) -> float | None:
    """Seconds from 1 to ``high`` (a watch or a probe more often than each second is a mistake), or None."""
    if k.value is None:
        return None
    value = seconds(k.label, k.value, default, high=high)
    if value < 1:
        raise InputError(f"{k.label} '{k.value}' must be a number of seconds from 1 to {high:.0f}")
    return value


def ip_address(k: Knob) -> str:
    """An IP address to bind: a host name here would bind whatever it resolves to today."""
    import ipaddress

    try:
        return str(ipaddress.ip_address(k.value or ""))
    except ValueError:
        raise InputError(f"{k.label} '{k.value}' is not an IP address; use e.g. 0.0.0.0, 127.0.0.1 or ::") from None


def is_ip(value: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def log_format(args: argparse.Namespace) -> str:
    k = knob(args, "log-format")
    return choice_knob(Knob(k.value or "text", k.label), ("text", "json"))


def kubeconfig(args: argparse.Namespace) -> str | None:
    k = knob(args, "kubeconfig")
    if k.value is not None and not Path(k.value).expanduser().is_file():
        raise InputError(f"{k.label} {k.value}: file not found; give the path of a kubeconfig file")
    return k.value


# --- the topology options: render, explain, init and the sidecar -------------------------------------------

def add_topology_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("topology options (each also read from TOPOLOGY_<NAME>)")
    group.add_argument("--roles", help="training roles in rank order, comma-separated (default: the controller's)")
    group.add_argument("--master-port", help="MASTER_PORT (default: port 'pytorchjob-port', else 29500)")
    group.add_argument("--nproc-per-node", help="processes per pod: an integer or 'auto' (default auto)")
    group.add_argument("--container", help="the trainer container (default: first container that is not the agent)")
    group.add_argument("--address", help="how peers are named in files: dns (default) or ip")
    group.add_argument("--cluster-domain", help="write fully qualified names under this domain, e.g. cluster.local")
    group.add_argument("--elastic", help="MIN:MAX nodes: torchrun elastic rendezvous (c10d)")
    group.add_argument("--rdzv-port", help="c10d rendezvous port (default 29400)")
    group.add_argument("--controller", help=f"force a controller: {', '.join(CONTROLLERS)}")
    group.add_argument("--selector", help="generic: equality label selector of the job's pods, e.g. app=x,job=y")
    group.add_argument("--index-label", help="generic: the label that holds each pod's index")
    group.add_argument("--rank-order", help="index (default: the controller's order) or topology (pods of each "
                                            "network domain contiguous, rank 0 kept; reads Node labels)")
    group.add_argument("--world-size", help="training pods in the world of a static job: the training pods past it "
                       "in rank order are hot spares, each taking a member's place when it leaves (docs/topology.md)")
    group.add_argument("--view", help="what a pod of a large job reads: auto (default: every member for a pod whose "
                       "files name every member, a launcher's hostfile, TF_CONFIG; the published summary for the "
                       "others), full (every member, every pod) or own (the summary: rank 0, the job's size and its "
                       "own ranks; torch.env without the long host lists, no hostfile; docs/sidecar.md)")
    group.add_argument("--topology-levels", help="Node label keys outermost first, comma-separated, or 'default' "
                                                 "(zone, region, GKE, EKS, NVLink clique): TOPOLOGY_<LEVEL> vars")
    group.add_argument("--frameworks", help="files for these frameworks too, comma-separated: "
                       f"{', '.join(FRAMEWORKS)} (added to what the job implies; torch.env is always written; "
                       "docs/frameworks.md)")
    group.add_argument("--replica-groups", help="one world per replica group (torchft, HSDP, multi-slice): "
                       "jobset-job, volcano-partition or label:KEY; pods of role lighthouse are torchft's "
                       "lighthouse (docs/topology.md)")
    for key in PORTED:
        group.add_argument(f"--{key}-port", action=FrameworkPort, framework=key)
    ssh = parser.add_argument_group("SSH for DeepSpeed/MPI (written when the job's Secret is mounted)")
    ssh.add_argument("--ssh-secret-dir", help="the mounted Secret from 'topology-agent keygen', e.g. /etc/topology/ssh")
    ssh.add_argument("--ssh-port", help="port the trainers' sshd listens on (default 2222: non-root)")
    ssh.add_argument("--ssh-owner", help="UID:GID that owns the SSH files (the trainer's user; sshd checks it)")


def options_from_args(args: argparse.Namespace) -> Options:
    """Flags first, then ``TOPOLOGY_*`` variables; values are checked here so the core sees only good ones."""
    roles_k, nproc_k, elastic_k = knob(args, "roles"), knob(args, "nproc-per-node"), knob(args, "elastic")
    roles, nproc, elastic = _roles(roles_k), _nproc(nproc_k), _elastic(elastic_k)
    controller_k, selector_k, index_k = knob(args, "controller"), knob(args, "selector"), knob(args, "index-label")
    _check_selection(controller_k, selector_k, index_k)
    address_k, domain_k = knob(args, "address"), knob(args, "cluster-domain")
    address = _address(address_k, domain_k)
    order_k = knob(args, "rank-order")
    rank_order = choice_knob(Knob(order_k.value or "index", order_k.label), RANK_ORDERS)
    levels_k = knob(args, "topology-levels")
    levels = parse_levels(levels_k.value, option=levels_k.label) if levels_k.value is not None else None
    if levels is None and (rank_order == "topology" or getattr(args, "nodes", None)):
        levels = DEFAULT_LEVELS
    world_k = knob(args, "world-size")
    world_size = whole_knob(world_k, high=1_000_000)
    if world_size is not None and (elastic is not None or rank_order == "topology"):
        other = elastic_k.label if elastic is not None else order_k.label
        raise InputError(f"{world_k.label} keeps a static world whose seats follow the index order; {other} "
                         "contradicts it; drop one of them")
    view_k = knob(args, "view")
    view = choice_knob(Knob(view_k.value or "auto", view_k.label), VIEWS)

    frameworks_k = knob(args, "frameworks")
    port_ks = {key: knob(args, f"{key}-port") for key in PORTED}
    frameworks = FrameworkOptions(names=_frameworks(frameworks_k),
                                  ports=tuple((key, port) for key, k in port_ks.items()
                                              if (port := whole_knob(k)) is not None))
    groups_k = knob(args, "replica-groups")
    if groups_k.value is not None:
        parse_rule(groups_k.value, label=groups_k.label)
        if view == "own":
            raise InputError(f"{groups_k.label} reads every member's labels, so it cannot go with {view_k.label} own; "
                             "use --view auto or full")
    given = (roles_k, nproc_k, elastic_k, controller_k, selector_k, index_k, address_k, domain_k, view_k,
             frameworks_k, groups_k, world_k, *port_ks.values())
    return Options(
        labels=tuple((k.label.removeprefix("TOPOLOGY_").lower(), k.label) for k in given
                     if k.label.startswith("TOPOLOGY_")),
        roles=roles,
        ports=Ports(master=whole_knob(knob(args, "master-port")), rdzv=whole_knob(knob(args, "rdzv-port"))),
        processes=Processes(per_node=nproc, container=_container(knob(args, "container"))),
        address=address,
        cluster_domain=domain_k.value,
        elastic=elastic,
        choice=ControllerChoice(controller_k.value, selector_k.value, index_k.value),
        levels=levels,
        rank_order=rank_order,
        view=view,
        frameworks=frameworks,
        replica_groups=groups_k.value.strip() if groups_k.value is not None else None,
        world_size=world_size,
    )


def _frameworks(k: Knob) -> tuple[str, ...]:
    """The frameworks named, in registry order; ``torch`` (always written) is allowed and adds nothing."""
    names = {n.strip() for n in (k.value or "").split(",") if n.strip()}
    unknown = sorted(names - set(FRAMEWORKS) - {"torch"})
    if unknown:
        raise InputError(f"{k.label} names {', '.join(repr(n) for n in unknown)}, which the agent does not know; use "
                         f"some of: torch, {', '.join(FRAMEWORKS)}")
    return tuple(key for key in FRAMEWORKS if key in names)


def _roles(k: Knob) -> tuple[str, ...] | None:
    if k.value is None:
        return None
    roles = tuple(r.strip() for r in k.value.split(",") if r.strip())
    if not roles:
        raise InputError(f"{k.label} is empty; give the training roles in rank order, e.g. master,worker")
    return roles


def _nproc(k: Knob) -> int | Literal["auto"] | None:
    if k.value is None:
        return None
    return "auto" if k.value == "auto" else whole(k.label, k.value, high=1_000_000)


def _elastic(k: Knob) -> tuple[int, int] | None:
    if k.value is None:
        return None
    low, sep, high = k.value.partition(":")
    ok = sep and is_whole_number(low) and is_whole_number(high) and len(low.strip()) <= 7 \
        and len(high.strip()) <= 7 and 1 <= int(low) <= int(high)
    if not ok:
        raise InputError(f"{k.label} '{k.value}' must be MIN:MAX with 1 <= MIN <= MAX, e.g. 2:8")
    return int(low), int(high)


def _check_selection(controller_k: Knob, selector_k: Knob, index_k: Knob) -> None:
    """A forced controller is a known one; a selector comes with its index label and no other controller."""
    if controller_k.value is not None and controller_k.value not in CONTROLLERS:
        known = ", ".join(CONTROLLERS)
        raise InputError(f"{controller_k.label} '{controller_k.value}' is unknown; use one of: {known}")
    if index_k.value and not selector_k.value:
        raise InputError(f"{index_k.label} needs --selector (the labels that pick the job's pods)")
    if selector_k.value and controller_k.value not in (None, "selector"):
        raise InputError(f"{selector_k.label} and {controller_k.label} {controller_k.value} contradict: the selector "
                         f"picks pods by your labels, the controller by its own; give one of them")
    if selector_k.value:
        parse_selector(selector_k.value, label=selector_k.label)
        if not index_k.value:
            raise InputError(f"{selector_k.label} needs --index-label KEY (the label holding each pod's index)")


def _address(address_k: Knob, domain_k: Knob) -> AddressMode:
    address = choice_knob(Knob(address_k.value or "dns", address_k.label), ADDRESS_MODES)
    if domain_k.value is not None:
        if not DNS_NAME.fullmatch(domain_k.value.strip(".")):
            raise InputError(f"{domain_k.label} '{domain_k.value}' is not a DNS domain; use e.g. cluster.local")
        if address == "ip":
            raise InputError(f"{domain_k.label} and {address_k.label} ip contradict: domain names are not written "
                             "when peers are named by IP; drop one of them")
    return address


def _container(k: Knob) -> str | None:
    if k.value is not None and not is_dns1123_label(k.value):
        raise InputError(f"{k.label} '{k.value}' is not a container name (lower-case letters, digits and '-'); "
                         "give the name of the trainer container")
    return k.value


# --- SSH: render, explain, init and the sidecar ---------------------------------------------------------------

def ssh_settings(args: argparse.Namespace) -> SshSettings | None:
    """``SshSettings`` when --ssh-secret-dir (or TOPOLOGY_SSH_SECRET_DIR) is given, else None. The SSH options
    are checked either way: a bad value is a mistake even where it is not used yet."""
    port, owner = ssh_values(args)
    secret_dir = knob(args, "ssh-secret-dir")
    if not secret_dir.value:
        return None
    if not Path(secret_dir.value).is_dir():
        raise InputError(f"{secret_dir.label} {secret_dir.value}: directory not found; mount the job's SSH Secret "
                         "(topology-agent keygen) there, or drop the option")
    from agent.ssh.files import SshSettings  # not material.py: asyncssh is init's only (0.2 s, 16 MB)

    return SshSettings(secret_dir=Path(secret_dir.value), port=port, owner=owner)


def ssh_values(args: argparse.Namespace) -> tuple[int, tuple[int, int] | None]:
    port = whole_knob(knob(args, "ssh-port")) or 2222
    owner_k = knob(args, "ssh-owner")
    return port, parse_owner(owner_k.value, label=owner_k.label)


def state_dir(args: argparse.Namespace, out: Path) -> Path:
    """The directory only the agent's containers mount. It must not be the output directory nor hold it or lie in
    it: the trainer writes there, and what is kept here decides who the members are."""
    k = knob(args, "state-dir", STATE_DIR)
    state = Path(k.value or STATE_DIR)
    if not state.is_absolute():
        raise InputError(f"{k.label} '{k.value}' is not an absolute path; give the directory where the agent's "
                         f"containers alone mount a volume (default {STATE_DIR})")
    mine, theirs = Path(os.path.normpath(state)), Path(os.path.normpath(out.absolute()))
    if mine == theirs or theirs in mine.parents or mine in theirs.parents:
        raise InputError(f"{k.label} {state} and the output directory {out} overlap, and the trainer writes the "
                         "output directory; give a directory that only the agent's containers mount (default "
                         f"{STATE_DIR})")
    return state


def out_dir(args: argparse.Namespace, *, check: bool = False) -> Path:
    """The output directory; with ``check``, made and proven writable now (init would otherwise find out only
    after waiting for the whole gang)."""
    k = knob(args, "out", DEFAULT_OUT)
    out = Path(k.value or DEFAULT_OUT)
    if check:
        from agent.errors import OutputError

        try:
            out.mkdir(parents=True, exist_ok=True)
            probe = out / f".topology-agent-probe-{os.urandom(8).hex()}"  # a writer's stale temp files' prefix
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
            probe.unlink()
        except OSError as err:
            raise OutputError(f"{k.label} {out}: cannot write there ({err.strerror or err}); mount a writable "
                              "volume (an emptyDir) there") from None
    return out


def add_set_argument(parser: argparse.ArgumentParser) -> None:
    """``--set KEY=VALUE``, the settings inject and the webhook give every job they add the agent to."""
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="a default for every job, as annotation topology-agent.io/KEY would give it (the "
                             "job's own annotations, and the webhook's namespace's, win), e.g. --set "
                             "image=registry.example.com/topology-agent:0.1.0: the agent's image")


def defaults_from(args: argparse.Namespace) -> Settings:
    """The settings ``--set`` gives, each checked as its annotation would be."""
    from agent.core.adoption.injection import PREFIX, Settings

    defaults = {}
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--set {item!r}: give KEY=VALUE, e.g. --set elastic=2:4")
        defaults[PREFIX + key.strip()] = value
    return Settings().over(defaults, "--set")
