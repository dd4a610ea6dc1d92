"""What each controller appends to a training pod's containers, by release: data, one row per variable.

Each row names the upstream file and the releases it was read from, so a reviewer checks the row against its
source without reading any logic. The agent uses the table for one decision: which entries of the trainer's
``env`` the controller wrote (the agent's to replace) and which the user wrote (left alone). The test fixtures
build their pods from the same rows (``injected_env``), in the controller's order.

How a controller writes decides how "user or controller?" is answered:

* ``append`` (training-operator v1): the controller appends its block after the template's env, so an entry
  named like an injected one is the user's when the same name appears again later (the controller's copy).
* ``upsert`` (Trainer v2): the controller replaces a same-named entry in place or appends; its admission webhook
  refuses TrainJobs that set the reserved PET_* names. An entry with an injected name is always the controller's.

Rows for Volcano, JobSet, LeaderWorkerSet and the MPI operator are not in this table yet (issue 11): for those
controllers ``Controller.injected`` in ``controllers.py`` still holds the names from the previous reading.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from agent.core.model import RawEnvVar

Mode = Literal["append", "upsert"]
COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


@dataclass(frozen=True)
class Injection:
    """One variable a controller writes. ``value`` is a template over the job's facts (see ``injected_env``);
    ``field_ref`` marks a ``valueFrom.fieldRef`` instead of a value. ``when`` names the job feature it needs."""

    controller: str
    releases: tuple[str, ...]
    name: str
    value: str
    when: str
    source: str
    field_ref: bool = False


TO = "kubeflow/training-operator"
TO_OLD = ("v1.5.0", "v1.6.0")
TO_NEW = ("v1.7.0", "v1.8.0", "v1.9.0")
TRAINER = "kubeflow/trainer"
TRAINER_V2 = ("v2.0.0", "v2.1.0", "v2.2.0", "v2.3.0")
_ENVVAR = "pkg/controller.v1/pytorch/envvar.go setPodEnv"
_MASTER = "pkg/controller.v1/pytorch/master.go MasterEnvVarGenerator.Generate"
_ELASTIC = "pkg/controller.v1/pytorch/elastic.go ElasticEnvVarGenerator.Generate"
_TORCH = "pkg/runtime/framework/plugins/torch/torch.go Torch.EnforceMLPolicy; pkg/constants/constants.go"

# In the order the controller writes them. {master}: '<job>-master-0'; {port}: the master container's port
# 'pytorchjob-port'; {replicas}: pods of all replica types; {rank}: 0 for the master, index + 1 for a worker.
ROWS: tuple[Injection, ...] = (
    # training-operator v1.5-v1.6 (every container of every replica; appended)
    Injection("pytorchjob", TO_OLD, "PYTHONUNBUFFERED", "0", "always", f"{TO} {_ENVVAR}"),
    Injection("pytorchjob", TO_OLD, "MASTER_PORT", "{port}", "master", f"{TO} {_MASTER}"),
    Injection("pytorchjob", TO_OLD, "MASTER_ADDR", "{master}", "master", f"{TO} {_MASTER}"),
    Injection("pytorchjob", TO_OLD, "WORLD_SIZE", "{replicas}", "master", f"{TO} {_ENVVAR}"),
    Injection("pytorchjob", TO_OLD, "RANK", "{rank}", "master", f"{TO} {_ENVVAR}"),
    # training-operator v1.7-v1.9: the PET_* twins for torchrun, WORLD_SIZE counts processes
    Injection("pytorchjob", TO_NEW, "PYTHONUNBUFFERED", "1", "always", f"{TO} {_ENVVAR}"),
    Injection("pytorchjob", TO_NEW, "MASTER_PORT", "{port}", "master", f"{TO} {_MASTER}"),
    Injection("pytorchjob", TO_NEW, "PET_MASTER_PORT", "{port}", "master", f"{TO} {_MASTER}"),
    Injection("pytorchjob", TO_NEW, "MASTER_ADDR", "{master}", "master", f"{TO} {_MASTER}"),
    Injection("pytorchjob", TO_NEW, "PET_MASTER_ADDR", "{master}", "master", f"{TO} {_MASTER}"),
    Injection("pytorchjob", TO_NEW, "WORLD_SIZE", "{world}", "master", f"{TO} {_ENVVAR} (replicas x nprocPerNode)"),
    Injection("pytorchjob", TO_NEW, "RANK", "{rank}", "master", f"{TO} {_ENVVAR}"),
    Injection("pytorchjob", TO_NEW, "PET_NODE_RANK", "{rank}", "master", f"{TO} {_ENVVAR}"),
    Injection("pytorchjob", TO_NEW, "PET_NPROC_PER_NODE", "{nproc}", "nprocPerNode", f"{TO} {_ENVVAR}"),
    Injection("pytorchjob", TO_NEW, "PET_RDZV_ENDPOINT", "{rdzv_host}:{rdzv_port}", "elastic", f"{TO} {_ELASTIC}"),
    Injection("pytorchjob", TO_NEW, "PET_RDZV_BACKEND", "c10d", "elastic", f"{TO} {_ELASTIC} (default backend)"),
    Injection("pytorchjob", TO_NEW, "PET_NNODES", "{min}:{max}", "elastic", f"{TO} {_ELASTIC}"),
    Injection("pytorchjob", TO_NEW, "PET_MAX_RESTARTS", "{max_restarts}", "elastic.maxRestarts", f"{TO} {_ELASTIC}"),
    Injection("pytorchjob", TO_NEW, "PET_NPROC_PER_NODE", "{nproc}", "elastic.nProcPerNode", f"{TO} {_ELASTIC}"),
    Injection("pytorchjob", TO_NEW, "PET_RDZV_ID", "{rdzv_id}", "elastic.rdzvId", f"{TO} {_ELASTIC}"),
    Injection("pytorchjob", TO_NEW, "PET_RDZV_CONF", "{rdzv_conf}", "elastic.rdzvConf", f"{TO} {_ELASTIC}"),
    Injection("pytorchjob", TO_NEW, "PET_STANDALONE", "", "elastic.standalone", f"{TO} {_ELASTIC}"),
    Injection("pytorchjob", TO_NEW, "PET_NNODES", "{replicas}", "not elastic", f"{TO} {_ENVVAR}"),
    # Trainer v2 torch plugin (container 'node' of the trainer's replicated job; upserted)
    Injection("trainjob", TRAINER_V2, "PET_NNODES", "{nnodes}", "always", f"{TRAINER} {_TORCH}"),
    Injection("trainjob", TRAINER_V2, "PET_NPROC_PER_NODE", "{nproc}", "always",
              f"{TRAINER} {_TORCH} (numProcPerNode, default 'auto')"),
    Injection("trainjob", TRAINER_V2, "PET_NODE_RANK", COMPLETION_INDEX_FIELD, "always", f"{TRAINER} {_TORCH}",
              field_ref=True),
    Injection("trainjob", TRAINER_V2, "PET_MASTER_ADDR", "{trainjob}-node-0-0.{trainjob}", "not torchtune",
              f"{TRAINER} {_TORCH}"),
    Injection("trainjob", TRAINER_V2, "PET_MASTER_PORT", "29500", "not torchtune",
              f"{TRAINER} {_TORCH} (ContainerTrainerPort = 29500)"),
)

MODES: Mapping[str, Mode] = {"pytorchjob": "append", "trainjob": "upsert"}
RELEASES: Mapping[str, tuple[str, ...]] = {"pytorchjob": TO_OLD + TO_NEW, "trainjob": TRAINER_V2}
TRAINJOB_MASTER_PORT = 29500  # Trainer's ContainerTrainerPort, in every v2 release above


def injected_names(controller: str) -> frozenset[str]:
    """Every name the controller writes in any release of the table."""
    return frozenset(row.name for row in ROWS if row.controller == controller)


def rows_for(controller: str, release: str) -> tuple[Injection, ...]:
    return tuple(row for row in ROWS if row.controller == controller and release in row.releases)


def injected_env(controller: str, release: str, features: set[str], facts: Mapping[str, Any]) -> list[RawEnvVar]:
    """The entries the controller writes at ``release`` for a job with ``features`` (e.g. {"master",
    "elastic"}), in its order: what a fixture appends to a container's env."""
    out: list[RawEnvVar] = []
    for row in rows_for(controller, release):
        negated = row.when.startswith("not ")
        wanted = row.when.removeprefix("not ")
        if row.when != "always" and (wanted in features) == negated:
            continue
        if row.field_ref:
            out.append({"name": row.name, "valueFrom": {"fieldRef": {"fieldPath": row.value}}})
        else:
            out.append({"name": row.name, "value": row.value.format(**facts)})
    return out


def _block_length(controller: str, release: str, names: list[str]) -> int:
    """How many entries at the end of ``names`` the controller appended at ``release``: the longest suffix that
    is, in order, a run of the release's rows and begins with its unconditional first row."""
    rows = rows_for(controller, release)
    pointer = len(rows)
    length = 0
    start_ok = 0
    for name in reversed(names):
        match = next((i for i in range(pointer - 1, -1, -1) if rows[i].name == name), None)
        if match is None:
            break
        pointer, length = match, length + 1
        if rows[match].when == "always" and all(r.when != "always" for r in rows[:match]):
            start_ok = length  # the block may begin here
    return start_ok


def controller_entries(controller: str, env: list[RawEnvVar]) -> set[int] | None:
    """Positions in ``env`` that the controller wrote, or None when the table has no rows for it yet."""
    mode = MODES.get(controller)
    if mode is None:
        return None
    names = [e.get("name", "") for e in env]
    if mode == "upsert":
        known = injected_names(controller)
        return {i for i, name in enumerate(names) if name in known}
    longest = max(_block_length(controller, release, names) for release in RELEASES[controller])
    return set(range(len(names) - longest, len(names)))
