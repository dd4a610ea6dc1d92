"""Replica groups (--replica-groups): each group of a job's training pods is its own world, with the variables
torchft and JAX multi-slice read, and a change in one group leaves the other groups' files as they are."""

from __future__ import annotations

import json
import signal
from types import SimpleNamespace

import pytest

from agent import examples
from agent.core import Renderer, render_pod
from agent.core.files.frameworks import FRAMEWORKS
from agent.core.model import FrameworkOptions, Options
from agent.core.publication.published import _row as pod_row
from agent.errors import InputError


def env_of(rendered) -> dict[str, str]:
    return {v.name: v.value for v in rendered.variables if v.written and not v.unset}


def name(pod) -> str:
    return pod["metadata"]["name"]


def torchft_jobset():
    """A JobSet: replicated job lighthouse (1 pod), then trainer (2 Jobs of 2 pods): groups 0 and 1."""
    return examples.jobset("ft", (("lighthouse", 1, 1), ("trainer", 2, 2)))


def volcano_partitions():
    """A Volcano job of 4 workers in partitions of 2 (volcano.sh/partition-id = index // 2) and a lighthouse task."""
    pods = examples.volcano_job("vp", (("worker", 4), ("lighthouse", 1)))
    for pod in pods:
        labels = pod["metadata"]["labels"]
        if labels["volcano.sh/task-spec"] == "worker":
            labels["volcano.sh/partition-id"] = str(int(labels["volcano.sh/task-index"]) // 2)
    return pods


def labelled_jobset():
    """One Job of 4 pods split by a label of the user's: pods 0, 2 in group 0; 1, 3 in group 1."""
    pods = examples.jobset("hsdp", (("node", 1, 4),))
    for at, pod in enumerate(pods):
        pod["metadata"]["labels"]["example.com/replica"] = str(at % 2)
    return pods


# (id, pods, rule, pod, REPLICA_GROUP_ID, NUM_REPLICA_GROUPS, MASTER_ADDR, WORLD_SIZE, RANK, TORCHFT_LIGHTHOUSE)
CASES = [
    ("jobset-job group 0, rank 0", torchft_jobset, "jobset-job", 1, "0", "2", "ft-trainer-0-0.ft", "2", "0",
     "http://ft-lighthouse-0-0.ft:29510"),
    ("jobset-job group 0, rank 1", torchft_jobset, "jobset-job", 2, "0", "2", "ft-trainer-0-0.ft", "2", "1",
     "http://ft-lighthouse-0-0.ft:29510"),
    ("jobset-job group 1, rank 0", torchft_jobset, "jobset-job", 3, "1", "2", "ft-trainer-1-0.ft", "2", "0",
     "http://ft-lighthouse-0-0.ft:29510"),
    ("jobset-job group 1, rank 1", torchft_jobset, "jobset-job", 4, "1", "2", "ft-trainer-1-0.ft", "2", "1",
     "http://ft-lighthouse-0-0.ft:29510"),
    ("volcano partition 0", volcano_partitions, "volcano-partition", 1, "0", "2", "vp-worker-0.vp", "2", "1",
     "http://vp-lighthouse-0.vp:29510"),
    ("volcano partition 1", volcano_partitions, "volcano-partition", 3, "1", "2", "vp-worker-2.vp", "2", "1",
     "http://vp-lighthouse-0.vp:29510"),
    ("a label of the user's, group 1", labelled_jobset, "label:example.com/replica", 3, "1", "2",
     "hsdp-node-0-1.hsdp", "2", "1", None),
    ("a label of the user's, group 0", labelled_jobset, "label:example.com/replica", 2, "0", "2",
     "hsdp-node-0-0.hsdp", "2", "1", None),
]


@pytest.mark.parametrize(("make", "rule", "at", "group", "count", "master", "world", "rank", "lighthouse"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_each_replica_group_is_its_own_world(make, rule, at, group, count, master, world, rank, lighthouse):
    pods = make()
    env = env_of(render_pod(pods, name(pods[at]), Options(replica_groups=rule)))
    assert (env["REPLICA_GROUP_ID"], env["NUM_REPLICA_GROUPS"]) == (group, count)
    assert (env["MASTER_ADDR"], env["WORLD_SIZE"], env["RANK"], env["NODE_RANK"]) == (master, world, rank, rank)
    assert env["PET_MASTER_ADDR"] == master and env["NNODES"] == env["PET_NNODES"] == world
    assert env.get("TORCHFT_LIGHTHOUSE") == lighthouse
    assert not any(key.startswith("MEGASCALE_") for key in env)  # JAX's only


def test_the_lighthouse_is_no_training_role_and_is_told_the_groups_and_its_address():
    pods = torchft_jobset()
    rendered = render_pod(pods, name(pods[0]), Options(replica_groups="jobset-job"))
    env = env_of(rendered)
    assert env["TOPOLOGY_TRAINING"] == "0" and "RANK" not in env and "REPLICA_GROUP_ID" not in env
    assert env["NUM_REPLICA_GROUPS"] == "2" and env["TORCHFT_LIGHTHOUSE"] == "http://ft-lighthouse-0-0.ft:29510"
    one_world = env_of(render_pod(pods, name(pods[3]), Options()))  # without the setting: the job's one world
    assert one_world["WORLD_SIZE"] == "5" and one_world["MASTER_ADDR"] == "ft-lighthouse-0-0.ft"
    assert not {"REPLICA_GROUP_ID", "NUM_REPLICA_GROUPS", "TORCHFT_LIGHTHOUSE"} & set(one_world)


def test_a_port_named_lighthouse_on_the_lighthouse_pod_is_its_address_port():
    pods = torchft_jobset()
    pods[0]["spec"]["containers"][0]["ports"] = [{"name": "lighthouse", "containerPort": 29600}]
    env = env_of(render_pod(pods, name(pods[1]), Options(replica_groups="jobset-job")))
    assert env["TORCHFT_LIGHTHOUSE"] == "http://ft-lighthouse-0-0.ft:29600"


def test_topology_json_lists_every_group_and_the_pods_own_world():
    pods = torchft_jobset()
    document = json.loads(render_pod(pods, name(pods[4]), Options(replica_groups="jobset-job")).files["topology.json"])
    groups = document["replicaGroups"]
    assert (groups["rule"], groups["group"], groups["count"]) == ("jobset-job", 1, 2)
    assert [(g["id"], g["masterAddr"], g["members"]) for g in groups["groups"]] == [
        (0, "ft-trainer-0-0.ft", [name(pods[1]), name(pods[2])]),
        (1, "ft-trainer-1-0.ft", [name(pods[3]), name(pods[4])])]
    ranked = [(m["name"], m["nodeRank"]) for m in document["members"] if m["training"]]
    assert ranked == [(name(pods[3]), 0), (name(pods[4]), 1)]
    assert document["nnodes"] == 2 and document["masterAddr"] == "ft-trainer-1-0.ft"


def test_jax_multi_slice_gets_the_megascale_variables_of_its_slice():
    pods = torchft_jobset()
    options = Options(replica_groups="jobset-job", frameworks=FrameworkOptions(names=("jax",)))
    assert "jax" in FRAMEWORKS
    env = env_of(render_pod(pods, name(pods[3]), options))
    assert env["MEGASCALE_SLICE_ID"] == "1" and env["MEGASCALE_NUM_SLICES"] == "2"
    assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "ft-trainer-0-0.ft"  # slice 0's first pod


def test_a_group_whose_pods_are_all_gone_still_counts_as_its_job_declares():
    pods = [p for p in torchft_jobset() if not name(p).startswith("ft-trainer-1-")]
    env = env_of(render_pod(pods, name(pods[1]), Options(replica_groups="jobset-job")))
    assert env["NUM_REPLICA_GROUPS"] == "2"  # the label jobset.sigs.k8s.io/replicatedjob-replicas


@pytest.mark.parametrize(("rule", "words"), [
    ("jobset-jobs", "must be one of: jobset-job, volcano-partition, or label:KEY"),
    ("label:", "must be one of"),
    ("label:bad key!", "must be one of"),
], ids=["misspelt", "label without key", "label key out of grammar"])
def test_a_rule_the_agent_does_not_know_is_one_line(rule, words):
    pods = torchft_jobset()
    with pytest.raises(InputError, match=words):
        render_pod(pods, name(pods[1]), Options(replica_groups=rule))


def test_a_training_pod_without_the_group_label_is_named_in_one_line():
    pods = torchft_jobset()
    del pods[2]["metadata"]["labels"]["jobset.sigs.k8s.io/job-index"]
    del pods[2]["metadata"]["annotations"]["jobset.sigs.k8s.io/job-index"]
    with pytest.raises(InputError, match=f"pod '{name(pods[2])}'.*jobset.sigs.k8s.io/job-index.*does not carry"):
        render_pod(pods, name(pods[1]), Options(replica_groups="jobset-job"))


def test_the_published_row_keeps_the_label_the_groups_are_read_from():
    pods = volcano_partitions()
    row = pod_row(pods[1], Options(replica_groups="volcano-partition"), {})
    assert row[2]["volcano.sh/partition-id"] == "0"
    assert "volcano.sh/partition-id" not in pod_row(pods[1], Options(), {})[2]


def test_a_lost_pod_changes_only_its_own_groups_files():
    """Group 1's second pod is deleted: group 0's torch.env and topology.json members and its membership key stay
    (no new generation, no signal); group 1's world shrinks."""
    pods = torchft_jobset()
    by_name = {name(p): p for p in pods}
    options = Options(replica_groups="jobset-job")
    renderers = {n: Renderer(options, n) for n in by_name}
    before = {n: r.render(by_name, generation=1) for n, r in renderers.items()}
    keys = {n: renderers[n].membership_key(before[n]) for n in by_name}
    lost = name(pods[4])
    left = {n: p for n, p in by_name.items() if n != lost}
    after = {n: renderers[n].render(left, generation=1) for n in left}
    for member in (name(pods[1]), name(pods[2])):  # group 0
        assert after[member].files["torch.env"] == before[member].files["torch.env"]
        assert renderers[member].membership_key(after[member]) == keys[member]
    survivor = name(pods[3])
    assert renderers[survivor].membership_key(after[survivor]) != keys[survivor]
    assert env_of(after[survivor])["WORLD_SIZE"] == "1"


class CountingFinder:
    def __init__(self) -> None:
        self.asked = 0
        self.pid_file, self.match = None, None

    def find(self):
        self.asked += 1
        return None


def _evaluator(out, pod: str):
    from agent.runtime.metrics import SidecarMetrics
    from agent.runtime.sidecar.evaluating import Evaluator

    settings = SimpleNamespace(options=Options(replica_groups="jobset-job"), pod_name=pod, out_dir=out, ssh=None,
                               finder=CountingFinder(), signal=signal.SIGUSR1)
    return Evaluator(settings, SidecarMetrics())


def test_the_sidecar_of_another_group_neither_rewrites_nor_signals_when_a_pod_is_lost(tmp_path):
    pods = torchft_jobset()
    by_name = {name(p): p for p in pods}
    lost = name(pods[4])
    left = {n: p for n, p in by_name.items() if n != lost}
    evaluators = {}
    for member in (name(pods[1]), name(pods[3])):
        out = tmp_path / member
        out.mkdir()
        evaluators[member] = evaluator = _evaluator(out, member)
        evaluator.evaluate(0.0, pods=by_name, light=None, nodes={}, note="first")
        assert evaluator.generation == 1 and evaluator.settings.finder.asked == 1
    written = (tmp_path / name(pods[1]) / "torch.env").read_bytes()
    for evaluator in evaluators.values():
        evaluator.evaluate(0.0, pods=left, light=None, nodes={}, note="lost")
    other, own = evaluators[name(pods[1])], evaluators[name(pods[3])]
    assert (other.generation, other.settings.finder.asked) == (1, 1)
    assert (tmp_path / name(pods[1]) / "torch.env").read_bytes() == written
    assert (own.generation, own.settings.finder.asked) == (2, 2)
    assert "export WORLD_SIZE='1'" in (tmp_path / name(pods[3]) / "torch.env").read_text()


def test_a_sidecar_continuing_from_inits_files_keeps_its_groups_generation(tmp_path):
    """The membership key read back from topology.json (init's) holds the groups' part: the sidecar's first
    evaluation of the same pods is no new generation."""
    pods = torchft_jobset()
    by_name = {name(p): p for p in pods}
    member = name(pods[3])
    first = _evaluator(tmp_path, member)
    first.evaluate(0.0, pods=by_name, light=None, nodes={}, note="init")
    again = _evaluator(tmp_path, member)
    again.load_previous()
    again.evaluate(0.0, pods=by_name, light=None, nodes={}, note="start")
    assert again.generation == 1 and again.settings.finder.asked == 0


def test_status_shows_each_pods_group_and_its_rank_within_it():
    from agent.core.report.status import document, job_status, table

    pods = torchft_jobset()
    status = job_status(pods, job="ft", kind="JobSet 'ft'", namespace="default",
                        options=Options(replica_groups="jobset-job"), roster=None, expected=None, seen={})
    rows = {row.name: (row.group, row.node_rank) for row in status.rows}
    assert rows == {name(pods[0]): (None, None), name(pods[1]): (0, 0), name(pods[2]): (0, 1),
                    name(pods[3]): (1, 0), name(pods[4]): (1, 1)}
    text = table(status, now=0.0)
    assert "in 2 replica groups, each its own world" in text and "GROUP" in text.splitlines()[1]
    assert [m["replicaGroup"] for m in document(status, now=0.0)["members"]] == [0, 0, 1, 1, None]


def test_explain_lists_every_group_and_marks_the_pods_own():
    from agent.core.files.explaining import format_explanation

    pods = torchft_jobset()
    text = format_explanation(render_pod(pods, name(pods[3]), Options(replica_groups="jobset-job")))
    assert f"  * group 1: MASTER_ADDR ft-trainer-1-0.ft, pods {name(pods[3])}, {name(pods[4])}" in text
    assert f"    group 0: MASTER_ADDR ft-trainer-0-0.ft, pods {name(pods[1])}, {name(pods[2])}" in text
    assert "lighthouse: http://ft-lighthouse-0-0.ft:29510" in text and "this pod's replica group 1:" in text


def test_an_elastic_groups_rendezvous_is_its_own_first_pod():
    pods = torchft_jobset()
    options = Options(replica_groups="jobset-job", elastic=(1, 2))
    for at, host in ((2, "ft-trainer-0-0.ft"), (4, "ft-trainer-1-0.ft")):
        env = env_of(render_pod(pods, name(pods[at]), options))
        assert env["PET_RDZV_ENDPOINT"] == f"{host}:29400" and env["PET_NNODES"] == "1:2"
        assert env["RANK"] == "1" and env["MASTER_ADDR"] == host


def test_a_pod_whose_group_label_changes_is_read_again_by_the_sidecars_renderer():
    import copy

    pods = labelled_jobset()
    by_name = {name(p): p for p in pods}
    renderer = Renderer(Options(replica_groups="label:example.com/replica"), name(pods[0]))
    assert env_of(renderer.render(by_name, generation=1))["WORLD_SIZE"] == "2"
    moved = copy.deepcopy(pods[1])  # the API's next version of the pod: a new object
    moved["metadata"]["labels"]["example.com/replica"] = "0"
    env = env_of(renderer.render({**by_name, name(moved): moved}, generation=1))
    assert (env["WORLD_SIZE"], env["NUM_REPLICA_GROUPS"]) == ("3", "2")
