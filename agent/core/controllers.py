"""Everything the agent knows about each controller, one class per controller: nothing about a controller lives
outside this module.

A controller answers two kinds of question, both pure:

* from one pod's labels: does this pod belong to me (``claims``), which job, role and index is it (``identify``),
  which DNS name its peers reach it by (``dns_name``), which label selector lists its peers (``selector``), which
  pod JobSet names the coordinator (``coordinator``);
* from the job's objects, which the shell reads through the API (``owner_path`` names the first, ``next_read``
  the ones it leads to, such as a TrainJob's runtime): how many pods each role has (``replica_counts``), what the
  job says that its pods do not (``owner_options``: MPI roles and slots), which roles the controller creates only
  once others are Ready (``waits_for``: JobSet ``dependsOn``, MPIJob ``launcherCreationPolicy``), where the first
  pod of a role stands in the index order (``first_index``), and an elastic minimum (``elastic_minimum``).

Label keys, field names and conventions are the controllers' own, read from their sources (each names the file).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

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

# The port torchrun listens on for the master, by the container port's name: training-operator names it so
# (pkg/controller.v1/pytorch, "pytorchjob-port"), and so does Volcano's pytorch plugin
# (pkg/controllers/job/plugins/distributed-framework/pytorch/pytorch.go).
MASTER_PORT_NAME = "pytorchjob-port"
TORCHRUN_MASTER_PORT = 29500  # torchrun's default --master-port

Objects = Sequence[Mapping[str, Any]]  # the job's objects as read: the owner first, then what it led to


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


def replicas(value: Any, default: int = 1) -> int:
    """A replica count as a job object holds it (absent: the API's default)."""
    if isinstance(value, bool):
        return default
    try:
        return int(value) if value is not None else default
    except (TypeError, ValueError):
        return default


def _spec(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    spec = (obj or {}).get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _owner_ref(obj: Mapping[str, Any], group: str, kind: str) -> Mapping[str, Any] | None:
    """The ownerReference of ``obj`` to a ``kind`` of API group ``group`` (any version)."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("kind") == kind \
                and str(ref.get("apiVersion", "")).startswith(f"{group}/") and ref.get("name"):
            return ref
    return None


@dataclasses.dataclass(frozen=True)
class OwnerOptions:
    """What the job's objects say that its pods do not: options for the ones the user left open, and a line per
    decision for the log."""

    options: Options
    notes: tuple[str, ...] = ()


class Controller(abc.ABC):
    """One controller's conventions. ``key`` is what ``--controller`` takes; ``labels`` are the pod label (and
    annotation) keys it reads, which the published rows keep."""

    key: ClassVar[str]
    title: ClassVar[str]
    marker: ClassVar[str]
    labels: ClassVar[frozenset[str]] = frozenset()
    default_roles: ClassVar[tuple[str, ...] | None] = None  # None: every role trains
    owner_is_job: ClassVar[bool] = False  # the pod's controlling owner is the job object (its uid names the job)
    checks_index: ClassVar[bool] = False  # a pod's index is below its role's replicas in the job object
    default_master_port: ClassVar[int] = TORCHRUN_MASTER_PORT
    fix: ClassVar[str] = "(or pass --controller)"

    # --- one pod ------------------------------------------------------------------------------------------

    def claims(self, pod: RawPod) -> bool:
        return self.marker in _meta(pod)[1]

    def job_of(self, pod: RawPod) -> str | None:
        """The job a pod belongs to, read from labels alone (no role or index needed)."""
        return _meta(pod)[1].get(self.marker)

    @abc.abstractmethod
    def identify(self, pod: RawPod, options: Options) -> Identity:
        """Role, index and job of one pod, by the controller's own labels (each controller below says how)."""

    def dns_name(self, pod: RawPod, ident: Identity, namespace: str, cluster_domain: str | None) -> str | None:
        """The name peers reach the pod by: its hostname.subdomain when set, else the controller's convention
        (None: no DNS name, so the files need --address ip)."""
        if spec := _spec_dns(pod):
            return qualify(f"{spec[0]}.{spec[1]}", namespace, cluster_domain)
        return None

    def selector(self, pod: RawPod, options: Options) -> str:
        """The label selector that lists this pod's peers through the API server."""
        return f"{self.marker}={_meta(pod)[1][self.marker]}"

    def coordinator(self, pod: RawPod) -> str | None:
        """``<hostname>.<subdomain>`` of the pod the controller names rank 0, when it names one."""
        return None

    def owns_directly(self, ident: Identity) -> bool:
        """Whether the job object itself owns this pod (its ownerReference carries the job's uid)."""
        return self.owner_is_job

    def training_roles(self, options: Options) -> tuple[str, ...] | None:
        """The roles that train, in rank order: the user's, else the controller's (None: every role present)."""
        return options.roles if options.roles is not None else self.default_roles

    def master_port(self, container_ports: Sequence[Mapping[str, Any]]) -> tuple[int, str] | None:
        """The master port a container declares by the controller's port name."""
        for port in container_ports:
            if port.get("name") == MASTER_PORT_NAME and port.get("containerPort"):
                return int(port["containerPort"]), f"port '{MASTER_PORT_NAME}'"
        return None

    # --- the job's objects --------------------------------------------------------------------------------

    def owner_path(self, pod: RawPod) -> str | None:
        """API path of the object that says how big the job is; None when the pod itself says (LWS) or nothing
        does."""
        return None

    def next_read(self, objects: Objects) -> str | None:
        """The path of the next object to read after ``objects`` (the owner and what it led to), or None."""
        return None

    def replica_counts(self, objects: Objects) -> dict[str, int]:
        """Pods per role, as the job object asks for them."""
        return {}

    def size_from_pod(self, pod: RawPod) -> tuple[dict[str, int], str] | None:
        """Pods per role as the pod itself says (LWS annotates it), and where it says so; or None."""
        return None

    def elastic_minimum(self, objects: Objects) -> int | None:
        """The fewest training pods the job runs with, when the job object is elastic."""
        return None

    def owner_options(self, objects: Objects, options: Options) -> OwnerOptions:
        return OwnerOptions(options)

    def waits_for(self, objects: Objects) -> dict[str, frozenset[str]]:
        """role -> the roles whose pods must be Ready before the controller creates this role's pods."""
        return {}

    def first_index(self, role: str, objects: Objects) -> tuple[int, ...] | None:
        """The index (as ``identify`` gives it) of the role's first pod in rank order."""
        return (0,)

    def frameworks(self, objects: Objects) -> tuple[str, ...]:
        """The frameworks (agent/core/frameworks) whose files the job's pods get besides torch.env. ``objects``
        is empty where none were read (render, explain): then what the controller implies by itself."""
        return ()

    def framework_port(self, framework: str) -> tuple[str | None, int | None] | None:
        """The container port name (looked up on rank 0's trainer container) and the default port this
        controller gives ``framework``; None: no convention of its own."""
        return None


# --- Volcano Job ---------------------------------------------------------------------------------------

class Volcano(Controller):
    key, title, marker = "volcano", "Volcano Job", VOLCANO_JOB
    labels = frozenset({VOLCANO_JOB, VOLCANO_TASK, VOLCANO_INDEX})
    default_roles = ("master", "worker")  # the pytorch plugin's --master and --worker defaults
    owner_is_job = True
    checks_index = True

    def identify(self, pod: RawPod, options: Options) -> Identity:
        fix = "the pod must be created by a Volcano Job (or pass --controller)"
        job = _required(pod, VOLCANO_JOB, fix=fix)
        role = _required(pod, VOLCANO_TASK, fix=fix)
        index = _number(pod, VOLCANO_INDEX, fix="Volcano >= 1.7 sets it; set it on the pod or use --selector")
        return Identity(job=job, role=role, index=(index,), ordinal=index)

    def dns_name(self, pod: RawPod, ident: Identity, namespace: str, cluster_domain: str | None) -> str:
        # Volcano's svc plugin gives every pod hostname=<pod name>, subdomain=<job name> and a headless Service.
        hostname, subdomain = _spec_dns(pod) or (_meta(pod)[0], ident.job)
        return qualify(f"{hostname}.{subdomain}", namespace, cluster_domain)

    def owner_path(self, pod: RawPod) -> str | None:
        return _owner_path(pod, "batch.volcano.sh", "Job", "jobs")

    def replica_counts(self, objects: Objects) -> dict[str, int]:
        tasks = _spec(objects[0] if objects else None).get("tasks") or []
        return {t.get("name", ""): replicas(t.get("replicas")) for t in tasks if isinstance(t, Mapping)}


def _owner_path(pod: RawPod, group: str, kind: str, plural: str) -> str | None:
    namespace = pod.get("metadata", {}).get("namespace", "default")
    ref = _owner_ref(pod, group, kind)  # type: ignore[arg-type]
    return f"/apis/{ref['apiVersion']}/namespaces/{namespace}/{plural}/{ref['name']}" if ref else None


# --- Kubeflow PyTorchJob (training-operator v1) ----------------------------------------------------------

class PyTorchJob(Controller):
    key, title, marker = "pytorchjob", "Kubeflow PyTorchJob", PYTORCHJOB_JOB
    labels = frozenset({PYTORCHJOB_JOB, PYTORCHJOB_TYPE, PYTORCHJOB_INDEX})
    default_roles = ("master", "worker")
    owner_is_job = True
    checks_index = True

    def identify(self, pod: RawPod, options: Options) -> Identity:
        fix = "the pod must be created by a Kubeflow PyTorchJob (or pass --controller)"
        job = _required(pod, PYTORCHJOB_JOB, fix=fix)
        role = _required(pod, PYTORCHJOB_TYPE, fix=fix).lower()
        index = _number(pod, PYTORCHJOB_INDEX, fix=fix)
        return Identity(job=job, role=role, index=(index,), ordinal=index)

    def dns_name(self, pod: RawPod, ident: Identity, namespace: str, cluster_domain: str | None) -> str:
        # training-operator creates one headless Service per replica, named <job>-<replica-type>-<index>.
        if spec := _spec_dns(pod):
            return qualify(f"{spec[0]}.{spec[1]}", namespace, cluster_domain)
        return qualify(f"{ident.job}-{ident.role}-{ident.ordinal}", namespace, cluster_domain)

    def owner_path(self, pod: RawPod) -> str | None:
        return _owner_path(pod, "kubeflow.org", "PyTorchJob", "pytorchjobs")

    def replica_counts(self, objects: Objects) -> dict[str, int]:
        specs = _spec(objects[0] if objects else None).get("pytorchReplicaSpecs") or {}
        return {k.lower(): replicas(v.get("replicas")) for k, v in specs.items() if isinstance(v, Mapping)}

    def elastic_minimum(self, objects: Objects) -> int | None:
        # The operator's elastic job: torchrun starts once its minimum is there (elasticPolicy.minReplicas).
        policy = _spec(objects[0] if objects else None).get("elasticPolicy")
        low = policy.get("minReplicas") if isinstance(policy, Mapping) else None
        return max(1, low) if isinstance(low, int) and not isinstance(low, bool) else None


# --- MPIJob (MPI operator v2): a launcher runs mpirun, workers run the ranks ------------------------------------

class MpiJob(Controller):
    key, title, marker = "mpijob", "MPIJob (MPI operator v2)", MPI_OPERATOR_NAME
    labels = frozenset({PYTORCHJOB_JOB, PYTORCHJOB_INDEX, MPI_OPERATOR_NAME, MPI_JOB_ROLE})
    default_roles = ("worker",)  # the launcher runs mpirun; runLauncherAsWorker makes it a node (owner_options)
    checks_index = True

    def owns_directly(self, ident: Identity) -> bool:
        return ident.role == "worker"  # the launcher's owner is a batch Job the MPIJob owns

    def claims(self, pod: RawPod) -> bool:
        return _meta(pod)[1].get(MPI_OPERATOR_NAME) == MPI_OPERATOR

    def job_of(self, pod: RawPod) -> str | None:
        return _meta(pod)[1].get(PYTORCHJOB_JOB)

    def identify(self, pod: RawPod, options: Options) -> Identity:
        fix = "the pod must be created by an MPIJob of the MPI operator v2 (or pass --controller)"
        job = _required(pod, PYTORCHJOB_JOB, fix=fix)
        role = _required(pod, MPI_JOB_ROLE, fix=fix)
        if role not in ("launcher", "worker"):
            raise InputError(f"pod '{_meta(pod)[0]}': label '{MPI_JOB_ROLE}' is '{role}', not launcher or worker; "
                             f"{fix}")
        index = 0 if role == "launcher" else _number(pod, PYTORCHJOB_INDEX, fix=fix)
        return Identity(job=job, role=role, index=(index,), ordinal=index)

    def dns_name(self, pod: RawPod, ident: Identity, namespace: str, cluster_domain: str | None) -> str:
        # The operator sets hostname <job>-launcher / <job>-worker-<i> and subdomain <job> (its headless Service).
        if spec := _spec_dns(pod):
            return qualify(f"{spec[0]}.{spec[1]}", namespace, cluster_domain)
        host = f"{ident.job}-launcher" if ident.role == "launcher" else f"{ident.job}-worker-{ident.ordinal}"
        return qualify(f"{host}.{ident.job}", namespace, cluster_domain)

    def selector(self, pod: RawPod, options: Options) -> str:
        labels = _meta(pod)[1]
        return f"{PYTORCHJOB_JOB}={labels[PYTORCHJOB_JOB]},{MPI_OPERATOR_NAME}={labels[MPI_OPERATOR_NAME]}"

    def owner_path(self, pod: RawPod) -> str | None:
        # The launcher's owner is a batch Job; the job-name label names the MPIJob.
        meta = pod.get("metadata", {})
        name = (meta.get("labels") or {}).get(PYTORCHJOB_JOB)
        return f"/apis/kubeflow.org/v2beta1/namespaces/{meta.get('namespace', 'default')}/mpijobs/{name}" \
            if name else None

    def replica_counts(self, objects: Objects) -> dict[str, int]:
        specs = _spec(objects[0] if objects else None).get("mpiReplicaSpecs") or {}
        return {k.lower(): replicas(v.get("replicas")) for k, v in specs.items() if isinstance(v, Mapping)}

    def owner_options(self, objects: Objects, options: Options) -> OwnerOptions:
        """``runLauncherAsWorker`` makes the launcher a node (first, as the operator's hostfile lists it) and
        ``slotsPerWorker`` is the slots of every host (newConfigMap, pkg/controller/mpi_job_controller.go)."""
        spec = _spec(objects[0] if objects else None)
        notes = []
        if options.roles is None and spec.get("runLauncherAsWorker") is True:
            options = dataclasses.replace(options, roles=("launcher", "worker"))
            notes.append("MPIJob runLauncherAsWorker: the launcher is node rank 0")
        slots = spec.get("slotsPerWorker")
        if options.nproc_per_node is None and isinstance(slots, int) and not isinstance(slots, bool) \
                and 1 <= slots <= 1_000_000:
            options = dataclasses.replace(options, nproc_per_node=slots)
            notes.append(f"MPIJob slotsPerWorker: {slots} slots per host")
        return OwnerOptions(options, tuple(notes))

    def frameworks(self, objects: Objects) -> tuple[str, ...]:
        return ("mpi",)  # the launcher runs mpirun: mpi.env points it at the live hostfile

    def waits_for(self, objects: Objects) -> dict[str, frozenset[str]]:
        # v0.6.0+: launcherCreationPolicy WaitForWorkersReady creates the launcher once every worker is Ready
        # (pkg/apis/kubeflow/v2beta1/types.go).
        if _spec(objects[0] if objects else None).get("launcherCreationPolicy") == "WaitForWorkersReady":
            return {"launcher": frozenset({"worker"})}
        return {}


# --- JobSet and Kubeflow TrainJob (Trainer v2 runs on JobSet) ----------------------------------------------

class JobSet(Controller):
    key, title, marker = "jobset", "JobSet", JOBSET_NAME
    labels = frozenset({JOBSET_NAME, JOBSET_RJOB, JOBSET_JOB_INDEX, JOBSET_GLOBAL_INDEX, COMPLETION_INDEX,
                        COORDINATOR})

    def identify(self, pod: RawPod, options: Options) -> Identity:
        fix = f"the pod must be created by a {self.title} (or pass --controller)"
        _, labels, annotations = _meta(pod)
        job = _required(pod, JOBSET_NAME, fix=fix)
        role = _required(pod, JOBSET_RJOB, fix=fix)
        completion = _number(pod, COMPLETION_INDEX, fix="the JobSet's Jobs must use completionMode: Indexed")
        if JOBSET_GLOBAL_INDEX in labels or JOBSET_GLOBAL_INDEX in annotations:
            job_index = _number(pod, JOBSET_GLOBAL_INDEX, fix=fix)
        else:
            job_index = _number(pod, JOBSET_JOB_INDEX, fix=fix)
        return Identity(job=job, role=role, index=(job_index, completion), ordinal=-1)

    def dns_name(self, pod: RawPod, ident: Identity, namespace: str, cluster_domain: str | None) -> str:
        # JobSet names Jobs <jobset>-<rjob>-<job-index>; an Indexed Job's pod hostname is <job>-<completion index>;
        # the subdomain is the JobSet's headless Service (named after the JobSet unless spec.network.subdomain).
        if spec := _spec_dns(pod):
            return qualify(f"{spec[0]}.{spec[1]}", namespace, cluster_domain)
        job_index = _meta(pod)[1].get(JOBSET_JOB_INDEX, str(ident.index[0]))
        return qualify(f"{ident.job}-{ident.role}-{job_index}-{ident.index[1]}.{ident.job}", namespace,
                       cluster_domain)

    def coordinator(self, pod: RawPod) -> str | None:
        # JobSet >= v0.6.0 labels (and annotates) every pod with the coordinator = <pod hostname>.<subdomain> of
        # the pod its spec.coordinator names (CoordinatorEndpoint in pkg/controllers/jobset_controller.go).
        _, labels, annotations = _meta(pod)
        return labels.get(COORDINATOR) or annotations.get(COORDINATOR) or None

    def owner_path(self, pod: RawPod) -> str | None:
        meta = pod.get("metadata", {})
        name = (meta.get("labels") or {}).get(JOBSET_NAME)
        return f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{meta.get('namespace', 'default')}/jobsets/{name}" \
            if name else None

    def next_read(self, objects: Objects) -> str | None:
        """A JobSet that Trainer made: its TrainJob, then the TrainJob's runtime (owner_options reads both)."""
        if len(objects) == 1:
            ref = _owner_ref(objects[0], "trainer.kubeflow.org", "TrainJob")
            if ref is None:
                return None
            namespace = (objects[0].get("metadata") or {}).get("namespace", "default")
            return f"/apis/{ref['apiVersion']}/namespaces/{namespace}/trainjobs/{ref['name']}"
        if len(objects) == 2:
            return _runtime_path(objects[1])
        return None

    def replica_counts(self, objects: Objects) -> dict[str, int]:
        counts = {}
        for rjob in _replicated_jobs(objects):
            job_spec = (rjob.get("template") or {}).get("spec") or {}
            parallelism = replicas(job_spec.get("parallelism"))
            completions = replicas(job_spec.get("completions"), parallelism)
            counts[rjob.get("name", "")] = replicas(rjob.get("replicas")) * min(parallelism, completions)
        return counts

    def owner_options(self, objects: Objects, options: Options) -> OwnerOptions:
        """A JobSet that a TrainJob owns is the TrainJob's, whatever its pods' labels say (a launcher that runs
        container "launcher" looks like a plain JobSet's pod)."""
        if options.controller is None and objects and _owner_ref(objects[0], "trainer.kubeflow.org", "TrainJob"):
            options = dataclasses.replace(options, controller=TRAINJOB.key)
            found = TRAINJOB.owner_options(objects, options)
            return OwnerOptions(found.options, ("the JobSet belongs to a TrainJob", *found.notes))
        return OwnerOptions(options)

    def waits_for(self, objects: Objects) -> dict[str, frozenset[str]]:
        """``dependsOn`` (JobSet v0.8.0+: the replicated job is created once the named ones are Ready or
        Complete) and the deprecated ``startupPolicy: InOrder`` (each once the one before is Ready)
        (api/jobset/v1alpha2/jobset_types.go)."""
        rjobs = _replicated_jobs(objects)
        spec = _spec(objects[0] if objects else None)
        policy = spec.get("startupPolicy")
        in_order = isinstance(policy, Mapping) and policy.get("startupPolicyOrder") == "InOrder"
        waits: dict[str, frozenset[str]] = {}
        for position, rjob in enumerate(rjobs):
            needs = {d.get("name") for d in rjob.get("dependsOn") or [] if isinstance(d, Mapping) and d.get("name")}
            if in_order and position:
                needs.add(rjobs[position - 1].get("name"))
            if needs:
                waits[rjob.get("name", "")] = frozenset(str(n) for n in needs)
        return waits

    def first_index(self, role: str, objects: Objects) -> tuple[int, ...] | None:
        """(job-global-index of the role's first Job, completion 0): the global index counts the Jobs of the
        replicated jobs before it (pkg/controllers/jobset_controller.go globalJobIndex)."""
        global_index = 0
        for rjob in _replicated_jobs(objects):
            if rjob.get("name") == role:
                return global_index, 0
            global_index += replicas(rjob.get("replicas"))
        return None


def _replicated_jobs(objects: Objects) -> list[Mapping[str, Any]]:
    rjobs = _spec(objects[0] if objects else None).get("replicatedJobs") or []
    return [r for r in rjobs if isinstance(r, Mapping)]


def _runtime_path(trainjob: Mapping[str, Any]) -> str | None:
    """The TrainJob's runtime: ``spec.runtimeRef`` (kind ClusterTrainingRuntime unless it says TrainingRuntime;
    pkg/apis/trainer/v1alpha1/trainjob_types.go RuntimeRef)."""
    ref = _spec(trainjob).get("runtimeRef")
    if not isinstance(ref, Mapping) or not ref.get("name"):
        return None
    version = str(trainjob.get("apiVersion", "trainer.kubeflow.org/v1alpha1")).rpartition("/")[2]
    group = ref.get("apiGroup") or "trainer.kubeflow.org"
    if ref.get("kind") == "TrainingRuntime":
        namespace = (trainjob.get("metadata") or {}).get("namespace", "default")
        return f"/apis/{group}/{version}/namespaces/{namespace}/trainingruntimes/{ref['name']}"
    return f"/apis/{group}/{version}/clustertrainingruntimes/{ref['name']}"


# Trainer v2's replicated job names (pkg/constants/constants.go Node, Launcher, v2.0.0-v2.3.0).
TRAINER_NODE = "node"
TRAINER_LAUNCHER = "launcher"


class TrainJob(JobSet):
    key, title, marker = "trainjob", "Kubeflow TrainJob (via JobSet)", TRAINJOB_PREFIX
    # The nodes, then the launcher when the MPI runtime runs it as a node. In the cluster the runtime decides
    # (owner_options); offline, pass --roles node for a runtime with runLauncherAsNode: false.
    default_roles = (TRAINER_NODE, TRAINER_LAUNCHER)
    default_master_port = TRAINJOB_MASTER_PORT

    def claims(self, pod: RawPod) -> bool:
        # Trainer v2 labels its Jobs, not always its pods; pods show it by a trainer.kubeflow.org/ label or by the
        # runtimes' convention: container "node" in replicated job "node", or in "launcher" when the MPI runtime
        # runs the launcher as a node. Any other pod of a TrainJob's JobSet is known as such once the JobSet is
        # read (JobSet.owner_options).
        labels = _meta(pod)[1]
        containers = {c.get("name") for c in pod.get("spec", {}).get("containers", [])}
        return JOBSET_NAME in labels and (
            any(k.startswith(TRAINJOB_PREFIX) for k in labels)
            or (labels.get(JOBSET_RJOB) in (TRAINER_NODE, TRAINER_LAUNCHER) and TRAINER_NODE in containers))

    def job_of(self, pod: RawPod) -> str | None:
        return _meta(pod)[1].get(JOBSET_NAME)

    def selector(self, pod: RawPod, options: Options) -> str:
        return f"{JOBSET_NAME}={_meta(pod)[1][JOBSET_NAME]}"

    def owner_options(self, objects: Objects, options: Options) -> OwnerOptions:
        """On an MPI runtime, Trainer's hostfile lists the pods of replicated job ``node``, and of ``launcher``
        only when ``runLauncherAsNode`` (isNode and buildHostFileConfigMap in
        pkg/runtime/framework/plugins/mpi/mpi.go, v2.0.0-v2.3.0), in the runtime's replicated-job order, with
        ``numProcPerNode`` slots (the TrainJob's ``trainer.numProcPerNode`` first)."""
        runtime = objects[2] if len(objects) > 2 else None
        mpi = (_spec(runtime).get("mlPolicy") or {}).get("mpi") if runtime is not None else None
        if not isinstance(mpi, Mapping):
            return OwnerOptions(options)
        notes = []
        name = (runtime or {}).get("metadata", {}).get("name", "?")
        if options.roles is None:
            as_node = mpi.get("runLauncherAsNode") is True
            order = [str(r.get("name")) for r in _replicated_jobs(objects)]
            roles = tuple(r for r in order if r == TRAINER_NODE or (as_node and r == TRAINER_LAUNCHER)) \
                or (TRAINER_NODE,)
            options = dataclasses.replace(options, roles=roles)
            notes.append(f"runtime '{name}' mlPolicy.mpi.runLauncherAsNode {str(as_node).lower()}: training roles "
                         f"{', '.join(roles)}")
        # numProcPerNode: the TrainJob's first, else the runtime's (default 1); 1 means "the GPUs of a node if it has
        # more than one, else 1" (EnforceMLPolicy), which the container's accelerators give.
        trainer = _spec(objects[1]).get("trainer") if len(objects) > 1 else None
        asked = trainer.get("numProcPerNode") if isinstance(trainer, Mapping) else None
        runtime_slots = mpi.get("numProcPerNode", 1)
        slots: int | Literal["accelerators"] | None = None
        if _count(asked):
            slots, why = asked, "the TrainJob's trainer.numProcPerNode"  # type: ignore[assignment]
        elif _count(runtime_slots, 2):
            slots, why = runtime_slots, f"runtime '{name}' mlPolicy.mpi.numProcPerNode"
        elif runtime_slots == 1:
            slots, why = "accelerators", f"runtime '{name}' mlPolicy.mpi.numProcPerNode 1: the node's GPUs, else 1"
        if options.nproc_per_node is None and slots is not None:
            options = dataclasses.replace(options, nproc_per_node=slots)
            notes.append(f"slots per host from {why}")
        return OwnerOptions(options, tuple(notes))


def _count(value: object, low: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= 1_000_000


# --- LeaderWorkerSet: one group is one training world ---------------------------------------------------

class LeaderWorkerSet(Controller):
    key, title, marker = "lws", "LeaderWorkerSet", LWS_NAME
    labels = frozenset({LWS_NAME, LWS_GROUP, LWS_WORKER, LWS_SIZE})
    default_roles = ("leader", "worker")

    def identify(self, pod: RawPod, options: Options) -> Identity:
        fix = "the pod must be created by a LeaderWorkerSet (or pass --controller)"
        name = _required(pod, LWS_NAME, fix=fix)
        group = _number(pod, LWS_GROUP, fix=fix)
        worker = _number(pod, LWS_WORKER, fix=fix)
        role = "leader" if worker == 0 else "worker"
        return Identity(job=f"{name}/{group}", role=role, index=(worker,), ordinal=worker)

    def job_of(self, pod: RawPod) -> str | None:
        labels = _meta(pod)[1]
        return f"{labels[LWS_NAME]}/{labels.get(LWS_GROUP)}" if LWS_NAME in labels else None

    def dns_name(self, pod: RawPod, ident: Identity, namespace: str, cluster_domain: str | None) -> str:
        # The LWS webhook sets hostname <lws>-<group>[-<worker>] and subdomain <lws> (the shared headless Service).
        if spec := _spec_dns(pod):
            return qualify(f"{spec[0]}.{spec[1]}", namespace, cluster_domain)
        lws, group = ident.job.split("/")
        host = f"{lws}-{group}" if ident.index[0] == 0 else f"{lws}-{group}-{ident.index[0]}"
        return qualify(f"{host}.{lws}", namespace, cluster_domain)

    def selector(self, pod: RawPod, options: Options) -> str:
        labels = _meta(pod)[1]
        return f"{LWS_NAME}={labels[LWS_NAME]},{LWS_GROUP}={labels[LWS_GROUP]}"

    def size_from_pod(self, pod: RawPod) -> tuple[dict[str, int], str] | None:
        raw = _meta(pod)[2].get(LWS_SIZE)
        if raw is None or not raw.isascii() or not raw.isdigit() or len(raw) > 9:
            return None
        size = int(raw)
        return {"leader": 1, "worker": size - 1}, f"annotation {LWS_SIZE}"


# --- plain Indexed Job ------------------------------------------------------------------------------------

class IndexedJob(Controller):
    key, title, marker = "indexed-job", "Indexed Job", JOB_NAME
    labels = frozenset({JOB_NAME, COMPLETION_INDEX})
    owner_is_job = True

    def identify(self, pod: RawPod, options: Options) -> Identity:
        job = _required(pod, JOB_NAME, fix="the pod must be created by a batch/v1 Job (or pass --controller)")
        index = _number(pod, COMPLETION_INDEX, fix="the Job must use completionMode: Indexed")
        return Identity(job=job, role="worker", index=(index,), ordinal=index)

    # dns_name: the Job controller sets hostname <job>-<index> only when the template has a subdomain; without a
    # headless Service of that name there is no DNS record, so None makes the caller ask for --address ip.

    def owner_path(self, pod: RawPod) -> str | None:
        return _owner_path(pod, "batch", "Job", "jobs")

    def replica_counts(self, objects: Objects) -> dict[str, int]:
        spec = _spec(objects[0] if objects else None)
        parallelism = replicas(spec.get("parallelism"))
        return {"worker": min(parallelism, replicas(spec.get("completions"), parallelism))}


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


class Generic(Controller):
    key, title, marker = "selector", "label selector", ""

    def claims(self, pod: RawPod) -> bool:
        return False  # chosen by --selector only

    def job_of(self, pod: RawPod) -> str | None:
        return None

    def identify(self, pod: RawPod, options: Options) -> Identity:
        if not options.index_label:
            raise InputError("--selector needs --index-label KEY (the label holding each pod's index)")
        index = _number(pod, options.index_label, fix="every pod the selector matches needs it")
        return Identity(job=options.selector or "", role="worker", index=(index,), ordinal=index)

    def selector(self, pod: RawPod, options: Options) -> str:
        return options.selector or ""


VOLCANO = Volcano()
PYTORCHJOB = PyTorchJob()
MPIJOB = MpiJob()
TRAINJOB = TrainJob()
JOBSET = JobSet()
LWS = LeaderWorkerSet()
INDEXED_JOB = IndexedJob()
GENERIC = Generic()

CONTROLLERS: dict[str, Controller] = {
    c.key: c for c in (VOLCANO, PYTORCHJOB, MPIJOB, TRAINJOB, JOBSET, LWS, INDEXED_JOB, GENERIC)
}

# Every pod label (and annotation) key some controller reads: the published rows keep these.
ALL_LABELS = frozenset().union(*(c.labels for c in CONTROLLERS.values()))


def is_read_label(key: str) -> bool:
    """A label some controller reads (TrainJob's claim reads any ``trainer.kubeflow.org/`` label)."""
    return key in ALL_LABELS or key.startswith(TRAINJOB_PREFIX)

# A controller that creates another's objects outranks it: a TrainJob makes a JobSet, which makes Jobs; the MPI
# operator's launcher is a Job's pod. MPIJob pods carry training-operator's job-name label too.
_SUPERSEDES = {"trainjob": {"jobset", "indexed-job"}, "jobset": {"indexed-job"},
               "mpijob": {"pytorchjob", "indexed-job"}}


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
    found = {c.key for c in CONTROLLERS.values() if c.claims(pod)}
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
