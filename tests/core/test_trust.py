"""Nothing a pod, an annotation or a published ConfigMap says can reach a file as a directive.

Each case is one that, without the validation layer (agent/core/pods/validation.py), ends in a traceback, a hang, or a
line written into a file from data."""

from __future__ import annotations

import base64
import copy
import gzip
import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from agent import examples
from agent.core import Options, render_pod
from agent.core.publication.journal import state_from
from agent.errors import InputError

PROXY = "worker\nHost *\n    ProxyCommand sh -c 'touch /tmp/pwned'"


def _job():
    return examples.volcano_job(tasks=(("master", 1), ("worker", 2)))


def _intruder(role_annotation: str, *, index: str = "7") -> dict:
    """A pod anyone who can create pods could label into the job: job label only, role in an annotation."""
    pod = examples.make_pod("intruder", labels={"volcano.sh/job-name": "demo"},
                            annotations={"volcano.sh/task-spec": role_annotation, "volcano.sh/task-index": index},
                            hostname="intruder", subdomain="demo", ip="127.1.0.99")
    return pod


@pytest.mark.parametrize("annotation", [
    PROXY,
    "worker\n@cert-authority * ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostile",
    "worker slots=999\nevil.example.com",
    "w'; touch /tmp/pwned; '",
    "worker\u2028x",
    "EOF\nrm -rf /\nEOF",
], ids=["ssh_config", "known_hosts", "hostfile", "quote", "u2028", "heredoc"])
def test_a_role_from_an_annotation_cannot_carry_a_line_into_any_file(annotation):
    pods = [*_job(), _intruder(annotation)]
    with pytest.raises(InputError) as err:
        render_pod(pods, "demo-worker-0", Options())
    assert "pod 'intruder'" in str(err.value) and "volcano.sh/task-spec" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value", ["9" * 5000, "1" * 10, "-1", "1_000", "١٢"])
def test_an_index_is_a_small_whole_number_or_the_pod_is_refused(value):
    pods = _job()
    pods[1]["metadata"]["labels"]["volcano.sh/task-index"] = value
    started = time.monotonic()
    with pytest.raises(InputError) as err:
        render_pod(pods, "demo-worker-0", Options())
    assert time.monotonic() - started < 5
    assert "volcano.sh/task-index" in str(err.value)


def test_a_huge_cpu_limit_is_refused_at_once_not_computed_for_minutes():
    pods = _job()
    pods[1]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "1e999999"
    started = time.monotonic()
    with pytest.raises(InputError) as err:
        render_pod(pods, "demo-worker-0", Options())
    assert time.monotonic() - started < 5
    assert "limits.cpu" in str(err.value)


def _set(path: str, value):
    def mutate(pod):
        keys = path.split(".")
        target = pod
        for key in keys[:-1]:
            target = target[int(key)] if isinstance(target, list) else target[key]
        last = keys[-1]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    return mutate


# The shapes a hand-made or hostile pod file can have (32 of them): each refused in one line.
MALFORMED = [
    ("metadata null", _set("metadata", None)), ("metadata a list", _set("metadata", [])),
    ("name an int", _set("metadata.name", 7)), ("name with a newline", _set("metadata.name", "a\nb")),
    ("name upper case", _set("metadata.name", "Demo-Worker-0")), ("namespace a list", _set("metadata.namespace", [])),
    ("labels a list", _set("metadata.labels", ["a"])), ("label value an int", _set("metadata.labels.x", 1)),
    ("annotations a string", _set("metadata.annotations", "x")),
    ("ownerReferences an object", _set("metadata.ownerReferences", {})),
    ("owner uid an int", _set("metadata.ownerReferences.0.uid", 3)),
    ("resourceVersion an int", _set("metadata.resourceVersion", 12)),
    ("spec null", _set("spec", None)), ("spec a string", _set("spec", "x")),
    ("hostname with a dot", _set("spec.hostname", "a.b")), ("subdomain upper", _set("spec.subdomain", "DEMO")),
    ("containers null", _set("spec.containers", None)), ("containers an object", _set("spec.containers", {})),
    ("container a string", _set("spec.containers.0", "trainer")),
    ("container name an int", _set("spec.containers.0.name", 1)),
    ("command a string", _set("spec.containers.0.command", "bash")),
    ("env an object", _set("spec.containers.0.env", {"A": "1"})),
    ("env name missing", _set("spec.containers.0.env", [{"value": "1"}])),
    ("env value an int", _set("spec.containers.0.env", [{"name": "A", "value": 1}])),
    ("resources a list", _set("spec.containers.0.resources", [])),
    ("limits null", _set("spec.containers.0.resources.limits", None)),
    ("quantity a bool", _set("spec.containers.0.resources.limits.cpu", True)),
    ("port a string", _set("spec.containers.0.ports", [{"name": "p", "containerPort": "80"}])),
    ("status a list", _set("status", [])), ("phase an int", _set("status.phase", 1)),
    ("podIPs a string", _set("status.podIPs", "1.2.3.4")), ("podIP not an IP", _set("status.podIP", "1.2.3.4\nx")),
]


@pytest.mark.parametrize("mutate", [m for _, m in MALFORMED], ids=[n for n, _ in MALFORMED])
def test_a_malformed_pod_file_is_one_line_and_exit_2(tmp_path, mutate, capsys, monkeypatch):
    """The command in process (the CLI's exit code and stream are tests/test_cli.py's): a bug would be exit 70."""
    from agent.cli import main

    monkeypatch.delenv("TOPOLOGY_DEBUG", raising=False)
    pods = _job()
    target = copy.deepcopy(pods[1])
    mutate(target)
    pods[1] = target
    path = tmp_path / "pods.json"
    path.write_text(json.dumps({"kind": "List", "items": pods}))
    code = main(["render", "--pods", str(path), "--self", "demo-master-0", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def _configmap(document: object, *, raw: bytes | None = None) -> dict:
    data = raw if raw is not None else gzip.compress(json.dumps(document).encode())
    return {"metadata": {"name": "demo-topology"}, "data": {"leader": "demo-master-0", "generation": "1"},
            "binaryData": {"topology.json.gz": base64.b64encode(data).decode()}}


def _gzip_bomb() -> dict:
    """70 MiB of text zipped: made when its test runs, not at collection in every worker (0.3 s of CPU each)."""
    return _configmap(None, raw=gzip.compress(b"{" + b" " * (70 * 1024 * 1024)))


FORGED = [
    ("not gzip", _configmap(None, raw=b"plain")),
    ("a gzip bomb", _gzip_bomb),
    ("a list", _configmap([1, 2])),
    ("NaN", _configmap(None, raw=gzip.compress(b'{"schema": NaN}'))),
    ("deep nesting", _configmap(None, raw=gzip.compress(b"[" * 100000 + b"]" * 100000))),
    ("rows of the wrong shape", _configmap({"schema": 1, "generation": 1, "containers": [], "pods": [[1, 2]]})),
    ("a container index out of range", _configmap({"schema": 1, "generation": 1, "containers": [],
                                                   "pods": [["a", "1", {}, {}, "", "", 5, "Running", "", ""]]})),
    ("a role with a newline", _configmap({"schema": 1, "generation": 1, "namespace": "default", "containers": [{}],
                                          "pods": [["demo-worker-0", "1", {"volcano.sh/job-name": "demo",
                                                    "volcano.sh/task-spec": PROXY, "volcano.sh/task-index": "0"},
                                                    {}, "", "", 0, "Running", "", ""]]})),
    ("not base64", {"metadata": {"name": "demo-topology"}, "data": {"leader": "x"},
                    "binaryData": {"topology.json.gz": "!!!"}}),
]


@pytest.mark.parametrize("configmap", [c for _, c in FORGED], ids=[n for n, _ in FORGED])
def test_a_broken_or_forged_published_topology_is_refused_in_one_line(configmap):
    configmap = configmap() if callable(configmap) else configmap
    started = time.monotonic()
    try:
        state, _ = state_from([configmap], "demo-topology")  # what init and the sidecars read it with
    except InputError as err:
        assert "\n" not in str(err)
    else:  # decoded: then the core refuses the pods it holds
        assert state is not None
        pods = list(state.pods.values())
        with pytest.raises(InputError):
            render_pod(pods, pods[0]["metadata"]["name"], Options())
    assert time.monotonic() - started < 5


def test_the_troubleshooting_page_explains_the_new_refusals():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md").read_text()
    assert "not a Kubernetes label value" in doc and "published topology is not valid" in doc
    assert "the published topology is not used (configmap <job>-topology: its writer" in doc
    assert "waiting for the published topology to be written again" in doc


def test_a_5000_digit_nproc_in_the_env_is_refused_in_one_line():
    # Found by bench/fuzz.py (seed 3): int() of a 5000-digit PET_NPROC_PER_NODE raised ValueError.
    pods = _job()
    pods[1]["spec"]["containers"][0]["env"].insert(0, {"name": "PET_NPROC_PER_NODE", "value": "9" * 5000})
    with pytest.raises(InputError) as err:
        render_pod(pods, "demo-worker-0", Options())
    assert "PET_NPROC_PER_NODE='99999999999999999...'" in str(err.value)


# An IPv6 zone id ("fe80::1%<anything>") is an address to Python's ipaddress module, and its text would reach
# hostfile, ssh_config and known_hosts from a published row. Kubernetes' own parser (ParseIPSloppy) has no
# zone ids: neither does the agent's.

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

ZONE_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=40)


@pytest.mark.slow
@settings(max_examples=2000, deadline=None)
@given(address=st.ip_addresses(), zone=st.one_of(st.none(), ZONE_TEXT), spelling=st.sampled_from(
    ["compressed", "exploded"]))
def test_whatever_ipaddress_accepts_the_validators_give_a_canonical_ip_or_refuse(address, zone, spelling):
    import ipaddress

    from agent.core.pods.validation import canonical_ip, parse_ip

    text = getattr(address, spelling) + ("" if zone is None else f"%{zone}")
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return  # not something ipaddress accepts: the grammar tests cover the rest
    parsed = parse_ip(text)
    if zone is not None:
        assert parsed is None, text  # a zone id is never an address of a pod
        return
    assert parsed is not None and len(parsed) in (4, 16)
    shown = canonical_ip(parsed)
    assert set(shown) <= set("0123456789abcdef:."), shown
    assert parse_ip(shown) == parsed


@pytest.mark.parametrize("hostile", ["fe80::1%h\n    ProxyCommand touch /tmp/pwned", "fe80::1%eth0",
                                     "127.1.0.2%x", "::ffff:127.1.0.2%0"])
def test_a_published_row_with_a_zone_id_is_refused_and_writes_nothing(hostile):
    from agent.core.publication.journal import PublishedState, Publisher
    from agent.core.publication.published import decode, pack

    pods = _job()
    options = Options(address="ip")
    publisher = Publisher(PublishedState(job="demo", namespace="default"), options,
                          leader=pods[0]["metadata"]["name"])
    publisher.change({p["metadata"]["name"]: p for p in pods}, [p["metadata"]["name"] for p in pods])
    document = publisher.snapshot_document()
    document["pods"][1][8] = hostile  # the row's IP, as a forger would write it
    state = PublishedState.from_document(decode(pack(document)))
    with pytest.raises(InputError, match=r"status\.podIP is .* not an IP address"):  # no file is written from it
        render_pod(list(state.pods.values()), "demo-worker-1", options)


def test_a_nul_in_the_pods_own_env_is_never_copied_into_torch_env(tmp_path):
    """MASTER_PORT="23456\\0..." is not copied into PET_MASTER_PORT: bash drops a NUL from a sourced file without
    a word, and no environment can hold one (the runtime cuts a C string there), so the alias follows the
    variable the process really has."""
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 2)),  # the user's own, before the plugins'
                                user_env=[{"name": "MASTER_PORT", "value": "23456\x00; junk"}])
    me = pods[1]
    rendered = render_pod(pods, me["metadata"]["name"], Options())
    written = rendered.files["torch.env"]
    assert b"\x00" not in written and b"junk" not in written
    assert b'export PET_MASTER_PORT="${MASTER_PORT}"' in written
    (tmp_path / "torch.env").write_bytes(written)
    shown = subprocess.run(["env", "-i", "MASTER_PORT=23456", "bash", "-c",
                            f". {tmp_path / 'torch.env'} && echo \"$PET_MASTER_PORT\""],
                           capture_output=True, text=True, check=True).stdout
    assert shown == "23456\n"


def _wrapped(pods_json: bytes) -> bytes:
    from agent.core.publication.published import SCHEMA

    head = b'{"schema":%d,"generation":1,"containers":[],"pods":' % SCHEMA
    return gzip.compress(head + pods_json + b"}", 9)


@pytest.mark.parametrize(("bomb", "says"), [  # each text made when its test runs, not at collection
    (lambda: b"[" + b"{}," * (64 * 1024 * 1024 // 3) + b"{}]", "more than 16777216 bytes uncompressed"),
    (lambda: b"[" + b"{}," * (5 * 1024 * 1024) + b"{}]", "holds more than 466033 values"),
    (lambda: b"[" + b"[]," * 300_000 + b"[]]", "holds more than 466033 values"),
], ids=["64 MiB of objects", "5 Mi objects", "300 k lists"])
def test_a_published_bomb_is_refused_before_it_is_parsed(bomb, says):
    """An 87 KB ConfigMap (64 MiB of `{}` unzipped) costs a follower little: the text is inflated a MiB at a
    time up to its cap, and its values are counted before json makes them (peak RSS per
    input: bench/bomb_bench.py)."""
    from agent.core.publication.published import decode

    with pytest.raises(InputError, match=re.escape(says)):
        decode(_wrapped(bomb()))


def test_a_truncated_or_trailing_gzip_stream_is_refused_in_one_line():
    from agent.core.publication.published import decode

    whole = _wrapped(b"[]")
    with pytest.raises(InputError, match="does not decode: EOFError"):
        decode(whole[: len(whole) // 2])
    with pytest.raises(InputError, match="does not decode"):
        decode(b"not gzip at all")


def test_the_snapshots_gzip_members_are_read_in_turn_and_capped_together():
    """The leader writes the snapshot as one gzip member per block of rows. The cap on the inflated
    text counts every member (a bomb cut into members is still refused), as does the number of members, and
    bytes after the last member that are no gzip member are refused, not skipped."""
    from agent.core.publication.published import MAX_MEMBERS, SCHEMA, decode

    text = b'{"schema":%d,"generation":1,"containers":[],"pods":[]}' % SCHEMA
    assert decode(b"".join(gzip.compress(text[i:i + 7]) for i in range(0, len(text), 7)))["generation"] == 1
    bomb = gzip.compress(b" " * (9 * 1024 * 1024), 9)
    with pytest.raises(InputError, match="more than 16777216 bytes uncompressed"):
        decode(gzip.compress(text[:-1]) + bomb + bomb + gzip.compress(b"}"))
    with pytest.raises(InputError, match=f"more than {MAX_MEMBERS} gzip members"):
        decode(gzip.compress(text) + gzip.compress(b" ") * MAX_MEMBERS)
    with pytest.raises(InputError, match="does not decode"):
        decode(gzip.compress(text) + b"trailing")


def test_a_journal_of_a_million_values_is_refused_before_it_is_parsed():
    from agent.core.publication.journal import read_journal

    data = {"changes.json": "[" + "{}," * 200_000 + "{}]", "base": "0", "seq": "0"}
    with pytest.raises(InputError, match="the journal holds more than 150000 values"):
        read_journal({"data": data})
