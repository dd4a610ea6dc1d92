"""Volcano's job controller (volcano-sh/volcano, v1.15.0) and its job plugins, as they create pods.

Each task's pods are ``<job>-<task>-<index>``, owned by the Job, labelled and annotated with the job, its
namespace and queue, the task and the index, and annotated with the PodGroup (``<job>-<uid>``) and the job
version (pkg/controllers/job/job_controller_util.go createJobPod). The job plugins then run in the order the
manifest lists them (Volcano runs them in Go map order: any order) and each appends its block to every container
(core/injected.py's ``volcano`` rows): ``env`` the task index, ``svc`` the tasks' hosts and counts from the
``<job>-svc`` ConfigMap, ``pytorch`` MASTER_ADDR/PORT, WORLD_SIZE and RANK, ``tensorflow`` TF_CONFIG, ``mpi``
MPI_HOST on the master task (the workers' DNS names, pkg/controllers/job/plugins/distributed-framework/mpi/
mpi.go). ``env``, ``svc`` and ``mpi`` write to the init containers too. ``svc`` gives each pod hostname = its name
and subdomain = the job's where the template has none, and mounts the ``<job>-svc`` ConfigMap at /etc/volcano;
``pytorch`` opens its port (``pytorchjob-port``) in every container. The job webhook turns ``svc`` on for the
pytorch, tensorflow, mpi and ray plugins (and ``ssh`` for mpi) when the manifest does not.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from agent.core.controllers.volcano import VOLCANO_INDEX, VOLCANO_JOB, VOLCANO_TASK, PluginArgs, plugin_args
from agent.core.emulation.objects import (
    Obj,
    add_env,
    count,
    make_pod,
    name_of,
    namespace_of,
    refuse,
    template_at,
    uid_of,
)
from agent.core.injected import injected_env
from agent.core.model import RawEnvVar

VOLCANO_RELEASE = "v1.15.0"
QUEUE = "volcano.sh/queue-name"
# The plugins that need the svc plugin's headless Service and turn it on (and mpi the ssh plugin).
NEEDS_SVC = ("pytorch", "tensorflow", "mpi", "ray")  # webhooks/admission/jobs/mutate patchDefaultPlugins
TF_ROLES = ("ps", "worker", "chief", "evaluator")  # tensorflow.go's cluster keys, in its struct's order


def _tasks(job: Mapping[str, Any]) -> list[tuple[str, int, Mapping[str, Any]]]:
    tasks = (job.get("spec") or {}).get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise refuse(job, "spec.tasks is missing or empty", "give the job its tasks")
    out = []
    for position, task in enumerate(tasks):
        name = task.get("name") if isinstance(task, Mapping) else None
        if not isinstance(name, str) or not name:
            raise refuse(job, f"spec.tasks[{position}] has no name", "name every task (Volcano names pods by it)")
        out.append((name, count(job, task.get("replicas"), f"spec.tasks[{position}].replicas"),
                    template_at(job, task.get("template"), f"spec.tasks[{position}].template")))
    names = [n for n, _, _ in out]
    if len(set(names)) != len(names):
        raise refuse(job, f"two tasks share a name ({', '.join(names)})", "give each task its own name")
    return out


def _plugin_order(job: Mapping[str, Any]) -> list[str]:
    plugins = (job.get("spec") or {}).get("plugins") or {}
    order = [str(p) for p in plugins] if isinstance(plugins, Mapping) else []
    if any(p in order for p in NEEDS_SVC) and "svc" not in order:
        order.append("svc")
    if "mpi" in order and "ssh" not in order:
        order.append("ssh")
    return order


def _open_port(containers: list[dict[str, Any]], port: int) -> None:
    """The pytorch plugin's openContainerPort: its port in each container that does not expose that number."""
    for container in containers:
        if not any(p.get("containerPort") == port for p in container.get("ports") or []):
            container["ports"] = [*(container.get("ports") or []),
                                  {"name": "pytorchjob-port", "containerPort": port, "protocol": "TCP"}]


def _mount_hosts(spec: dict[str, Any], configmap: str) -> None:
    """The svc plugin's mountConfigmap: the tasks' host files at /etc/volcano in every container."""
    spec["volumes"] = [*(spec.get("volumes") or []), {"name": configmap, "configMap": {"name": configmap}}]
    for container in [*spec["containers"], *(spec.get("initContainers") or [])]:
        container["volumeMounts"] = [*(container.get("volumeMounts") or []),
                                     {"name": configmap, "mountPath": "/etc/volcano"}]


def emulate_volcano(job: Mapping[str, Any]) -> tuple[list[Obj], list[Obj]]:
    name, namespace, uid = name_of(job), namespace_of(job), uid_of(job)
    spec = job.get("spec") or {}
    tasks = _tasks(job)
    total = sum(n for _, n, _ in tasks)
    least = spec.get("minAvailable")
    if isinstance(least, int) and not isinstance(least, bool) and least > total:
        raise refuse(job, f"spec.minAvailable {least} is more than the tasks' {total} replicas",
                     "lower minAvailable or add replicas")
    order = _plugin_order(job)
    given = spec.get("plugins")
    plugins: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    task_names = [n for n, _, _ in tasks]
    replicas = dict((n, r) for n, r, _ in tasks)
    pytorch = plugin_args("pytorch", plugins.get("pytorch") or [], job)
    master, worker = pytorch.tasks["master"], pytorch.tasks["worker"]
    queue = str(spec.get("queue") or "default")
    tf = plugin_args("tensorflow", plugins.get("tensorflow") or [], job) if "tensorflow" in order else None
    tf_cluster = json.dumps({role: [f"{name}-{tf.tasks[role]}-{i}.{name}:{tf.port}"
                                    for i in range(replicas.get(tf.tasks[role], 0))]
                             for role in TF_ROLES if replicas.get(tf.tasks[role])}, separators=(",", ":")) \
        if tf is not None else ""
    mpi = plugin_args("mpi", plugins.get("mpi") or [], job) if "mpi" in order else None
    pods = []
    for task, count_, template in tasks:
        for i in range(count_):
            pod_name = f"{name}-{task}-{i}"
            ids = {VOLCANO_JOB: name, VOLCANO_TASK: task, VOLCANO_INDEX: str(i), QUEUE: queue}
            own = template.get("spec") or {}
            svc = "svc" in order
            pod = make_pod(pod_name, template, owner=job, labels={**ids, "volcano.sh/job-namespace": namespace},
                           annotations={**ids, "scheduling.k8s.io/group-name": f"{name}-{uid}",
                                        "volcano.sh/job-version": "0", "volcano.sh/job-retry-count": "0",
                                        "volcano.sh/template-uid": f"{name}-{task}"},
                           hostname=(own.get("hostname") or pod_name) if svc else None,
                           subdomain=(own.get("subdomain") or name) if svc else None)
            if not pod["spec"].get("schedulerName") and spec.get("schedulerName"):
                pod["spec"]["schedulerName"] = spec["schedulerName"]
            training = task in (master, worker)
            features = {f"plugin {p}" for p in order} | ({"training task"} if training else set())
            role = next((r for r in TF_ROLES if tf is not None and tf.tasks[r] == task), None)
            if role is None or (len(tasks) == 1 and count_ == 1):  # OnPodCreate: none for a stand-alone pod
                features.discard("plugin tensorflow")
            facts = {"plugin_order": order, "tasks": task_names, "job": name, "index": i, "port": pytorch.port,
                     "replicas": replicas.get(master, 0) + replicas.get(worker, 0),
                     "rank": i + 1 if task == worker else 0, "master_task": master,
                     "tf_config": f'{{"cluster":{tf_cluster},"task":{{"type":"{role}","index":{i}}}}}'}
            _inject_plugins(pod, order, task=task, job=name, master=master, mpi=mpi, replicas=replicas,
                            pytorch=pytorch, features=features, facts=facts)
            if svc:
                _mount_hosts(pod["spec"], f"{name}-svc")
            pods.append(pod)
    return [], pods


def _inject_plugins(pod: Obj, order: Sequence[str], *, task: str, job: str, master: str, mpi: PluginArgs | None,
                    replicas: Mapping[str, int], pytorch: PluginArgs, features: set[str],
                    facts: dict[str, Any]) -> None:
    """Each plugin's variables, in the job's plugin order, on the pod's containers (and, for env, svc and mpi, on
    its init containers); the pytorch plugin opens its port."""
    containers = pod["spec"]["containers"]
    inits = pod["spec"].get("initContainers") or []
    for plugin in order:
        block: list[RawEnvVar] = []
        if plugin == "mpi" and mpi is not None and task == mpi.tasks["master"]:
            hosts = ",".join(f"{job}-{mpi.tasks['worker']}-{k}.{job}"
                             for k in range(replicas.get(mpi.tasks["worker"], 0)))
            block = [{"name": "MPI_HOST", "value": hosts}]
        elif plugin in ("env", "svc", "pytorch", "tensorflow"):
            block = injected_env("volcano", VOLCANO_RELEASE, features, {**facts, "plugin_order": (plugin,)})
        for entry in block:  # the pytorch plugin's master is its --master task's first pod
            if entry["name"] == "MASTER_ADDR" and "value" in entry:
                entry["value"] = f"{job}-{master}-0.{job}"
        add_env(containers, block)
        if plugin in ("env", "svc", "mpi"):
            add_env(inits, block)
        if plugin == "pytorch":
            _open_port(containers, pytorch.port)

