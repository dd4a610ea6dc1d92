"""Jobs as the tests' clusters hold them, for the sandbox over HTTPS (tests/integration) and in memory (the fast
lane): both are a ``SandboxThread`` with the same helpers. And what the tests read of a pod's files."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from agent import examples
from agent.runtime.demo import volcano_owner


def create_volcano_job(sandbox: Any, tasks=(("master", 1), ("worker", 3), ("extras", 1)), *,
                       with_ips: bool = True) -> list[dict[str, Any]]:
    owner = volcano_owner()
    owner["spec"]["tasks"] = [{"name": n, "replicas": r, "template": {}} for n, r in tasks]
    created = sandbox.create("batch.volcano.sh/v1alpha1/jobs", "default", owner)
    pods = examples.volcano_job("demo", tasks)
    for pod in pods:
        pod["metadata"]["ownerReferences"][0]["uid"] = created["metadata"]["uid"]
        if not with_ips:
            pod["status"] = {"phase": "Pending"}
        sandbox.create_pod(pod)
    return pods


def add_worker(sandbox: Any, index: int, ip_index: int) -> None:
    pod = examples.volcano_job("demo", (("master", 1), ("worker", index + 1)))[-1]
    pod["status"].update(podIP=examples.loopback_ip(ip_index), podIPs=[{"ip": examples.loopback_ip(ip_index)}])
    sandbox.create_pod(pod)


def rogue(name: str, role: str, index: int, ip: int) -> dict[str, Any]:
    """A pod someone else created with the job's labels: no ownerReference to the job."""
    pod = examples.volcano_job("demo", (("master", 1), ("worker", 1)))[1]
    pod["metadata"]["name"] = name
    pod["metadata"]["labels"].update({"volcano.sh/task-spec": role, "volcano.sh/task-index": str(index)})
    pod["metadata"].pop("ownerReferences")
    pod["spec"]["hostname"] = name
    pod["status"].update(podIP=examples.loopback_ip(ip), podIPs=[{"ip": examples.loopback_ip(ip)}])
    return pod


def forge_publication(sandbox: Any, pods: list[dict[str, Any]], *, writer: str, writer_uid: str,
                      forged_ip: str = "127.9.9.9") -> None:
    """`demo-topology` and its journal, made before the job's leader publishes, by ``writer`` (the admission
    policy binds data.leader and data.leaderUid to the writer's token, not to the job)."""
    from agent.core import Options
    from agent.core.journal import PublishedState, Publisher, journal_body
    from agent.core.published import configmap_body, configmap_name, pack

    forged_pods = copy.deepcopy(pods)
    for pod in forged_pods:
        pod["status"].update(podIP=forged_ip, podIPs=[{"ip": forged_ip}])
    forger = Publisher(PublishedState(job="demo", namespace="default"), Options(address="ip"), leader=writer,
                       leader_uid=writer_uid)
    forger.change({p["metadata"]["name"]: p for p in forged_pods}, [p["metadata"]["name"] for p in forged_pods])
    sandbox.create("/v1/configmaps", "default", configmap_body(
        configmap_name("demo"), pack(forger.snapshot_document()), generation=forger.state.seq, leader=writer,
        leader_uid=writer_uid, owner=None))
    forger.start_from_snapshot()
    sandbox.create("/v1/configmaps", "default", journal_body(configmap_name("demo"), forger.journal_data(),
                                                             owner=None))


def configmap(sandbox: Any, name: str) -> dict[str, Any]:
    return sandbox.sandbox.store.get("/v1/configmaps", "default", name)


def policy_admits(sandbox: Any, operation: str, writer: str, obj: dict[str, Any], old: dict[str, Any] | None) -> bool:
    """What manifests/policy says of the agent's real write ``obj`` (over ``old``) by pod ``writer``'s bound token,
    evaluated by a real CEL engine (tests/vap.py); Deny is raised with the policy's message."""
    from tests.vap import Policy, agent_request

    pod = sandbox.sandbox.store.get("/v1/pods", "default", writer)
    request = agent_request(operation, namespace="default", pod=writer, pod_uid=pod["metadata"]["uid"],
                            name=obj["metadata"]["name"])
    return Policy().admit(request, obj, old)


def generation(out: Path) -> int:
    try:
        return int((out / "generation").read_text())
    except (OSError, ValueError):
        return 0


def world(out: Path) -> tuple[str, str]:
    env = json.loads((out / "topology.json").read_text())["env"]
    return env["WORLD_SIZE"], env["MASTER_ADDR"]
