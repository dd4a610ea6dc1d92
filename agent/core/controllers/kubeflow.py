"""Kubeflow's v1 jobs (kubeflow.org): training-operator's PyTorchJob and the MPI operator v2's MPIJob. Both label
their pods with training-operator's job-name and replica-index keys, and list each role's template in a map of
replica specs keyed by replica type."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

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

PYTORCHJOB_JOB = "training.kubeflow.org/job-name"
PYTORCHJOB_TYPE = "training.kubeflow.org/replica-type"
PYTORCHJOB_INDEX = "training.kubeflow.org/replica-index"

# MPI operator v2 (kubeflow/mpi-operator v0.5.0-v0.8.0, pkg/apis/kubeflow/v2beta1/constants.go; the labels
# are set by defaultLabels() and newWorker() in pkg/controller/mpi_job_controller.go).
MPI_OPERATOR_NAME = "training.kubeflow.org/operator-name"
MPI_OPERATOR = "mpi-operator"
MPI_JOB_ROLE = "training.kubeflow.org/job-role"

PYTORCHJOBS = JobResource("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs")
MPIJOBS = JobResource("kubeflow.org", "v2beta1", "MPIJob", "mpijobs")


def _replica_specs(job: Mapping[str, Any], field: str, **about: Any) -> Iterator[PodTemplate]:
    """One template per replica type (``spec.<field>.<type>.template``), ``replicas`` pods each; the role is the
    type in lower case, as the operators label the pods."""
    for rtype, replica in map_at(job, "spec", field).items():
        if isinstance(replica, Mapping):
            yield PodTemplate(str(rtype).lower(), str(rtype), ("spec", field, rtype, "template"),
                              replica.get("template"), replicas(replica.get("replicas")), **about)


# --- Kubeflow PyTorchJob (training-operator v1) ----------------------------------------------------------

class PyTorchJob(Controller):
    key, title, marker = "pytorchjob", "Kubeflow PyTorchJob", PYTORCHJOB_JOB
    labels = frozenset({PYTORCHJOB_JOB, PYTORCHJOB_TYPE, PYTORCHJOB_INDEX})
    resources = (PYTORCHJOBS,)
    default_roles = ("master", "worker")
    owner_is_job = True
    checks_index = True

    def identify(self, pod: RawPod, options: Options) -> Identity:
        fix = "the pod must be created by a Kubeflow PyTorchJob (or pass --controller)"
        job = required(pod, PYTORCHJOB_JOB, fix=fix)
        role = required(pod, PYTORCHJOB_TYPE, fix=fix).lower()
        index = number(pod, PYTORCHJOB_INDEX, fix=fix)
        return Identity(job=job, role=role, index=(index,), ordinal=index)

    def dns_name(self, pod: RawPod, ident: Identity, namespace: str, cluster_domain: str | None) -> str:
        # training-operator creates one headless Service per replica, named <job>-<replica-type>-<index>.
        if spec := spec_dns(pod):
            return qualify(f"{spec[0]}.{spec[1]}", namespace, cluster_domain)
        return qualify(f"{ident.job}-{ident.role}-{ident.ordinal}", namespace, cluster_domain)

    def elastic_in_pod(self, pod: Mapping[str, Any]) -> str | None:
        # training-operator writes an elasticPolicy's MIN:MAX into PET_NNODES of every container it runs.
        for container in list_at(pod, "spec", "containers"):
            for env in list_at(container, "env"):
                value = at(env, "value")
                if at(env, "name") == "PET_NNODES" and isinstance(value, str) and ":" in value:
                    return value
        return None

    def owner_path(self, pod: RawPod) -> str | None:
        return owner_ref_path(pod, PYTORCHJOBS)

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
        return meta(pod)[1].get(MPI_OPERATOR_NAME) == MPI_OPERATOR

    def job_of(self, pod: RawPod) -> str | None:
        return meta(pod)[1].get(PYTORCHJOB_JOB)

    def identify(self, pod: RawPod, options: Options) -> Identity:
        fix = "the pod must be created by an MPIJob of the MPI operator v2 (or pass --controller)"
        job = required(pod, PYTORCHJOB_JOB, fix=fix)
        role = required(pod, MPI_JOB_ROLE, fix=fix)
        if role not in ("launcher", "worker"):
            raise InputError(f"pod '{meta(pod)[0]}': label '{MPI_JOB_ROLE}' is '{role}', not launcher or worker; "
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
        labels = meta(pod)[1]
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
        if spec_of(objects[0] if objects else None).get("launcherCreationPolicy") == "WaitForWorkersReady":
            return {"launcher": frozenset({"worker"})}
        return {}


PYTORCHJOB = PyTorchJob()
MPIJOB = MpiJob()
