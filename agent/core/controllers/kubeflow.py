"""Kubeflow's v1 jobs (kubeflow.org): training-operator's PyTorchJob, TFJob, XGBoostJob, PaddleJob and JAXJob, and
the MPI operator v2's MPIJob. All label their pods with training-operator's job-name key, the operator's name and,
but for MPIJob, the replica type and index; each lists its roles' templates in a map of replica specs keyed by
replica type. The operator-name label (else the pod's owner's kind) tells the kinds apart."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from agent.core.controllers.base import (
    Controller,
    JobResource,
    Objects,
    OwnerOptions,
    PodTemplate,
    at,
    list_at,
    map_at,
    meta,
    named_path,
    number,
    owner_ref_path,
    qualify,
    replicas,
    required,
    spec_dns,
    spec_of,
)
from agent.core.model import Identity, Options, RawPod
from agent.errors import InputError

# training-operator's pod labels (pkg/apis/kubeflow.org/v1/common_types.go, v1.7.0-v1.9.4: ReplicaIndexLabel,
# ReplicaTypeLabel, OperatorNameLabel, JobNameLabel, JobRoleLabel; set by GenLabels in
# pkg/controller.v1/common/job_controller.go and createNewPod in pkg/controller.v1/common/pod.go).
PYTORCHJOB_JOB = "training.kubeflow.org/job-name"
PYTORCHJOB_TYPE = "training.kubeflow.org/replica-type"
PYTORCHJOB_INDEX = "training.kubeflow.org/replica-index"
OPERATOR_NAME = "training.kubeflow.org/operator-name"

# MPI operator v2 (kubeflow/mpi-operator v0.5.0-v0.8.0, pkg/apis/kubeflow/v2beta1/constants.go; the labels
# are set by defaultLabels() and newWorker() in pkg/controller/mpi_job_controller.go).
MPI_OPERATOR_NAME = OPERATOR_NAME
MPI_OPERATOR = "mpi-operator"
MPI_JOB_ROLE = "training.kubeflow.org/job-role"

PYTORCHJOBS = JobResource("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs")
MPIJOBS = JobResource("kubeflow.org", "v2beta1", "MPIJob", "mpijobs")
# training-operator v1.9's other kinds (pkg/apis/kubeflow.org/v1/{tensorflow,xgboost,paddlepaddle,jax}_types.go:
# *Kind, *Plural).
TFJOBS = JobResource("kubeflow.org", "v1", "TFJob", "tfjobs")
XGBOOSTJOBS = JobResource("kubeflow.org", "v1", "XGBoostJob", "xgboostjobs")
PADDLEJOBS = JobResource("kubeflow.org", "v1", "PaddleJob", "paddlejobs")
JAXJOBS = JobResource("kubeflow.org", "v1", "JAXJob", "jaxjobs")

# The operator-name label's value per kind: each reconciler's controllerName (pkg/controller.v1/<kind>/
# <kind>_controller.go, v1.7.0-v1.9.4; PaddleJob since v1.6.0, JAXJob since v1.9.0), and the kind of the
# ownerReference training-operator gives the pods (GenOwnerReference: the job object, controller: true).
OPERATORS = {"PyTorchJob": "pytorchjob-controller", "TFJob": "tfjob-controller",
             "XGBoostJob": "xgboostjob-controller", "PaddleJob": "paddlejob-controller",
             "JAXJob": "jaxjob-controller"}


def operator_of(pod: RawPod) -> str | None:
    """Which training-operator reconciler made the pod: its operator-name label, else its controlling owner's kind
    (None: the pod says neither)."""
    name = meta(pod).labels.get(OPERATOR_NAME)
    if name:
        return name
    for ref in pod.get("metadata", {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") and str(ref.get("apiVersion", "")).startswith(
                "kubeflow.org/"):
            return OPERATORS.get(str(ref.get("kind")))
    return None


def _replica_specs(job: Mapping[str, Any], field: str, **about: Any) -> Iterator[PodTemplate]:
    """One template per replica type (``spec.<field>.<type>.template``), ``replicas`` pods each; the role is the
    type in lower case, as the operators label the pods."""
    for rtype, replica in map_at(job, "spec", field).items():
        if isinstance(replica, Mapping):
            yield PodTemplate(str(rtype).lower(), str(rtype), ("spec", field, rtype, "template"),
                              replica.get("template"), replicas(replica.get("replicas")), **about)


class _OperatorJob(Controller):
    """A training-operator v1 kind: role = the replica type in lower case, index = the replica index, one
    Service per replica named ``<job>-<replica type>-<index>`` (GenGeneralName, pkg/controller.v1/common/util.go),
    the pods owned by the job object."""

    labels = frozenset({PYTORCHJOB_JOB, PYTORCHJOB_TYPE, PYTORCHJOB_INDEX, OPERATOR_NAME})
    owner_is_job = True
    checks_index = True
    resource: ClassVar[JobResource]
    spec_field: ClassVar[str]  # the job's map of replica specs

    def claims(self, pod: RawPod) -> bool:
        return PYTORCHJOB_JOB in meta(pod).labels and operator_of(pod) == OPERATORS[self.resource.kind]

    def job_of(self, pod: RawPod) -> str | None:
        # Another kind's job of the same name is another job: the operator lists its pods by both labels
        # (GenLabels, pkg/controller.v1/common/job_controller.go; GetPodsForJob, common/pod.go). A pod that names
        # an operator the agent does not know is left to --controller.
        other = operator_of(pod)
        known = other in OPERATORS.values() or other == MPI_OPERATOR
        return None if known and other != OPERATORS[self.resource.kind] else meta(pod).labels.get(PYTORCHJOB_JOB)

    def selector(self, pod: RawPod, options: Options) -> str:
        labels = meta(pod).labels
        own = f"{PYTORCHJOB_JOB}={labels[PYTORCHJOB_JOB]}"
        return f"{own},{OPERATOR_NAME}={labels[OPERATOR_NAME]}" if labels.get(OPERATOR_NAME) else own

    def identify(self, pod: RawPod, options: Options) -> Identity:
        fix = f"the pod must be created by a {self.title} (or pass --controller)"
        job = required(pod, PYTORCHJOB_JOB, fix=fix)
        role = required(pod, PYTORCHJOB_TYPE, fix=fix).lower()
        index = number(pod, PYTORCHJOB_INDEX, fix=fix)
        return Identity(job=job, role=role, index=(index,), ordinal=index)

    def dns_name(self, pod: RawPod, ident: Identity, namespace: str, cluster_domain: str | None) -> str:
        # training-operator creates one headless Service per replica, named <job>-<replica-type>-<index>.
        if spec := spec_dns(pod):
            return qualify(f"{spec[0]}.{spec[1]}", namespace, cluster_domain)
        return qualify(f"{ident.job}-{ident.role}-{ident.ordinal}", namespace, cluster_domain)

    def owner_path(self, pod: RawPod) -> str | None:
        return owner_ref_path(pod, self.resource)

    def pod_templates(self, job: Mapping[str, Any]) -> Iterator[PodTemplate]:
        return _replica_specs(job, self.spec_field)


# --- Kubeflow PyTorchJob (training-operator v1) ----------------------------------------------------------

class PyTorchJob(_OperatorJob):
    key, title, marker = "pytorchjob", "Kubeflow PyTorchJob", PYTORCHJOB_JOB
    resources = (PYTORCHJOBS,)
    resource, spec_field = PYTORCHJOBS, "pytorchReplicaSpecs"
    default_roles = ("master", "worker")

    def claims(self, pod: RawPod) -> bool:
        # The job-name label, and no other operator's name: another kind's pods carry the same label keys (a
        # TFJob's pod is not a PyTorchJob's), and a pod that names no operator is taken for a PyTorchJob's.
        return PYTORCHJOB_JOB in meta(pod).labels and operator_of(pod) in (OPERATORS["PyTorchJob"], None)

    def selector(self, pod: RawPod, options: Options) -> str:
        return f"{self.marker}={meta(pod).labels[self.marker]}"  # pods that name no operator are listed too

    def elastic_in_pod(self, pod: Mapping[str, Any]) -> str | None:
        # training-operator writes an elasticPolicy's MIN:MAX into PET_NNODES of every container it runs.
        for container in list_at(pod, "spec", "containers"):
            for env in list_at(container, "env"):
                value = at(env, "value")
                if at(env, "name") == "PET_NNODES" and isinstance(value, str) and ":" in value:
                    return value
        return None

    def pod_templates(self, job: Mapping[str, Any]) -> Iterator[PodTemplate]:
        """One template per replica type; an elastic job (``elasticPolicy`` with minReplicas or maxReplicas)
        states MIN:MAX (the one given for the other when only one is) and may grow to maxReplicas pods."""
        policy = spec_of(job).get("elasticPolicy")
        about: dict[str, Any] = {}
        if isinstance(policy, Mapping) and (policy.get("minReplicas") or policy.get("maxReplicas")):
            low = policy.get("minReplicas") or policy.get("maxReplicas")
            about = {"elastic": f"{low}:{policy.get('maxReplicas') or low}",
                     "grows_to": replicas(policy.get("maxReplicas"), 0)}
        yield from _replica_specs(job, "pytorchReplicaSpecs", **about)

    def elastic_minimum(self, objects: Objects) -> int | None:
        # The operator's elastic job: torchrun starts once its minimum is there (elasticPolicy.minReplicas).
        policy = spec_of(objects[0] if objects else None).get("elasticPolicy")
        low = policy.get("minReplicas") if isinstance(policy, Mapping) else None
        return max(1, low) if isinstance(low, int) and not isinstance(low, bool) else None


# --- TFJob, XGBoostJob, PaddleJob, JAXJob (training-operator v1.9) --------------------------------------------

class TFJob(_OperatorJob):
    """TFJob: TF_CONFIG lists every replica of every type as ``<job>-<type>-<i>.<ns>.svc[.<CUSTOM_CLUSTER_DOMAIN>]
    :<port>`` (pkg/controller.v1/tensorflow/tensorflow.go genClusterSpec, v1.7.0-v1.9.4), so its pods are named
    so here too. The chief (or master), else worker 0, is the master role (tfjob_controller.go IsMasterRole):
    rank 0. Every type is a member the gang waits for, parameter servers and the evaluator too: TF_CONFIG names
    them all."""

    key, title, marker = "tfjob", "Kubeflow TFJob", PYTORCHJOB_JOB
    resources = (TFJOBS,)
    resource, spec_field = TFJOBS, "tfReplicaSpecs"
    # TFJobReplicaType{Chief,Master,Worker,PS,Eval} (pkg/apis/kubeflow.org/v1/tensorflow_types.go), lower-cased
    default_roles = ("chief", "master", "worker", "ps", "evaluator")

    def dns_name(self, pod: RawPod, ident: Identity, namespace: str, cluster_domain: str | None) -> str:
        if spec := spec_dns(pod):
            return qualify(f"{spec[0]}.{spec[1]}", namespace, cluster_domain)
        service = f"{ident.job}-{ident.role}-{ident.ordinal}"
        return qualify(service, namespace, cluster_domain) if cluster_domain else f"{service}.{namespace}.svc"

    def frameworks(self, objects: Objects) -> tuple[str, ...]:
        return ("tf",)

    def framework_port(self, framework: str) -> tuple[str | None, int | None] | None:
        # The port named tfjob-port of container tensorflow, else 2222 (util.go GetPortFromTFJob;
        # tensorflow_types.go TFJobDefaultPortName, TFJobDefaultPort).
        return ("tfjob-port", 2222) if framework == "tf" else None

    def framework_fields(self, framework: str) -> tuple[tuple[str, str], ...]:
        # TFConfig.Environment "cloud" (tensorflow.go genTFConfigJSONStr; read by TF <= 1.3 only).
        return (("environment", "cloud"),) if framework == "tf" else ()


class XGBoostJob(_OperatorJob):
    """XGBoostJob: RANK is 0 for the master and index + master replicas for a worker, WORLD_SIZE the replicas of
    both, MASTER_ADDR ``<job>-master-0`` (pkg/controller.v1/xgboost/xgboost.go SetPodEnv, v1.7.0-v1.9.4)."""

    key, title, marker = "xgboostjob", "Kubeflow XGBoostJob", PYTORCHJOB_JOB
    resources = (XGBOOSTJOBS,)
    resource, spec_field = XGBOOSTJOBS, "xgbReplicaSpecs"
    default_roles = ("master", "worker")  # XGBoostJobReplicaType{Master,Worker} (xgboost_types.go)

    def frameworks(self, objects: Objects) -> tuple[str, ...]:
        return ("xgboost",)

    def framework_port(self, framework: str) -> tuple[str | None, int | None] | None:
        # The master's port named xgboostjob-port of container xgboost (xgboost.go getPortFromXGBoostJob; the
        # defaulting webhook adds 9999: xgboost_types.go XGBoostJobDefaultPortName, XGBoostJobDefaultPort).
        return ("xgboostjob-port", 9999) if framework == "xgboost" else None


class PaddleJob(_OperatorJob):
    """PaddleJob: without a Master spec every worker is a trainer and worker 0 hosts Paddle's master (collective
    mode); with one, the masters are Paddle's parameter servers and master 0 hosts it (PS mode)
    (pkg/controller.v1/paddlepaddle/envvar.go setPodEnv, v1.7.0-v1.9.4)."""

    key, title, marker = "paddlejob", "Kubeflow PaddleJob", PYTORCHJOB_JOB
    resources = (PADDLEJOBS,)
    resource, spec_field = PADDLEJOBS, "paddleReplicaSpecs"
    default_roles = ("master", "worker")  # PaddleJobReplicaType{Master,Worker} (paddlepaddle_types.go)

    def frameworks(self, objects: Objects) -> tuple[str, ...]:
        return ("paddle",)

    def framework_port(self, framework: str) -> tuple[str | None, int | None] | None:
        # The port named master of container paddle, else 36543 (envvar.go getPortFromPaddleJob;
        # paddlepaddle_types.go PaddleJobDefaultPortName, PaddleJobDefaultPort).
        return ("master", 36543) if framework == "paddle" else None

    def framework_roles(self, framework: str) -> Mapping[str, str] | None:
        # envvar.go: a Master pod gets PADDLE_SERVER_NUM, a Worker pod PADDLE_TRAINER_NUM (PS mode).
        return {"master": "server", "worker": "trainer"} if framework == "paddle" else None


class JAXJob(_OperatorJob):
    """JAXJob: one process per pod; worker 0 is the coordinator (pkg/controller.v1/jax/envvar.go setPodEnv,
    v1.9.0-v1.9.4)."""

    key, title, marker = "jaxjob", "Kubeflow JAXJob", PYTORCHJOB_JOB
    resources = (JAXJOBS,)
    resource, spec_field = JAXJOBS, "jaxReplicaSpecs"
    default_roles = ("worker",)  # JAXJobReplicaTypeWorker, its one type (jax_types.go)

    def frameworks(self, objects: Objects) -> tuple[str, ...]:
        return ("jax",)

    def framework_port(self, framework: str) -> tuple[str | None, int | None] | None:
        # The port named jaxjob-port of container jax; the defaulting webhook adds 6666 (envvar.go
        # getPortFromJAXJob; jax_defaults.go setJAXDefaultPort; jax_types.go JAXJobDefaultPort).
        return ("jaxjob-port", 6666) if framework == "jax" else None


# --- MPIJob (MPI operator v2): a launcher runs mpirun, workers run the ranks ------------------------------------

class MpiJob(Controller):
    key, title, marker = "mpijob", "MPIJob (MPI operator v2)", MPI_OPERATOR_NAME
    labels = frozenset({PYTORCHJOB_JOB, PYTORCHJOB_INDEX, MPI_OPERATOR_NAME, MPI_JOB_ROLE})
    resources = (MPIJOBS,)
    # The launcher is a Job's pod, and every pod carries training-operator's job-name label.
    supersedes = frozenset({"pytorchjob", "indexed-job"})
    default_roles = ("worker",)  # the launcher runs mpirun; runLauncherAsWorker makes it a node (owner_options)
    checks_index = True

    def owns_directly(self, ident: Identity) -> bool:
        return ident.role == "worker"  # the launcher's owner is a batch Job the MPIJob owns

    def claims(self, pod: RawPod) -> bool:
        return meta(pod).labels.get(MPI_OPERATOR_NAME) == MPI_OPERATOR

    def job_of(self, pod: RawPod) -> str | None:
        return meta(pod).labels.get(PYTORCHJOB_JOB)

    def pods_selector(self, job: str) -> str:
        # The marker (operator-name) says whose pod it is; the job-name label says which job's.
        return f"{PYTORCHJOB_JOB}={job},{MPI_OPERATOR_NAME}={MPI_OPERATOR}"

    def identify(self, pod: RawPod, options: Options) -> Identity:
        fix = "the pod must be created by an MPIJob of the MPI operator v2 (or pass --controller)"
        job = required(pod, PYTORCHJOB_JOB, fix=fix)
        role = required(pod, MPI_JOB_ROLE, fix=fix)
        if role not in ("launcher", "worker"):
            raise InputError(f"pod '{meta(pod).name}': label '{MPI_JOB_ROLE}' is '{role}', not launcher or worker; "
                             f"{fix}")
        index = 0 if role == "launcher" else number(pod, PYTORCHJOB_INDEX, fix=fix)
        return Identity(job=job, role=role, index=(index,), ordinal=index)

    def dns_name(self, pod: RawPod, ident: Identity, namespace: str, cluster_domain: str | None) -> str:
        # The operator sets hostname <job>-launcher / <job>-worker-<i> and subdomain <job> (its headless Service).
        if spec := spec_dns(pod):
            return qualify(f"{spec[0]}.{spec[1]}", namespace, cluster_domain)
        host = f"{ident.job}-launcher" if ident.role == "launcher" else f"{ident.job}-worker-{ident.ordinal}"
        return qualify(f"{host}.{ident.job}", namespace, cluster_domain)

    def selector(self, pod: RawPod, options: Options) -> str:
        labels = meta(pod).labels
        return f"{PYTORCHJOB_JOB}={labels[PYTORCHJOB_JOB]},{MPI_OPERATOR_NAME}={labels[MPI_OPERATOR_NAME]}"

    def owner_path(self, pod: RawPod) -> str | None:
        # The launcher's owner is a batch Job; the job-name label names the MPIJob.
        return named_path(pod, MPIJOBS, PYTORCHJOB_JOB)

    def pod_templates(self, job: Mapping[str, Any]) -> Iterator[PodTemplate]:
        return _replica_specs(job, "mpiReplicaSpecs")

    def owner_options(self, objects: Objects, options: Options) -> OwnerOptions:
        """``runLauncherAsWorker`` makes the launcher a node (first, as the operator's hostfile lists it) and
        ``slotsPerWorker`` is the slots of every host (newConfigMap, pkg/controller/mpi_job_controller.go)."""
        spec = spec_of(objects[0] if objects else None)
        notes = []
        if options.roles is None and spec.get("runLauncherAsWorker") is True:
            options = dataclasses.replace(options, roles=("launcher", "worker"))
            notes.append("MPIJob runLauncherAsWorker: the launcher is node rank 0")
        slots = spec.get("slotsPerWorker")
        if options.processes.per_node is None and isinstance(slots, int) and not isinstance(slots, bool) \
                and 1 <= slots <= 1_000_000:
            options = dataclasses.replace(options, processes=dataclasses.replace(options.processes, per_node=slots))
            notes.append(f"MPIJob slotsPerWorker: {slots} slots per host")
        return OwnerOptions(options, tuple(notes))

    def frameworks(self, objects: Objects) -> tuple[str, ...]:
        return ("mpi",)  # the launcher runs mpirun: mpi.env points it at the live hostfile

    def waits_for(self, objects: Objects) -> dict[str, frozenset[str]]:
        # v0.6.0+: launcherCreationPolicy WaitForWorkersReady creates the launcher once every worker is Ready
        # (pkg/apis/kubeflow/v2beta1/types.go).
        if spec_of(objects[0] if objects else None).get("launcherCreationPolicy") == "WaitForWorkersReady":
            return {"launcher": frozenset({"worker"})}
        return {}


PYTORCHJOB = PyTorchJob()
TFJOB = TFJob()
XGBOOSTJOB = XGBoostJob()
PADDLEJOB = PaddleJob()
JAXJOB = JAXJob()
MPIJOB = MpiJob()
