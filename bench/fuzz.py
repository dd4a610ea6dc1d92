"""Fuzz the trust boundary: mutated pod lists through the core, mutated watch streams through
the wire parser and the sidecar's intake, and mutated published topologies (the snapshot's document, the
journal's entries, the ConfigMaps' fields, their compressed bytes) through a follower's reading, its check of
the writer, and the core. A finding is a traceback (any exception but InputError/ApiError), a render slower
than 5 s, or a file with a line the members do not account for.

    python bench/fuzz.py --pod-lists 10000 --streams 10000 --published 10000 --seed 1

Prints one Markdown row per kind, for docs/reliability.md. Exit 1 if anything was found.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import re
import signal
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent import examples
from agent.core import Options, render_pod
from agent.core.controllers import detect_controller
from agent.core.files.ssh_config import SshPaths, render_known_hosts, render_ssh_config
from agent.core.publication.journal import JOURNAL_KEY, PublishedState, Publisher, journal_body, state_from
from agent.core.publication.provenance import WriterCheck, writer_of
from agent.core.publication.published import configmap_body, configmap_name, pack
from agent.errors import ApiError, InputError
from agent.k8s.core import parse_event
from agent.runtime.views import usable_pods
from agent.trainer import parse_env_file

HOSTILE: list[Any] = [
    None, [], {}, True, 0, -1, 10**30, 1.5, float("nan"), "", " ", "\n", "a\nb", "worker\nHost *\n ProxyCommand x",
    "$(id)", "'", '"', "`id`", "x" * 300, "9" * 5000, "1e999999", "-1", "\u0661", "w\u2028x", "@cert-authority",
    "*", "a b", "a,b", "#", "EOF", "../../etc", "127.1.0.1", "fd00::1", "256.1.1.1", "worker", "master", "0",
    {"a": 1}, [1, "x"], [[[[[]]]]], "Running", "Failed", "nvidia.com/gpu", "2", "500m",
]
JOBS: list[Callable[[], list[dict[str, Any]]]] = [
    lambda: examples.volcano_job(tasks=(("master", 1), ("worker", 2), ("extras", 1))),
    lambda: examples.pytorchjob(workers=2),
    lambda: examples.jobset(),
    lambda: examples.leaderworkerset(size=3, groups=1),
    lambda: examples.mpijob(workers=2),
    lambda: examples.indexed_job(completions=3),
    lambda: examples.trainjob(num_nodes=2),
]
_HOST_LINE = re.compile(r"[A-Za-z0-9.:\[\]-]+")


def _where(err: BaseException) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    last = frames[-1] if frames else None
    return f"{Path(last.filename).name}:{last.lineno}" if last else "?"


class Hang(Exception):
    pass


def _alarm(_signum: int, _frame: object) -> None:
    raise Hang


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for key, value in obj.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            out += _paths(value, (*prefix, i))
    return out


def _mutate(pods: list[dict[str, Any]], rng: random.Random) -> None:
    for _ in range(rng.randint(1, 5)):
        pod = rng.choice(pods)
        paths = _paths(pod)
        if not paths:
            return
        path = rng.choice(paths)
        parent: Any = pod
        for key in path[:-1]:
            parent = parent[key]
        action = rng.random()
        if action < 0.15 and isinstance(parent, dict):
            del parent[path[-1]]
        elif action < 0.25 and isinstance(parent, dict):
            parent[rng.choice(["extra", "labels", "spec", "hostname", "env"])] = copy.deepcopy(rng.choice(HOSTILE))
        else:
            parent[path[-1]] = copy.deepcopy(rng.choice(HOSTILE))


def check_files(rendered: Any) -> str | None:
    """What a file holds that the members do not account for (None: nothing)."""
    topo = rendered.plan.topology
    files = {k: v.decode() for k, v in rendered.files.items()}
    hostfile = files["hostfile"].splitlines()
    first = {}  # hostNetwork pods may share an address: a host list names each address once, its first member
    for member in topo.training:
        first.setdefault(member.address, member)
    if hostfile != [f"{m.address} slots={m.slots}" for m in first.values()]:
        return "hostfile"
    for member in topo.members:
        if not _HOST_LINE.fullmatch(member.address):
            return f"address {member.address!r}"
    written = {v.name: v.value for v in rendered.variables if v.written and not v.unset and not v.reference}
    parsed = parse_env_file(files["torch.env"])
    if any(parsed.get(k) != v for k, v in written.items()) or not set(parsed) <= {v.name for v in rendered.variables}:
        return "torch.env"
    body = files["discover_hosts.sh"].split("<<'EOF'\n", 1)[1].rsplit("EOF\n", 1)[0].splitlines()
    if body != [f"{m.address}:{m.slots}" for m in first.values() if m.running]:
        return "discover_hosts.sh"
    known = render_known_hosts(topo, "ssh-ed25519 AAAA job-ca", 2222)
    if len([line for line in known.splitlines() if line and not line.startswith("#")]) != 1:
        return "known_hosts"
    config = render_ssh_config(topo, SshPaths("/shared/ssh"), 2222).splitlines()
    if any(line and not line.startswith(("Host ", "    ", "#")) for line in config) or \
            not _ssh_config_names_members_only(config, topo):
        return "ssh_config"
    return None


def _ssh_config_names_members_only(config: list[str], topo: Any) -> bool:
    """Every ``Host`` block but the last names members (their names) or a pattern of a member's name with its index
    wildcarded and no dot, and sends them to a member's address or to ``%h.<a member's DNS suffix>``; the last is
    ``Host *``; every member is reached by one of them."""
    names = {n for m in topo.members for n in (m.name, m.address, m.dns_name, (m.dns_name or "").split(".")[0]) if n}
    suffixes = {m.dns_name.split(".", 1)[1] for m in topo.members if m.dns_name and "." in m.dns_name}
    heads = [(i, line[5:].split()) for i, line in enumerate(config) if line.startswith("Host ")]
    if not heads or heads[-1][1] != ["*"]:
        return False
    reached = set()
    for i, patterns in heads[:-1]:
        target = config[i + 1].strip()
        if patterns[-1:] == ["!*.*"] and len(patterns) == 2 and patterns[0].endswith("-*"):
            prefix = patterns[0][:-1]
            if target[len("HostName %h."):] not in suffixes or not target.startswith("HostName %h.") or \
                    not any(m.name.startswith(prefix) for m in topo.members):
                return False
            reached |= {m.name for m in topo.members if m.name.startswith(prefix) and "." not in m.name}
        elif set(patterns) <= names and target[len("HostName "):] in {m.address for m in topo.members}:
            reached |= set(patterns)
        else:
            return False
    return {m.name for m in topo.members} <= reached


def _try(label: str, refused: str, outcomes: Counter[str], findings: list[str],
         body: Callable[[], str | None]) -> float:
    """One input under a 5 s alarm. A finding: the problem ``body`` returns, a traceback, a hang, or a refusal of
    several lines (``refused`` counts the one-line ones). Returns the seconds it took."""
    started = time.monotonic()
    signal.alarm(5)
    try:
        problem = body()
        if problem:
            findings.append(f"{label}: {problem}")
    except InputError as err:
        outcomes[refused] += 1
        if "\n" in str(err):
            findings.append(f"{label}: a message of several lines: {str(err)[:300]!r}")
    except Hang:
        findings.append(f"{label}: over 5 s")
    except Exception as err:
        findings.append(f"{label}: {type(err).__name__}: {str(err)[:100]} at {_where(err)}")
    finally:
        signal.alarm(0)
    return time.monotonic() - started


def fuzz_pod_lists(count: int, rng: random.Random) -> tuple[Counter[str], list[str], float]:
    outcomes: Counter[str] = Counter()
    findings: list[str] = []
    slowest = 0.0
    for i in range(count):
        pods = JOBS[i % len(JOBS)]()
        _mutate(pods, rng)
        names = [p["metadata"]["name"] for p in pods if isinstance(p, dict) and isinstance(p.get("metadata"), dict)
                 and isinstance(p["metadata"].get("name"), str)] or ["nobody"]

        def render(pods: list[dict[str, Any]] = pods, names: list[str] = names) -> str | None:
            rendered = render_pod(pods, rng.choice(names), Options(address=rng.choice(["dns", "ip"])))
            problem = check_files(rendered)
            outcomes["rendered"] += 1
            return f"injected into {problem}" if problem else None

        slowest = max(slowest, _try(f"pod list {i}", "refused", outcomes, findings, render))
    return outcomes, findings, slowest


def _event_lines(rng: random.Random) -> list[bytes]:
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 2)))
    lines = []
    for n, pod in enumerate(pods):
        pod["metadata"]["resourceVersion"] = str(100 + n)
        lines.append(json.dumps({"type": rng.choice(["ADDED", "MODIFIED"]), "object": pod}).encode())
    lines.append(json.dumps({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "200"}}}).encode())
    lines.append(json.dumps({"type": "DELETED", "object": pods[-1]}).encode())
    return lines


def _mutate_line(line: bytes, rng: random.Random) -> bytes:
    choice = rng.random()
    if choice < 0.3:
        data = bytearray(line)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    if choice < 0.45:
        return line[:rng.randrange(len(line))]
    if choice < 0.6:
        return rng.choice([b"[" * 50000 + b"]" * 50000, b"NaN", b'{"type":"ERROR","object":{"code":"x"}}',
                           b'{"type":"ADDED","object":null}', b"\xff\xfe", b'{"a":1e9999}', b"9" * 5000])
    event = json.loads(line)
    _mutate([event], rng)
    return json.dumps(event).encode()


def fuzz_streams(count: int, rng: random.Random) -> tuple[Counter[str], list[str], float]:
    outcomes: Counter[str] = Counter()
    findings: list[str] = []
    slowest = 0.0
    for i in range(count):
        lines = [_mutate_line(line, rng) if rng.random() < 0.5 else line for line in _event_lines(rng)]

        def intake(lines: list[bytes] = lines) -> str | None:
            pods: dict[str, Any] = {}
            for line in lines:
                try:
                    event = parse_event(line)
                except ApiError:
                    outcomes["broken line"] += 1
                    continue
                outcomes["event"] += 1
                kept = usable_pods([event.object])
                name = kept[0]["metadata"]["name"] if kept else None
                if event.type in ("DELETED", "BOOKMARK") or not kept:
                    pods.pop(name, None)
                    continue
                pods[name] = kept[0]
            problem = check_files(render_pod(list(pods.values()), next(iter(pods)), Options())) if pods else None
            outcomes["stream rendered"] += 1
            return f"injected into {problem}" if problem else None

        slowest = max(slowest, _try(f"stream {i}", "stream refused", outcomes, findings, intake))
    return outcomes, findings, slowest


def _publication(pods: list[dict[str, Any]], rng: random.Random) -> tuple[str, list[dict[str, Any]],
                                                                          dict[str, Any]]:
    """A job's snapshot and journal as its leader writes them (one change after the snapshot), and the snapshot's
    document, for mutation."""
    options = Options(address="ip")
    leader = pods[0]["metadata"]
    name = configmap_name("job")
    publisher = Publisher(PublishedState(job="job", namespace="default"), options, leader=leader["name"],
                          leader_uid=str(leader.get("uid", "")))
    by_name = {p["metadata"]["name"]: p for p in pods}
    publisher.change(by_name, list(by_name))
    document = json.loads(json.dumps(publisher.snapshot_document()))  # as published: text, not the leader's rows
    publisher.snapshot_written(publisher.state.seq)
    publisher.start_from_snapshot()
    moved = copy.deepcopy(rng.choice(pods))
    moved["status"].update(podIP="127.0.9.9", podIPs=[{"ip": "127.0.9.9"}])
    publisher.change({**by_name, moved["metadata"]["name"]: moved}, [moved["metadata"]["name"]])
    journal = journal_body(name, publisher.journal_data(), owner=None)
    return name, [journal], document


def fuzz_published(count: int, rng: random.Random) -> tuple[Counter[str], list[str], float]:
    outcomes: Counter[str] = Counter()
    findings: list[str] = []
    slowest = 0.0
    for i in range(count):
        pods = JOBS[i % len(JOBS)]()
        name, items, document = _publication(pods, rng)
        leader = pods[0]["metadata"]
        kind = rng.random()
        if kind < 0.35:  # the snapshot's document
            _mutate([document], rng)
        packed = pack(document)
        if kind >= 0.85:  # the compressed bytes
            data = bytearray(packed)
            for _ in range(rng.randint(1, 6)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            packed = bytes(data[:rng.randrange(len(data) + 1)] if rng.random() < 0.3 else data)
        snapshot = configmap_body(name, packed, generation=int(document.get("generation", 1))
                                  if isinstance(document.get("generation"), int) else 1,
                                  leader=leader["name"], leader_uid=str(leader.get("uid", "")), owner=None)
        items = [snapshot, *items]
        if 0.35 <= kind < 0.6:  # the journal's entries, decoded and mutated
            entries = json.loads(items[1]["data"][JOURNAL_KEY])
            _mutate([{"entries": entries}], rng)
            items[1]["data"][JOURNAL_KEY] = json.dumps(entries)
        elif 0.6 <= kind < 0.85:  # the ConfigMaps' own fields (data, binaryData, the writer)
            _mutate(items, rng)
        me = rng.choice(pods)["metadata"]["name"]

        def follow(pods: list[dict[str, Any]] = pods, items: list[dict[str, Any]] = items, name: str = name,
                   me: str = me) -> str | None:
            controller = detect_controller(pods[0], Options())
            check = WriterCheck(controller, Options(), controller.identify(pods[0], Options()).job,
                                "default", None)
            for writer, what in check.pending(items, name):
                path = check.path(writer)
                check.judge(writer, next((p for p in pods if path and p["metadata"]["name"] == writer.name),
                                         None), what)
                if path is not None and ("\n" in path or ".." in path):
                    return f"a request path from data.leader: {path!r}"
            for item in items:
                writer_of(item)
            state, _ = state_from(items, name)
            if state is None or me not in state.pods:
                outcomes["not usable"] += 1
                return None
            rendered = render_pod(list(state.pods.values()), me, Options(address="ip"),
                                  nodes=state.node_labels(), checked=True)  # as a follower's init renders them
            problem = check_files(rendered)
            outcomes["published rendered"] += 1
            return f"injected into {problem}" if problem else None

        slowest = max(slowest, _try(f"published {i}", "published refused", outcomes, findings, follow))
    return outcomes, findings, slowest


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pod-lists", type=int, default=10000)
    parser.add_argument("--streams", type=int, default=10000)
    parser.add_argument("--published", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    signal.signal(signal.SIGALRM, _alarm)
    import logging

    logging.disable(logging.WARNING)  # the intake logs every refused pod; the counts are below
    rng = random.Random(args.seed)
    print("| input | tried | outcomes | findings | slowest (s) |")
    print("|---|---|---|---|---|")
    found = []
    for kind, run, count in (("pod lists", fuzz_pod_lists, args.pod_lists),
                             ("watch streams", fuzz_streams, args.streams),
                             ("published topologies", fuzz_published, args.published)):
        started = time.monotonic()
        outcomes, findings, slowest = run(count, rng)
        found += findings
        shown = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
        took = time.monotonic() - started
        print(f"| {kind} | {count} | {shown} | {len(findings)} | {slowest:.2f} (all: {took:.0f}) |")
    for finding in found[:20]:
        print(finding, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
