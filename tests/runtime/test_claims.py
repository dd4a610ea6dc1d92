"""When init and the sidecar list the DRA claims: only for pods that take some, once, and what a refusal leaves."""

from __future__ import annotations

import pytest

from agent.core.model import Options, Processes
from agent.errors import ApiForbidden
from agent.runtime.claims import claims_path, with_claims
from tests.core.test_claims import ALLOCATED, GPUS, MADE, dra_pod, trainer
from tests.core.test_rules import container, one_pod_job


class Api:
    """The client face init and the sidecar give: each LIST recorded, answered with ``items`` or ``error``."""

    def __init__(self, items=(), error=None):
        self.items, self.error, self.lists = list(items), error, []

    async def list_objects(self, path, **query):
        self.lists.append((path, query))
        if self.error is not None:
            raise self.error
        return self.items, "7"


async def retry(call, what):
    return await call()


async def test_a_job_without_claims_lists_none():
    api = Api()
    options = Options()
    assert await with_claims(api, "team-a", one_pod_job(container({"cpu": "8"})), options, retry=retry) is options
    assert api.lists == []


async def test_an_explicit_process_count_lists_none():
    api = Api(ALLOCATED)
    pod = dra_pod(trainer([{"name": "gpus"}]), pod_claims=[GPUS], statuses=MADE[:1])
    options = Options(processes=Processes(per_node=2))
    assert await with_claims(api, "team-a", [pod], options, retry=retry) is options and api.lists == []


async def test_pods_taking_claims_list_the_namespaces_claims_once():
    api = Api(ALLOCATED)
    pod = dra_pod(trainer([{"name": "gpus"}]), pod_claims=[GPUS], statuses=MADE[:1])
    options = await with_claims(api, "team-a", [pod, pod], Options(), retry=retry)
    assert [path for path, _ in api.lists] == [claims_path("team-a")]
    assert claims_path("team-a") == "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims"
    assert options.processes.claims is not None and options.processes.claims.named("solo-0-gpus-x1") is not None


@pytest.mark.parametrize("error", [ApiForbidden("resourceclaims is forbidden")], ids=["forbidden"])
async def test_a_refused_list_leaves_a_note_not_an_error(error):
    pod = dra_pod(trainer([{"name": "gpus"}]), pod_claims=[GPUS], statuses=MADE[:1])
    options = await with_claims(Api(error=error), "team-a", [pod], Options(), retry=retry)
    claims = options.processes.claims
    assert claims is not None and "grant get and list on resourceclaims" in claims.note


def test_the_claimants_are_asked_once_per_containers_list(monkeypatch):
    """Pods that share one containers list (a held job's pods of one shape) get one answer; a pod with a list of its
    own is asked on its own, and a pod without the --container named is no claimant."""
    from agent.core.compact import CompactPod
    from agent.runtime import claims

    taking = dra_pod(trainer([{"name": "gpus"}]), pod_claims=[GPUS], statuses=MADE[:1])
    plain = one_pod_job(container({"cpu": "8"}))[0]
    shared = taking["spec"]["containers"]
    held = [CompactPod(f"w-{k}", "team-a", "1", {}, {}, shared) for k in range(5)]
    asked: list[object] = []
    picking = claims.pick_trainer_container
    monkeypatch.setattr(claims, "pick_trainer_container",
                        lambda pod, wanted: (asked.append(pod), picking(pod, wanted))[1])
    assert claims.claimants([*held, plain, taking], Options()) == [*held, taking]
    assert asked == [held[0], plain]  # the held five and the pod whose list they hold: one answer
    named = Options(processes=Processes(container="no-such"))
    assert claims.claimants([*held, plain], named) == []
