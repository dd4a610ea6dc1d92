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
    assert (env["NPROC_PER_NODE"], env["RANK"], env["MASTER_ADDR"]) == ("2", "2", "127.1.0.1")


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


def test_checking_options_imports_no_heavy_library():
    # init pays its imports in every pod: asyncssh (0.2 s, 20 MB) only with SSH, kubernetes only outside a pod.
    code = ("import sys; from agent.cli import build_parser, options_from_args, ssh_settings; "
            "a = build_parser().parse_args(['init', '--ssh-owner', '1000:1000']); options_from_args(a); "
            "ssh_settings(a); print(sorted(m for m in ('asyncssh', 'kubernetes', 'aiohttp') if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"


def test_render_with_node_labels_gives_the_documented_variables(tmp_path):
    """Issue 14, "Done when": each default level's variable, read back by bash, is named in docs/variables.md."""
    from agent.core.placement import DEFAULT_LEVELS

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
