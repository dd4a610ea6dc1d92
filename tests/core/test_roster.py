"""Membership is decided by the job's own object, not by labels alone. A pod with the job's labels
and no ownerReference to it, a role the job does not have (`WORKER` beside `worker`), or (while init forms the
gang) an index beyond the role's replicas is left out with one line; the others go on."""

from __future__ import annotations

import copy
import subprocess

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agent import examples
from agent.core import Options, render_pod
from agent.core.controllers import MPIJOB, PYTORCHJOB, VOLCANO
from agent.core.model import ControllerChoice
from agent.core.plan.gang import JobView, roster_of
from agent.errors import InputError
from agent.runtime.demo import volcano_owner

OWNER = volcano_owner()
OWNER["spec"]["tasks"] = [{"name": "master", "replicas": 1}, {"name": "worker", "replicas": 2}]


def pods():
    return examples.volcano_job("demo", (("master", 1), ("worker", 2)))


def rogue(*, index: int = 9, role: str = "worker", owned: bool = False) -> dict:
    pod = copy.deepcopy(pods()[1])
    pod["metadata"]["name"] = f"rogue-{role}-{index}"
    pod["metadata"]["labels"].update({"volcano.sh/task-spec": role, "volcano.sh/task-index": str(index)})
    if not owned:
        pod["metadata"].pop("ownerReferences")
    return pod


def roster(check_index: bool = True, options: Options | None = None):
    return roster_of(JobView(VOLCANO, options or Options(), (OWNER,)), check_index=check_index)


def test_the_jobs_own_pods_are_members():
    assert OWNER["metadata"]["uid"] == pods()[0]["metadata"]["ownerReferences"][0]["uid"]
    assert [roster().refusal(p) for p in pods()] == [None, None, None]


def test_labels_without_the_owners_uid_are_not_a_member():
    why = roster().refusal(rogue())
    assert why.startswith("pod 'rogue-worker-9' has the labels of Job 'demo' but is not owned by it")
    forged = rogue(index=1)
    forged["metadata"]["ownerReferences"] = [{**pods()[1]["metadata"]["ownerReferences"][0], "uid": "someone-else"}]
    assert "is not owned by it" in roster().refusal(forged)


def test_a_role_the_job_does_not_have_is_not_a_member_even_when_owned():
    why = roster().refusal(rogue(role="WORKER", index=0, owned=True))
    assert why == ("pod 'rogue-WORKER-0': role 'WORKER' is not one of Job 'demo''s (master, worker); role names "
                   "must match exactly")


def test_an_index_beyond_the_replicas_is_left_out_by_init_but_is_a_scale_up_to_the_sidecar():
    beyond = rogue(index=2, owned=True)
    assert "index 2 of role 'worker' is beyond Job 'demo''s 2 replicas" in roster().refusal(beyond)
    assert roster(check_index=False).refusal(beyond) is None
    assert roster(options=Options(elastic="2:4")).refusal(beyond) is None  # an elastic job's size moves


def test_controllers_that_own_pods_through_other_objects_check_roles_only():
    assert PYTORCHJOB.owns_directly(examples.pytorchjob and PYTORCHJOB.identify(
        examples.pytorchjob()[0], Options()))
    launcher, worker = examples.mpijob(workers=1)
    assert not MPIJOB.owns_directly(MPIJOB.identify(launcher, Options()))  # its owner is a batch Job
    assert MPIJOB.owns_directly(MPIJOB.identify(worker, Options()))
    view = JobView(MPIJOB, Options(), ({"kind": "MPIJob", "metadata": {"name": "allreduce",
                                                                       "uid": "not-the-examples"},
                                        "spec": {"mpiReplicaSpecs": {"Launcher": {"replicas": 1},
                                                                     "Worker": {"replicas": 1}}}},))
    checked = roster_of(view)
    assert checked.refusal(launcher) is None and "is not owned by it" in checked.refusal(worker)


ROLES = st.text(st.sampled_from("abwWoOrRkKeE-_.0"), min_size=1, max_size=8).filter(
    lambda r: r[0].isalnum() and r[-1].isalnum())


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(roles=st.lists(ROLES, min_size=1, max_size=4, unique=True))
@example(roles=["worker", "WORKER"])  # the review's case
@example(roles=["a-b", "a_b", "A.B"])
def test_each_variable_is_exported_once_and_bash_sees_the_value_written(roles, tmp_path_factory):
    """Whatever role names the pods' labels carry (no job object to check them against: `render`), every
    name in torch.env is exported once, and bash, sourcing it, sees exactly the values written."""
    roles = [r for r in roles if r != "master"]
    job = examples.volcano_job("demo", (("master", 1), *((f"r{i}", 1) for i in range(len(roles)))))
    for pod, role in zip(job[1:], roles, strict=True):  # valid pod names; the role is only a label's value
        pod["metadata"]["labels"]["volcano.sh/task-spec"] = role
    rendered = render_pod(job, job[0]["metadata"]["name"], Options(roles=("master", *roles)))
    text = rendered.files["torch.env"].decode()
    names = [line.split("=", 1)[0].removeprefix("export ") for line in text.splitlines()
             if line.startswith("export ")]
    assert len(names) == len(set(names)), names
    written = {v.name: v.value for v in rendered.variables if v.written and not v.unset and not v.reference}
    path = tmp_path_factory.mktemp("env") / "torch.env"
    path.write_text(text)
    seen = subprocess.run(["env", "-i", "bash", "-c", f". {path} && env -0"], capture_output=True, check=True).stdout
    env = dict(item.split("=", 1) for item in seen.decode().split("\0") if "=" in item)
    for name, value in written.items():
        assert env.get(name) == value, name


def test_the_generic_selector_promises_its_labels_and_no_more():
    """docs/security.md, "Membership is the job's": the generic `--selector` mode reads no job object, so nothing
    can be checked beyond the labels. A pod with the labels joins (that is the mode's contract); its values pass
    the same checks as everyone's, and each variable is exported once. What it cannot promise: a second pod that
    claims a member's index is refused with both names for every pod until one is deleted, since nothing tells
    which one is the job's (with a job object, the roster leaves the one the job does not own out)."""
    from agent.core.controllers import GENERIC
    from agent.core.plan.gang import job_reads

    options = Options(choice=ControllerChoice(selector="app=train,run=r1", index_label="idx"), address="ip")
    pods = [examples.make_pod(f"w-{i}", labels={"app": "train", "run": "r1", "idx": str(i)},
                              ip=examples.loopback_ip(i)) for i in range(3)]
    reads = job_reads(pods[0], options)
    with pytest.raises(StopIteration) as read:
        next(reads)  # no object to read
    view = read.value.value
    assert view.controller is GENERIC and view.objects == () and roster_of(view) is None  # nothing to check
    stranger = examples.make_pod("anyone", labels={"app": "train", "run": "r1", "idx": "3"},
                                 ip=examples.loopback_ip(9))
    rendered = render_pod([*pods, stranger], "w-0", options)
    assert rendered.plan.topology.me.name == "w-0" and len(rendered.plan.topology.training) == 4  # it joins
    hostile = examples.make_pod("hostile", labels={"app": "train", "run": "r1", "idx": "4"},
                                ip="127.0.0.1\n ProxyCommand x")
    with pytest.raises(InputError, match="hostile"):
        render_pod([*pods, hostile], "w-0", options)  # its values are checked like everyone's
    text = render_pod([*pods, stranger], "w-0", options).files["torch.env"].decode()
    names = [line.split("=", 1)[0] for line in text.splitlines() if line.startswith("export ")]
    assert len(names) == len(set(names))
    twin = examples.make_pod("twin", labels={"app": "train", "run": "r1", "idx": "1"}, ip=examples.loopback_ip(8))
    with pytest.raises(InputError, match="pods 'w-1' and 'twin' both claim role 'worker' index 1; delete the stale"):
        render_pod([*pods, twin], "w-0", options)
