"""`topology-agent plan`: a job's manifest in, every pod's rank and files out, with no cluster.

The manifest gets the agent as ``inject`` gives it (the same transform, when no pod template has it yet); the
controller's pods come from core/emulation, placed on placeholder loopback IPs (a DNS name, where the controller
gives the pod hostname and subdomain, is the real one); then each pod goes through init's own steps: its options
from its init container (``options_of``, as status reads them), the job's objects read as init reads them
(``job_reads``, answered from the emulated objects), the plan and files of ``render_pod``, and the own view of a
job that publishes (``own_view``). No second planner: what differs from a pod's init is only where the objects
come from, and that the SSH files, made from the job's Secret, are not made.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, cast

import yaml

from agent.core import Rendered, render_plan, render_pod
from agent.core.controllers import detect_controller
from agent.core.controllers.jobset import RUNTIME_KINDS, TRAINJOBS
from agent.core.emulation import KINDS_EMULATED, Emulation, emulate, is_job, pod_templates
from agent.core.emulation.placing import loopback_address, placed
from agent.core.model import Options, RawPod
from agent.core.plan.gang import expectation_from_job, expectation_from_pod, job_reads, roster_of
from agent.core.publication.summary import own_view
from agent.core.publication.view_choice import LARGE_JOB
from agent.errors import InputError
from agent.runtime.views import PodView

INIT = "topology-agent"  # the agent's init container, as inject names it
SHIPPED_RUNTIME = "{}-distributed-topology.yaml"  # manifests/trainer's, as package data (links in agent/runtime)
PLACEHOLDER = "127."  # the placeholder pod IPs: loopback, never a cluster's


@dataclass(frozen=True)
class PodPlan:
    """One pod's plan: its files as its init would write them (None: the pod runs no agent)."""

    pod: RawPod
    rendered: Rendered | None
    options: Options | None
    from_pod: tuple[str, ...]  # the init container's command line
    ssh: bool  # init would add the SSH files from the job's Secret


# --- the manifest -----------------------------------------------------------------------------------------------

def _documents(text: str, where: str) -> list[dict[str, Any]]:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark else ""
        raise InputError(f"{where} is not YAML{line}: {getattr(err, 'problem', None) or err}") from None
    out: list[dict[str, Any]] = []
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            out += [d for d in doc["items"] if isinstance(d, dict)]
        elif isinstance(doc, dict):
            out.append(doc)
    return out


def _has_agent(template: Mapping[str, Any]) -> bool:
    spec = template.get("spec") or {}
    return any(isinstance(c, Mapping) and c.get("name") == INIT for c in spec.get("initContainers") or [])


def _with_agent(text: str, where: str, *, version: str) -> list[dict[str, Any]]:
    """The manifest's objects with the agent in their pod templates: inject's output when a template lacks it,
    else the manifest as it is (a manifest that has it, by inject or by hand)."""
    from agent.core.adoption.injection import Settings
    from agent.runtime.commands.inject import inject_report

    docs = _documents(text, where)
    templates = [t for d in docs if (is_job(d) and d.get("kind") != TRAINJOBS.kind) or d.get("kind") in RUNTIME_KINDS
                 for t in pod_templates(d)]
    if templates and not all(_has_agent(t) for t in templates):
        text, _ = inject_report(text, Settings(), version=version)
        docs = _documents(text, where)
    return docs


def read_job(filename: str, runtime_files: Sequence[str], *, version: str) -> tuple[dict[str, Any],
                                                                                     list[dict[str, Any]]]:
    """The job object of ``filename`` and the runtimes given (in it and in ``runtime_files``), with the agent."""
    from agent.flags.inject import read_manifest

    where = "stdin" if filename == "-" else filename
    docs = _with_agent(read_manifest(filename), f"-f {where}", version=version)
    runtimes = [d for d in docs if d.get("kind") in RUNTIME_KINDS]
    for name in runtime_files:
        try:
            text = read_manifest(name)
        except InputError as err:  # inject's reader names -f
            raise InputError(str(err).replace(f"-f {name}:", f"--runtime {name}:", 1)) from None
        runtimes += [d for d in _with_agent(text, f"--runtime {name}", version=version)
                     if d.get("kind") in RUNTIME_KINDS]
    jobs = [d for d in docs if is_job(d)]
    if not jobs:
        found = ", ".join(f"{d.get('kind', '?')} '{(d.get('metadata') or {}).get('name', '?')}'" for d in docs)
        known = ", ".join(sorted(set(KINDS_EMULATED.values())))
        said = f"found {found}" if found else "it is empty"
        raise InputError(f"-f {where}: no job of a kind the agent knows ({said}); give the manifest of one of: {known}")
    if len(jobs) > 1:
        names = ", ".join(f"{d['kind']} '{(d.get('metadata') or {}).get('name', '?')}'" for d in jobs)
        raise InputError(f"-f {where} holds {len(jobs)} jobs ({names}); plan one job at a time")
    job = jobs[0]
    if job.get("kind") == TRAINJOBS.kind and not runtimes:
        ref = ((job.get("spec") or {}).get("runtimeRef") or {}).get("name")
        framework = ref.removesuffix("-distributed-topology") if isinstance(ref, str) else ""
        shipped = resources.files("agent.runtime").joinpath(SHIPPED_RUNTIME.format(framework))
        if framework.isalpha() and shipped.is_file():
            runtimes = [d for d in _with_agent(shipped.read_text(), f"manifests/trainer/{ref}.yaml", version=version)
                        if d.get("kind") in RUNTIME_KINDS]
    return job, runtimes


# --- each pod's plan, as its init makes it ----------------------------------------------------------------------

def objects_by_path(emulation: Emulation, runtimes: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, str], Any]:
    """The objects a pod's init may read, by (kind's plural, namespace, name): what the API paths name."""
    from agent.core.controllers import job_resources

    plurals = {r.kind: r.plural for r in job_resources()}
    plurals.update(Job="jobs", StatefulSet="statefulsets")
    found: dict[tuple[str, str, str], Any] = {}
    for obj in (emulation.job, *emulation.owners, *runtimes):
        meta = obj.get("metadata") or {}
        namespace = "" if obj.get("kind") == "ClusterTrainingRuntime" else meta.get("namespace", "default")
        found[(plurals.get(str(obj.get("kind")), ""), namespace, str(meta.get("name")))] = obj
    return found


def _answer(path: str, objects: Mapping[tuple[str, str, str], Any], namespace: str) -> Any:
    """The object at API path ``path`` (``/apis/<group>/<version>[/namespaces/<ns>]/<plural>/<name>``)."""
    parts = path.strip("/").split("/")
    if "namespaces" in parts:
        at = parts.index("namespaces")
        return objects.get((parts[at + 2], parts[at + 1], parts[at + 3])) if len(parts) > at + 3 else None
    return objects.get((parts[-2], "", parts[-1])) if len(parts) >= 2 else None


def init_command(pod: RawPod) -> list[str] | None:
    from agent.flags.status import init_args

    return init_args(pod)


class Held:
    """The pods as init's ``PodView`` holds them (runtime/views.py: each passed by the job's roster and compacted
    for the options; the own pod kept as read), made once per set of options: every pod of a job holds the same
    peers, so the job's pods are compacted once, not once per pod."""

    def __init__(self, pods: Sequence[RawPod]) -> None:
        self.pods = pods
        self._views: list[tuple[Options, Any, dict[str, RawPod]]] = []

    def for_pod(self, pod: RawPod, options: Options, roster: Any) -> list[RawPod]:
        name = pod["metadata"]["name"]
        peers = next((held for o, r, held in self._views if o == options and r == roster), None)
        if peers is None:
            view = PodView("", options, roster=roster, whole_own=True)
            view.replace(view.intake(list(self.pods)))
            peers = view.pods
            self._views.append((options, roster, peers))
        return [pod if held_name == name else held for held_name, held in peers.items()]


def plan_pod(pods: Sequence[RawPod] | Held, pod: RawPod, objects: Mapping[tuple[str, str, str], Any], *,
             files_dir: str | None = None) -> PodPlan:
    """``pod``'s files as its init makes them from ``pods`` and the job's ``objects`` (``files_dir``: where they
    are written, by default its init's ``--out``)."""
    held_pods = pods if isinstance(pods, Held) else Held(pods)
    from agent.flags.init import check
    from agent.flags.parser import parse_command_line
    from agent.flags.status import options_of

    argv = init_command(pod)
    options = options_of(pod)
    if argv is None or options is None:
        return PodPlan(pod, None, None, tuple(argv or ()), ssh=False)
    parsed = parse_command_line(argv)
    own = check(parsed)
    ssh = getattr(parsed, "ssh_secret_dir", None) is not None  # its files come from the Secret mounted there
    name = pod["metadata"]["name"]
    namespace = pod["metadata"].get("namespace", "default")
    controller = detect_controller(pod, options)
    expected = expectation_from_pod(controller, pod)
    objects_read: tuple[Mapping[str, Any], ...] = ()
    roster = None
    if own.expect is None and expected is None and controller.owner_path(pod) is not None:
        reads = job_reads(pod, options)
        try:
            path = next(reads)
            while True:
                path = reads.send(_answer(path, objects, namespace))
        except StopIteration as done:
            view = done.value
        options, objects_read, roster = view.options, view.objects, roster_of(view)
        role = view.controller.identify(pod, options).role
        expected = expectation_from_job(view.controller, view.objects, view.controller.training_roles(options),
                                        options, role=role)
    total = own.expect if own.expect is not None else expected.total if expected is not None else 0
    source = own.source if own.source != "auto" else \
        "published" if options.levels is not None or total >= LARGE_JOB else "pods"
    role = controller.identify(pod, options).role
    if source == "published" and role in controller.waits_for(objects_read):
        source = "pods"
    out = files_dir or str(parsed.out)
    # The pods as init holds them: this pod as read, the others compacted, each passed by the job's roster; checked
    # on the way in, as init's planner takes them.
    rendered = render_pod(held_pods.for_pod(pod, options, roster), name, options, files_dir=out, checked=True)
    own_plan, _ = own_view(rendered.plan, options, ssh=ssh, published=source == "published")
    if own_plan is not None:
        rendered = render_plan(own_plan, options, files_dir=out)
    return PodPlan(pod, rendered, options, tuple(argv), ssh=ssh)


def placed_pods(emulation: Emulation) -> list[RawPod]:
    """The emulated pods, each Running at a placeholder loopback IP of its own."""
    return [cast(RawPod, placed(pod, ip=loopback_address(n))) for n, pod in enumerate(emulation.pods)]


def plan_job(emulation: Emulation, runtimes: Sequence[Mapping[str, Any]] = (), *,
             files_dir: Callable[[str], str] | None = None) -> list[PodPlan]:
    """Every pod's plan (``files_dir(pod)``: where its files are written; default: its init's ``--out``)."""
    pods = placed_pods(emulation)
    objects = objects_by_path(emulation, runtimes)
    held = Held(pods)
    return [plan_pod(held, pod, objects, files_dir=files_dir(pod["metadata"]["name"]) if files_dir else None)
            for pod in pods]


# --- output -------------------------------------------------------------------------------------------------------

def _variables(rendered: Rendered) -> dict[str, str]:
    return {v.name: v.value for v in rendered.variables if v.written and not v.unset}


def row_of(plan: PodPlan) -> dict[str, Any]:
    name = plan.pod["metadata"]["name"]
    if plan.rendered is None:
        return {"pod": name, "role": "-", "node_rank": None, "rank": None, "process_ranks": None, "world_size": None,
                "processes": None,
                "address": "-", "placeholder": False, "files": [], "note": "no agent init container"}
    me = plan.rendered.plan.topology.me
    env = _variables(plan.rendered)
    ranks = None if me.first_rank is None else [me.first_rank, me.first_rank + me.slots - 1]
    files = [f for f in plan.rendered.files if not f.startswith(".")] + (["ssh/"] if plan.ssh else [])
    return {"pod": name, "role": me.role, "node_rank": me.node_rank,
            "rank": int(env["RANK"]) if env.get("RANK", "").isdigit() else None, "process_ranks": ranks,
            "world_size": int(env["WORLD_SIZE"]) if env.get("WORLD_SIZE", "").isdigit() else None,
            "processes": me.slots if me.training else None, "address": me.address,
            "placeholder": me.address.startswith(PLACEHOLDER), "files": files, "note": ""}


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return str(value[0]) if value[0] == value[1] else f"{value[0]}-{value[1]}"
    return str(value)


def format_table(job: Mapping[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    meta = job.get("metadata") or {}
    head = ("POD", "ROLE", "NODE_RANK", "RANK", "WORLD_SIZE", "PROCS", "PROCESS_RANKS", "ADDRESS", "FILES")
    body = [(r["pod"], r["role"], _cell(r["node_rank"]), _cell(r["rank"]), _cell(r["world_size"]),
             _cell(r["processes"]), _cell(r["process_ranks"]), r["address"] + ("*" if r["placeholder"] else ""),
             ", ".join(r["files"]) or r["note"]) for r in rows]
    widths = [max(len(str(line[i])) for line in (head, *body)) for i in range(len(head) - 1)]
    api = str(job.get("apiVersion", ""))
    title = KINDS_EMULATED.get((api.split("/")[0] if "/" in api else "", str(job.get("kind"))), job.get("kind"))
    lines = [f"{title} '{meta.get('name')}' in namespace {meta.get('namespace', 'default')}: "
             f"{len(rows)} pods, as its controller creates them"]
    for line in (head, *body):
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=False)) + "  " + str(line[-1]))
    if any(r["placeholder"] for r in rows):
        lines.append("* a placeholder: the pod's IP, which the cluster gives when it runs")
    lines.append("RANK and WORLD_SIZE as torch.env exports them (one process per pod); a launcher (torchrun, "
                 "deepspeed, mpirun) numbers each process from PROCESS_RANKS")
    if any("ssh/" in r["files"] for r in rows):
        lines.append("ssh/: made by init from the job's SSH Secret; plan does not make it")
    return "\n".join(line.rstrip() for line in lines)


def write_plans(out: Path, plans: Sequence[PodPlan]) -> list[Path]:
    """DIR/<pod>/<each file>, as init writes them (runtime/output.py: each file atomically)."""
    from agent.runtime.output import write_generation

    written = []
    for plan in plans:
        if plan.rendered is None or plan.options is None:
            continue
        where = out / plan.pod["metadata"]["name"]
        write_generation(where, plan.rendered, plan.options)
        written.append(where)
    return written


def run_plan(filename: str, runtime_files: Sequence[str], *, out: Path | None, me: str | None, output: str,
             version: str) -> int:
    job, runtimes = read_job(filename, runtime_files, version=version)
    emulation = emulate(job, runtimes=runtimes)
    plans = plan_job(emulation, runtimes)
    if out is not None:  # written first: a directory that cannot be written is said before anything is printed
        written = write_plans(out, plans)
        print(f"wrote the files of {len(written)} pods to {out}{os.sep}<pod>", file=sys.stderr)
    if me is not None:
        chosen = next((p for p in plans if p.pod["metadata"]["name"] == me), None)
        if chosen is None:
            names = ", ".join(p.pod["metadata"]["name"] for p in plans)
            raise InputError(f"--self {me}: no such pod in {job.get('kind')} '{job['metadata']['name']}' (its pods: "
                             f"{names})")
        if chosen.rendered is None:
            raise InputError(f"--self {me}: the pod runs no agent init container; nothing to explain")
        from agent.core.files.explaining import explain_with_options

        print(explain_with_options(chosen.rendered, chosen.from_pod))
    elif output == "json":
        print(json.dumps({"job": {"apiVersion": job.get("apiVersion"), "kind": job.get("kind"),
                                  "name": job["metadata"]["name"],
                                  "namespace": emulation.job["metadata"]["namespace"]},
                          "pods": [row_of(p) for p in plans]}, indent=2))
    else:
        print(format_table(emulation.job, [row_of(p) for p in plans]))
    return 0
