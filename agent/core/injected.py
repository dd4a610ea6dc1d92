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
* ``prepend`` (LeaderWorkerSet): the webhook puts its variables first and drops the template's entries of the
  same names, so an entry with an injected name is always the controller's too.
* ``plugins`` (Volcano): each job plugin (env, svc, pytorch) appends its own block, and the job controller runs
  the plugins in Go map order, so the blocks follow the template's env in any order. The controller's part is
  the longest run of whole blocks at the end; a lone ``RANK`` a user wrote last is not a pytorch block.

JobSet writes no variable, so it has no rows here. The MPI operator's rows matter for mpi.env
(core/files/frameworks/mpi.py): the hostfile names it writes on the launcher are the operator's, not the user's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from agent.core.model import RawEnvVar

Mode = Literal["append", "upsert", "prepend", "plugins"]
# The variables that make a process a rank: written to training pods only, and unset in the others' torch.env
# where a controller put them there.
TRAINING_NAMES = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "NODE_RANK", "NNODES", "NPROC_PER_NODE",
    "LOCAL_WORLD_SIZE", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NNODES", "PET_NODE_RANK",
    "PET_NPROC_PER_NODE", "PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_ID", "PET_LOCAL_ADDR",
    "PET_MAX_RESTARTS", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
})
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
    block: str = "main"  # plugins mode: the plugin that writes it
    config_map_key: str = ""  # valueFrom.configMapKeyRef of this ConfigMap (a template), key = the name


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

VC = "volcano-sh/volcano"
VC_RELEASES = ("v1.7.0", "v1.8.0", "v1.9.0", "v1.10.0", "v1.11.0", "v1.12.0", "v1.13.0", "v1.14.0", "v1.15.0")
_VC_ENV = "pkg/controllers/job/plugins/env/env.go envPlugin.OnPodCreate; env/const.go"
_VC_SVC = "pkg/controllers/job/plugins/svc/svc.go servicePlugin.OnPodCreate; svc/const.go"
_VC_PT = "pkg/controllers/job/plugins/distributed-framework/pytorch/pytorch.go pytorchPlugin.OnPodCreate"
LWS = "kubernetes-sigs/lws"
LWS_RELEASES = ("v0.4.0", "v0.5.0", "v0.6.0", "v0.7.0", "v0.8.0", "v0.9.0", "v0.10.0")
_LWS = "pkg/utils/pod/pod_utils.go AddLWSVariables (addEnvVarsIfNotExists)"

ROWS += (
    # Volcano job plugins, every container of every task. {task_key}: the task name upper-cased, '-' -> '_'.
    Injection("volcano", VC_RELEASES, "VK_TASK_INDEX", "{index}", "plugin env", f"{VC} {_VC_ENV}", block="env"),
    Injection("volcano", VC_RELEASES, "VC_TASK_INDEX", "{index}", "plugin env", f"{VC} {_VC_ENV}", block="env"),
    Injection("volcano", VC_RELEASES, "VC_{task_key}_HOSTS", "", "plugin svc (each task, in job order)",
              f"{VC} {_VC_SVC}", block="svc", config_map_key="{job}-svc"),
    Injection("volcano", VC_RELEASES, "VC_{task_key}_NUM", "", "plugin svc (each task, in job order)",
              f"{VC} {_VC_SVC}", block="svc", config_map_key="{job}-svc"),
    Injection("volcano", VC_RELEASES, "MASTER_ADDR", "{job}-master-0.{job}", "plugin pytorch",
              f"{VC} {_VC_PT} (<master hostname>.<subdomain>)", block="pytorch"),
    Injection("volcano", VC_RELEASES, "MASTER_PORT", "{port}", "plugin pytorch", f"{VC} {_VC_PT} (--port, 23456)",
              block="pytorch"),
    Injection("volcano", VC_RELEASES, "WORLD_SIZE", "{replicas}", "plugin pytorch",
              f"{VC} {_VC_PT} (master + worker replicas: pods, not processes)", block="pytorch"),
    Injection("volcano", VC_RELEASES, "RANK", "{rank}", "plugin pytorch, master or worker task",
              f"{VC} {_VC_PT} (master 0, worker index + 1)", block="pytorch"),
    # LeaderWorkerSet webhook, every container; put first, replacing the template's entries of these names.
    Injection("lws", LWS_RELEASES, "LWS_LEADER_ADDRESS", "{lws}-{group}.{subdomain}.{namespace}", "always",
              f"{LWS} {_LWS}"),
    Injection("lws", LWS_RELEASES, "LWS_GROUP_SIZE", "{size}", "always", f"{LWS} {_LWS}"),
    Injection("lws", LWS_RELEASES[2:], "LWS_WORKER_INDEX", "{worker}", "always", f"{LWS} {_LWS}"),
)

MPI_OP = "kubeflow/mpi-operator"
MPI_RELEASES = ("v0.5.0", "v0.6.0", "v0.7.0", "v0.8.0")
_MPI = "pkg/controller/mpi_job_controller.go"
_MPI_LAUNCHER = f"{_MPI} newLauncherPodTemplate"

ROWS += (
    # MPI operator v2: the first container of each pod; appended (the launcher's by its MPI implementation).
    Injection("mpijob", MPI_RELEASES, "K_MPI_JOB_ROLE", "{role}", "always",
              f"{MPI_OP} {_MPI} launcherEnvVars, workerEnvVars"),
    Injection("mpijob", MPI_RELEASES, "OMPI_MCA_orte_keep_fqdn_hostnames", "true", "launcher, OpenMPI",
              f"{MPI_OP} {_MPI_LAUNCHER} (ompiEnvVars)"),
    Injection("mpijob", MPI_RELEASES, "OMPI_MCA_orte_default_hostfile", "/etc/mpi/hostfile", "launcher, OpenMPI",
              f"{MPI_OP} {_MPI_LAUNCHER} (ompiEnvVars)"),
    Injection("mpijob", MPI_RELEASES, "OMPI_MCA_plm_rsh_args", "-o ConnectionAttempts=10", "launcher, OpenMPI",
              f"{MPI_OP} {_MPI_LAUNCHER} (ompiEnvVars)"),
    Injection("mpijob", MPI_RELEASES, "OMPI_MCA_orte_set_default_slots", "{slots}", "launcher, OpenMPI",
              f"{MPI_OP} {_MPI_LAUNCHER} (slotsPerWorker)"),
    Injection("mpijob", MPI_RELEASES, "I_MPI_HYDRA_HOST_FILE", "/etc/mpi/hostfile", "launcher, Intel",
              f"{MPI_OP} {_MPI_LAUNCHER} (intelEnvVars)"),
    Injection("mpijob", MPI_RELEASES, "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS", "-o ConnectionAttempts=10",
              "launcher, Intel", f"{MPI_OP} {_MPI_LAUNCHER} (intelEnvVars)"),
    Injection("mpijob", MPI_RELEASES, "I_MPI_PERHOST", "{slots}", "launcher, Intel",
              f"{MPI_OP} {_MPI_LAUNCHER} (slotsPerWorker)"),
    Injection("mpijob", MPI_RELEASES, "HYDRA_HOST_FILE", "/etc/mpi/hostfile", "launcher, MPICH",
              f"{MPI_OP} {_MPI_LAUNCHER} (mpichEnvVars)"),
    Injection("mpijob", MPI_RELEASES, "HYDRA_LAUNCH_EXTRA_ARGS", "-o ConnectionAttempts=10", "launcher, MPICH",
              f"{MPI_OP} {_MPI_LAUNCHER} (mpichEnvVars)"),
    Injection("mpijob", MPI_RELEASES, "NVIDIA_VISIBLE_DEVICES", "", "launcher, not runLauncherAsWorker",
              f"{MPI_OP} {_MPI_LAUNCHER} (nvidiaDisableEnvVars)"),
    Injection("mpijob", MPI_RELEASES, "NVIDIA_DRIVER_CAPABILITIES", "", "launcher, not runLauncherAsWorker",
              f"{MPI_OP} {_MPI_LAUNCHER} (nvidiaDisableEnvVars)"),
)

TO_JAX = ("v1.9.0",)  # JAXJob is new in v1.9
_TF = "pkg/controller.v1/tensorflow/tfjob_controller.go SetClusterSpec; tensorflow.go genTFConfigJSONStr"
_XGB = "pkg/controller.v1/xgboost/xgboost.go SetPodEnv"
_PADDLE = "pkg/controller.v1/paddlepaddle/envvar.go setPodEnv"
_JAX = "pkg/controller.v1/jax/envvar.go setPodEnv"
TRAINER_V22 = ("v2.2.0", "v2.3.0")  # Trainer v2's jax and xgboost plugins are new in v2.2.0
_TRAINER_JAX = "pkg/runtime/framework/plugins/jax/jax.go Jax.EnforceMLPolicy"
_TRAINER_XGB = "pkg/runtime/framework/plugins/xgboost/xgboost.go XGBoost.EnforceMLPolicy; pkg/constants/constants.go"

ROWS += (
    # training-operator TFJob: the container named tensorflow only; appended; not for a job of one pod
    # (util.go isDistributed). {tf_config}: {"cluster":{<type>:[...]},"task":{...},"environment":"cloud"}.
    Injection("tfjob", TO_NEW, "TF_CONFIG", "{tf_config}", "distributed", f"{TO} {_TF}"),
    # training-operator XGBoostJob: every container of every replica; appended. {rank}: 0 for the master, index +
    # master replicas for a worker; {replicas}: master + worker replicas; the WORKER_* for LightGBM.
    Injection("xgboostjob", TO_NEW, "MASTER_PORT", "{port}", "always", f"{TO} {_XGB} (port xgboostjob-port)"),
    Injection("xgboostjob", TO_NEW, "MASTER_ADDR", "{job}-master-0", "always", f"{TO} {_XGB}"),
    Injection("xgboostjob", TO_NEW, "WORLD_SIZE", "{replicas}", "always", f"{TO} {_XGB}"),
    Injection("xgboostjob", TO_NEW, "RANK", "{rank}", "always", f"{TO} {_XGB}"),
    Injection("xgboostjob", TO_NEW, "PYTHONUNBUFFERED", "1", "always", f"{TO} {_XGB}"),
    Injection("xgboostjob", TO_NEW, "WORKER_PORT", "{worker_port}", "several replicas", f"{TO} {_XGB}"),
    Injection("xgboostjob", TO_NEW, "WORKER_ADDRS", "{worker_addrs}", "several replicas",
              f"{TO} {_XGB} (<job>-worker-0 .. <job>-worker-<replicas - 2>)"),
    # training-operator PaddleJob: every container of every replica; appended. {master}: the worker 0's (or
    # master 0's, with a Master spec) <name>:<port>, and $(POD_IP_DUMMY):<port> in that pod itself.
    Injection("paddlejob", TO_NEW, "PYTHONUNBUFFERED", "1", "always", f"{TO} {_PADDLE}"),
    Injection("paddlejob", TO_NEW, "PADDLE_JOB_ID", "{job}", "always", f"{TO} {_PADDLE}"),
    Injection("paddlejob", TO_NEW, "PADDLE_NNODES", "{replicas}", "always", f"{TO} {_PADDLE}"),
    Injection("paddlejob", TO_NEW, "POD_IP_DUMMY", "status.podIP", "the master's pod", f"{TO} {_PADDLE}",
              field_ref=True),
    Injection("paddlejob", TO_NEW, "PADDLE_MASTER", "{master}", "always", f"{TO} {_PADDLE} (port master, 36543)"),
    Injection("paddlejob", TO_NEW, "PADDLE_SERVER_NUM", "1", "ps mode, master", f"{TO} {_PADDLE}"),
    Injection("paddlejob", TO_NEW, "PADDLE_TRAINER_NUM", "1", "ps mode, worker", f"{TO} {_PADDLE}"),
    # training-operator JAXJob: every container of every replica; appended.
    Injection("jaxjob", TO_JAX, "PYTHONUNBUFFERED", "1", "always", f"{TO} {_JAX}"),
    Injection("jaxjob", TO_JAX, "COORDINATOR_PORT", "{port}", "always", f"{TO} {_JAX} (port jaxjob-port, 6666)"),
    Injection("jaxjob", TO_JAX, "COORDINATOR_ADDRESS", "{job}-worker-0", "always", f"{TO} {_JAX} (no port)"),
    Injection("jaxjob", TO_JAX, "NUM_PROCESSES", "{replicas}", "always", f"{TO} {_JAX}"),
    Injection("jaxjob", TO_JAX, "PROCESS_ID", "{index}", "always", f"{TO} {_JAX}"),
    # Trainer v2 jax and xgboost plugins (container 'node' of the trainer's replicated job; upserted).
    Injection("trainjob", TRAINER_V22, "JAX_NUM_PROCESSES", "{nnodes}", "mlPolicy jax", f"{TRAINER} {_TRAINER_JAX}",
              block="jax"),
    Injection("trainjob", TRAINER_V22, "JAX_PROCESS_ID", COMPLETION_INDEX_FIELD, "mlPolicy jax",
              f"{TRAINER} {_TRAINER_JAX}", field_ref=True, block="jax"),
    Injection("trainjob", TRAINER_V22, "JAX_COORDINATOR_ADDRESS", "{trainjob}-node-0-0.{trainjob}:29500",
              "mlPolicy jax", f"{TRAINER} {_TRAINER_JAX} (ContainerTrainerPort = 29500)", block="jax"),
    Injection("trainjob", TRAINER_V22, "DMLC_TRACKER_URI", "{trainjob}-node-0-0.{trainjob}", "mlPolicy xgboost",
              f"{TRAINER} {_TRAINER_XGB}", block="xgboost"),
    Injection("trainjob", TRAINER_V22, "DMLC_TRACKER_PORT", "29500", "mlPolicy xgboost",
              f"{TRAINER} {_TRAINER_XGB} (ContainerTrainerPort = 29500)", block="xgboost"),
    Injection("trainjob", TRAINER_V22, "DMLC_TASK_ID", COMPLETION_INDEX_FIELD, "mlPolicy xgboost",
              f"{TRAINER} {_TRAINER_XGB}", field_ref=True, block="xgboost"),
    Injection("trainjob", TRAINER_V22, "DMLC_NUM_WORKER", "{workers}", "mlPolicy xgboost",
              f"{TRAINER} {_TRAINER_XGB} (numNodes x GPUs per node, else numNodes)", block="xgboost"),
    # Volcano tensorflow plugin: TF_CONFIG in every container of every pod (not for one task of one replica).
    Injection("volcano", VC_RELEASES, "TF_CONFIG", "{tf_config}", "plugin tensorflow",
              f"{VC} pkg/controllers/job/plugins/distributed-framework/tensorflow/tensorflow.go "
              "tensorflowPlugin.OnPodCreate", block="tensorflow"),
)

MODES: Mapping[str, Mode] = {"pytorchjob": "append", "tfjob": "append", "xgboostjob": "append", "paddlejob": "append",
                             "jaxjob": "append", "trainjob": "upsert", "lws": "prepend", "volcano": "plugins",
                             "mpijob": "append"}
RELEASES: Mapping[str, tuple[str, ...]] = {"pytorchjob": TO_OLD + TO_NEW, "tfjob": TO_NEW, "xgboostjob": TO_NEW,
                                          "paddlejob": TO_NEW, "jaxjob": TO_JAX, "trainjob": TRAINER_V2,
                                          "volcano": VC_RELEASES, "lws": LWS_RELEASES, "mpijob": MPI_RELEASES}
# Rows of a block other than "main" outside Volcano's plugins mode (Trainer's plugins) are written only when the
# fixture names the block in facts["plugins"]; a controller's rows without that name are its default blocks.
DEFAULT_BLOCKS: Mapping[str, tuple[str, ...]] = {"trainjob": ("main",)}
TRAINJOB_MASTER_PORT = 29500  # Trainer's ContainerTrainerPort, in every v2 release above


def injected_names(controller: str) -> frozenset[str]:
    """Every fixed name the controller writes in any release of the table (templated names left out)."""
    return frozenset(row.name for row in ROWS if row.controller == controller and "{" not in row.name)


def rows_for(controller: str, release: str) -> tuple[Injection, ...]:
    return tuple(row for row in ROWS if row.controller == controller and release in row.releases)


def _entry(row: Injection, facts: Mapping[str, Any]) -> RawEnvVar:
    name = row.name.format(**facts)
    if row.field_ref:
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": row.value}}}
    if row.config_map_key:
        return {"name": name, "valueFrom": {"configMapKeyRef": {"name": row.config_map_key.format(**facts),
                                                                "key": name}}}
    return {"name": name, "value": row.value.format(**facts)}


def injected_env(controller: str, release: str, features: set[str], facts: Mapping[str, Any]) -> list[RawEnvVar]:
    """The entries the controller writes at ``release`` for a job with ``features`` (e.g. {"master",
    "elastic"}, or for Volcano the plugins and "training task"), in its order: what a fixture appends to a
    container's env. Volcano's svc rows repeat for each of ``facts["tasks"]``; its blocks follow
    ``facts["plugin_order"]`` (the job controller's map order is random)."""
    out: list[RawEnvVar] = []
    rows = rows_for(controller, release)
    if MODES[controller] == "plugins":
        for plugin in facts["plugin_order"]:
            if f"plugin {plugin}" not in features:
                continue
            if plugin == "pytorch" and facts.get("master_task", "master") not in facts["tasks"]:
                continue  # OnPodCreate returns early: "job ... doesn't have task master"
            for row in (r for r in rows if r.block == plugin):
                if row.name == "RANK" and "training task" not in features:
                    continue
                if "{task_key}" in row.name:
                    if row.name.endswith("_HOSTS"):  # one HOSTS/NUM pair per task, in job order
                        num = next(r for r in rows if r.block == "svc" and r.name.endswith("_NUM"))
                        for task in facts["tasks"]:
                            task_facts = {**facts, "task_key": task.replace("-", "_").upper()}
                            out += [_entry(row, task_facts), _entry(num, task_facts)]
                    continue
                out.append(_entry(row, facts))
        return out
    blocks = facts.get("plugins", DEFAULT_BLOCKS.get(controller, ("main",)))
    for row in rows:
        if row.block not in blocks:
            continue
        negated = row.when.startswith("not ")
        wanted = row.when.removeprefix("not ")
        if row.when != "always" and (wanted in features) == negated:
            continue
        out.append(_entry(row, facts))
    return out


def _block_length(controller: str, release: str, names: list[str]) -> int:
    """How many entries at the end of ``names`` the controller appended at ``release``: the longest suffix that
    is, in order, a run of the release's rows and begins with its unconditional first row (or its first row,
    where the block's rows are all conditional: TFJob's one TF_CONFIG)."""
    rows = rows_for(controller, release)
    pointer = len(rows)
    length = 0
    start_ok = 0
    for name in reversed(names):
        match = next((i for i in range(pointer - 1, -1, -1) if rows[i].name == name), None)
        if match is None:
            break
        pointer, length = match, length + 1
        if match == 0 or (rows[match].when == "always" and all(r.when != "always" for r in rows[:match])):
            start_ok = length  # the block may begin here
    return start_ok


_SVC_NAME = re.compile(r"VC_[A-Z0-9_]+_(HOSTS|NUM)")


def _is_svc_entry(entry: RawEnvVar) -> bool:
    ref = (entry.get("valueFrom") or {}).get("configMapKeyRef")
    name = entry.get("name", "")
    return isinstance(ref, dict) and bool(_SVC_NAME.fullmatch(name)) and ref.get("key") == name \
        and str(ref.get("name", "")).endswith("-svc")


def _plugin_blocks_length(controller: str, env: list[RawEnvVar]) -> int:
    """Volcano: the longest run of whole plugin blocks at the end of ``env``, each plugin at most once."""
    rows = rows_for(controller, RELEASES[controller][-1])
    fixed = {block: [r.name for r in rows if r.block == block and "{" not in r.name]
             for block in ("env", "pytorch", "tensorflow")}
    names = [e.get("name", "") for e in env]
    end, used = len(env), set()
    while end > 0:
        for block, sequence in fixed.items():
            options = [sequence, sequence[:-1]] if block == "pytorch" else [sequence]  # RANK: training tasks
            found = next((s for s in options if block not in used and len(s) <= end
                          and names[end - len(s):end] == s), None)
            if found is not None:
                used.add(block)
                end -= len(found)
                break
        else:
            start = end
            while start >= 2 and _is_svc_entry(env[start - 1]) and _is_svc_entry(env[start - 2]) \
                    and names[start - 1].endswith("_NUM") and names[start - 2].endswith("_HOSTS"):
                start -= 2
            if start == end or "svc" in used:
                break
            used.add("svc")
            end = start
    return len(env) - end


def controller_entries(controller: str, env: list[RawEnvVar]) -> set[int]:
    """Positions in ``env`` that the controller wrote (none for a controller without rows: JobSet, the MPI
    operator, the Job controller and a label selector write no variable the agent writes)."""
    mode = MODES.get(controller)
    if mode is None:
        return set()
    names = [e.get("name", "") for e in env]
    if mode in ("upsert", "prepend"):
        known = injected_names(controller)
        return {i for i, name in enumerate(names) if name in known}
    if mode == "plugins":
        length = _plugin_blocks_length(controller, env)
        return set(range(len(env) - length, len(env)))
    longest = max(_block_length(controller, release, names) for release in RELEASES[controller])
    return set(range(len(names) - longest, len(names)))


TITLES: Mapping[str, str] = {"pytorchjob": "Kubeflow training-operator (PyTorchJob)",
                             "tfjob": "Kubeflow training-operator (TFJob)",
                             "xgboostjob": "Kubeflow training-operator (XGBoostJob)",
                             "paddlejob": "Kubeflow training-operator (PaddleJob)",
                             "jaxjob": "Kubeflow training-operator (JAXJob)",
                             "trainjob": "Kubeflow Trainer v2 (TrainJob: torch, jax and xgboost plugins)",
                             "volcano": "Volcano (job plugins)", "lws": "LeaderWorkerSet",
                             "mpijob": "MPI operator v2 (MPIJob)"}
WHAT_THE_AGENT_DOES: Mapping[str, str] = {
    "PYTHONUNBUFFERED": "left as it is (not a topology fact)",
    "VK_TASK_INDEX": "left as it is (the agent writes VC_TASK_INDEX)",
    "PET_MAX_RESTARTS": "left as it is", "PET_RDZV_CONF": "left as it is", "PET_STANDALONE": "left as it is",
    "LWS_LEADER_ADDRESS": "left as it is (MASTER_ADDR is the leader's address)",
    "LWS_GROUP_SIZE": "left as it is (NNODES is the group's live size)", "LWS_WORKER_INDEX": "left as it is",
    "K_MPI_JOB_ROLE": "left as it is", "OMPI_MCA_plm_rsh_args": "left as it is",
    "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": "left as it is", "I_MPI_PERHOST": "left as it is",
    "HYDRA_LAUNCH_EXTRA_ARGS": "left as it is", "NVIDIA_VISIBLE_DEVICES": "left as it is",
    "NVIDIA_DRIVER_CAPABILITIES": "left as it is",
    **dict.fromkeys(("OMPI_MCA_orte_keep_fqdn_hostnames", "OMPI_MCA_orte_default_hostfile",
                     "OMPI_MCA_orte_set_default_slots", "I_MPI_HYDRA_HOST_FILE", "HYDRA_HOST_FILE"),
                    "replaced in mpi.env (docs/frameworks.md)"),
    "TF_CONFIG": "replaced in tf.env and tf_config.json (docs/frameworks.md)",
    **dict.fromkeys(("COORDINATOR_PORT", "COORDINATOR_ADDRESS", "NUM_PROCESSES", "PROCESS_ID", "JAX_NUM_PROCESSES",
                     "JAX_PROCESS_ID", "JAX_COORDINATOR_ADDRESS"), "replaced in jax.env (docs/frameworks.md)"),
    **dict.fromkeys(("WORKER_PORT", "WORKER_ADDRS", "DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_TASK_ID",
                     "DMLC_NUM_WORKER"), "replaced in xgboost.env (docs/frameworks.md)"),
    **dict.fromkeys(("PADDLE_JOB_ID", "PADDLE_NNODES", "PADDLE_MASTER", "PADDLE_SERVER_NUM", "PADDLE_TRAINER_NUM"),
                    "replaced in paddle.env (docs/frameworks.md)"),
    "POD_IP_DUMMY": "left as it is (paddle.env's PADDLE_MASTER and POD_IP hold rank 0's own IP)",
}
# Where one name means something else under another controller (XGBoostJob's MASTER_* are its tracker's).
WHAT_THE_AGENT_DOES_FOR: Mapping[tuple[str, str], str] = {
    **{("xgboostjob", name): "replaced in torch.env (training pods) and in xgboost.env, per pod (docs/frameworks.md)"
       for name in ("MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE", "RANK")},
}


def injection_table_markdown() -> str:
    """The table of docs/variables.md, made from the rows (tests/core/test_fidelity.py keeps them equal)."""
    lines = []
    for controller, title in TITLES.items():
        releases = RELEASES[controller]
        lines += [f"### {title}, {releases[0]} to {releases[-1]} ({MODES[controller]})", "",
                  "| variable | value | when | releases | source | the agent |", "|---|---|---|---|---|---|"]
        for row in ROWS:
            if row.controller != controller:
                continue
            value = f"fieldRef `{row.value}`" if row.field_ref else (
                f"configMapKeyRef `{row.config_map_key}`" if row.config_map_key else f"`{row.value}`")
            span = row.releases[0] if len(row.releases) == 1 else f"{row.releases[0]}-{row.releases[-1]}"
            agent = WHAT_THE_AGENT_DOES_FOR.get((controller, row.name)) or WHAT_THE_AGENT_DOES.get(
                row.name, "replaced (training pods) / unset (others)" if row.name in TRAINING_NAMES else "replaced")
            lines.append(f"| `{row.name}` | {value} | {row.when} | {span} | {row.source} | {agent} |")
        lines.append("")
    return "\n".join(lines)

