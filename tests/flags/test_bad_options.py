"""Every subcommand, a bad value for each of its options: one line on stderr, a non-zero exit, no traceback.

The table is checked against the real parser: an option added to a subcommand without a row here fails
``test_every_option_of_every_subcommand_has_a_bad_value_row``. Each row gives words the line must contain
(the option as the user spelled it, and what to do), so a generic catch-all message cannot pass for it.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli import main
from agent.flags.parser import build_parser

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PODS = str(EXAMPLES / "volcano-pods.json")
BLOCKER = "@blocker"  # replaced by a path below a regular file: no one, not even root, can create it
MISSING = "/nonexistent/topology-agent-test"
OFFLINE = ["--pods", PODS, "--self", "demo-worker-0"]
PLANNED = str(EXAMPLES.parent / "manifests" / "examples" / "pytorchjob.yaml")

# (subcommands, option, argv after the subcommand, words the one line must contain)
COMMON = [
    ("--roles", ["--roles", ","], ["--roles", "empty"]),
    ("--master-port", ["--master-port", "abc"], ["--master-port 'abc'", "whole number from 1 to 65535"]),
    ("--master-port", ["--master-port", "70000"], ["--master-port '70000'"]),
    ("--nproc-per-node", ["--nproc-per-node", "0"], ["--nproc-per-node '0'"]),
    ("--nproc-per-node", ["--nproc-per-node", "9" * 5000], ["--nproc-per-node", "whole number"]),
    ("--container", ["--container", "Trainer 1"], ["--container 'Trainer 1'", "container name"]),
    ("--address", ["--address", "dnss"], ["--address 'dnss'", "dns, ip"]),
    ("--cluster-domain", ["--cluster-domain", "bad domain"], ["--cluster-domain 'bad domain'", "cluster.local"]),
    ("--cluster-domain", ["--cluster-domain", "cluster.local", "--address", "ip"],
     ["--cluster-domain and --address ip contradict"]),
    ("--elastic", ["--elastic", "3:2"], ["--elastic '3:2'", "MIN:MAX"]),
    ("--elastic", ["--elastic", "2"], ["--elastic '2'", "MIN:MAX"]),
    ("--rdzv-port", ["--rdzv-port", "-1"], ["--rdzv-port '-1'"]),
    ("--controller", ["--controller", "kubeflow"], ["--controller 'kubeflow' is unknown", "volcano"]),
    ("--selector", ["--selector", "app"], ["--selector 'app'", "key=value"]),
    ("--selector", ["--selector", "app=x", "--index-label", "i", "--controller", "pytorchjob"],
     ["--selector and --controller pytorchjob contradict"]),
    ("--selector", ["--selector", "app=x"], ["--selector needs --index-label"]),
    ("--index-label", ["--index-label", "idx"], ["--index-label needs --selector"]),
    ("--ssh-secret-dir", ["--ssh-secret-dir", MISSING], ["--ssh-secret-dir", "directory not found", "keygen"]),
    ("--ssh-port", ["--ssh-port", "ssh"], ["--ssh-port 'ssh'"]),
    ("--ssh-owner", ["--ssh-owner", "root"], ["--ssh-owner 'root'", "UID:GID"]),
    ("--rank-order", ["--rank-order", "rack"], ["--rank-order 'rack'", "index, topology"]),
    ("--world-size", ["--world-size", "0"], ["--world-size '0'", "whole number"]),
    ("--world-size", ["--world-size", "2", "--elastic", "1:3"], ["--world-size", "--elastic contradicts"]),
    ("--world-size", ["--world-size", "2", "--rank-order", "topology"], ["--world-size", "--rank-order contradicts"]),
    ("--view", ["--view", "mine"], ["--view 'mine'", "full, own"]),
    ("--replica-groups", ["--replica-groups", "jobset"], ["--replica-groups 'jobset'", "jobset-job"]),
    ("--replica-groups", ["--replica-groups", "label:", "--view", "full"], ["--replica-groups 'label:'", "label:KEY"]),
    ("--replica-groups", ["--replica-groups", "jobset-job", "--view", "own"],
     ["--replica-groups reads every member's labels", "--view own"]),
    ("--topology-levels", ["--topology-levels", "rack name"], ["--topology-levels", "'rack name'", "label key"]),
    ("--topology-levels", ["--topology-levels", "a.io/rack,b.io/rack"],
     ["--topology-levels", "TOPOLOGY_RACK", "only one"]),
    ("--topology-levels", ["--topology-levels", "example.com/node"], ["TOPOLOGY_NODE", "writes itself"]),
    ("--topology-levels", ["--topology-levels", ","], ["--topology-levels is empty", "default"]),
    ("--frameworks", ["--frameworks", "jax,pytorch"], ["--frameworks names 'pytorch'", "torch, jax, tf"]),
    *[(f"--{fw}-port", [f"--{fw}-port", "0"], [f"--{fw}-port '0'", "whole number from 1 to 65535"])
      for fw in ("jax", "tf", "xgboost", "paddle", "mlx", "ray")],
]
# Checked against the pods: offline here; init is tested against the sandbox (tests/integration/test_init.py),
# and the sidecar keeps its last files on a topology error by design (pods change; init has refused already).
POD_DEPENDENT = [
    ("--roles", ["--roles", "mastr,worker"], ["--roles", "'mastr'", "roles present: extras, master, worker"]),
    ("--container", ["--container", "nope"], ["'nope'", "fix --container"]),
]
IN_CLUSTER = [
    ("--out", ["--out", BLOCKER], ["--out", "cannot write"]),
    ("--kubeconfig", ["--kubeconfig", MISSING], ["--kubeconfig", "file not found"]),
    ("--log-format", ["--log-format", "xml"], ["--log-format 'xml'", "text, json"]),
    ("--watch-idle", ["--watch-idle", "0.5"], ["--watch-idle '0.5'", "from 1 to 3600"]),
    ("--watch-idle", ["--watch-idle", "soon"], ["--watch-idle 'soon'", "seconds"]),
    ("--state-dir", ["--state-dir", "agent-state"], ["--state-dir 'agent-state'", "absolute path"]),
    ("--state-dir", ["--state-dir", "/shared/agent"], ["--state-dir /shared/agent and the output directory /shared "
                                                       "overlap", "only the agent's containers mount"]),
    ("--state-dir", ["--out", "/var/run/topology-agent/out"], ["the output directory /var/run/topology-agent/out",
                                                               "overlap"]),
]
CASES: list[tuple[str, str, list[str], list[str]]] = []
for command in ("render", "explain"):
    where = ["--out", "@out"] if command == "render" else []
    CASES += [(command, opt, [*OFFLINE, *where, *argv], words) for opt, argv, words in COMMON + POD_DEPENDENT]
    CASES += [
        (command, "--pods", ["--pods", MISSING, "--self", "x", *where], ["--pods", "file not found"]),
        (command, "--pods", ["--pods", "@empty", "--self", "x", *where], ["the pod list is empty"]),
        (command, "--self", ["--pods", PODS, "--self", "nope-0", *where], ["'nope-0'", "not in the pod list"]),
        (command, "--nodes", [*OFFLINE, *where, "--nodes", MISSING], ["--nodes", "file not found",
                                                                        "kubectl get nodes"]),
        (command, "--nodes", [*OFFLINE, *where, "--nodes", PODS], ["--nodes", "is not a Node", "kubectl get nodes"]),
        (command, "--claims", [*OFFLINE, *where, "--claims", MISSING], ["--claims", "file not found",
                                                                          "kubectl get resourceclaims"]),
        (command, "--claims", [*OFFLINE, *where, "--claims", PODS], ["--claims", "item 0 is not a ResourceClaim",
                                                                       "kubectl get resourceclaims"]),
    ]
CASES.append(("render", "--out", [*OFFLINE, "--out", BLOCKER], ["cannot"]))
CASES.append(("render", "--out", OFFLINE, ["render needs --out DIR", "explain prints the same"]))
for command in ("init", "sidecar"):
    CASES += [(command, opt, argv, words) for opt, argv, words in COMMON + IN_CLUSTER]
CASES += [
    ("init", "--expect", ["--expect", "0"], ["--expect '0'"]),
    ("init", "--timeout", ["--timeout", "soon"], ["--timeout 'soon'"]),
    ("init", "--source", ["--source", "both"], ["--source 'both'", "auto, pods, published"]),
    ("sidecar", "--debounce", ["--debounce", "nan"], ["--debounce 'nan'", "seconds"]),
    ("sidecar", "--debounce", ["--debounce", "-1"], ["--debounce '-1'"]),
    *[(command, "--lease-seconds", ["--lease-seconds", "1"], ["--lease-seconds '1'", "from 2 to 3600"])
      for command in ("init", "sidecar")],
    *[(command, "--lease-seconds", ["--lease-seconds", "2.5"], ["--lease-seconds '2.5'", "whole number"])
      for command in ("init", "sidecar")],
    ("sidecar", "--probe-every", ["--probe-every", "0.1"], ["--probe-every '0.1'", "from 1 to 86400"]),
    ("sidecar", "--signal", ["--signal", "SIGFOO"], ["--signal 'SIGFOO'", "SIGUSR1"]),
    ("sidecar", "--signal", ["--signal", "SIGUSR1"], ["--signal SIGUSR1 names a signal but no process",
                                                      "--trainer-pid-file FILE or --trainer-match REGEX"]),
    ("sidecar", "--trainer-pid-file", ["--trainer-pid-file", "/"], ["--trainer-pid-file /", "directory"]),
    ("sidecar", "--trainer-match", ["--trainer-match", "(torchrun"], ["--trainer-match '(torchrun'"]),
    ("sidecar", "--health-port", ["--health-port", "http"], ["--health-port 'http'"]),
    ("sidecar", "--health-host", ["--health-host", "everywhere"], ["--health-host 'everywhere'", "IP address"]),
    ("sidecar", "--stuck-after", ["--stuck-after", "inf"], ["--stuck-after 'inf'"]),
    ("sandbox", "--port", ["--port", "99999"], ["--port '99999'"]),
    ("sandbox", "--state-dir", ["--state-dir", BLOCKER], ["--state-dir", "writable directory"]),
    ("sandbox", "--bookmark-interval", ["--bookmark-interval", "abc"], ["--bookmark-interval 'abc'"]),
    ("sandbox", "--bookmark-interval", ["--bookmark-interval", "0"], ["--bookmark-interval '0'"]),
    ("sandbox", "--nodes", ["--controllers", "--nodes", "1001"], ["--nodes '1001'", "from 0 to 1000"]),
    ("sandbox", "--nodes", ["--nodes", "2"], ["--nodes 2 needs --controllers"]),
    ("keygen", "--job", ["--job", "Bad_Name"], ["--job 'Bad_Name'", "Kubernetes name"]),
    ("keygen", "--namespace", ["--job", "j", "--namespace", "team a"], ["--namespace 'team a'"]),
    ("keygen", "--kubeconfig", ["--job", "j", "--apply", "--kubeconfig", MISSING], ["--kubeconfig", "file not found"]),
    ("demo", "--out", ["--out", BLOCKER], ["--out", "cannot write there"]),
    ("inject", "--filename", ["-f", MISSING], ["-f", "cannot read it"]),
    ("inject", "--set", ["--set", "elastic", "-f", "@empty"], ["--set 'elastic'", "KEY=VALUE"]),
    ("inject", "--set", ["--set", "rank-ordr=topology", "-f", "@empty"], ["'topology-agent.io/rank-ordr'",
                                                                          "not a setting"]),
    ("inject", "--set", ["--set", "timeout=soon", "-f", "@pod"], ["--timeout 'soon'", "annotation"]),
    ("inject", "--set", ["--set", "sidecar=true", "--set", "debounce=-1", "-f", "@pod"], ["--debounce '-1'"]),
    ("sandbox", "--service", ["--service", "webhook=127.0.0.1:8443"], ["--service 'webhook=127.0.0.1:8443'",
                                                                       "NAMESPACE/NAME=IP:PORT"]),
    ("webhook", "--port", ["--port", "0"], ["--port '0'"]),
    ("webhook", "--host", ["--host", "webhook.local"], ["--host 'webhook.local'", "IP address"]),
    ("webhook", "--namespace", ["--namespace", "Team_A"], ["--namespace 'Team_A'"]),
    ("webhook", "--service", ["--service", "web.hook"], ["--service 'web.hook'"]),
    ("webhook", "--cert-host", ["--cert-host", "not a host"], ["--cert-host 'not a host'"]),
    ("webhook", "--secret", ["--secret", "TLS"], ["--secret 'TLS'"]),
    ("webhook", "--config", ["--config", "a/b"], ["--config 'a/b'"]),
    ("webhook", "--tls-dir", ["--tls-dir", MISSING], ["--tls-dir", "not a directory"]),
    ("webhook", "--check-every", ["--check-every", "0.5"], ["--check-every '0.5'"]),
    ("webhook", "--kubeconfig", ["--kubeconfig", MISSING], ["--kubeconfig", "file not found"]),
    ("webhook", "--log-format", ["--log-format", "xml"], ["--log-format 'xml'"]),
    ("webhook", "--set", ["--set", "image"], ["--set 'image'", "KEY=VALUE"]),
    ("webhook", "--set", ["--set", "image=Not An Image"], ["'topology-agent.io/image'", "not an image reference"]),
    ("status", "(job)", ["Bad_Job"], ["JOB 'Bad_Job'", "not a valid object name"]),
    ("status", "--namespace", ["demo", "--namespace", "Team A"], ["--namespace 'Team A'"]),
    ("status", "--kubeconfig", ["demo", "--kubeconfig", MISSING], ["--kubeconfig", "file not found"]),
    ("status", "--context", ["demo", "--kubeconfig", "@kubeconfig", "--context", "nope"],
     ["--context 'nope' is not a context of kubeconfig", "(its contexts: sandbox)"]),
    ("status", "--controller", ["demo", "--controller", "slurm"], ["--controller 'slurm'", "volcano"]),
    ("status", "--output", ["demo", "-o", "yaml"], ["--output 'yaml' must be one of: table, json"]),
    ("plan", "--filename", ["-f", MISSING], ["-f /nonexistent/topology-agent-test", "cannot read it"]),
    ("plan", "--filename", ["-f", "@pod"], ["no job of a kind the agent knows (found Pod 'p')"]),
    ("plan", "--runtime", ["-f", PLANNED, "--runtime", MISSING], ["--runtime /nonexistent/topology-agent-test",
                                                                  "cannot read it"]),
    ("plan", "--out", ["-f", PLANNED, "--out", BLOCKER], ["cannot"]),
    ("plan", "--self", ["-f", PLANNED, "--self", "mnist-worker-9"], ["--self mnist-worker-9: no such pod",
                                                                     "mnist-master-0"]),
    ("plan", "--output", ["-f", PLANNED, "-o", "yaml"], ["--output 'yaml' must be one of: table, json"]),
    ("render", "(usage)", ["--pods"], ["expected one argument", "--help"]),
    ("init", "(usage)", ["--no-such-option"], ["unrecognized arguments", "--help"]),
]
# flags: no bad value
NO_VALUE = {"--help", "--version", "--wait-dns", "--apply", "--health-topology", "--watch", "--controllers"}


def _case_id(case: tuple[str, str, list[str], list[str]]) -> str:
    command, _, argv, _ = case
    return f"{command} {' '.join(a if len(a) < 20 else a[:8] + '...' for a in argv)}"


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith("TOPOLOGY_") or name in ("KUBERNETES_SERVICE_HOST", "KUBECONFIG"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("POD_NAME", "demo-worker-0")
    monkeypatch.setenv("POD_NAMESPACE", "default")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config from the machine


def _materialise(argv: list[str], tmp_path: Path) -> list[str]:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    empty = tmp_path / "empty.json"
    empty.write_text('{"kind": "List", "items": []}')
    pod = tmp_path / "pod.json"
    pod.write_text('{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, '
                   '"spec": {"containers": [{"name": "t", "image": "t"}]}}')
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: [{name: sandbox, cluster: {server: "
                          "'https://127.0.0.1:1'}}]\nusers: [{name: sandbox, user: {token: t}}]\ncontexts: "
                          "[{name: sandbox, context: {cluster: sandbox, user: sandbox}}]\ncurrent-context: sandbox\n")
    named = {"@empty": str(empty), "@pod": str(pod), "@kubeconfig": str(kubeconfig), "@out": str(tmp_path / "out")}
    return [str(blocker / "sub") if a == BLOCKER else named.get(a, a) for a in argv]


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_a_bad_value_gives_one_line_and_a_non_zero_exit(case, clean_env, tmp_path, capsys):
    command, _, argv, words = case
    code = main([command, *_materialise(argv, tmp_path)])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code not in (0, None), captured
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err and "internal error" not in captured.err, captured.err
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not (tmp_path / "a-file" / "sub").exists()


def test_every_option_of_every_subcommand_has_a_bad_value_row():
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    covered = {(command, option) for command, option, _, _ in CASES}
    missing = [
        (name, opt)
        for name, sub in commands.choices.items()
        for action in sub._actions
        for opt in action.option_strings[-1:]
        if opt not in NO_VALUE and (name, opt) not in covered
    ]
    assert not missing, f"options with no bad-value row: {missing}"


def test_a_knob_from_the_environment_is_named_as_the_user_set_it(clean_env, monkeypatch, capsys):
    monkeypatch.setenv("TOPOLOGY_MASTER_PORT", "http")
    assert main(["render", *OFFLINE]) == 2
    assert "TOPOLOGY_MASTER_PORT 'http' must be a whole number" in capsys.readouterr().err
    monkeypatch.delenv("TOPOLOGY_MASTER_PORT")
    monkeypatch.setenv("TOPOLOGY_ROLES", "mastr,worker")
    assert main(["explain", *OFFLINE]) == 2
    assert "TOPOLOGY_ROLES names 'mastr'" in capsys.readouterr().err


def _busy_port() -> tuple[socket.socket, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


def _run(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOPOLOGY_") and k != "KUBERNETES_SERVICE_HOST"}
    return subprocess.run([sys.executable, "-m", "agent.cli", *argv], capture_output=True, text=True, timeout=60,
                          env={**base, **env})


def test_sandbox_on_a_port_in_use_says_so_in_one_line():
    sock, port = _busy_port()
    with sock:
        run = _run(["sandbox", "--port", str(port)])
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [run.stderr.strip()]
    assert f"--port {port}: cannot listen on 127.0.0.1" in run.stderr and "Traceback" not in run.stderr


def test_sidecar_health_port_in_use_fails_at_once_before_the_api_is_reached(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    sock, port = _busy_port()
    with sock:
        run = _run(["sidecar", "--kubeconfig", str(kubeconfig), "--health-port", str(port),
                    "--health-host", "127.0.0.1", "--out", str(tmp_path / "out")],
                   POD_NAME="p", POD_NAMESPACE="default")
    assert run.returncode == 2, run.stderr
    line = run.stderr.strip()
    assert "\n" not in line and f"--health-port {port} on 127.0.0.1: cannot listen" in line, run.stderr


def test_an_unexpected_exception_is_one_line_that_asks_for_a_report(monkeypatch, capsys):
    import agent.cli as cli

    def broken(_args):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setitem(cli.COMMANDS, "explain", broken)
    monkeypatch.delenv("TOPOLOGY_DEBUG", raising=False)
    assert main(["explain", *OFFLINE]) == cli.BUG_EXIT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: RuntimeError: boom" in err and "TOPOLOGY_DEBUG=1" in err
