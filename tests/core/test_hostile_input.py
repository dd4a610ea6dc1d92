"""Hostile and odd input: the core either builds a topology that keeps the rank rules or refuses with an
InputError. Never another exception, never a rank gap, never a duplicate, never a value the shell executes."""

from __future__ import annotations

import copy
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import examples
from agent.core import Options, render_pod
from agent.core.files.rendering import render_env
from agent.core.files.variables import Variable, warnings_for
from agent.errors import InputError

odd_text = st.one_of(
    st.text(min_size=0, max_size=40),
    st.sampled_from(["master", "worker", "extras", "$(rm -rf /)", "`id`", "a'b", "-1", "00", "٣", "²", " 1",
                     "1e3", "99999999999999999999999", "x" * 253, "wörker", "data-loader", ""]),
)
index_text = st.one_of(st.integers(min_value=-5, max_value=10**30).map(str), odd_text)
ip_text = st.one_of(st.none(), st.sampled_from(["127.1.0.1", "fd00::1", "::1", "127.1.0.1 ", "not-an-ip", ""]))


@st.composite
def volcano_pods(draw):
    count = draw(st.integers(min_value=1, max_value=12))
    pods = []
    for i in range(count):
        role = draw(st.one_of(st.sampled_from(["master", "worker", "extras"]), odd_text))
        index = draw(st.one_of(st.just(str(i)), index_text))
        name = draw(st.one_of(st.just(f"p-{i}"), odd_text.filter(bool)))
        labels = {"volcano.sh/job-name": draw(st.sampled_from(["demo", "demo", "other", "dëmo"])),
                  "volcano.sh/task-spec": role, "volcano.sh/task-index": index}
        if draw(st.booleans()) and i:
            del labels[draw(st.sampled_from(list(labels)))]
        annotations = draw(st.dictionaries(odd_text, odd_text, max_size=3))
        ip = draw(ip_text)
        pod = examples.make_pod(name, labels=labels, annotations=annotations, ip=ip or None,
                                hostname=draw(st.one_of(st.none(), odd_text)), subdomain="demo",
                                phase=draw(st.sampled_from(["Running", "Running", "Pending", "Failed", "Succeeded"])),
                                terminating=draw(st.booleans()) and draw(st.booleans()))
        env = draw(st.lists(st.fixed_dictionaries({"name": st.sampled_from(
            ["MASTER_PORT", "PET_NPROC_PER_NODE", "WORLD_SIZE", "RANK", "X"]), "value": odd_text}), max_size=3))
        pod["spec"]["containers"][0]["env"] = env
        pod["spec"]["containers"][0]["resources"]["limits"] = draw(st.dictionaries(
            st.sampled_from(["cpu", "nvidia.com/gpu", "memory"]), odd_text, max_size=2))
        if draw(st.booleans()):
            pods.append(copy.deepcopy(pod))  # duplicates
        pods.append(pod)
    self_name = draw(st.sampled_from([p["metadata"]["name"] for p in pods]))
    options = Options(address=draw(st.sampled_from(["dns", "ip"])),
                      roles=draw(st.one_of(st.none(), st.lists(odd_text, min_size=1, max_size=3).map(tuple))),
                      elastic=draw(st.one_of(st.none(), st.just((1, 4)))))
    return pods, self_name, options


def check_rank_rules(rendered):
    topo = rendered.plan.topology
    training = topo.training
    assert [m.node_rank for m in training] == list(range(len(training)))
    firsts = [m.first_rank for m in training]
    assert firsts == sorted(firsts) and len(set(firsts)) == len(firsts)
    names = [m.name for m in topo.members]
    assert len(names) == len(set(names))
    keys = [(topo.training_roles.index(m.role) if m.role in topo.training_roles else -1, m.index) for m in training]
    if topo.controller != "jobset":
        assert keys == sorted(keys)
    env = {v.name: v.value for v in rendered.variables if v.written and not v.unset}
    if topo.me.training:
        world = str(sum(m.slots for m in training))
        variable = next(v for v in rendered.variables if v.name == "WORLD_SIZE")
        if variable.written:
            assert env["WORLD_SIZE"] == world
        else:  # the user's own WORLD_SIZE is kept, and a contradiction is warned about
            assert "set by user" in variable.source
            warned = any("WORLD_SIZE=" in w for w in warnings_for(rendered.plan, rendered.variables))
            assert warned == (variable.value not in (world, "(valueFrom)"))
        if "NODE_RANK" in env:
            assert env["NODE_RANK"] == str(topo.me.node_rank)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(volcano_pods())
def test_any_pods_give_a_valid_topology_or_one_input_error(case):
    pods, self_name, options = case
    try:
        rendered = render_pod(pods, self_name, options)
    except InputError as err:
        assert str(err).strip(), "an error must say what is wrong"
        return
    check_rank_rules(rendered)


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=0, max_size=60))
def test_any_value_sourced_from_torch_env_is_exactly_that_text(value):
    if "\x00" in value:
        value = value.replace("\x00", "")  # a process environment cannot hold NUL
    text = render_env([Variable("HOSTILE", value, "test")])
    out = subprocess.run(["sh", "-c", f'{text}\nprintf %s "$HOSTILE"'], capture_output=True, check=True)
    assert out.stdout.decode("utf-8", "surrogateescape") == value


def test_thousands_of_extras_do_not_change_the_training_world():
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 3), ("extras", 3000)))
    rendered = render_pod(pods, "demo-worker-1", Options())
    env = {v.name: v.value for v in rendered.variables if v.written}
    assert (env["WORLD_SIZE"], env["NODE_RANK"], env["VC_EXTRAS_NUM"]) == ("4", "2", "3000")


@pytest.mark.parametrize("ip", ["fd00::1", "2001:db8::7"])
def test_dual_stack_pods_use_their_first_ip(ip):
    pods = examples.indexed_job(completions=2)
    for pod in pods:
        pod["status"]["podIPs"] = [{"ip": ip}, {"ip": pod["status"]["podIP"]}]
        pod["status"]["podIP"] = ip
    rendered = render_pod(pods[:1], pods[0]["metadata"]["name"], Options(address="ip"))
    assert rendered.plan.topology.me.address == ip


def test_a_pod_whose_role_changes_is_placed_by_its_current_role():
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 2)))
    pods[2]["metadata"]["labels"]["volcano.sh/task-spec"] = "extras"
    rendered = render_pod(pods, "demo-worker-0", Options())
    assert [m.name for m in rendered.plan.topology.training] == ["demo-master-0", "demo-worker-0"]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True),
                       st.text(min_size=0, max_size=40).map(lambda v: v.replace("\x00", "")), max_size=5))
def test_agent_trainer_reads_back_exactly_what_torch_env_holds(values):
    # Values with a line break or U+2028 (which bash reads fine) read back whole in agent.trainer's parser.
    from agent.trainer import parse_env_file

    text = render_env([Variable(name, value, "test") for name, value in values.items()])
    assert parse_env_file(text) == values


def test_agent_trainer_reads_the_unicode_line_separators_sh_ignores():
    from agent.trainer import parse_env_file

    value = "a\nb\u2028c\u2029d\x85e\x1cf'g\"h$i"
    assert parse_env_file(render_env([Variable("V", value, "t")])) == {"V": value}


def test_pods_that_share_an_address_train_and_the_host_lists_name_it_once():
    """hostNetwork pods on one node share the node's IP (kubeflow/pytorch-operator#352 runs training so). torch's
    env:// and c10d work there, so torch.env counts every pod; a hostfile cannot name one host twice (DeepSpeed
    refuses it), so it lists the address once, for the first pod, and one warning names the others."""
    from agent.core.files.variables import warnings_for

    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 2)))
    shared = pods[0]["status"]["podIP"]
    pods[2]["status"].update(podIP=shared, podIPs=[{"ip": shared}])
    rendered = render_pod(pods, "demo-worker-0", Options(address="ip"))
    env = rendered.files["torch.env"].decode()
    assert "export WORLD_SIZE='3'\n" in env and "export NNODES='3'\n" in env
    assert f"export VC_WORKER_HOSTS='{pods[1]['status']['podIP']},{shared}'" in env  # one entry per pod
    assert rendered.files["hostfile"].decode() == f"{shared} slots=1\n{pods[1]['status']['podIP']} slots=1\n"
    assert rendered.files["discover_hosts.sh"].decode().count(f"{shared}:1") == 1
    (warning,) = warnings_for(rendered.plan, rendered.variables)
    assert "'demo-worker-1' (" + shared + ", as 'demo-master-0')" in warning and "podAntiAffinity" in warning
    assert warnings_for(render_pod(pods, "demo-worker-0", Options(address="dns")).plan, ()) == []


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 300), st.text("0123456789 x:.", min_size=0, max_size=4)), min_size=1,
                max_size=5))
def test_the_ipv4_fast_path_agrees_with_the_kubernetes_parser(parts):
    """ip_value skips parsing for a canonical dotted quad: for any text, the same answer or the same refusal as
    Kubernetes' own parser (validation.parse_ip), and the same address as Python's wherever Python reads one."""
    import ipaddress

    from agent.core.pods.validation import canonical_ip, ip_value, parse_ip
    from agent.errors import InputError

    raw = ".".join(p if isinstance(p, str) else (f"0{p}" if p % 7 == 0 else str(p)) for p in parts)
    parsed = parse_ip(raw)
    want = canonical_ip(parsed) if parsed is not None else None
    try:
        got = ip_value({"metadata": {"name": "p"}}, raw)
    except InputError:
        got = None
    assert got == want, raw
    try:
        python = ipaddress.ip_address(raw)
    except ValueError:
        return
    assert got is not None and ipaddress.ip_address(got) == python, raw
