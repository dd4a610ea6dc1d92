"""What every controller module answers, and the readings they share.

A controller answers three kinds of question, all pure:

* from one pod's labels: does this pod belong to me (``claims``), which job, role and index is it (``identify``),
  which DNS name its peers reach it by (``dns_name``), which label selector lists its peers (``selector``), which
  pod JobSet names the coordinator (``coordinator``);
* from the job's objects, which the shell reads through the API (``owner_path`` names the first, ``next_read``
  the ones it leads to, such as a TrainJob's runtime): how many pods each role has (``replica_counts``), what the
  job says that its pods do not (``owner_options``: MPI roles and slots), which roles the controller creates only
  once others are Ready (``waits_for``: JobSet ``dependsOn``, MPIJob ``launcherCreationPolicy``), where the first
  pod of a role stands in the index order (``first_index``), which pod the job names rank 0 (``named_first``:
  JobSet's ``spec.coordinator``), and an elastic minimum (``elastic_minimum``);
* of its job objects as kinds (``resources``: API group, version, kind, plural, whether the agent reads it and
  whether it holds pod templates): where each pod template is, how many pods it runs and what the job says about
  them (``pod_templates``), which ``inject`` and the webhook edit and ``replica_counts`` counts.

Label keys, field names and conventions are the controllers' own, read from their sources (each names the file).
This module holds the labels more than one controller reads: the Job controller's, which JobSet's pods carry too.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

from agent.core.model import Identity, Options, RawPod
from agent.core.pods.pod import PodMeta, meta_of
from agent.core.pods.validation import index_value, role_value
from agent.errors import InputError

# The Job controller's pod labels (k8s.io/api/batch/v1/types.go JobNameLabel, JobCompletionIndexAnnotation):
# an Indexed Job's pods carry them, and so do a JobSet's, whose replicated jobs are Indexed Jobs.
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOB_NAME = "batch.kubernetes.io/job-name"

# The port torchrun listens on for the master, by the container port's name: training-operator names it so
# (pkg/controller.v1/pytorch, "pytorchjob-port"), and so does Volcano's pytorch plugin
# (pkg/controllers/job/plugins/distributed-framework/pytorch/pytorch.go).
MASTER_PORT_NAME = "pytorchjob-port"
TORCHRUN_MASTER_PORT = 29500  # torchrun's default --master-port

Objects = Sequence[Mapping[str, Any]]  # the job's objects as read: the owner first, then what it led to


@dataclasses.dataclass(frozen=True)
class JobResource:
    """A kind of job object of a controller's API: the agent reads it (the RBAC manifests grant ``get``), or the
    webhook injects it (it holds pod templates; the webhook's rules name it), or both. ``version`` is the one the
    agent reads and the sandbox serves; ``short`` are kubectl's short names (the CRD's)."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool = True
    short: tuple[str, ...] = ()
    read: bool = True
    templates: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


@dataclasses.dataclass(frozen=True)
class PodTemplate:
    """One pod template of a job object, and what the object says about its pods."""

    role: str  # the role of its pods, as identify() names it
    place: str  # where it is, as a message names it after the object ("tasks[0] (master)"; "": the object's one)
    path: tuple[str | int, ...]  # its place in the object, key by key (the webhook patches at this JSON Pointer)
    template: Any  # what the object holds there: a pod template, or whatever a bad manifest put (then not one)
    replicas: int | None  # its pods at once (None: the object does not say, as a runtime that each TrainJob sizes)
    elastic: str | None = None  # MIN:MAX as an elastic job states them (PyTorchJob elasticPolicy)
    grows_to: int = 0  # the most pods an elastic job may grow to
    by_dns: bool = False  # the controller names the pods by DNS (hostname + subdomain)


def meta(pod: RawPod) -> PodMeta:
    """A pod's name, labels and annotations."""
    return meta_of(pod)


def required(pod: RawPod, key: str, *, fix: str) -> str:
    """A label the controller sets (falling back to the annotation of the same key, which Volcano and JobSet
    also set), checked as a label value: annotations are free text, and the value reaches files."""
    name, labels, annotations = meta(pod)
    value = labels.get(key, annotations.get(key))
    if value is None or value == "":
        raise InputError(f"pod '{name}': label '{key}' is missing; {fix}")
    return role_value(pod, key, value, fix=fix)  # type: ignore[arg-type]


def number(pod: RawPod, key: str, *, fix: str) -> int:
    """A non-negative integer label below 10^9 (falling back to the annotation of the same key)."""
    name, labels, annotations = meta(pod)
    raw = labels.get(key, annotations.get(key))
    if raw is None or raw == "":
        raise InputError(f"pod '{name}': label '{key}' is missing; {fix}")
    return index_value(pod, key, raw, fix=fix)  # type: ignore[arg-type]


def spec_dns(pod: RawPod) -> tuple[str, str] | None:
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
    """A count as a job object states it (replicas, parallelism, completions, size): a whole number from 0 up;
    absent, it is the API's default. Anything else is the API server's to refuse, and counts as the default
    here. The one reading of a count, for the pods the agent waits for and the size ``inject`` gives it."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def spec_of(obj: Any) -> Mapping[str, Any]:
    """An object's spec, or an empty one when the object or its spec is not a map."""
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    return spec if isinstance(spec, Mapping) else {}


def at(obj: Any, *keys: str) -> Any:
    """The value under ``keys`` in nested maps, or None when a level is missing or not a map."""
    for key in keys:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
        if obj is None:
            return None
    return obj


def list_at(obj: Any, *keys: str) -> list[Any]:
    """A list field (tasks, replicatedJobs); any other value is the API server's to refuse and holds nothing."""
    value = at(obj, *keys)
    return value if isinstance(value, list) else []


def map_at(obj: Any, *keys: str) -> Mapping[Any, Any]:
    """A map field (pytorchReplicaSpecs, leaderWorkerTemplate), or an empty one for any other value."""
    value = at(obj, *keys)
    return value if isinstance(value, Mapping) else {}


# The labels the Job controller puts on its pods (k8s.io/api/batch/v1/types.go JobNameLabel and the unprefixed one
# it keeps for earlier releases): a pod with one was made by a Job (an Indexed Job's, or a JobSet's Job's).
JOB_POD_LABELS = (JOB_NAME, "job-name")


def is_job_pod_by_dns(pod: Mapping[str, Any]) -> bool:
    """A Job's pod with a subdomain, as its Job's template has it: named by DNS (hostname <job>-<index>)."""
    labels = at(pod, "metadata", "labels")
    return bool(at(pod, "spec", "subdomain")) and isinstance(labels, Mapping) and any(
        key in labels for key in JOB_POD_LABELS)


def owner_ref(obj: Mapping[str, Any], group: str, kind: str) -> Mapping[str, Any] | None:
    """The ownerReference of ``obj`` to a ``kind`` of API group ``group`` (any version)."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("kind") == kind \
                and str(ref.get("apiVersion", "")).startswith(f"{group}/") and ref.get("name"):
            return ref
    return None


def owner_ref_path(pod: RawPod, resource: JobResource) -> str | None:
    """The API path of the pod's owner of ``resource``'s kind, at the version the ownerReference names."""
    namespace = pod.get("metadata", {}).get("namespace", "default")
    ref = owner_ref(pod, resource.group, resource.kind)
    return f"/apis/{ref['apiVersion']}/namespaces/{namespace}/{resource.plural}/{ref['name']}" if ref else None


def named_path(pod: RawPod, resource: JobResource, label: str) -> str | None:
    """The API path of the job object a pod's label names (at ``resource``'s version)."""
    metadata = pod.get("metadata", {})
    name = (metadata.get("labels") or {}).get(label)
    namespace = metadata.get("namespace", "default")
    return f"/apis/{resource.api_version}/namespaces/{namespace}/{resource.plural}/{name}" if name else None


@dataclasses.dataclass(frozen=True)
class FrameworkArgs:
    """What a job object says of a framework it runs, beyond that it runs it (a Volcano job's tensorflow plugin:
    its flags): which of the job's roles plays which of the framework's roles, and a port with where it was
    read."""

    roles: tuple[tuple[str, str], ...] = ()
    port: int | None = None
    source: str = ""
    container: str | None = None  # the container whose ports hold the port (the ray plugin's --headContainer)


@dataclasses.dataclass(frozen=True)
class OwnerOptions:
    """What the job's objects say that its pods do not: options for the ones the user left open, and a line per
    decision for the log."""

    options: Options
    notes: tuple[str, ...] = ()


class Controller(abc.ABC):
    """One controller's conventions. ``key`` is what ``--controller`` takes; ``labels`` are the pod label (and
    annotation) keys it reads, which the published rows keep; ``resources`` its job objects' kinds."""

    key: ClassVar[str]
    title: ClassVar[str]
    marker: ClassVar[str]
    labels: ClassVar[frozenset[str]] = frozenset()
    resources: ClassVar[tuple[JobResource, ...]] = ()
    # The controllers whose labels this one's pods carry too, because it creates their objects (a TrainJob makes
    # a JobSet, which makes Jobs): a pod that both claim is this one's.
    supersedes: ClassVar[frozenset[str]] = frozenset()
    default_roles: ClassVar[tuple[str, ...] | None] = None  # None: every role trains
    owner_is_job: ClassVar[bool] = False  # the pod's controlling owner is the job object (its uid names the job)
    checks_index: ClassVar[bool] = False  # a pod's index is below its role's replicas in the job object
    default_master_port: ClassVar[int] = TORCHRUN_MASTER_PORT
    fix: ClassVar[str] = "(or pass --controller)"

    # --- one pod ------------------------------------------------------------------------------------------

    def claims(self, pod: RawPod) -> bool:
        return self.marker in meta(pod).labels

    def job_of(self, pod: RawPod) -> str | None:
        """The job a pod belongs to, read from labels alone (no role or index needed)."""
        return meta(pod).labels.get(self.marker)

    @property
    def job_kind(self) -> JobResource | None:
        """The kind of object a job of this controller is (the first of its resources; None: no object)."""
        return self.resources[0] if self.resources else None

    def pods_selector(self, job: str) -> str:
        """The label selector of the pods of the job object named ``job`` (``topology-agent status``)."""
        return f"{self.marker}={job}"

    @abc.abstractmethod
    def identify(self, pod: RawPod, options: Options) -> Identity:
        """Role, index and job of one pod, by the controller's own labels (each controller says how)."""

    def dns_name(self, pod: RawPod, ident: Identity, namespace: str, cluster_domain: str | None) -> str | None:
        """The name peers reach the pod by: its hostname.subdomain when set, else the controller's convention
        (None: no DNS name, so the files need --address ip)."""
        if spec := spec_dns(pod):
            return qualify(f"{spec[0]}.{spec[1]}", namespace, cluster_domain)
        return None

    def selector(self, pod: RawPod, options: Options) -> str:
        """The label selector that lists this pod's peers through the API server."""
        return f"{self.marker}={meta(pod).labels[self.marker]}"

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

    def elastic_in_pod(self, pod: Mapping[str, Any]) -> str | None:
        """MIN:MAX of an elastic job, as the controller wrote it into the job's pod (the webhook's Pods)."""
        return None

    def names_by_dns(self, pod: Mapping[str, Any]) -> bool:
        """Whether the controller names this pod by DNS, as it names the pods of its template."""
        return False

    # --- the job's objects --------------------------------------------------------------------------------

    def owner_path(self, pod: RawPod) -> str | None:
        """API path of the object that says how big the job is; None when the pod itself says (LWS) or nothing
        does."""
        return None

    def next_read(self, objects: Objects) -> str | None:
        """The path of the next object to read after ``objects`` (the owner and what it led to), or None."""
        return None

    def pod_templates(self, job: Mapping[str, Any]) -> Iterator[PodTemplate]:
        """The pod templates of a job object of one of ``resources``' kinds, in the object's order: one for each
        role the object states, whether or not it holds a template there."""
        return iter(())

    def replica_counts(self, objects: Objects) -> dict[str, int]:
        """Pods per role, as the job object asks for them: its pod templates' replica counts."""
        if not objects:
            return {}
        return {t.role: t.replicas for t in self.pod_templates(objects[0]) if t.replicas is not None}

    def size_from_pod(self, pod: RawPod) -> tuple[dict[str, int], str] | None:
        """Pods per role as the pod itself says (LWS annotates it), and where it says so; or None."""
        return None

    def elastic_minimum(self, objects: Objects) -> int | None:
        """The fewest training pods the job runs with, when the job object is elastic."""
        return None

    def owner_options(self, objects: Objects, options: Options) -> OwnerOptions:
        return OwnerOptions(options)

    def untrained(self, job: Mapping[str, Any], roles: tuple[str, ...] | None) -> str | None:
        """Why no pod of the job object ``job`` would train, ``roles`` being the user's training roles (None: the
        controller's rule), for ``inject`` to refuse the job in one line; None: some pod trains, or the object
        alone cannot tell."""
        return None

    def waits_for(self, objects: Objects) -> dict[str, frozenset[str]]:
        """role -> the roles whose pods must be Ready before the controller creates this role's pods."""
        return {}

    def index_base(self, role: str) -> int:
        """The last index part of a role's first pod: where the indices of its pods start counting (hot spares'
        seats count the missing ones from here, core/plan/spares.py)."""
        return 0

    def first_index(self, role: str, objects: Objects) -> tuple[int, ...] | None:
        """The index (as ``identify`` gives it) of the role's first pod in rank order."""
        return (0,)

    def named_first(self, objects: Objects) -> tuple[str, tuple[int, ...]] | None:
        """(role, index) of the pod the job object names rank 0, when it names one (the object's counterpart of
        ``coordinator``)."""
        return None

    def frameworks(self, objects: Objects) -> tuple[str, ...]:
        """The frameworks (agent/core/frameworks) whose files the job's pods get besides torch.env. ``objects``
        is empty where none were read (render, explain): then what the controller implies by itself."""
        return ()

    def framework_port(self, framework: str) -> tuple[str | None, int | None] | None:
        """The container port name (looked up on rank 0's trainer container) and the default port this
        controller gives ``framework``; None: no convention of its own."""
        return None

    def framework_container(self, framework: str) -> str | None:
        """The container (by name) whose ports hold ``framework``'s port where the controller names one (Volcano's
        ray plugin: the head task's ``head``); None: the trainer container."""
        return None

    def framework_args(self, objects: Objects) -> dict[str, FrameworkArgs]:
        """What the job's objects say of each framework they imply: role names and ports (empty: nothing)."""
        return {}

    def framework_roles(self, framework: str) -> Mapping[str, str] | None:
        """The controller's own naming of ``framework``'s roles, role -> the framework's role (PaddleJob's Master
        is Paddle's parameter server); None: the framework reads the role names itself."""
        return None

    def framework_fields(self, framework: str) -> tuple[tuple[str, str], ...]:
        """Fields the controller writes into ``framework``'s configuration that no fact of the plan decides
        (TFJob's ``environment`` in TF_CONFIG), so that the agent's file says what the controller's said."""
        return ()

    # Roles whose pods say themselves whether they train, where neither the user nor the job's objects did
    # (Trainer's MPI launcher runs container 'node' exactly when it is a node): ``trains_by_pod`` decides.
    roles_by_pod: ClassVar[frozenset[str]] = frozenset()

    def trains_by_pod(self, pod: RawPod, role: str) -> bool:
        """Whether a pod of one of ``roles_by_pod`` trains, by what the pod shows."""
        return True

    def shows_training(self, pod: RawPod) -> bool:
        """Whether a pod is of one of ``roles_by_pod``, by its labels alone (the planner then plans again)."""
        return False
