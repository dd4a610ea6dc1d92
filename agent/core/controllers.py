"""Controller adapters: what each controller's pod labels say about a pod's job, role and index.

One adapter per controller, each a small frozen object with the same four answers: does this pod belong to
me (``claims``), which job/role/index is it (``identify``), which roles train by default, and what DNS name
its peers reach it by. Label keys are the controllers' own (read from their sources); nothing else about a
controller lives outside this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agent.core.injected import TRAINJOB_MASTER_PORT
from agent.core.model import Identity, Options, RawPod
from agent.core.validation import index_value, role_value
from agent.errors import InputError

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOB_NAME = "batch.kubernetes.io/job-name"

VOLCANO_JOB = "volcano.sh/job-name"
VOLCANO_TASK = "volcano.sh/task-spec"
VOLCANO_INDEX = "volcano.sh/task-index"

PYTORCHJOB_JOB = "training.kubeflow.org/job-name"
PYTORCHJOB_TYPE = "training.kubeflow.org/replica-type"
PYTORCHJOB_INDEX = "training.kubeflow.org/replica-index"

# MPI operator v2 (kubeflow/mpi-operator v0.5.0-v0.8.0, pkg/apis/kubeflow/v2beta1/constants.go; the labels
# are set by defaultLabels() and newWorker() in pkg/controller/mpi_job_controller.go).
MPI_OPERATOR_NAME = "training.kubeflow.org/operator-name"
MPI_OPERATOR = "mpi-operator"
MPI_JOB_ROLE = "training.kubeflow.org/job-role"

JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_RJOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOBSET_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
COORDINATOR = "jobset.sigs.k8s.io/coordinator"  # api/jobset/v1alpha2/jobset_types.go CoordinatorKey, v0.6.0+
TRAINJOB_PREFIX = "trainer.kubeflow.org/"

LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"


def _meta(pod: RawPod) -> tuple[str, dict[str, str], dict[str, str]]:
    meta = pod.get("metadata", {})
    return meta.get("name", "?"), meta.get("labels", {}) or {}, meta.get("annotations", {}) or {}


def _required(pod: RawPod, key: str, *, fix: str) -> str:
    """A label the controller sets (falling back to the annotation of the same key, which Volcano and JobSet
    also set), checked as a label value: annotations are free text, and the value reaches files."""
    name, labels, annotations = _meta(pod)
    value = labels.get(key, annotations.get(key))
    if value is None or value == "":
        raise InputError(f"pod '{name}': label '{key}' is missing; {fix}")
    return role_value(pod, key, value, fix=fix)  # type: ignore[arg-type]


def _number(pod: RawPod, key: str, *, fix: str) -> int:
    """A non-negative integer label below 10^9 (falling back to the annotation of the same key)."""
    name, labels, annotations = _meta(pod)
    raw = labels.get(key, annotations.get(key))
    if raw is None or raw == "":
        raise InputError(f"pod '{name}': label '{key}' is missing; {fix}")
    return index_value(pod, key, raw, fix=fix)  # type: ignore[arg-type]


def _spec_dns(pod: RawPod) -> tuple[str, str] | None:
    spec = pod.get("spec", {})
    hostname, subdomain = spec.get("hostname"), spec.get("subdomain")
    if hostname and subdomain:
        return hostname, subdomain
    return None


def qualify(name: str, namespace: str, cluster_domain: str | None) -> str:
    """A peer's name as written in files: relative (resolved through the pod's DNS search list) unless a
    cluster domain is given, then fully qualified."""
    if not cluster_domain:
        return name
    return f"{name}.{namespace}.svc.{cluster_domain.strip('.')}"


@dataclass(frozen=True)
class Controller:
    """One controller's conventions. ``key`` is what ``--controller`` takes."""

    key: str
    title: str
    marker: str
    default_roles: tuple[str, ...] | None
    identify_fn: Callable[[RawPod, Options], Identity]
    dns_fn: Callable[[RawPod, Identity, str, str | None], str | None]
    selector_fn: Callable[[RawPod, Options], str]
    job_fn: Callable[[RawPod], str | None]
    owner_is_job: bool = False
    default_master_port: int | None = None

    def claims(self, pod: RawPod) -> bool:
        return self.marker in _meta(pod)[1]

    def job_of(self, pod: RawPod) -> str | None:
        """The job a pod belongs to, read from labels alone (no role or index needed)."""
        return self.job_fn(pod)

    def identify(self, pod: RawPod, options: Options) -> Identity:
        return self.identify_fn(pod, options)

    def dns_name(self, pod: RawPod, ident: Identity, namespace: str, cluster_domain: str | None) -> str | None:
        return self.dns_fn(pod, ident, namespace, cluster_domain)

    def selector(self, pod: RawPod, options: Options) -> str:
        """The label selector that lists this pod's peers through the API server."""
        return self.selector_fn(pod, options)


# --- Volcano Job ---------------------------------------------------------------------------------------

def _volcano_identify(pod: RawPod, _: Options) -> Identity:
    fix = "the pod must be created by a Volcano Job (or pass --controller)"
    job = _required(pod, VOLCANO_JOB, fix=fix)
    role = _required(pod, VOLCANO_TASK, fix=fix)
    index = _number(pod, VOLCANO_INDEX, fix="Volcano >= 1.7 sets it; set it on the pod or use --selector")
    return Identity(job=job, role=role, index=(index,), ordinal=index)


def _volcano_dns(pod: RawPod, ident: Identity, namespace: str, domain: str | None) -> str:
    # Volcano's svc plugin gives every pod hostname=<pod name>, subdomain=<job name> and a headless Service.
    hostname, subdomain = _spec_dns(pod) or (_meta(pod)[0], ident.job)
    return qualify(f"{hostname}.{subdomain}", namespace, domain)


# --- Kubeflow PyTorchJob (training-operator v1) ----------------------------------------------------------

def _pytorchjob_identify(pod: RawPod, _: Options) -> Identity:
    fix = "the pod must be created by a Kubeflow PyTorchJob (or pass --controller)"
    job = _required(pod, PYTORCHJOB_JOB, fix=fix)
    role = _required(pod, PYTORCHJOB_TYPE, fix=fix).lower()
    index = _number(pod, PYTORCHJOB_INDEX, fix=fix)
    return Identity(job=job, role=role, index=(index,), ordinal=index)


def _pytorchjob_dns(pod: RawPod, ident: Identity, namespace: str, domain: str | None) -> str:
    # training-operator creates one headless Service per replica, named <job>-<replica-type>-<index>.
    if spec := _spec_dns(pod):
        return qualify(f"{spec[0]}.{spec[1]}", namespace, domain)
    return qualify(f"{ident.job}-{ident.role}-{ident.ordinal}", namespace, domain)


# --- MPIJob (MPI operator v2): a launcher runs mpirun, workers run the ranks ------------------------------------

def _mpijob_identify(pod: RawPod, _: Options) -> Identity:
    fix = "the pod must be created by an MPIJob of the MPI operator v2 (or pass --controller)"
    job = _required(pod, PYTORCHJOB_JOB, fix=fix)
    role = _required(pod, MPI_JOB_ROLE, fix=fix)
    if role not in ("launcher", "worker"):
        raise InputError(f"pod '{_meta(pod)[0]}': label '{MPI_JOB_ROLE}' is '{role}', not launcher or worker; {fix}")
    index = 0 if role == "launcher" else _number(pod, PYTORCHJOB_INDEX, fix=fix)
    return Identity(job=job, role=role, index=(index,), ordinal=index)


def _mpijob_dns(pod: RawPod, ident: Identity, namespace: str, domain: str | None) -> str:
    # The operator sets hostname <job>-launcher / <job>-worker-<i> and subdomain <job> (its headless Service).
    if spec := _spec_dns(pod):
        return qualify(f"{spec[0]}.{spec[1]}", namespace, domain)
    host = f"{ident.job}-launcher" if ident.role == "launcher" else f"{ident.job}-worker-{ident.ordinal}"
    return qualify(f"{host}.{ident.job}", namespace, domain)


# --- JobSet and Kubeflow TrainJob (Trainer v2 runs on JobSet) ----------------------------------------------

def _jobset_identify(pod: RawPod, _options: Options) -> Identity:
    fix = "the pod must be created by a JobSet (or pass --controller)"
    _, labels, annotations = _meta(pod)
    job = _required(pod, JOBSET_NAME, fix=fix)
    role = _required(pod, JOBSET_RJOB, fix=fix)
    completion = _number(pod, COMPLETION_INDEX, fix="the JobSet's Jobs must use completionMode: Indexed")
    if JOBSET_GLOBAL_INDEX in labels or JOBSET_GLOBAL_INDEX in annotations:
        job_index = _number(pod, JOBSET_GLOBAL_INDEX, fix=fix)
    else:
        job_index = _number(pod, JOBSET_JOB_INDEX, fix=fix)
    return Identity(job=job, role=role, index=(job_index, completion), ordinal=-1)


def _jobset_dns(pod: RawPod, ident: Identity, namespace: str, domain: str | None) -> str:
    # JobSet names Jobs <jobset>-<rjob>-<job-index>; an Indexed Job's pod hostname is <job>-<completion index>;
    # the subdomain is the JobSet's headless Service (named after the JobSet unless spec.network.subdomain).
    if spec := _spec_dns(pod):
        return qualify(f"{spec[0]}.{spec[1]}", namespace, domain)
    job_index = _meta(pod)[1].get(JOBSET_JOB_INDEX, str(ident.index[0]))
    return qualify(f"{ident.job}-{ident.role}-{job_index}-{ident.index[1]}.{ident.job}", namespace, domain)


def _jobset_selector(pod: RawPod, _: Options) -> str:
    return f"{JOBSET_NAME}={_meta(pod)[1][JOBSET_NAME]}"


# --- LeaderWorkerSet: one group is one training world ---------------------------------------------------

def _lws_identify(pod: RawPod, _: Options) -> Identity:
    fix = "the pod must be created by a LeaderWorkerSet (or pass --controller)"
    name = _required(pod, LWS_NAME, fix=fix)
    group = _number(pod, LWS_GROUP, fix=fix)
    worker = _number(pod, LWS_WORKER, fix=fix)
    role = "leader" if worker == 0 else "worker"
    return Identity(job=f"{name}/{group}", role=role, index=(worker,), ordinal=worker)


def _lws_dns(pod: RawPod, ident: Identity, namespace: str, domain: str | None) -> str:
    # The LWS webhook sets hostname <lws>-<group>[-<worker>] and subdomain <lws> (the shared headless Service).
    if spec := _spec_dns(pod):
        return qualify(f"{spec[0]}.{spec[1]}", namespace, domain)
    lws, group = ident.job.split("/")
    host = f"{lws}-{group}" if ident.index[0] == 0 else f"{lws}-{group}-{ident.index[0]}"
    return qualify(f"{host}.{lws}", namespace, domain)


def _lws_selector(pod: RawPod, _: Options) -> str:
    labels = _meta(pod)[1]
    return f"{LWS_NAME}={labels[LWS_NAME]},{LWS_GROUP}={labels[LWS_GROUP]}"


# --- plain Indexed Job ------------------------------------------------------------------------------------

def _indexed_identify(pod: RawPod, _: Options) -> Identity:
    job = _required(pod, JOB_NAME, fix="the pod must be created by a batch/v1 Job (or pass --controller)")
    index = _number(pod, COMPLETION_INDEX, fix="the Job must use completionMode: Indexed")
    return Identity(job=job, role="worker", index=(index,), ordinal=index)


def _indexed_dns(pod: RawPod, ident: Identity, namespace: str, domain: str | None) -> str | None:
    # The Job controller sets hostname <job>-<index> only when the template has a subdomain; without a
    # headless Service of that name there is no DNS record, so None makes the caller ask for --address ip.
    if spec := _spec_dns(pod):
        return qualify(f"{spec[0]}.{spec[1]}", namespace, domain)
    return None


# --- generic label selector -------------------------------------------------------------------------------

def parse_selector(selector: str, *, label: str = "--selector") -> dict[str, str]:
    """``a=b,c=d`` (equality only: the agent needs a set it can also match offline)."""
    pairs: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in selector.split(","))):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip().lstrip("=")
        if not sep or not key or key.endswith("!"):
            raise InputError(f"{label} '{selector}': '{part}' is not key=value; use e.g. app=x,job=y")
        pairs[key] = value
    if not pairs:
        raise InputError(f"{label} is empty; use e.g. app=x,job=y")
    return pairs


def _generic_identify(pod: RawPod, options: Options) -> Identity:
    if not options.index_label:
        raise InputError("--selector needs --index-label KEY (the label holding each pod's index)")
    index = _number(pod, options.index_label, fix="every pod the selector matches needs it")
    return Identity(job=options.selector or "", role="worker", index=(index,), ordinal=index)


def _generic_dns(pod: RawPod, ident: Identity, namespace: str, domain: str | None) -> str | None:
    if spec := _spec_dns(pod):
        return qualify(f"{spec[0]}.{spec[1]}", namespace, domain)
    return None


def _label_selector(*keys: str) -> Callable[[RawPod, Options], str]:
    def selector(pod: RawPod, _: Options) -> str:
        labels = _meta(pod)[1]
        return ",".join(f"{k}={labels[k]}" for k in keys)

    return selector


def _job_label(key: str) -> Callable[[RawPod], str | None]:
    def job_of(pod: RawPod) -> str | None:
        return _meta(pod)[1].get(key)

    return job_of


def _lws_job(pod: RawPod) -> str | None:
    labels = _meta(pod)[1]
    return f"{labels[LWS_NAME]}/{labels.get(LWS_GROUP)}" if LWS_NAME in labels else None


def _generic_selector(_: RawPod, options: Options) -> str:
    return options.selector or ""


VOLCANO = Controller(
    key="volcano",
    title="Volcano Job",
    marker=VOLCANO_JOB,
    default_roles=("master", "worker"),
    identify_fn=_volcano_identify,
    dns_fn=_volcano_dns,
    selector_fn=_label_selector(VOLCANO_JOB),
    job_fn=_job_label(VOLCANO_JOB),
    owner_is_job=True,
)
PYTORCHJOB = Controller(
    key="pytorchjob",
    title="Kubeflow PyTorchJob",
    marker=PYTORCHJOB_JOB,
    default_roles=("master", "worker"),
    identify_fn=_pytorchjob_identify,
    dns_fn=_pytorchjob_dns,
    selector_fn=_label_selector(PYTORCHJOB_JOB),
    job_fn=_job_label(PYTORCHJOB_JOB),
    owner_is_job=True,
)
MPIJOB = Controller(
    key="mpijob",
    title="MPIJob (MPI operator v2)",
    marker=MPI_OPERATOR_NAME,
    default_roles=("worker",),  # the launcher runs mpirun; with runLauncherAsWorker init adds it (docs)
    identify_fn=_mpijob_identify,
    dns_fn=_mpijob_dns,
    selector_fn=_label_selector(PYTORCHJOB_JOB, MPI_OPERATOR_NAME),
    job_fn=_job_label(PYTORCHJOB_JOB),
)
TRAINJOB = Controller(
    key="trainjob",
    title="Kubeflow TrainJob (via JobSet)",
    marker=TRAINJOB_PREFIX,
    # One world: the nodes, then the launcher when it runs as a node (the MPI runtimes' hostfile lists the node
    # pod set, then the launcher: buildHostFileConfigMap in pkg/runtime/framework/plugins/mpi/mpi.go). A runtime
    # with runLauncherAsNode: false runs container "launcher" there: pass --roles node.
    default_roles=("node", "launcher"),
    identify_fn=_jobset_identify,
    dns_fn=_jobset_dns,
    selector_fn=_jobset_selector,
    job_fn=_job_label(JOBSET_NAME),
    default_master_port=TRAINJOB_MASTER_PORT,
)
JOBSET = Controller(
    key="jobset",
    title="JobSet",
    marker=JOBSET_NAME,
    default_roles=None,
    identify_fn=_jobset_identify,
    dns_fn=_jobset_dns,
    selector_fn=_jobset_selector,
    job_fn=_job_label(JOBSET_NAME),
)
LWS = Controller(
    key="lws",
    title="LeaderWorkerSet",
    marker=LWS_NAME,
    default_roles=("leader", "worker"),
    identify_fn=_lws_identify,
    dns_fn=_lws_dns,
    selector_fn=_lws_selector,
    job_fn=_lws_job,
)
INDEXED_JOB = Controller(
    key="indexed-job",
    title="Indexed Job",
    marker=JOB_NAME,
    default_roles=None,
    identify_fn=_indexed_identify,
    dns_fn=_indexed_dns,
    selector_fn=_label_selector(JOB_NAME),
    job_fn=_job_label(JOB_NAME),
    owner_is_job=True,
)
GENERIC = Controller(
    key="selector",
    title="label selector",
    marker="",
    default_roles=None,
    identify_fn=_generic_identify,
    dns_fn=_generic_dns,
    selector_fn=_generic_selector,
    job_fn=lambda _pod: None,
)

CONTROLLERS: dict[str, Controller] = {
    c.key: c for c in (VOLCANO, PYTORCHJOB, MPIJOB, TRAINJOB, JOBSET, LWS, INDEXED_JOB, GENERIC)
}

# A controller that creates another's objects outranks it: a TrainJob makes a JobSet, which makes Jobs; the MPI
# operator's launcher is a Job's pod. MPIJob pods carry training-operator's job-name label too.
_SUPERSEDES = {"trainjob": {"jobset", "indexed-job"}, "jobset": {"indexed-job"},
               "mpijob": {"pytorchjob", "indexed-job"}}


def _claims(controller: Controller, pod: RawPod) -> bool:
    labels = _meta(pod)[1]
    if controller is MPIJOB:
        return labels.get(MPI_OPERATOR_NAME) == MPI_OPERATOR
    if controller is TRAINJOB:
        # Trainer v2 labels its Jobs, not always its pods; pods show it by a trainer.kubeflow.org/ label or by
        # the runtimes' convention: container "node" in replicated job "node", or in "launcher" when the MPI
        # runtime runs the launcher as a node (Trainer v2.0-v2.3 pkg/constants/constants.go Node, Launcher).
        containers = {c.get("name") for c in pod.get("spec", {}).get("containers", [])}
        return JOBSET_NAME in labels and (
            any(k.startswith(TRAINJOB_PREFIX) for k in labels)
            or (labels.get(JOBSET_RJOB) in ("node", "launcher") and "node" in containers)
        )
    return controller.claims(pod)


def detect_controller(pod: RawPod, options: Options) -> Controller:
    """The controller named by ``--controller``/``--selector``, else the one whose labels the pod carries."""
    name = _meta(pod)[0]
    if options.controller:
        try:
            return CONTROLLERS[options.controller]
        except KeyError:
            known = ", ".join(CONTROLLERS)
            raise InputError(f"--controller '{options.controller}' is unknown; use one of: {known}") from None
    if options.selector:
        return GENERIC
    found = {c.key for c in CONTROLLERS.values() if c is not GENERIC and _claims(c, pod)}
    for key in list(found):
        found -= _SUPERSEDES.get(key, set())
    if not found:
        raise InputError(
            f"pod '{name}': no controller labels found (Volcano, PyTorchJob, MPIJob, JobSet/TrainJob, "
            "LeaderWorkerSet, Indexed Job); pass --controller, or --selector with --index-label"
        )
    if len(found) > 1:
        raise InputError(
            f"pod '{name}': labels of several controllers disagree ({', '.join(sorted(found))}); "
            "pass --controller to choose one"
        )
    return CONTROLLERS[found.pop()]


def selector_matches(pod: RawPod, pairs: dict[str, str]) -> bool:
    labels = _meta(pod)[1]
    return all(labels.get(k) == v for k, v in pairs.items())
