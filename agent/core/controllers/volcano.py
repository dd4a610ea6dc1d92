"""Volcano Job (batch.volcano.sh): tasks of pods, each pod labelled with its job, task and index. Its job plugins
(``spec.plugins``: a plugin's name -> its arguments) say what runs: the tensorflow plugin writes TF_CONFIG, the ray
plugin starts a Ray head and workers; their flags name the tasks that play each role."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from agent.core.controllers.base import (
    Controller,
    FrameworkArgs,
    JobResource,
    Objects,
    OwnerOptions,
    PodTemplate,
    list_at,
    map_at,
    meta,
    number,
    owner_ref_path,
    qualify,
    replicas,
    required,
    spec_dns,
)
from agent.core.model import Identity, Options, RawPod

VOLCANO_JOB = "volcano.sh/job-name"
VOLCANO_TASK = "volcano.sh/task-spec"
VOLCANO_INDEX = "volcano.sh/task-index"

# The Job CRD (config/crd/volcano/bases/batch.volcano.sh_jobs.yaml: short names vcjob, vj).
VCJOB = JobResource("batch.volcano.sh", "v1alpha1", "Job", "jobs", short=("vcjob", "vj"))


# The distributed-framework plugins: the framework, the flags that name a role's task (each defaulting to the
# role's name), the port flag's default, and the plugin's other flags (Go's flag package stops at a flag it does
# not know). volcano-sh/volcano v1.15.0 pkg/controllers/job/plugins/distributed-framework/tensorflow/tensorflow.go
# addFlags: --ps, --worker, --chief, --evaluator, --port 2222 (since v1.5.0); .../ray/ray.go addFlags: --head,
# --worker, --port 6379, --headContainer, --workerContainer, --dashboardPort, --clientPort (since v1.13.0).
PLUGINS: Mapping[str, tuple[str, tuple[str, ...], int, tuple[str, ...]]] = {
    "tensorflow": ("tf", ("chief", "worker", "ps", "evaluator"), 2222, ()),
    "ray": ("ray", ("head", "worker"), 6379, ("headContainer", "workerContainer", "dashboardPort", "clientPort")),
}


def go_flags(args: Sequence[Any], known: Sequence[str]) -> dict[str, str]:
    """The flags Go's flag package reads from ``args`` (``-name=v``, ``--name=v``, ``-name v``), among ``known``:
    it stops at the first argument that is no flag, at ``--``, and at an unknown or valueless flag, keeping what
    it read before (the plugins parse with ContinueOnError and go on with those values)."""
    found: dict[str, str] = {}
    words = [a for a in args if isinstance(a, str)] if isinstance(args, list) else []
    at = 0
    while at < len(words):
        word = words[at]
        if word == "--" or len(word) < 2 or not word.startswith("-"):
            break
        name, sep, value = word.lstrip("-").partition("=")
        if name not in known or (not sep and at + 1 >= len(words)):
            break
        if not sep:
            at += 1
            value = words[at]
        found[name] = value
        at += 1
    return found


def _plugins(objects: Objects) -> Mapping[Any, Any]:
    return map_at(objects[0], "spec", "plugins") if objects else {}


class Volcano(Controller):
    key, title, marker = "volcano", "Volcano Job", VOLCANO_JOB
    labels = frozenset({VOLCANO_JOB, VOLCANO_TASK, VOLCANO_INDEX})
    resources = (VCJOB,)
    default_roles = ("master", "worker")  # the pytorch plugin's --master and --worker defaults
    owner_is_job = True
    checks_index = True

    def identify(self, pod: RawPod, options: Options) -> Identity:
        fix = "the pod must be created by a Volcano Job (or pass --controller)"
        job = required(pod, VOLCANO_JOB, fix=fix)
        role = required(pod, VOLCANO_TASK, fix=fix)
        index = number(pod, VOLCANO_INDEX, fix="Volcano >= 1.7 sets it; set it on the pod or use --selector")
        return Identity(job=job, role=role, index=(index,), ordinal=index)

    def dns_name(self, pod: RawPod, ident: Identity, namespace: str, cluster_domain: str | None) -> str:
        # Volcano's svc plugin gives every pod hostname=<pod name>, subdomain=<job name> and a headless Service.
        hostname, subdomain = spec_dns(pod) or (meta(pod)[0], ident.job)
        return qualify(f"{hostname}.{subdomain}", namespace, cluster_domain)

    def owner_path(self, pod: RawPod) -> str | None:
        return owner_ref_path(pod, VCJOB)

    def frameworks(self, objects: Objects) -> tuple[str, ...]:
        """The frameworks whose plugin the job enables (none known without the job object)."""
        plugins = _plugins(objects)
        return tuple(framework for name, (framework, *_) in PLUGINS.items() if name in plugins)

    def framework_args(self, objects: Objects) -> dict[str, FrameworkArgs]:
        """Each plugin's task names for its roles and its port, from its flags (the defaults where unset)."""
        plugins, found = _plugins(objects), {}
        job = (objects[0].get("metadata") or {}).get("name", "?") if objects else "?"
        for name, (framework, roles, default, others) in PLUGINS.items():
            if name not in plugins:
                continue
            flags = go_flags(plugins[name], (*roles, "port", *others))
            port = flags.get("port", "")
            given = port.isascii() and port.isdigit() and 0 < int(port) < 65536
            where = f"--port {port} of the {name} plugin of Job '{job}'" if given else \
                f"the {name} plugin's default {default} (Job '{job}')"
            found[framework] = FrameworkArgs(roles=tuple((flags.get(role, role), role) for role in roles),
                                             port=int(port) if given else default, source=where)
        return found

    def owner_options(self, objects: Objects, options: Options) -> OwnerOptions:
        """A job with the tensorflow or ray plugin and no pytorch plugin: the training roles are the plugin's
        tasks that the job has, in the plugin's order (the TF chief, or the Ray head, first), so that every pod
        TF_CONFIG names is waited for."""
        plugins = _plugins(objects)
        if options.roles is not None or "pytorch" in plugins:
            return OwnerOptions(options)
        tasks = [t.get("name") for t in list_at(objects[0] if objects else None, "spec", "tasks")
                 if isinstance(t, Mapping)]
        for name, (framework, *_) in PLUGINS.items():
            if name in plugins:
                args = self.framework_args(objects)[framework]
                roles = tuple(task for task, _ in args.roles if task in tasks)
                if roles:
                    return OwnerOptions(dataclasses.replace(options, roles=roles),
                                        (f"Volcano {name} plugin: training roles {', '.join(roles)}",))
        return OwnerOptions(options)

    def pod_templates(self, job: Mapping[str, Any]) -> Iterator[PodTemplate]:
        """One template per task (``spec.tasks[i].template``), ``replicas`` pods each."""
        for i, task in enumerate(list_at(job, "spec", "tasks")):
            if isinstance(task, Mapping):
                name = task.get("name")
                yield PodTemplate(task.get("name", ""), f"tasks[{i}] ({name})", ("spec", "tasks", i, "template"),
                                  task.get("template"), replicas(task.get("replicas")))


VOLCANO = Volcano()
