"""The command line: render and explain on the shipped examples, and one-line errors on bad input."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent import examples
from agent.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# The documented rank-0 pod and a later pod of each shipped example, with the NODE_RANK it must get.
EXPECTED = {
    "volcano": ("demo-master-0", "demo-worker-2", "3"),
    "pytorchjob": ("mnist-master-0", "mnist-worker-2", "3"),
    "trainjob": ("llm-node-0-0-cpc5v", "llm-node-0-2-f59jk", "2"),
    "mpijob": ("allreduce-worker-0", "allreduce-worker-2", "2"),
    "jobset": ("trainer-driver-0-0-cht55", "trainer-workers-1-1-mpjsn", "4"),
    "lws": ("vllm-0", "vllm-0-3", "3"),
    "indexed-job": ("sweep-0-4vtwl", "sweep-2-dl25p", "2"),
}


def read_env(path: Path) -> dict[str, str]:
    out = subprocess.run(["bash", "-c", f"set -a; . {path}; env -0"], env={"PATH": os.environ["PATH"]},
                         capture_output=True, check=True)
    pairs = (item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)
    return dict(pairs)


def test_shipped_examples_are_what_the_generator_makes():
    for key, build in examples.EXAMPLES.items():
        shipped = json.loads((EXAMPLES / f"{key}-pods.json").read_text())
        assert shipped == json.loads(json.dumps(examples.as_list(build()))), f"regenerate examples/{key}-pods.json"
    for key, nodes in examples.NODE_EXAMPLES.items():
        shipped = json.loads((EXAMPLES / f"{key}-nodes.json").read_text())
        assert shipped == json.loads(json.dumps(examples.as_list(nodes()))), f"regenerate examples/{key}-nodes.json"


def test_explain_orders_the_shipped_volcano_example_by_rack_with_its_nodes_file(capsys):
    """docs/topology.md's offline example: the pods carry their nodes, and the nodes file their racks."""
    assert main(["explain", "--pods", str(EXAMPLES / "volcano-pods.json"), "--nodes",
                 str(EXAMPLES / "volcano-nodes.json"), "--self", "demo-worker-0", "--rank-order", "topology",
                 "--topology-levels", "topology.kubernetes.io/zone,example.com/rack"]) == 0
    out = capsys.readouterr().out
    assert "not applied" not in out and "TOPOLOGY_RANK_ORDER=topology" in out
    ranks = [line.split()[4] for line in out.splitlines() if line.strip().startswith(("0 ", "1 ", "2 ", "3 "))]
    assert ranks == ["demo-master-0", "demo-worker-1", "demo-worker-0", "demo-worker-2"]  # rack a, then rack b


@pytest.mark.parametrize(("ready", "taint", "why"), [
    pytest.param("False", None, "node node-2 NotReady", id="not-ready"),
    pytest.param("True", ("node.kubernetes.io/unreachable", "NoExecute"),
                 "node node-2 tainted node.kubernetes.io/unreachable:NoExecute", id="tainted"),
])
def test_explain_and_render_leave_out_a_member_on_a_lost_node_of_the_nodes_file(capsys, tmp_path, ready, taint, why):
    """The plan a sidecar that watches the Nodes makes: the pod on the lost Node is no member, and says why."""
    nodes = json.loads((EXAMPLES / "volcano-nodes.json").read_text())
    lost = next(item for item in nodes["items"] if item["metadata"]["name"] == "node-2")
    lost["status"]["conditions"] = [{"type": "Ready", "status": ready, "reason": "KubeletNotReady"}]
    if taint is not None:
        lost.setdefault("spec", {})["taints"] = [{"key": taint[0], "effect": taint[1]}]
    (tmp_path / "nodes.json").write_text(json.dumps(nodes))
    given = ["--pods", str(EXAMPLES / "volcano-pods.json"), "--nodes", str(tmp_path / "nodes.json"),
             "--self", "demo-master-0"]
    assert main(["explain", *given]) == 0
    out = capsys.readouterr().out
    assert f"pod 'demo-worker-1' is not a member: lost: {why}" in out and "WORLD_SIZE=3 " in out
    assert main(["render", *given, "--out", str(tmp_path / "shared")]) == 0
    members = json.loads((tmp_path / "shared" / "topology.json").read_text())["members"]
    assert "demo-worker-1" not in [m["name"] for m in members] and len(members) == 5  # the extras too


@pytest.mark.parametrize("key", list(EXPECTED))
def test_render_writes_every_file_for_each_shipped_example(key, tmp_path):
    master, later, node_rank = EXPECTED[key]
    out = tmp_path / "shared"
    assert main(["render", "--pods", str(EXAMPLES / f"{key}-pods.json"), "--self", later, "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert {"torch.env", "hostfile", "topology.json"} <= set(names)
    assert not [n for n in names if n.startswith(".topology-agent-")], "temp files left behind"
    env = read_env(out / "torch.env")
    assert env["NODE_RANK"] == node_rank
    doc = json.loads((out / "topology.json").read_text())
    assert doc["members"][0]["name"] == master and doc["members"][0]["nodeRank"] == 0


@pytest.mark.parametrize("key", list(EXPECTED))
def test_explain_names_the_rule_for_each_variable(key, capsys):
    _, later, _ = EXPECTED[key]
    assert main(["explain", "--pods", str(EXAMPLES / f"{key}-pods.json"), "--self", later]) == 0
    text = capsys.readouterr().out
    assert "NODE_RANK=" in text and "# position in rank order" in text
    assert "members in rank order:" in text


def test_explain_says_why_a_pod_gets_no_training_variables(capsys):
    main(["explain", "--pods", str(EXAMPLES / "volcano-pods.json"), "--self", "demo-extras-1"])
    text = capsys.readouterr().out
    assert "pod is role 'extras', not a training role (master, worker): no training variables" in text
    assert "unset WORLD_SIZE" in text


def test_explain_says_user_set_variables_are_left_alone(tmp_path, capsys):
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 1)))
    pods[1]["spec"]["containers"][0]["env"].insert(0, {"name": "MASTER_PORT", "value": "12345"})
    pods[1]["spec"]["containers"][0]["env"].append({"name": "MASTER_PORT", "value": "23456"})
    path = tmp_path / "pods.json"
    path.write_text(json.dumps(pods))
    main(["explain", "--pods", str(path), "--self", "demo-worker-0"])
    text = capsys.readouterr().out
    assert "- MASTER_PORT=12345" in text and "set by user in container 'trainer': left alone" in text
    assert "PET_MASTER_PORT=12345" in text


def test_render_reads_stdin_and_options_from_topology_environment(tmp_path):
    out = tmp_path / "o"
    run = subprocess.run(
        [sys.executable, "-m", "agent.cli", "render", "--pods", "-", "--out", str(out)],
        input=(EXAMPLES / "pytorchjob-pods.json").read_text(), capture_output=True, text=True,
        env={**os.environ, "POD_NAME": "mnist-worker-0", "TOPOLOGY_NPROC_PER_NODE": "2",
             "TOPOLOGY_ADDRESS": "ip"},
    )
    assert run.returncode == 0, run.stderr
    env = read_env(out / "torch.env")
    assert (env["NPROC_PER_NODE"], env["NODE_RANK"], env["RANK"], env["MASTER_ADDR"]) == ("2", "1", "1", "127.1.0.1")
    assert json.loads((out / "topology.json").read_text())["processes"] == 8  # 4 pods, 2 processes each


def _bad(tmp_path, mutate):
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 2)))
    mutate(pods)
    path = tmp_path / "pods.json"
    path.write_text(json.dumps(examples.as_list(pods)))
    return path


def _set_label(i, key, value):
    def mutate(pods):
        if value is None:
            del pods[i]["metadata"]["labels"][key]
            pods[i]["metadata"]["annotations"].pop(key, None)
        else:
            pods[i]["metadata"]["labels"][key] = value
            pods[i]["metadata"]["annotations"][key] = value
    return mutate


def _drop_ip(pods):
    pods[2]["status"].pop("podIP")
    pods[2]["status"].pop("podIPs")


def _second_controller(pods):
    pods[1]["metadata"]["labels"]["training.kubeflow.org/job-name"] = "other"


def _duplicate(pods):
    pods.append(copy.deepcopy(pods[2]))
    pods[-1]["metadata"]["name"] = "demo-worker-1-copy"


BAD_INPUT = [
    ("duplicate index within a role", _duplicate, [], ["demo-worker-1", "demo-worker-1-copy", "index 1"]),
    ("non-numeric index", _set_label(2, "volcano.sh/task-index", "one"), [],
     ["demo-worker-1", "volcano.sh/task-index", "'one'"]),
    ("missing role label", _set_label(2, "volcano.sh/task-spec", None), [], ["demo-worker-1", "volcano.sh/task-spec"]),
    ("no IP with --address ip", _drop_ip, ["--address", "ip"], ["demo-worker-1", "status.podIP", "--address dns"]),
    ("two controllers' labels disagree", _second_controller, [], ["demo-worker-0", "pytorchjob", "volcano",
                                                                  "--controller"]),
    ("self pod not in the list", lambda pods: None, ["--self-override", "nope-0"], ["'nope-0'", "not in the pod list"]),
    ("unknown --address", lambda pods: None, ["--address", "dnss"], ["--address 'dnss'", "dns, ip"]),
]


@pytest.mark.parametrize(("mutate", "extra", "words"), [c[1:] for c in BAD_INPUT], ids=[c[0] for c in BAD_INPUT])
def test_bad_input_gives_one_line_exit_2_and_writes_nothing(tmp_path, mutate, extra, words):
    path = _bad(tmp_path, mutate)
    out = tmp_path / "out"
    self_name = "demo-worker-0"
    if extra[:1] == ["--self-override"]:
        self_name, extra = extra[1], extra[2:]
    run = subprocess.run([sys.executable, "-m", "agent.cli", "render", "--pods", str(path), "--self", self_name,
                          "--out", str(out), *extra], capture_output=True, text=True)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    for word in words:
        assert word in lines[0]
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("text", ["{not json", '{"kind": "Pod"', "[1, 2]", '{"items": "x"}'])
def test_malformed_pods_file_gives_one_line_and_exit_2(tmp_path, text):
    path = tmp_path / "pods.json"
    path.write_text(text)
    run = subprocess.run([sys.executable, "-m", "agent.cli", "render", "--pods", str(path), "--self", "x",
                          "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert run.returncode == 2
    assert len(run.stderr.strip().splitlines()) == 1 and "--pods" in run.stderr
    assert not (tmp_path / "out").exists()


def test_unwritable_output_dir_fails_cleanly_and_keeps_old_files(tmp_path):
    if os.geteuid() == 0:
        # root ignores directory modes; a path under a regular file cannot be created by anyone.
        blocker = tmp_path / "file"
        blocker.write_text("x")
        out = blocker / "shared"
    else:  # pragma: no cover - CI runs as root
        out = tmp_path / "ro"
        out.mkdir(mode=0o500)
    code = main(["render", "--pods", str(EXAMPLES / "volcano-pods.json"), "--self", "demo-master-0",
                 "--out", str(out)])
    assert code == 1


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport sys; print('\\n'.join(sys.modules))"
    return set(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split())


def test_checking_options_imports_no_heavy_library():
    # init pays its imports in every pod: asyncssh (0.2 s, 20 MB) only with SSH, kubernetes only outside a pod.
    loaded = _modules_after("from agent.flags.parser import build_parser; "
                            "from agent.flags.common import options_from_args, ssh_settings; "
                            "a = build_parser().parse_args(['init', '--ssh-owner', '1000:1000']); "
                            "options_from_args(a); ssh_settings(a)")
    assert not loaded & {"asyncssh", "kubernetes", "aiohttp"}


def test_init_starts_without_what_a_torch_only_pod_never_runs():
    # Every pod pays init's imports: the frameworks' renderers load when a job selects one, ctypes when a process
    # gives memory back (init's leader), the SSH files' module with the SSH material (bench/import_bench.py); the
    # API client is http.client's (urllib3's imports cost 40 ms of CPU more).
    loaded = _modules_after("import agent.cli, agent.flags.init, agent.flags.pod, agent.runtime.init, agent.k8s.client")
    assert sorted(m for m in loaded if m.startswith(("agent.core.files.frameworks.", "ctypes",
                                                     "agent.core.files.ssh_config", "agent.ssh", "urllib3"))) == []


def test_the_sidecar_starts_without_aiohttps_application_server():
    # Every pod's sidecar serves four fixed paths on aiohttp's low-level server (runtime/health.py): the
    # application, router and runner modules are the webhook's alone.
    loaded = _modules_after("import agent.cli, agent.runtime.sidecar, agent.runtime.health")
    assert "aiohttp.web_server" in loaded
    assert not loaded & {"aiohttp.web", "aiohttp.web_app", "aiohttp.web_runner", "aiohttp.web_urldispatcher"}


def test_render_with_node_labels_gives_the_documented_variables(tmp_path):
    """Each default level's variable, read back by bash, is named in docs/variables.md."""
    from agent.core.pods.placement import DEFAULT_LEVELS

    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 3)))
    nodes = examples.racks(pods)
    for k, node in enumerate(nodes):  # a GB200 cluster on GKE: every default level carries a value
        node["metadata"]["labels"].update({level.label: f"{level.name.lower().replace('_', '-')}-{k % 2}"
                                           for level in DEFAULT_LEVELS})
    (tmp_path / "pods.json").write_text(json.dumps(examples.as_list(pods)))
    (tmp_path / "nodes.json").write_text(json.dumps({"kind": "NodeList", "items": nodes}))
    out = tmp_path / "out"
    assert main(["render", "--pods", str(tmp_path / "pods.json"), "--nodes", str(tmp_path / "nodes.json"),
                 "--self", "demo-worker-0", "--out", str(out), "--rank-order", "topology"]) == 0
    printed = subprocess.run(["bash", "-c", f"set -a; . {out}/torch.env; env"], capture_output=True, text=True,
                             check=True, env={"PATH": "/usr/bin:/bin"}).stdout
    env = dict(line.split("=", 1) for line in printed.splitlines() if line.startswith("TOPOLOGY_"))
    documented = (Path(__file__).resolve().parent.parent / "docs" / "variables.md").read_text()
    assert env["TOPOLOGY_NODE"] == "node-1" and env["TOPOLOGY_RANK_ORDER"] == "topology"
    assert env["TOPOLOGY_LEVELS"] == ",".join(level.name.lower() for level in DEFAULT_LEVELS)
    for level in DEFAULT_LEVELS:
        assert env[f"TOPOLOGY_{level.name}"] == f"{level.name.lower().replace('_', '-')}-1"
        layer = level.name.startswith("NETWORK_LAYER")  # documented as TOPOLOGY_NETWORK_LAYER_1 .. _4
        shown = "`TOPOLOGY_NETWORK_LAYER_1`" if layer else f"`TOPOLOGY_{level.name}`"
        assert shown in documented, level
    for name in ("TOPOLOGY_NODE", "TOPOLOGY_LEVELS", "TOPOLOGY_RANK_ORDER"):
        assert f"`{name}`" in documented
    # the master stays rank 0; the workers on the master's rack (sub-block 0) come first
    document = json.loads((out / "topology.json").read_text())
    assert [m["name"] for m in document["members"]] == ["demo-master-0", "demo-worker-1", "demo-worker-0",
                                                         "demo-worker-2"]


def _cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True, text=True, timeout=60,
                          input=stdin.decode("latin-1") if stdin is not None else None)


def _one_line(run: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    lines = run.stderr.strip().splitlines()
    assert run.returncode == code and len(lines) == 1, run.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_one_pod_from_kubectl_get_pod_is_refused_with_the_command_that_lists_the_job(tmp_path):
    """kubectl get pod X -o json is one Pod, not a List: it used to become a world of one, silently."""
    pod = json.loads((EXAMPLES / "volcano-pods.json").read_text())["items"][1]
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(pod))
    _one_line(_cli("explain", "--pods", str(path), "--self", "demo-worker-0"), 2, "holds one Pod",
              "kubectl get pods -n default -l volcano.sh/job-name=demo -o json")


def test_a_binary_pods_file_is_named_not_a_crash(tmp_path):
    path = tmp_path / "pods.json"
    path.write_bytes(b"\x1f\x8b\x08\x00\xff\xfe" + bytes(range(256)))
    _one_line(_cli("render", "--pods", str(path), "--self", "x", "--out", str(tmp_path / "out")), 2,
              "is not text (byte 1 is not UTF-8)")


@pytest.mark.parametrize(("argv", "words"), [
    (["render", "--podz", "x", "--self", "y"], ["unrecognized arguments: --podz"]),
    (["render", "--pod", "x", "--self", "y"], ["unrecognized arguments: --pod"]),  # no abbreviations
    (["explain", "--self", "y"], ["the following arguments are required: --pods"]),
    (["keygen", "--jo", "x"], ["unrecognized arguments: --jo"]),
])
def test_options_are_spelt_out_and_an_unknown_one_is_named_first(argv, words):
    _one_line(_cli(*argv), 2, *words)


@pytest.mark.parametrize(("argv", "words"), [
    (["stauts", "demo"], ["invalid choice: 'stauts' (did you mean status?)", "choose from render"]),
    (["render", "--podz", "x", "--self", "y"], ["unrecognized arguments: --podz (did you mean --pods?)"]),
    (["inject", "--filname", "x.yaml"], ["--filname (did you mean --filename?)"]),
    (["explain", "--pods", "x", "--slef=y"], ["--slef=y (did you mean --self?)"]),
    (["status", "demo", "--outptu", "json", "--namspace", "a"],
     ["--outptu (did you mean --output?) --namspace (did you mean --namespace?)"]),
], ids=["command", "option", "inject", "option=value", "two options"])
def test_a_mistyped_command_or_option_is_answered_with_the_nearest_known_one(argv, words):
    _one_line(_cli(*argv), 2, *words)


def test_render_without_out_writes_nowhere_and_says_where_to(tmp_path):
    """render is offline: with no --out it refuses, rather than make /shared (init's volume in a pod) at the root
    of a workstation; the cwd is checked too, so no default anywhere is taken."""
    run = subprocess.run([sys.executable, "-m", "agent.cli", "render", "--pods", str(EXAMPLES / "volcano-pods.json"),
                          "--self", "demo-master-0"], capture_output=True,
                         text=True, cwd=tmp_path, env={**os.environ, "TOPOLOGY_OUT": ""}, timeout=60)
    _one_line(run, 2, "render needs --out DIR", "explain prints the same")
    assert list(tmp_path.iterdir()) == []


def test_explain_and_render_take_the_pods_own_init_options_unless_given_here(tmp_path, monkeypatch):
    """A dry run shows what the pod got: the options its init container was given (as status reads them), below
    this command line's own flags and TOPOLOGY_* values; its paths (--out) are never taken."""
    pods = examples.volcano_job("demo", (("master", 1), ("worker", 2)))
    for pod in pods:
        pod["spec"]["initContainers"][0]["args"] = ["init", "--out", "/shared", "--timeout", "60", "--address", "ip",
                                                    "--master-port", "1234"]
    path = tmp_path / "pods.json"
    path.write_text(json.dumps(examples.as_list(pods)))
    monkeypatch.delenv("TOPOLOGY_ADDRESS", raising=False)
    monkeypatch.delenv("TOPOLOGY_MASTER_PORT", raising=False)
    explained = _cli("explain", "--pods", str(path), "--self", "demo-worker-0")
    assert explained.returncode == 0, explained.stderr
    assert "options from its init container: --address ip --master-port 1234\n" in explained.stdout
    assert "MASTER_ADDR=127." in explained.stdout and "MASTER_PORT=1234 " in explained.stdout
    given_here = _cli("explain", "--pods", str(path), "--self", "demo-worker-0", "--address", "dns")
    assert "options from its init container: --master-port 1234\n" in given_here.stdout
    assert "MASTER_ADDR=demo-master-0.demo" in given_here.stdout
    rendered = _cli("render", "--pods", str(path), "--self", "demo-worker-0", "--out", str(tmp_path / "out"))
    assert rendered.returncode == 0, rendered.stderr
    assert "with the options of its init container: --address ip --master-port 1234" in rendered.stdout
    assert "MASTER_PORT='1234'" in (tmp_path / "out" / "torch.env").read_text()


def test_out_naming_a_file_says_so(tmp_path):
    blocker = tmp_path / "shared"
    blocker.write_text("not a directory")
    _one_line(_cli("render", "--pods", str(EXAMPLES / "volcano-pods.json"), "--self", "demo-master-0", "--out",
                   str(blocker)), 1, "it is a file, not a directory")
    assert blocker.read_text() == "not a directory"


@pytest.mark.parametrize(("text", "why"), [
    ("garbage: [\n", "not YAML at line 2"),
    ("just a string\n", "its top level is a str"),
    ("clusters: foo\n", "'clusters' is not a list of entries with a name"),
    ("", "it is empty"),
    ("apiVersion: v1\nkind: Config\n", "it names no cluster"),
])
def test_a_kubeconfig_that_is_not_one_gives_one_line(tmp_path, text, why):
    config = tmp_path / "kubeconfig"
    config.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    run = subprocess.run([sys.executable, "-m", "agent.cli", "init", "--kubeconfig", str(config), "--out",
                          str(tmp_path / "out"), "--timeout", "1"], capture_output=True, text=True, env=env,
                         timeout=60)
    _one_line(run, 2, f"kubeconfig {config} is not a kubeconfig ({why}")


def test_a_one_shot_command_run_in_process_leaves_the_cyclic_collector_as_it_found_it(tmp_path):
    """main() turns the cyclic collector off for one-shot commands; a caller that goes on (a test, an embedding
    program) gets it back on return, or its garbage cycles, unclosed sockets among them, were never collected."""
    import gc

    args = ["render", "--pods", str(EXAMPLES / "volcano-pods.json"), "--self", "demo-master-0"]
    assert gc.isenabled()
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert gc.isenabled()
    assert main(["render", "--pods", str(tmp_path / "missing.json"), "--self", "x", "--out", str(tmp_path / "b")]) \
        == 2
    assert gc.isenabled()  # after a refusal as well
    gc.disable()
    try:
        assert main([*args, "--out", str(tmp_path / "c")]) == 0
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()


@pytest.mark.slow  # seconds of real waiting (backoffs, a timeout): the whole suite runs it
def test_explain_piped_into_head_ends_quietly_with_the_shells_sigpipe_code(tmp_path):
    """``explain ... | head`` closes the pipe early: no "internal error" line, and the code a shell gives a process
    ended by SIGPIPE (141), not the bug exit (70). The job's explanation (~550 KB) outgrows the pipe's buffer."""
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps(examples.as_list(examples.volcano_job("big", tasks=(("master", 1), ("worker", 6000))))))
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "explain", "--pods", str(pods), "--self",
                             "big-worker-1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # the reader leaves after one line, as head does
    with proc.stderr:
        err = proc.stderr.read()
    assert proc.wait(60) == 141, err
    assert err == b""
