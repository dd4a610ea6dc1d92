"""Hot spares (``--world-size``, core/plan/spares.py): who waits, who takes an empty seat, and that every pod of the job
decides the same from the same pods, whether it plans them at once or follows them change by change."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agent import examples
from agent.core import render_pod
from agent.core.model import Member, Options
from agent.core.plan.layout import build_plan
from agent.core.plan.planner import Planner
from agent.core.plan.spares import seat
from agent.core.pods.placement import parse_levels
from agent.errors import InputError

OPTIONS = Options(address="ip", world_size=4)
RACKS = Options(address="ip", world_size=4, levels=parse_levels(examples.RACK))
LOST = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
TRAINING = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "NODE_RANK", "NNODES", "PET_NNODES", "PET_NODE_RANK",
            "PET_MASTER_ADDR", "NPROC_PER_NODE")


def job(count: int = 6) -> list[dict[str, Any]]:
    """An Indexed Job of ``count`` pods: with --world-size 4, pods 4 and 5 are born spares."""
    return examples.indexed_job("sweep", count)


def name(pods: list[dict[str, Any]], index: int) -> str:
    return next(p["metadata"]["name"] for p in pods if p["metadata"]["name"].startswith(f"sweep-{index}-"))


def lose(pods: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    pods = copy.deepcopy(pods)
    pod = next(p for p in pods if p["metadata"]["name"] == name(pods, index))
    pod["status"]["conditions"] = [LOST]
    return pods


def terminate(pods: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    pods = copy.deepcopy(pods)
    next(p for p in pods if p["metadata"]["name"] == name(pods, index))["metadata"]["deletionTimestamp"] = \
        "2026-11-22T00:05:00Z"
    return pods


def delete(pods: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    return [p for p in copy.deepcopy(pods) if p["metadata"]["name"] != name(pods, index)]


def recreate(pods: list[dict[str, Any]], index: int, *, at: str = "2026-11-22T00:09:00Z") -> list[dict[str, Any]]:
    """The pod of ``index`` made again by its controller: a new name and creation time, the same index."""
    again = copy.deepcopy(next(p for p in job(8) if p["metadata"]["name"].startswith(f"sweep-{index}-")))
    again["metadata"]["name"] = f"sweep-{index}-again"
    again["metadata"]["creationTimestamp"] = at
    return [*delete(pods, index), again]


def healthy(pods: list[dict[str, Any]]) -> str:
    """A pod of the job that is not leaving (the pod whose plan is looked at)."""
    return next(p["metadata"]["name"] for p in pods
                if not p["status"].get("conditions") and not p["metadata"].get("deletionTimestamp"))


def world(pods: list[dict[str, Any]], options: Options = OPTIONS, nodes: Any = None
          ) -> tuple[list[tuple[int | None, str]], list[str], list[tuple[str, int, str | None]]]:
    """(NODE_RANK, index) of each training member, the spares' indices, the takeovers (by index)."""
    topo = build_plan(pods, healthy(pods), options, nodes=nodes).topology

    def short(pod: str | None) -> str | None:
        return None if pod is None else pod.split("-")[1] + ("'" if pod.endswith("again") else "")
    return ([(m.node_rank, short(m.name)) for m in topo.training], [short(m.name) for m in topo.spares],  # type: ignore
            [(short(t.name), t.node_rank, short(t.replaced)) for t in topo.takeovers])


CASES = [
    pytest.param(job(), ([(0, "0"), (1, "1"), (2, "2"), (3, "3")], ["4", "5"], []), id="the-pods-past-N-are-spares"),
    pytest.param(lose(job(), 2), ([(0, "0"), (1, "1"), (2, "4"), (3, "3")], ["5"], [("4", 2, "2")]),
                 id="a-lost-member-s-seat-goes-to-the-first-spare"),
    pytest.param(terminate(job(), 0), ([(0, "4"), (1, "1"), (2, "2"), (3, "3")], ["5"], [("4", 0, "0")]),
                 id="a-terminating-rank-0-is-replaced-in-its-seat"),
    pytest.param(delete(job(), 1), ([(0, "0"), (1, "4"), (2, "2"), (3, "3")], ["5"], [("4", 1, None)]),
                 id="a-deleted-member-s-seat-is-seen-from-the-indices-left"),
    pytest.param(delete(job(), 3), ([(0, "0"), (1, "1"), (2, "2"), (3, "4")], ["5"], [("4", 3, None)]),
                 id="the-last-seat-emptied-before-the-spares"),
    pytest.param(lose(lose(job(), 1), 2), ([(0, "0"), (1, "4"), (2, "5"), (3, "3")], [],
                                           [("4", 1, "1"), ("5", 2, "2")]), id="two-lost-two-spares-in-seat-order"),
    pytest.param(recreate(lose(job(), 2), 2), ([(0, "0"), (1, "1"), (2, "4"), (3, "3")], ["5", "2'"],
                                               [("4", 2, "2'")]),
                 id="a-pod-made-again-waits-behind-the-spares-and-evicts-nobody"),
    pytest.param(recreate(job(), 4), ([(0, "0"), (1, "1"), (2, "2"), (3, "3")], ["4'", "5"], []),
                 id="a-spare-made-again-is-a-spare"),
    pytest.param(lose(lose(lose(job(5), 0), 1), 2), ([(0, "4"), (1, "3")], [], [("4", 0, "0")]),
                 id="fewer-pods-than-seats-the-world-is-what-there-is"),
    pytest.param(job(3), ([(0, "0"), (1, "1"), (2, "2")], [], []), id="fewer-pods-than-N-from-the-start"),
]


@pytest.mark.parametrize(("pods", "expected"), CASES)
def test_the_seats_of_a_world_of_four(pods, expected):
    assert world(pods) == expected


@pytest.mark.parametrize(("pods", "expected"), CASES)
def test_every_pod_of_the_job_decides_the_same(pods, expected):
    seen = set()
    for pod in pods:
        if pod["status"].get("conditions") or pod["metadata"].get("deletionTimestamp"):
            continue  # a pod that leaves plans nothing: it is not a member of its own job
        topo = build_plan(pods, pod["metadata"]["name"], OPTIONS).topology
        seen.add((tuple((m.node_rank, m.name) for m in topo.training), tuple(m.name for m in topo.spares),
                  topo.takeovers))
    assert len(seen) == 1


def test_a_sidecar_that_follows_the_changes_plans_what_a_fresh_one_plans():
    """The planner keeps its layout between changes: the seats it gives are those of a plan from scratch."""
    steps = [job(), lose(job(), 2), delete(job(), 2), recreate(job(), 2), recreate(lose(job(), 1), 2)]
    planner = Planner(OPTIONS, name(job(), 0))
    for pods in steps:
        followed = planner.plan({p["metadata"]["name"]: p for p in pods}).topology
        fresh = build_plan(pods, name(job(), 0), OPTIONS).topology
        assert followed.training == fresh.training
        assert (followed.members, followed.spares, followed.takeovers) == \
            (fresh.members, fresh.spares, fresh.takeovers)


def test_the_seat_keeps_its_spare_while_the_lost_pod_is_marked_deleted_and_made_again():
    """The takeover does not move under the trainers: one spare holds the seat through every step."""
    marked, gone, back = lose(job(), 2), delete(job(), 2), recreate(job(), 2)
    held = {world(pods)[0][2] for pods in (marked, gone, back)}
    assert held == {(2, "4")}


def racked(pods: list[dict[str, Any]], racks: dict[int, str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each pod on its own node, in the rack ``racks`` gives its index."""
    pods = copy.deepcopy(pods)
    nodes = {}
    for pod in pods:
        index = int(pod["metadata"]["name"].split("-")[1])
        pod["spec"]["nodeName"] = f"node-{index}"
        nodes[f"node-{index}"] = {examples.RACK: racks[index]}
    return pods, nodes


@pytest.mark.parametrize(("racks", "lost", "taker"), [
    pytest.param({0: "a", 1: "a", 2: "b", 3: "b", 4: "a", 5: "b"}, 3, "5", id="the-spare-in-the-neighbours-rack"),
    pytest.param({0: "a", 1: "a", 2: "b", 3: "b", 4: "a", 5: "b"}, 1, "4", id="the-first-spare-is-in-the-rack"),
    pytest.param({0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "d"}, 3, "4", id="no-spare-in-the-rack-rank-order"),
    pytest.param({0: "a", 1: "b", 2: "c", 3: "d", 4: "e", 5: "a"}, 1, "5", id="seat-before-it-first"),
])
def test_a_spare_in_the_domain_of_the_seat_s_neighbours_is_preferred(racks, lost, taker):
    pods, nodes = racked(lose(job(), lost), racks)
    members, _, takeovers = world(pods, RACKS, nodes)
    assert dict(members)[lost] == taker and takeovers == [(taker, lost, str(lost))]


def test_a_spare_s_files_carry_no_world_and_no_host_list_names_it():
    pods = job()
    spare = render_pod(pods, name(pods, 5), OPTIONS)
    env = {v.name: v.value for v in spare.variables if v.written and not v.unset}
    assert env["TOPOLOGY_SPARE"] == "1" and not set(TRAINING) & set(env)
    member = render_pod(pods, name(pods, 0), OPTIONS)
    assert {v.name: v.value for v in member.variables}["TOPOLOGY_SPARE"] == "0"
    for rendered in (spare, member):
        hosts = rendered.files["hostfile"].decode()
        assert "127.1.0.5" not in hosts and "127.1.0.6" not in hosts and len(hosts.splitlines()) == 4
        assert "127.1.0.5" not in rendered.files["worker.host"].decode()


def test_a_promoted_spare_gets_the_lost_members_ranks_and_the_same_world_size():
    pods = lose(job(), 2)
    before = {v.name: v.value for v in render_pod(job(), name(pods, 2), OPTIONS).variables}
    after = {v.name: v.value for v in render_pod(pods, name(pods, 4), OPTIONS).variables}
    for key in ("RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "PET_NNODES"):
        assert after[key] == before[key], key
    assert after["TOPOLOGY_SPARE"] == "0"


def test_explain_lines_name_the_spares_and_whose_place_a_spare_took():
    from agent.core.files.explaining import format_explanation

    text = format_explanation(render_pod(lose(job(), 2), name(job(), 5), OPTIONS))
    assert "role 'worker' (hot spare)" in text
    assert f"pod '{name(job(), 5)}' is a hot spare (--world-size 4)" in text
    assert f"pod '{name(job(), 4)}' holds node rank 2 as a promoted spare, in place of pod '{name(job(), 2)}'" in text


def test_leaderworkerset_workers_count_their_seats_from_one():
    pods = examples.leaderworkerset("vllm", size=5, groups=1)
    topo = build_plan(pods, pods[0]["metadata"]["name"], OPTIONS).topology
    assert [m.index for m in topo.training] == [(0,), (1,), (2,), (3,)] and [m.index for m in topo.spares] == [(4,)]


def test_a_world_size_with_the_c10d_rendezvous_is_refused_in_one_line():
    pods = job()
    with pytest.raises(InputError, match="--world-size keeps a static world"):
        build_plan(pods, name(pods, 0), Options(address="ip", world_size=4, elastic=(2, 6)))


def member(name: str, domains: tuple[str, ...] | None = None, slots: int = 1) -> Member:
    return Member(name, "worker", (0,), 0, name, None, None, True, slots, 0, 0, True, "", domains)


@pytest.mark.parametrize(("names", "created", "holes", "size", "seated", "spares"), [
    pytest.param("abc", ["t0"] * 3, {}, 2, ["a", "b"], ["c"], id="born-spare"),
    pytest.param("ac", ["t0"] * 2, {1: None}, 2, ["a", "c"], [], id="hole-filled"),
    pytest.param("abc", ["t0", "t9", "t0"], {}, 2, ["a", "c"], ["b"], id="made-after-every-spare-waits"),
    pytest.param("abc", ["t0", "t0", "t9"], {}, 2, ["a", "b"], ["c"], id="a-late-spare-changes-nothing"),
    pytest.param("ab", ["t0"] * 2, {2: None}, 3, ["a", "b"], [], id="too-few"),
])
def test_the_seating_rule_on_its_own(names, created, holes, size, seated, spares):
    positions = [k for k in range(len(names) + len(holes)) if k not in holes]
    got = seat([member(n) for n in names], [(k,) for k in positions], created, {(k,): v for k, v in holes.items()},
               size)
    assert [m.name for m in got.members] == seated and [m.name for m in got.spares] == spares
    assert [m.node_rank for m in got.members] == list(range(len(seated)))


def test_status_says_who_is_a_spare_and_whose_place_a_spare_took():
    from agent.core.report.status import document, job_status, table

    status = job_status(lose(job(), 2), job="sweep", kind="Indexed Job 'sweep'", namespace="default",
                        options=OPTIONS, roster=None, expected=None, seen={})
    text = table(status, now=0.0)
    assert "SPARES" in text and f"pod '{name(job(), 5)}' is a hot spare (--world-size 4)" in text
    assert f"pod '{name(job(), 4)}' holds node rank 2 as a promoted spare, in place of pod '{name(job(), 2)}'" in text
    doc = document(status, now=0.0)
    assert doc["spares"] == [name(job(), 5)]
    assert doc["takeovers"] == [{"name": name(job(), 4), "nodeRank": 2, "replaced": name(job(), 2)}]


@pytest.mark.parametrize(("pods", "expected"), CASES)
def test_a_pod_in_its_own_view_gets_from_the_summary_what_the_full_view_gives_it(pods, expected):
    """A follower of a large job reads the publisher's summary, not every pod: the spares and the takeovers travel
    in it, so each pod's torch.env is the one the whole plan gives it (a spare's too)."""
    from agent.core.files.variables import compute_variables
    from agent.core.publication.summary import light_plan, read_summary, summarize, summary_text

    publisher = build_plan(pods, healthy(pods), OPTIONS)
    summary = read_summary(summary_text(summarize(publisher, seq=1, options=OPTIONS)))
    assert summary is not None
    for pod in pods:
        if pod["status"].get("conditions") or pod["metadata"].get("deletionTimestamp"):
            continue
        light = light_plan(summary, pod, OPTIONS)
        assert light is not None, pod["metadata"]["name"]
        full = build_plan(pods, pod["metadata"]["name"], OPTIONS)
        assert light.topology.is_spare == full.topology.is_spare
        written = [{v.name: v.value for v in compute_variables(plan, OPTIONS, generation=1) if v.written}
                   for plan in (light, full)]
        assert written[0] == written[1]


def test_every_trainer_gets_new_files_when_a_seat_changes_hands():
    """Rank 0's own numbers stay when a spare takes seat 2; its torch.env changes all the same (TOPOLOGY_SEATS), so
    its sidecar signals it and its static torchrun joins the new world."""
    def env(pods: list[dict[str, Any]]) -> dict[str, str]:
        return {v.name: v.value for v in render_pod(pods, name(job(), 0), OPTIONS).variables if v.written}

    before, after = env(job()), env(lose(job(), 2))
    changed = {k for k, v in before.items() if v != after.get(k)}
    assert "TOPOLOGY_SEATS" in changed and changed <= {"TOPOLOGY_SEATS", "VC_WORKER_HOSTS"}  # a large role lists none


def test_a_spare_of_a_large_job_reads_the_summary_not_every_pod():
    """A spare's files name no host: in the default view it is placed from the summary, as a member is."""
    from agent.core.publication.summary import own_view

    options = Options(address="ip", world_size=4, view="auto")
    pods = lose(job(), 2)
    for index in (0, 4, 5):  # a member, the promoted spare, a spare
        light, why = own_view(build_plan(pods, name(pods, index), options), options, ssh=False, published=True)
        assert light is not None and why == "", (index, why)


def test_the_generation_event_names_the_spare_and_the_seat_it_took():
    from agent.core.model import Takeover
    from agent.core.report.events import generation_note

    note = generation_note(3, (4, 4), (4, 4), left=[("sweep-2", "lost: DisruptionTarget (EvictionByEvictionAPI)")],
                           took=[Takeover("sweep-4", 2, "sweep-2")])
    assert note.endswith("; spares took seats: sweep-4 node rank 2 (was sweep-2)")


@pytest.mark.parametrize(("pods", "expected"), CASES)
def test_a_follower_of_the_published_rows_seats_the_job_as_the_publisher(pods, expected):
    """The rows carry each pod's creation time: a follower that holds every member (the compact pods a published row
    makes) tells a pod made again from the one it replaced, as the publisher does from the pods."""
    import json

    from agent.core.publication.published import Compactor, _row, check_row, compact_of, shape_lists

    compactor, index = Compactor(OPTIONS), {}
    rows = [json.loads(json.dumps(_row(p, OPTIONS, index))) for p in pods]
    shapes = shape_lists([json.loads(t) for t in sorted(index, key=index.__getitem__)], [])
    for row in rows:
        check_row(row, len(index))
    for form in ([compactor.pod(p) for p in pods], [compact_of(row, shapes, "default") for row in rows]):
        assert world(form) == expected
