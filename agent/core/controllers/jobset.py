"""JobSet (jobset.x-k8s.io) and Kubeflow TrainJob (trainer.kubeflow.org: Trainer v2 runs each TrainJob as a JobSet
built from a TrainingRuntime or ClusterTrainingRuntime). A JobSet's replicated jobs are Indexed Jobs behind one
headless Service; its pods carry the Job controller's labels too."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Literal

from agent.core.controllers.base import (
    COMPLETION_INDEX,
    Controller,
    JobResource,
    Objects,
    OwnerOptions,
    PodTemplate,
    at,
    is_job_pod_by_dns,
    list_at,
    meta,
    named_path,
    number,
    owner_ref,
    qualify,
    replicas,
    required,
    spec_dns,
    spec_of,
)
from agent.core.injected import TRAINJOB_MASTER_PORT
from agent.core.model import Identity, Options, RawPod

JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_RJOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOBSET_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
COORDINATOR = "jobset.sigs.k8s.io/coordinator"  # api/jobset/v1alpha2/jobset_types.go CoordinatorKey, v0.6.0+
TRAINJOB_PREFIX = "trainer.kubeflow.org/"

JOBSETS = JobResource("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")
# Trainer v2's kinds (pkg/apis/trainer/v1alpha1): a TrainJob holds no pod template (its runtime does), and
# ClusterTrainingRuntime is cluster-scoped.
TRAINER = "trainer.kubeflow.org"
TRAINJOBS = JobResource(TRAINER, "v1alpha1", "TrainJob", "trainjobs", templates=False)
TRAINING_RUNTIMES = JobResource(TRAINER, "v1alpha1", "TrainingRuntime", "trainingruntimes")
CLUSTER_TRAINING_RUNTIMES = JobResource(TRAINER, "v1alpha1", "ClusterTrainingRuntime", "clustertrainingruntimes",
                                        namespaced=False)
RUNTIME_KINDS = (TRAINING_RUNTIMES.kind, CLUSTER_TRAINING_RUNTIMES.kind)


def _replicated_jobs(objects: Objects) -> list[Mapping[str, Any]]:
    rjobs = spec_of(objects[0] if objects else None).get("replicatedJobs") or []
    return [r for r in rjobs if isinstance(r, Mapping)]


def _replicated_job_templates(spec: Any, path: tuple[str, ...], *, sized: bool) -> Iterator[PodTemplate]:
    """One template per replicated job (``replicatedJobs[i].template.spec.template``): ``replicas`` Jobs of
    min(parallelism, completions) pods at once each, named by DNS. Unsized in a runtime: each TrainJob sizes it."""
    prefix = "".join(f"{key}." for key in path[1:])  # "template.spec." in a runtime
    for i, rjob in enumerate(list_at(spec, "replicatedJobs")):
        if not isinstance(rjob, Mapping):
            continue
        count = None
        if sized:
            parallelism = replicas(at(rjob, "template", "spec", "parallelism"))
            completions = replicas(at(rjob, "template", "spec", "completions"), parallelism)
            count = replicas(rjob.get("replicas")) * min(parallelism, completions)
        yield PodTemplate(rjob.get("name", ""), f"{prefix}replicatedJobs[{i}] ({rjob.get('name')})",
                          (*path, "replicatedJobs", i, "template", "spec", "template"),
                          at(rjob, "template", "spec", "template"), count, by_dns=True)


def _coordinate(value: Any) -> int | None:
    """An index of ``spec.coordinator``: absent, 0 (JobSet's default); a whole number from 0 up; anything else
    says nothing."""
    if value is None:
        return 0
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


# --- JobSet ------------------------------------------------------------------------------------------------

class JobSet(Controller):
    key, title, marker = "jobset", "JobSet", JOBSET_NAME
    labels = frozenset({JOBSET_NAME, JOBSET_RJOB, JOBSET_JOB_INDEX, JOBSET_GLOBAL_INDEX, COMPLETION_INDEX,
                        COORDINATOR})
    resources: ClassVar[tuple[JobResource, ...]] = (JOBSETS,)
    supersedes = frozenset({"indexed-job"})  # its replicated jobs are Jobs

    def names_by_dns(self, pod: Mapping[str, Any]) -> bool:
        """Its pods are its Jobs' pods, named by DNS as theirs are."""
        return is_job_pod_by_dns(pod)

    def identify(self, pod: RawPod, options: Options) -> Identity:
        fix = f"the pod must be created by a {self.title} (or pass --controller)"
        _, labels, annotations = meta(pod)
        job = required(pod, JOBSET_NAME, fix=fix)
        role = required(pod, JOBSET_RJOB, fix=fix)
        completion = number(pod, COMPLETION_INDEX, fix="the JobSet's Jobs must use completionMode: Indexed")
        if JOBSET_GLOBAL_INDEX in labels or JOBSET_GLOBAL_INDEX in annotations:
            job_index = number(pod, JOBSET_GLOBAL_INDEX, fix=fix)
        else:
            job_index = number(pod, JOBSET_JOB_INDEX, fix=fix)
        return Identity(job=job, role=role, index=(job_index, completion), ordinal=-1)

    def dns_name(self, pod: RawPod, ident: Identity, namespace: str, cluster_domain: str | None) -> str:
        # JobSet names Jobs <jobset>-<rjob>-<job-index>; an Indexed Job's pod hostname is <job>-<completion index>;
        # the subdomain is the JobSet's headless Service (named after the JobSet unless spec.network.subdomain).
        if spec := spec_dns(pod):
            return qualify(f"{spec[0]}.{spec[1]}", namespace, cluster_domain)
        job_index = meta(pod).labels.get(JOBSET_JOB_INDEX, str(ident.index[0]))
        return qualify(f"{ident.job}-{ident.role}-{job_index}-{ident.index[1]}.{ident.job}", namespace,
                       cluster_domain)

    def coordinator(self, pod: RawPod) -> str | None:
        # JobSet >= v0.6.0 labels (and annotates) every pod with the coordinator = <pod hostname>.<subdomain> of
        # the pod its spec.coordinator names (CoordinatorEndpoint in pkg/controllers/jobset_controller.go).
        _, labels, annotations = meta(pod)
        return labels.get(COORDINATOR) or annotations.get(COORDINATOR) or None

    def owner_path(self, pod: RawPod) -> str | None:
        return named_path(pod, JOBSETS, JOBSET_NAME)

    def next_read(self, objects: Objects) -> str | None:
        """A JobSet that Trainer made: its TrainJob, then the TrainJob's runtime (owner_options reads both)."""
        if len(objects) == 1:
            ref = owner_ref(objects[0], TRAINER, TRAINJOBS.kind)
            if ref is None:
                return None
            namespace = (objects[0].get("metadata") or {}).get("namespace", "default")
            return f"/apis/{ref['apiVersion']}/namespaces/{namespace}/{TRAINJOBS.plural}/{ref['name']}"
        if len(objects) == 2:
            return _runtime_path(objects[1])
        return None

    def pod_templates(self, job: Mapping[str, Any]) -> Iterator[PodTemplate]:
        return _replicated_job_templates(spec_of(job), ("spec",), sized=True)

    def owner_options(self, objects: Objects, options: Options) -> OwnerOptions:
        """A JobSet that a TrainJob owns is the TrainJob's, whatever its pods' labels say (a launcher that runs
        container "launcher" looks like a plain JobSet's pod)."""
        if options.choice.controller is None and objects and owner_ref(objects[0], TRAINER, TRAINJOBS.kind):
            options = options.with_controller(TRAINJOB.key)
            found = TRAINJOB.owner_options(objects, options)
            return OwnerOptions(found.options, ("the JobSet belongs to a TrainJob", *found.notes))
        return OwnerOptions(options)

    def waits_for(self, objects: Objects) -> dict[str, frozenset[str]]:
        """``dependsOn`` (JobSet v0.8.0+: the replicated job is created once the named ones are Ready or
        Complete) and the deprecated ``startupPolicy: InOrder`` (each once the one before is Ready)
        (api/jobset/v1alpha2/jobset_types.go)."""
        rjobs = _replicated_jobs(objects)
        spec = spec_of(objects[0] if objects else None)
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

    def named_first(self, objects: Objects) -> tuple[str, tuple[int, ...]] | None:
        """JobSet's ``spec.coordinator`` (v0.6.0+: replicatedJob, jobIndex, podIndex, both indices 0 when unset;
        api/jobset/v1alpha2/jobset_types.go) as (role, index): the pod JobSet names in the coordinator label of
        every pod (``coordinator``). Its global index counts the Jobs before it, as ``first_index`` does."""
        named = spec_of(objects[0] if objects else None).get("coordinator")
        if not isinstance(named, Mapping) or not isinstance(named.get("replicatedJob"), str):
            return None
        role = named["replicatedJob"]
        job_index, pod_index = _coordinate(named.get("jobIndex")), _coordinate(named.get("podIndex"))
        first = self.first_index(role, objects)
        if first is None or job_index is None or pod_index is None:
            return None
        return role, (first[0] + job_index, pod_index)


# --- Kubeflow TrainJob (Trainer v2 runs on JobSet) ----------------------------------------------------------

def _runtime_path(trainjob: Mapping[str, Any]) -> str | None:
    """The TrainJob's runtime: ``spec.runtimeRef`` (kind ClusterTrainingRuntime unless it says TrainingRuntime;
    pkg/apis/trainer/v1alpha1/trainjob_types.go RuntimeRef)."""
    ref = spec_of(trainjob).get("runtimeRef")
    if not isinstance(ref, Mapping) or not ref.get("name"):
        return None
    version = str(trainjob.get("apiVersion", TRAINJOBS.api_version)).rpartition("/")[2]
    group = ref.get("apiGroup") or TRAINER
    if ref.get("kind") == TRAINING_RUNTIMES.kind:
        namespace = (trainjob.get("metadata") or {}).get("namespace", "default")
        return f"/apis/{group}/{version}/namespaces/{namespace}/{TRAINING_RUNTIMES.plural}/{ref['name']}"
    return f"/apis/{group}/{version}/{CLUSTER_TRAINING_RUNTIMES.plural}/{ref['name']}"


# Trainer v2's replicated job names (pkg/constants/constants.go Node, Launcher, v2.0.0-v2.3.0), which name the
# containers too: the launcher's container is "node" exactly when the MPI runtime runs it as a node
# (constants.go: "When RunLauncherAsNode: true, for the launcher Job the container name is node").
TRAINER_NODE = "node"
TRAINER_LAUNCHER = "launcher"
# What a runtime says it runs: its label trainer.kubeflow.org/framework (manifests/base/runtimes/*.yaml, v2.3.0:
# torch, deepspeed, mlx, jax, xgboost, torchtune) and its mlPolicy's source (pkg/apis/trainer/v1alpha1/
# trainingruntime_types.go MLPolicySource: torch, mpi, flux, jax since v2.2.0, xgboost since v2.2.0). The
# mlx-distributed and deepspeed-distributed runtimes run mpirun (mlPolicy.mpi); mlx-distributed's nodes run MLX.
RUNTIME_FRAMEWORK = ("metadata", "labels", "trainer.kubeflow.org/framework")  # a runtime's label, not a pod's
LABEL_FRAMEWORKS = {"jax": "jax", "xgboost": "xgboost", "mlx": "mlx"}
POLICY_FRAMEWORKS = {"jax": "jax", "xgboost": "xgboost", "mpi": "mpi"}


class TrainJob(JobSet):
    key, title, marker = "trainjob", "Kubeflow TrainJob (via JobSet)", TRAINJOB_PREFIX
    resources = (TRAINJOBS, TRAINING_RUNTIMES, CLUSTER_TRAINING_RUNTIMES)  # and the JobSet it makes (JOBSETS)
    supersedes = frozenset({"jobset", "indexed-job"})
    # The nodes, then the launcher when the MPI runtime runs it as a node. In the cluster the runtime decides
    # (owner_options); offline, pass --roles node for a runtime with runLauncherAsNode: false.
    default_roles = (TRAINER_NODE, TRAINER_LAUNCHER)
    default_master_port = TRAINJOB_MASTER_PORT

    def claims(self, pod: RawPod) -> bool:
        # Trainer v2 labels its Jobs, not always its pods; pods show it by a trainer.kubeflow.org/ label or by the
        # runtimes' convention: container "node" in replicated job "node", or in "launcher" when the MPI runtime
        # runs the launcher as a node, or a launcher with the MPI plugin's hostfile volume. Any other pod of a
        # TrainJob's JobSet is known as such once the JobSet is read (JobSet.owner_options).
        labels = meta(pod).labels
        containers = {c.get("name") for c in pod.get("spec", {}).get("containers", [])}
        rjob = labels.get(JOBSET_RJOB)
        return JOBSET_NAME in labels and (
            any(k.startswith(TRAINJOB_PREFIX) for k in labels)
            or (rjob in (TRAINER_NODE, TRAINER_LAUNCHER) and TRAINER_NODE in containers)
            or (rjob == TRAINER_LAUNCHER and _mounts_trainers_hostfile(pod, labels[JOBSET_NAME])))

    # Offline (no runtime read), the launcher shows itself whether it is a node: by its container's name.
    roles_by_pod = frozenset({TRAINER_LAUNCHER})

    def trains_by_pod(self, pod: RawPod, role: str) -> bool:
        return any(c.get("name") == TRAINER_NODE for c in pod.get("spec", {}).get("containers", []))

    def shows_training(self, pod: RawPod) -> bool:
        return meta(pod).labels.get(JOBSET_RJOB) == TRAINER_LAUNCHER

    def job_of(self, pod: RawPod) -> str | None:
        return meta(pod).labels.get(JOBSET_NAME)

    def selector(self, pod: RawPod, options: Options) -> str:
        return f"{JOBSET_NAME}={meta(pod).labels[JOBSET_NAME]}"

    def frameworks(self, objects: Objects) -> tuple[str, ...]:
        """What the TrainJob's runtime runs: its framework label and its mlPolicy (mlx-distributed: mlx and mpi;
        deepspeed-distributed: mpi; jax-distributed: jax; xgboost-distributed: xgboost). Nothing without it."""
        runtime = objects[2] if len(objects) > 2 else None
        label = at(runtime, *RUNTIME_FRAMEWORK)
        policy = at(runtime, "spec", "mlPolicy")
        found = [LABEL_FRAMEWORKS[label]] if isinstance(label, str) and label in LABEL_FRAMEWORKS else []
        if isinstance(policy, Mapping):
            found += [name for key, name in POLICY_FRAMEWORKS.items() if isinstance(policy.get(key), Mapping)]
        return tuple(dict.fromkeys(found))

    def framework_port(self, framework: str) -> tuple[str | None, int | None] | None:
        # The jax and xgboost plugins put the coordinator and the tracker on ContainerTrainerPort 29500 (an
        # unnamed container port; pkg/runtime/framework/plugins/{jax/jax.go,xgboost/xgboost.go}, v2.2.0-v2.3.0).
        return (None, TRAINJOB_MASTER_PORT) if framework in ("jax", "xgboost") else None

    def pods_selector(self, job: str) -> str:
        return f"{JOBSET_NAME}={job}"  # the TrainJob's JobSet has its name

    def pod_templates(self, job: Mapping[str, Any]) -> Iterator[PodTemplate]:
        """A runtime's replicated jobs (``spec.template.spec``), unsized; the JobSet a TrainJob made, as JobSet's."""
        if job.get("kind") in RUNTIME_KINDS:
            return _replicated_job_templates(at(job, "spec", "template", "spec"), ("spec", "template", "spec"),
                                             sized=False)
        if job.get("kind") == TRAINJOBS.kind:
            return iter(())
        return super().pod_templates(job)

    def owner_options(self, objects: Objects, options: Options) -> OwnerOptions:
        """On an MPI runtime, Trainer's hostfile lists the pods of replicated job ``node``, and of ``launcher``
        only when ``runLauncherAsNode`` (isNode and buildHostFileConfigMap in
        pkg/runtime/framework/plugins/mpi/mpi.go, v2.0.0-v2.3.0), in the runtime's replicated-job order, with
        ``numProcPerNode`` slots (the TrainJob's ``trainer.numProcPerNode`` first)."""
        runtime = objects[2] if len(objects) > 2 else None
        mpi = at(runtime, "spec", "mlPolicy", "mpi")
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
        trainer = spec_of(objects[1]).get("trainer") if len(objects) > 1 else None
        asked = trainer.get("numProcPerNode") if isinstance(trainer, Mapping) else None
        runtime_slots = mpi.get("numProcPerNode", 1)
        slots: int | Literal["accelerators"] | None = None
        if _count(asked):
            slots, why = asked, "the TrainJob's trainer.numProcPerNode"
        elif _count(runtime_slots, 2):
            slots, why = runtime_slots, f"runtime '{name}' mlPolicy.mpi.numProcPerNode"
        elif runtime_slots == 1:
            slots, why = "accelerators", f"runtime '{name}' mlPolicy.mpi.numProcPerNode 1: the node's GPUs, else 1"
        if options.processes.per_node is None and slots is not None:
            options = dataclasses.replace(options, processes=dataclasses.replace(options.processes, per_node=slots))
            notes.append(f"slots per host from {why}")
        return OwnerOptions(options, tuple(notes))


# The MPI plugin's launcher volume: ConfigMap <trainjob>-mpi-hostfile as volume mpi-hostfile (pkg/constants/
# constants.go MPIHostfileVolumeName, MPIHostfileConfigMapSuffix; plugins/mpi/mpi.go, v2.0.0-v2.3.0).
MPI_HOSTFILE_VOLUME, MPI_HOSTFILE_SUFFIX = "mpi-hostfile", "-mpi-hostfile"


def _mounts_trainers_hostfile(pod: RawPod, jobset: str) -> bool:
    """A launcher with Trainer's hostfile volume: a TrainJob's, whatever its container is named."""
    return any(v.get("name") == MPI_HOSTFILE_VOLUME and at(v, "configMap", "name") == jobset + MPI_HOSTFILE_SUFFIX
               for v in list_at(pod, "spec", "volumes") if isinstance(v, Mapping))


def _count(value: object, low: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= 1_000_000


TRAINJOB = TrainJob()
JOBSET = JobSet()
