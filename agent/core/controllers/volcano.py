"""Volcano Job (batch.volcano.sh): tasks of pods, each pod labelled with its job, task and index. Its job plugins
(``spec.plugins``: a plugin's name -> its arguments) say what runs: the pytorch plugin names the master and worker
tasks and the master port, the mpi plugin a master task that runs mpiexec over the worker task's hosts, the
tensorflow plugin writes TF_CONFIG, the ray plugin starts a Ray head and workers. Each reads its arguments with Go's
flag package, so they are read here by the same grammar (``go_flags``) and the same table of flags (``PLUGINS``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

from agent.core.controllers.base import (
    Controller,
    FrameworkArgs,
    JobResource,
    Objects,
    OwnerOptions,
    PodTemplate,
    list_at,
    map_at,
    meta,
    number,
    owner_ref_path,
    qualify,
    replicas,
    required,
    spec_dns,
)
from agent.core.model import Identity, Options, RawPod

VOLCANO_JOB = "volcano.sh/job-name"
VOLCANO_TASK = "volcano.sh/task-spec"
VOLCANO_INDEX = "volcano.sh/task-index"

# The Job CRD (config/crd/volcano/bases/batch.volcano.sh_jobs.yaml: short names vcjob, vj).
VCJOB = JobResource("batch.volcano.sh", "v1alpha1", "Job", "jobs", short=("vcjob", "vj"))

FlagKind = Literal["string", "int", "bool"]  # flag.StringVar, flag.IntVar, flag.BoolVar


@dataclasses.dataclass(frozen=True)
class Plugin:
    """One distributed-framework plugin as its ``addFlags`` reads its arguments: the agent's framework whose files
    it implies (None: torch.env's own, the pytorch plugin), the flags that name a role's task (each defaulting to
    the role's name), the roles that train in rank order, what the framework calls a role whose name it does not
    share, the ``--port`` default, and the plugin's other flags (Go's flag package stops at a flag it does not
    know, so each is listed with its kind: a bool flag takes no next argument)."""

    framework: str | None
    roles: tuple[str, ...]
    trains: tuple[str, ...]
    port: int
    source: str
    plays: Mapping[str, str] = dataclasses.field(default_factory=dict)
    others: Mapping[str, FlagKind] = dataclasses.field(default_factory=dict)
    framework_port: bool = True  # --port is the framework's port (the mpi plugin's is the sshd port it opens)

    @property
    def flags(self) -> dict[str, FlagKind]:
        return {**dict.fromkeys(self.roles, "string"), "port": "int", **self.others}


_upstream = "volcano-sh/volcano pkg/controllers/job/plugins/distributed-framework"
# The plugins in the order their rule decides the training roles: the first the job has whose training tasks it
# has. Each row as its file reads at v1.16.0-alpha.1 (ed72c7c81), with the release the flags date from.
PLUGINS: Mapping[str, Plugin] = {
    # v1.7.0+ pytorch/pytorch.go addFlags: --master, --worker, --port 23456; the wait-master flags since v1.14.0.
    # OnPodCreate: MASTER_PORT = --port in every container, RANK 0 for the master, index + 1 for a worker.
    "pytorch": Plugin(None, ("master", "worker"), ("master", "worker"), 23456, f"{_upstream}/pytorch/pytorch.go",
                      others={"wait-master-enabled": "bool", "wait-master-timeout": "int",
                              "wait-master-image": "string"}),
    # v1.5.0+ tensorflow/tensorflow.go addFlags: --ps, --worker, --chief, --evaluator, --port 2222; every task
    # TF_CONFIG names is waited for.
    "tensorflow": Plugin("tf", ("chief", "worker", "ps", "evaluator"), ("chief", "worker", "ps", "evaluator"),
                         2222, f"{_upstream}/tensorflow/tensorflow.go"),
    # v1.13.0+ ray/ray.go addFlags: --head, --worker, --port 6379, --headContainer, --workerContainer,
    # --dashboardPort, --clientPort.
    "ray": Plugin("ray", ("head", "worker"), ("head", "worker"), 6379, f"{_upstream}/ray/ray.go",
                  others={"headContainer": "string", "workerContainer": "string", "dashboardPort": "int",
                          "clientPort": "int"}),
    # v1.7.0+ mpi/mpi.go addFlags: --master, --worker, --port 22 (the sshd port it opens). OnPodCreate gives the
    # master task MPI_HOST, the worker task's hosts for mpiexec --host: the master launches, the workers are the
    # ranks.
    "mpi": Plugin("mpi", ("master", "worker"), ("worker",), 22, f"{_upstream}/mpi/mpi.go",
                  plays={"master": "launcher"}, framework_port=False),
}

# strconv.ParseBool's spellings (what flag.BoolVar's -name=value accepts), as true or false.
_GO_BOOLS = {"1": "true", "t": "true", "T": "true", "TRUE": "true", "true": "true", "True": "true",
             "0": "false", "f": "false", "F": "false", "FALSE": "false", "false": "false", "False": "false"}

# The ray plugin starts the head with ``ray start --head --port=<--port>`` in the head task's container named by
# --headContainer (default "head"), and opens the GCS port there as a container port named "gcs" unless one has
# that number already; a head pod without that container is left alone (ray.go OnPodCreate, openHeadContainerPort,
# DefaultHeadContainer, GcsPortName; since v1.13.0).
RAY_HEAD_CONTAINER = ("headContainer", "head")
RAY_GCS_PORT_NAME = "gcs"


def _underscores_ok(digits: str) -> bool:
    """strconv's underscoreOK: each '_' follows a digit (or the base prefix) and precedes one."""
    saw, at, hexa = "^", 0, False
    if len(digits) >= 2 and digits[0] == "0" and digits[1].lower() in "box":
        saw, at, hexa = "0", 2, digits[1].lower() == "x"
    for ch in digits[at:]:
        if "0" <= ch <= "9" or (hexa and "a" <= ch.lower() <= "f"):
            saw = "0"
        elif ch == "_":
            if saw != "0":
                return False
            saw = "_"
        elif saw == "_":
            return False
        else:
            saw = "!"
    return saw != "_"


def go_int(text: str) -> int | None:
    """``text`` as Go's ``strconv.ParseInt(text, 0, 64)`` reads it (what ``flag.IntVar`` does): a sign, then a
    0x/0o/0b prefix or a leading 0 (octal: "030" is 24), underscores between digits; None where Go fails."""
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body:
        return None
    base, digits = 10, body
    if body[0] == "0":
        if len(body) >= 3 and body[1].lower() in "box":
            base, digits = {"b": 2, "o": 8, "x": 16}[body[1].lower()], body[2:]
        else:
            base, digits = 8, body[1:]
    value = 0
    for ch in digits:
        if ch == "_":
            continue
        digit = int(ch, 36) if ch.isascii() and ch.isalnum() else 99
        if digit >= base:
            return None
        value = value * base + digit
    if "_" in body and not _underscores_ok(body):
        return None
    value = -value if text[0] == "-" else value
    return value if -(2 ** 63) <= value < 2 ** 63 else None


def go_flags(args: Sequence[Any], flags: Mapping[str, FlagKind]) -> dict[str, str]:
    """The flags Go's flag package reads from ``args`` (``-name=v``, ``--name=v``, ``-name v``; a bool flag
    ``-name`` or ``-name=v``), among ``flags``: it stops at the first argument that is no flag, at ``--``, at an
    unknown flag, a flag without its value and a value its kind refuses, keeping what it read before (the
    plugins parse with ContinueOnError and go on with those values). Ints come back in decimal, bools as
    ``true``/``false``."""
    found: dict[str, str] = {}
    words = [a for a in args if isinstance(a, str)] if isinstance(args, list) else []
    at = 0
    while at < len(words):
        word = words[at]
        if len(word) < 2 or not word.startswith("-") or word == "--":
            break
        name = word[2:] if word.startswith("--") else word[1:]
        if not name or name[0] in "-=":  # "bad flag syntax"
            break
        name, sep, value = name.partition("=")
        kind = flags.get(name)
        if kind is None:
            break
        at += 1
        if kind == "bool":
            value = _GO_BOOLS.get(value, "") if sep else "true"
        elif not sep:
            if at >= len(words):
                break
            value, at = words[at], at + 1
        if kind == "int":
            number_ = go_int(value)
            value = "" if number_ is None else str(number_)
        if kind != "string" and not value:
            break
        found[name] = value
    return found


def _plugins(objects: Objects) -> Mapping[Any, Any]:
    return map_at(objects[0], "spec", "plugins") if objects else {}


def _job_name(job: Mapping[str, Any] | None) -> str:
    name = (job.get("metadata") or {}).get("name") if isinstance(job, Mapping) else None
    return name if isinstance(name, str) and name else "?"


@dataclasses.dataclass(frozen=True)
class PluginArgs:
    """What one plugin's arguments say: each of its roles' task, its port and where the port was read."""

    tasks: Mapping[str, str]  # role (the flag's name) -> task
    port: int
    source: str


def plugin_args(name: str, arguments: Any, job: Mapping[str, Any] | None) -> PluginArgs:
    """The plugin ``name``'s tasks and port as its ``addFlags`` reads ``arguments`` (the defaults where unset)."""
    plugin = PLUGINS[name]
    flags = go_flags(arguments, plugin.flags)
    port = flags.get("port", "")
    given = port.isdigit() and 0 < int(port) < 65536
    where = f"--port {port} of the {name} plugin of Job '{_job_name(job)}'" if given else \
        f"the {name} plugin's default {plugin.port} (Job '{_job_name(job)}')"
    return PluginArgs({role: flags.get(role, role) for role in plugin.roles}, int(port) if given else plugin.port,
                      where)


def task_names(job: Mapping[str, Any] | None) -> list[str]:
    """The names of a job object's tasks, in its order."""
    return [t["name"] for t in list_at(job, "spec", "tasks")
            if isinstance(t, Mapping) and isinstance(t.get("name"), str)]


class Volcano(Controller):
    key, title, marker = "volcano", "Volcano Job", VOLCANO_JOB
    labels = frozenset({VOLCANO_JOB, VOLCANO_TASK, VOLCANO_INDEX})
    resources = (VCJOB,)
    default_roles = ("master", "worker")  # the pytorch plugin's --master and --worker defaults
    owner_is_job = True
    checks_index = True

    def identify(self, pod: RawPod, options: Options) -> Identity:
        fix = "the pod must be created by a Volcano Job (or pass --controller)"
        job = required(pod, VOLCANO_JOB, fix=fix)
        role = required(pod, VOLCANO_TASK, fix=fix)
        index = number(pod, VOLCANO_INDEX, fix="Volcano >= 1.7 sets it; set it on the pod or use --selector")
        return Identity(job=job, role=role, index=(index,), ordinal=index)

    def dns_name(self, pod: RawPod, ident: Identity, namespace: str, cluster_domain: str | None) -> str:
        # Volcano's svc plugin gives every pod hostname=<pod name>, subdomain=<job name> and a headless Service.
        hostname, subdomain = spec_dns(pod) or (meta(pod).name, ident.job)
        return qualify(f"{hostname}.{subdomain}", namespace, cluster_domain)

    def owner_path(self, pod: RawPod) -> str | None:
        return owner_ref_path(pod, VCJOB)

    def frameworks(self, objects: Objects) -> tuple[str, ...]:
        """The frameworks whose plugin the job enables (none known without the job object)."""
        plugins = _plugins(objects)
        return tuple(p.framework for name, p in PLUGINS.items() if name in plugins and p.framework is not None)

    def framework_args(self, objects: Objects) -> dict[str, FrameworkArgs]:
        """Each framework plugin's task for each of its roles (as the framework names the role: the mpi plugin's
        master is MPI's launcher) and its port, from its flags (the defaults where unset)."""
        plugins, found = _plugins(objects), {}
        job = objects[0] if objects else None
        for name, plugin in PLUGINS.items():
            if name not in plugins or plugin.framework is None:
                continue
            args = plugin_args(name, plugins[name], job)
            container = go_flags(plugins[name], plugin.flags).get(*RAY_HEAD_CONTAINER) if name == "ray" else None
            found[plugin.framework] = FrameworkArgs(
                roles=tuple((args.tasks[role], plugin.plays.get(role, role)) for role in plugin.roles),
                port=args.port if plugin.framework_port else None, source=args.source, container=container)
        return found

    def framework_port(self, framework: str) -> tuple[str | None, int | None] | None:
        return (RAY_GCS_PORT_NAME, None) if framework == "ray" else None

    def framework_container(self, framework: str) -> str | None:
        return RAY_HEAD_CONTAINER[1] if framework == "ray" else None

    def plugin_roles(self, job: Mapping[str, Any] | None) -> tuple[str, tuple[str, ...]] | None:
        """The training roles the job's plugins give, in rank order, and the plugin: the first plugin of
        ``PLUGINS`` that the job enables and whose training tasks it has (None: no such plugin)."""
        plugins, tasks = map_at(job, "spec", "plugins"), task_names(job)
        for name, plugin in PLUGINS.items():
            if name in plugins:
                args = plugin_args(name, plugins[name], job)
                roles = tuple(args.tasks[role] for role in plugin.trains if args.tasks[role] in tasks)
                if roles:
                    return name, roles
        return None

    def owner_options(self, objects: Objects, options: Options) -> OwnerOptions:
        """The training roles a plugin gives (``plugin_roles``: the pytorch plugin's master and worker, the
        tensorflow and ray plugins' tasks in the plugin's order so that every pod TF_CONFIG names is waited for,
        the mpi plugin's worker, its master being the launcher) where the user gave none, and the pytorch plugin's
        port, which it writes into every container as MASTER_PORT (and declares as port 'pytorchjob-port' unless
        the container declares that number under a name of its own): MASTER_PORT where neither --master-port nor
        rank 0's container says."""
        job = objects[0] if objects else None
        notes = []
        found = self.plugin_roles(job) if options.roles is None else None
        if found is not None:
            name, roles = found
            options = dataclasses.replace(options, roles=roles)
            notes.append(f"Volcano {name} plugin: training roles {', '.join(roles)}")
        plugins = _plugins(objects)
        if "pytorch" in plugins:
            args = plugin_args("pytorch", plugins["pytorch"], job)
            options = dataclasses.replace(options, ports=dataclasses.replace(options.ports,
                                                                         job_master=(args.port, args.source)))
        return OwnerOptions(options, tuple(notes))

    def untrained(self, job: Mapping[str, Any], roles: tuple[str, ...] | None) -> str | None:
        tasks = task_names(job)
        found = self.plugin_roles(job) if roles is None else None
        trains = roles or (found[1] if found else self.default_roles) or ()
        if not tasks or set(trains) & set(tasks):
            return None
        if roles is not None:
            return f"none of its tasks ({', '.join(tasks)}) is a training role given ({', '.join(roles)})"
        plugins = map_at(job, "spec", "plugins")
        said = [f"the {name} plugin's {', '.join(args.tasks[r] for r in plugin.trains)} (its "
                f"{', '.join('--' + r for r in plugin.trains)})" for name, plugin in PLUGINS.items() if name in plugins
                for args in (plugin_args(name, plugins[name], job),)]
        default = f"{', '.join(trains)} (the pytorch plugin's defaults)"
        return (f"none of its tasks ({', '.join(tasks)}) trains: the training roles are "
                f"{', else '.join([*said, default] if 'pytorch' not in plugins else said)}")

    def pod_templates(self, job: Mapping[str, Any]) -> Iterator[PodTemplate]:
        """One template per task (``spec.tasks[i].template``), ``replicas`` pods each."""
        for i, task in enumerate(list_at(job, "spec", "tasks")):
            if isinstance(task, Mapping):
                name = task.get("name")
                yield PodTemplate(task.get("name", ""), f"tasks[{i}] ({name})", ("spec", "tasks", i, "template"),
                                  task.get("template"), replicas(task.get("replicas")))


VOLCANO = Volcano()
