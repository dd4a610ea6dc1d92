"""``--view own``: a pod's files from the published summary and its own pod against its files from every pod.

After every change of a random sequence (the planner property test's world), for each training pod of each
controller: the variables of the light plan must be the full plan's, except the address lists of roles too
large to be summarized, which it does not write (and says why); topology.json's job-wide fields likewise.
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import examples
from agent.core import Options, render_plan, render_pod
from agent.core.files.ssh_config import known_hosts_patterns
from agent.core.files.variables import env_key
from agent.core.model import FrameworkOptions
from agent.core.plan.layout import build_plan
from agent.core.pods.placement import DEFAULT_LEVELS
from agent.core.publication import summary as summary_module
from agent.core.publication.summary import light_plan, own_view, read_summary, summarize, summary_text
from agent.core.publication.view_choice import choose_view
from agent.errors import InputError
from tests.core.test_planner import JOBS, World

OPS = ("ip", "no-ip", "leave", "join", "terminating", "failed", "pending", "running", "slots", "clone", "node",
       "self", "burst")


def _stepped(make, seed: int, ops: list[str]) -> list:
    """A job's pods after the planner property test's random changes (its World)."""
    world = World(make(), random.Random(seed))
    for op in ops:
        world.step(op)
    return list(world.pods.values())


def _comparable(rendered, withheld: set[str]) -> tuple[dict[str, str], dict[str, object]]:
    written = {v.name: v.value for v in rendered.variables if v.written}
    for role in withheld:
        for name in (f"VC_{env_key(role)}_HOSTS", f"VC_{env_key(role)}_HOSTS_FILE"):
            written.pop(name, None)
    document = json.loads(rendered.files["topology.json"])
    job_wide = {key: document[key] for key in ("controller", "namespace", "job", "jobUid", "self", "trainingRoles",
                                               "masterAddr", "masterPort", "nnodes", "processes")}
    return written, job_wide


def _training_pods(pods: list, options: Options):
    """Each training pod that makes a plan, with its files from every pod (its full view)."""
    for pod in pods:
        try:
            full = render_pod(pods, pod["metadata"]["name"], options)
        except InputError:
            continue
        if full.plan.topology.me.training:
            yield pod, full


def _check_every_pod(pods: list, options: Options, listed: int = summary_module.LISTED_HOSTS) -> int:
    """Compare the two views for every training pod that makes a plan; the number compared."""
    compared = 0
    for pod, full in _training_pods(pods, options):
        name, topo = pod["metadata"]["name"], full.plan.topology
        raw = summarize(full.plan, seq=7, listed=listed, options=options)  # as the leader publishes it
        assert raw is not None, "an index-ordered job of a few runs is summarized"
        summary = read_summary(summary_text(raw))
        assert summary is not None and summary.seq == 7
        plan = light_plan(summary, pod, options)
        assert plan is not None, f"{name} is in the summary's runs"
        light = render_plan(plan, options)
        assert light.plan.topology.me == topo.me
        own, why = own_view(full.plan, dataclasses.replace(options, view="own"), ssh=False, published=True,
                             listed=listed)
        assert own is not None and why == "", why  # a pod holding every pod makes the files a follower makes
        assert render_plan(own, options).files == light.files
        withheld = {role for role, _, hosts in summary.roles if hosts is None}
        assert _comparable(light, withheld) == _comparable(full, withheld)
        for role in withheld:
            var = next(v for v in light.variables if v.name == f"VC_{env_key(role)}_HOSTS")
            assert not var.written and "own view" in var.source
        assert set(light.files) == {"torch.env", "topology.json", "generation"}
        compared += 1
    return compared


@pytest.mark.parametrize("job", sorted(JOBS))
@pytest.mark.parametrize("listed", [pytest.param(16, marks=pytest.mark.slow), 2])  # the fast lane: 2
@pytest.mark.parametrize("address", ["dns", "ip"])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), ops=st.lists(st.sampled_from(OPS), min_size=0, max_size=12))
def test_a_pods_light_variables_are_its_full_variables_without_the_long_host_lists(job, listed, address, seed, ops):
    _check_every_pod(_stepped(JOBS[job], seed, ops), Options(address=address), listed)


@pytest.mark.parametrize("job", sorted(JOBS))
def test_every_training_pod_of_every_controller_is_compared(job):
    pods = JOBS[job]()
    for k, pod in enumerate(pods):
        pod["spec"]["nodeName"] = f"node-{k}"
    live = [p for p in pods if p["status"].get("phase") != "Succeeded"]
    training = sum(build_plan(pods, p["metadata"]["name"], Options()).topology.me.training for p in live)
    assert training > 1
    assert _check_every_pod(pods, Options()) == training


def test_a_job_with_pods_missing_everywhere_is_not_summarized():
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 2 * summary_module.MAX_RUNS + 4)))
    kept = [p for k, p in enumerate(pods) if k % 2 == 0]  # every other worker gone: one run per worker
    plan = build_plan(kept, "demo-master-0", Options())
    assert summarize(plan, seq=1) is None
    assert summarize(build_plan(pods, "demo-master-0", Options()), seq=1) is not None
    levels = summarize(build_plan(pods, "demo-master-0", Options(levels=DEFAULT_LEVELS)), seq=1)
    assert levels is not None and levels["topology"]["order"] == "index"  # its pods read their Node's labels
    assert summarize(build_plan(kept, "demo-master-0", Options(levels=DEFAULT_LEVELS)), seq=1) is None


@pytest.mark.slow
def test_runs_state_a_large_job_in_a_few_hundred_bytes():
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 4095)))
    raw = summarize(build_plan(pods, "demo-master-0", Options(address="ip")), seq=3)
    assert raw is not None
    assert len(raw["runs"]) == 2 and raw["roles"][1] == ["worker", 4095, None]
    assert len(summary_text(raw)) < 600


@pytest.mark.parametrize("options, ssh, said", [
    (Options(), False, False),  # rank 0 by its DNS name: no pod's own view reads its IP
    (Options(address="ip"), False, True),  # the IP is rank 0's address
    (Options(), True, True),  # its known_hosts, with the SSH material
    (Options(frameworks=FrameworkOptions(names=("mlx",))), False, True),  # NCCL_HOST_IP
], ids=["dns", "address-ip", "ssh", "mlx"])
def test_the_summary_says_rank_0s_ip_only_where_an_own_view_reads_it(options, ssh, said):
    """Rank 0's IP comes after the leader's first summary more often than not; where no pod's own view reads it,
    the summary does not change when it comes (every pod of a 16384-pod job received it again, ~2.4 KB each)."""
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 300)))
    before = copy.deepcopy(pods)
    for pod in before:
        if pod["metadata"]["name"] == "demo-master-0":
            pod["status"].pop("podIP", None)
            pod["status"].pop("podIPs", None)
    if options.address == "ip":
        before = pods  # a pod without an IP has no address: it is no member
    texts = [summary_text(summarize(build_plan(each, "demo-worker-5", options), seq=1, options=options, ssh=ssh))
             for each in (before, pods)]
    ip = json.loads(texts[1])["rank0"][6]
    assert (ip == pods[0]["status"]["podIP"]) == said and (ip is None) == (not said)
    assert (texts[0] != texts[1]) == (said and options.address != "ip")


def test_a_pod_the_summary_does_not_place_waits():
    pods = examples.pytorchjob(workers=6)
    plan = build_plan(pods[:-1], "mnist-master-0", Options())  # the last worker not published yet
    summary = read_summary(summary_text(summarize(plan, seq=1)))
    assert light_plan(summary, pods[-1], Options()) is None
    assert light_plan(summary, pods[1], Options()) is not None


def _valid() -> dict:
    pods = examples.pytorchjob(workers=3)
    return summarize(build_plan(pods, "mnist-master-0", Options()), seq=2)


@pytest.mark.parametrize("mutate, complaint", [
    (lambda s: s.update(nnodes=5), "the runs make 4 pods"),
    (lambda s: s.update(worldSize=0), "worldSize is 0"),
    (lambda s: s["runs"][1].__setitem__(4, 2), "does not follow"),
    (lambda s: s["runs"].__setitem__(1, s["runs"][1][:7]), "a run is not"),
    (lambda s: s["rank0"].__setitem__(4, "$(reboot)"), "not an address"),
    (lambda s: s["rank0"].__setitem__(1, "worker"), "rank 0 is not the first pod"),
    (lambda s: s["roles"][0].__setitem__(2, ["a.b", "c.d"]), "lists"),
    (lambda s: s.update(masterPort=70000), "masterPort is 70000"),
    (lambda s: s.update(schema=2), "schema 1"),
    (lambda s: s.pop("runs"), "missing"),
    (lambda s: s["runs"][0].__setitem__(0, "ps"), "does not follow"),
], ids=["nnodes", "world", "gap", "short-run", "address", "rank0", "hosts", "port", "schema", "missing", "role"])
def test_a_summary_that_does_not_add_up_is_refused_in_one_line(mutate, complaint):
    raw = _valid()
    assert read_summary(summary_text(raw)) is not None
    mutate(raw)
    with pytest.raises(InputError) as err:
        read_summary(summary_text(raw))
    assert complaint in str(err.value) and "\n" not in str(err.value)


def test_a_summary_bomb_is_refused_before_it_is_parsed():
    with pytest.raises(InputError, match=r"values|bytes"):
        read_summary("[" * 60_000)


# --- TF_CONFIG from the summary: a large role's addresses as a template ------------------------------------------

TF_JOBS = {  # a chief and more workers than a summary lists (LISTED_HOSTS): their addresses come as a template
    "volcano": lambda: examples.volcano_job(tasks=(("chief", 1), ("worker", 20), ("ps", 2))),
    "pytorchjob": lambda: examples.pytorchjob(workers=20),  # master (TF's chief) and workers
    "jobset": lambda: examples.jobset(rjobs=(("chief", 1, 1), ("worker", 3, 7))),  # a two-part index
    "indexed-job": lambda: examples.indexed_job(completions=20),
}


def _tf_files(rendered) -> dict[str, bytes]:
    part = next((r for r in rendered.frameworks if r.key == "tf"), None)
    assert part is not None
    return dict(part.files)


def _check_tf(pods: list, options: Options) -> int:
    """Each training pod whose own view serves TF (``choose_view``) writes the TF files the full view writes; a
    pod holding every member chooses the same view (``own_view``). The number whose own view was written."""
    written = 0
    for pod, full in _training_pods(pods, options):
        name = pod["metadata"]["name"]
        summary = read_summary(summary_text(summarize(full.plan, seq=4, options=options)))
        plan = light_plan(summary, pod, options)
        assert plan is not None
        chosen = choose_view(plan, options, ssh=False, published=True)
        own, why = own_view(full.plan, options, ssh=False, published=True)
        assert why == (chosen or "")
        if chosen is None:
            assert _tf_files(render_plan(plan, options)) == _tf_files(full), name
            assert render_plan(own, options).files == render_plan(plan, options).files  # type: ignore[arg-type]
            written += 1
    return written


@pytest.mark.parametrize("job", sorted(TF_JOBS))
@pytest.mark.parametrize("address", ["dns", pytest.param("ip", marks=pytest.mark.slow)])  # the fast lane: dns
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), ops=st.lists(st.sampled_from(OPS), min_size=0, max_size=10))
def test_tf_config_from_the_summary_is_the_full_views(job, address, seed, ops):
    _check_tf(_stepped(TF_JOBS[job], seed, ops), Options(address=address, frameworks=FrameworkOptions(names=("tf",))))


@pytest.mark.parametrize("job", sorted(TF_JOBS))
def test_a_tf_job_named_by_dns_writes_tf_config_in_its_own_view(job):
    """Not vacuous: with DNS names every training pod of these jobs writes TF_CONFIG from the summary; with IPs
    the large role has no template, and none does."""
    pods = TF_JOBS[job]()
    tf = FrameworkOptions(names=("tf",))
    training = sum(build_plan(pods, p["metadata"]["name"], Options()).topology.me.training for p in pods)
    assert _check_tf(pods, Options(address="dns", frameworks=tf)) == training
    assert _check_tf(pods, Options(address="ip", frameworks=tf)) == 0


def test_a_large_role_template_is_published_only_for_a_framework_that_names_every_member_or_an_ssh_launch():
    pods = TF_JOBS["volcano"]()
    plan = build_plan(pods, "demo-chief-0", Options())
    assert "addresses" not in summarize(plan, seq=1, options=Options())
    assert summarize(plan, seq=1, options=Options(), ssh=True)["addresses"] == {  # rank 0's hostfile
        "worker": ["demo-worker-", [0, 0], ".demo"]}
    tf = Options(frameworks=FrameworkOptions(names=("tf",)))
    raw = summarize(build_plan(pods, "demo-chief-0", tf), seq=1, options=tf)
    assert raw["addresses"] == {"worker": ["demo-worker-", [0, 0], ".demo"]}
    assert len(summary_text(raw)) < 1000


@pytest.mark.parametrize("template, complaint", [
    (["demo-worker-", [1, 0], ".demo"], "template of role 'worker'"),  # no second index part
    (["demo-worker-"], "template of role 'worker'"),  # no index at all
    (["Demo_worker-", [0, 0]], "template of role 'worker'"),  # not DNS text
    (["demo-worker-", 0], "template of role 'worker'"),  # a place without what is added
    (["-", [0, 0], "..x"], "makes no DNS name"),
    (["a" * 62, [0, 0]], "makes no DNS name"),  # a label over 63 for the job's later indices
    (["demo-worker-", [0, -5], ".demo"], "makes no DNS name"),  # a negative number for index 0
], ids=["part", "no-index", "text", "place", "dots", "long", "negative"])
def test_a_template_that_could_make_no_address_is_refused(template, complaint):
    tf = Options(frameworks=FrameworkOptions(names=("tf",)))
    raw = summarize(build_plan(TF_JOBS["volcano"](), "demo-chief-0", tf), seq=1, options=tf)
    raw["addresses"]["worker"] = template
    with pytest.raises(InputError) as err:
        read_summary(summary_text(raw))
    assert complaint in str(err.value) and "\n" not in str(err.value)


def test_a_template_for_a_role_it_cannot_place_is_refused():
    tf = Options(frameworks=FrameworkOptions(names=("tf",)))
    raw = summarize(build_plan(TF_JOBS["volcano"](), "demo-chief-0", tf), seq=1, options=tf)
    raw["addresses"]["chief"] = ["demo-chief-", [0, 0], ".demo"]  # a small role: listed, not a template
    with pytest.raises(InputError, match="no large training role"):
        read_summary(summary_text(raw))


def test_a_role_with_members_that_do_not_train_gets_no_template():
    """Its addresses are not those of its runs (training members only): the summary lists nothing for it, and
    reading it does not fail on the count."""
    tf = Options(frameworks=FrameworkOptions(names=("tf",)))
    plan = build_plan(TF_JOBS["volcano"](), "demo-chief-0", tf)
    topo = plan.topology
    worker = topo.role_members("worker")
    idle = dataclasses.replace(topo, members=(*[m for m in topo.members if m not in worker[:1]],
                                              worker[0]._replace(training=False)))
    assert len(idle.role_members("worker")) == len(worker) and idle.address_templates["worker"] is None
    assert topo.address_templates["worker"] is not None


# --- the SSH launcher's host lists from the summary --------------------------------------------------------------

def _launcher_files(pods: list, options: Options, listed: int = summary_module.LISTED_HOSTS) -> bool | None:
    """Rank 0 of a job whose pods have the SSH material: when its own view lists the hosts (``Whole.hosts``), its
    hostfile and ``<role>.host`` files are the full view's, byte for byte, and it writes no discover_hosts.sh;
    a follower that reads the same summary chooses the same. True: written from the summary; False: the full
    view (said why); None: no rank 0 that launches (none, or a launcher role's pod does)."""
    for pod, full in _training_pods(pods, options):
        if full.plan.topology.me.node_rank != 0:
            continue
        own, why = own_view(full.plan, options, ssh=True, published=True, listed=listed)
        raw = summarize(full.plan, seq=5, listed=listed, options=options, ssh=True)
        light = light_plan(read_summary(summary_text(raw)), pod, options, ssh=True) if raw is not None else None
        if own is None:
            assert "launches over SSH" in why or "summary" in why, why
            assert light is None or not light.topology.whole.hosts
            return False
        if not own.topology.whole.hosts:  # a launcher role: mpirun runs there, not on rank 0, which lists nothing
            assert "launcher" in full.plan.topology.roles and "hostfile" not in render_plan(own, options).files
            return None
        assert light is not None and light.topology == own.topology
        files = render_plan(own, options).files
        lists = {name for name in full.files if name == "hostfile" or name.endswith(".host")}
        assert lists and {name: files[name] for name in lists} == {name: full.files[name] for name in lists}
        assert "discover_hosts.sh" not in files and json.loads(files["topology.json"])["view"] == "own"
        patterns = known_hosts_patterns(own.topology, 22)  # ssh checks a host's name against these (fnmatch)
        hosts = [line.split()[0] for line in files["hostfile"].decode().splitlines()]
        assert all(any(fnmatch.fnmatchcase(host, p) for p in patterns) for host in hosts), patterns
        assert choose_view(light, options, ssh=True, published=True) is None
        return True
    return None


@pytest.mark.parametrize("job", sorted(JOBS))
@pytest.mark.parametrize("address", ["dns", "ip"])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), ops=st.lists(st.sampled_from(OPS), min_size=0, max_size=12))
def test_an_ssh_launchers_host_lists_from_the_summary_are_the_full_views(job, address, seed, ops):
    _launcher_files(_stepped(JOBS[job], seed, ops), Options(address=address), listed=2)


def _other_domain(pods: list) -> list:
    """Rank 0 in a DNS domain of its own: the known_hosts patterns it makes from its own name would not cover its
    workers' names."""
    pods[0]["spec"].update(hostname=pods[0]["metadata"]["name"], subdomain="elsewhere")
    return pods


@pytest.mark.parametrize(("make", "address", "lists"), [
    (lambda: examples.volcano_job("demo", (("master", 1), ("worker", 299))), "dns", True),
    (lambda: examples.volcano_job("demo", (("master", 1), ("worker", 299))), "ip", False),  # IPs follow nothing
    (lambda: [p for p in examples.volcano_job("demo", (("master", 1), ("worker", 299)))
              if p["metadata"]["name"] not in ("demo-worker-7", "demo-worker-150")], "dns", True),  # leaves
    # a Service per replica: one-label names, whose known_hosts patterns go by role (rank 0's cover only its own)
    (lambda: examples.pytorchjob(workers=40), "dns", False),
    (lambda: _other_domain(examples.volcano_job("demo", (("master", 1), ("worker", 299)))), "dns", False),
    (lambda: examples.jobset(rjobs=(("driver", 1, 1), ("workers", 6, 5))), "dns", True),  # two index parts
    (lambda: examples.mpijob(workers=40), "dns", None),  # mpirun runs on the launcher (every pod): rank 0 lists none
], ids=["volcano", "volcano-ip", "volcano-leaves", "pytorchjob", "two-domains", "jobset", "mpijob"])
def test_rank_0_launching_over_ssh_lists_its_hosts_from_the_summary_where_their_names_follow_a_template(
        make, address, lists):
    """Not vacuous: these jobs' rank 0 takes its host lists from the summary (DNS names that follow the indices,
    one domain), or says why it holds every member."""
    assert _launcher_files(make(), Options(address=address), listed=2) is lists


def test_a_host_list_change_the_variables_do_not_show_is_a_new_generation():
    """One worker left and another came between two summaries: the counts are the same, and so is every
    variable, but the hostfile is not; topology.json's ``hosts`` (the key's) says so, as the sidecar reads it back."""
    from agent.core.files.rendering import hosts_digest

    options = Options(address="dns")
    pods = examples.volcano_job("demo", (("master", 1), ("worker", 40)))
    before = [p for p in pods if p["metadata"]["name"] != "demo-worker-39"]
    after = [p for p in pods if p["metadata"]["name"] != "demo-worker-3"]
    made = []
    for job in (before, after):
        own, why = own_view(render_pod(job, "demo-master-0", options).plan, options, ssh=True, published=True,
                            listed=2)
        assert own is not None, why
        rendered = render_plan(own, options)
        made.append((rendered, json.loads(rendered.files["topology.json"])))
    (first, doc1), (second, doc2) = made
    assert doc1["env"] == doc2["env"] and first.files["hostfile"] != second.files["hostfile"]
    assert doc1["hosts"] == hosts_digest(first.plan.topology) != doc2["hosts"]
