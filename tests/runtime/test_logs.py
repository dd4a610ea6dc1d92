"""The agent's log lines (runtime/logs.py) as ``kubectl logs`` shows them: a value read from an object cannot start
a line of its own nor drive the reader's terminal, in the text and the JSON format, and an init that meets a
Lease held by a name that is no pod's says so in one escaped line."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from agent import cli, examples
from agent.core.publication.lease import lease_body
from agent.errors import InputError
from agent.runtime.logs import setup_logging
from agent.runtime.publication.publishing import now_wall
from tests.fakeapi import init_pod
from tests.jobs import create_volcano_job

LEASES = "coordination.k8s.io/v1/leases"
FORGED = "x\n12:00:00 INFO init complete: wrote torch.env\r\x1b]8;;https://evil.example/\x07link\x1b]8;;\x07\x07"
LINE = re.compile(r"\d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def formatter(fmt: str) -> logging.Formatter:
    """The formatter the command's ``--log-format`` installs (the logger's handlers are restored after)."""
    logger = logging.getLogger("topology_agent")
    handlers, level, propagate = logger.handlers[:], logger.level, logger.propagate
    try:
        setup_logging(fmt)
        found = logger.handlers[0].formatter
    finally:
        logger.handlers[:], logger.propagate = handlers, propagate
        logger.setLevel(level)
    assert found is not None
    return found


@pytest.fixture
def written() -> Iterator[io.StringIO]:
    """What the agent's logger writes with the text format, as ``kubectl logs`` shows it."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter("text"))
    logger = logging.getLogger("topology_agent")
    logger.addHandler(handler)
    try:
        yield out
    finally:
        logger.removeHandler(handler)


def record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("topology_agent.init", logging.INFO, __file__, 1, msg, args, None)


def test_a_value_from_an_object_cannot_start_a_line_or_reach_the_terminal_in_either_format():
    text = formatter("text").format(record("lease %s is held by pod %s: it publishes the topology", "demo-topology",
                                           FORGED))
    assert "\n" not in text and "\r" not in text and "\x1b" not in text and "\x07" not in text
    assert text.endswith("is held by pod x\\n12:00:00 INFO init complete: wrote torch.env\\r\\x1b]8;;https://"
                         "evil.example/\\x07link\\x1b]8;;\\x07\\x07: it publishes the topology")
    entry = json.loads(formatter("json").format(record("held by %s", FORGED)))
    assert entry["msg"].isprintable() and entry["msg"].startswith("held by x\\n12:00:00 INFO")


def test_init_meeting_a_lease_held_by_no_pod_name_logs_it_escaped_and_invalid(memory, api, logs, tmp_path, written):
    pods = create_volcano_job(memory, (("master", 1), ("worker", 1)))
    owner = {k: pods[0]["metadata"]["ownerReferences"][0][k] for k in ("apiVersion", "kind", "name", "uid")}
    memory.create(LEASES, "default", lease_body("demo-topology", FORGED, now_wall=now_wall(), previous=None,
                                                owner=owner))
    ran = init_pod(api, logs, "demo-master-0", tmp_path / "m", "--source", "published", "--address", "ip",
                   "--timeout", "5")
    lines = written.getvalue().splitlines()
    assert lines and all(LINE.match(line) for line in lines), lines
    assert all(line.isprintable() for line in lines)
    taken = [line for line in lines if "lease demo-topology held by pod" in line]
    assert len(taken) == 1, ran.err
    assert "held by pod <invalid: x\\n12:00:00 INFO init complete: wrote torch.env\\r\\x1b]8;;https://evil." in \
        taken[0]


@pytest.mark.parametrize(("raised", "said"), [
    (InputError("pod 'x': \x1b[2Jcleared\x07\nINFO init complete"),
     "topology-agent explain: error: pod 'x': \\x1b[2Jcleared\\x07\\nINFO init complete\n"),
    (RuntimeError("broken \x1b]0;title\x07\nsecond line"),
     "topology-agent explain: internal error: RuntimeError: broken \\x1b]0;title\\x07 (a bug in the agent; run again "
     "with TOPOLOGY_DEBUG=1 for the traceback and report it)\n"),
], ids=["input-error", "bug"])
def test_the_commands_error_line_is_one_escaped_line(monkeypatch, capsys, tmp_path, raised, said):
    def fail(_settings):
        raise raised

    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps({"items": examples.volcano_job("demo", (("master", 1),))}))
    monkeypatch.delenv("TOPOLOGY_DEBUG", raising=False)
    monkeypatch.setitem(cli.COMMANDS, "explain", fail)
    assert cli.run(["explain", "--pods", str(pods), "--self", "demo-master-0"]).code != 0
    assert capsys.readouterr().err == said


def test_every_module_logs_under_the_handler_setup_logging_installs():
    """setup_logging gives the ``topology_agent`` logger its handler and formatter (with the escaping of
    core/escaping.py); a module logging under any other name would print unescaped through Python's last-resort
    handler, and its INFO lines not at all."""
    import importlib
    import logging
    import pkgutil

    import agent

    names = {}
    for module in pkgutil.walk_packages(agent.__path__, "agent."):
        if module.name.startswith(("agent.trainer", "agent.__main__")):
            continue  # runs in the trainer's Python, with its own logging
        loaded = importlib.import_module(module.name)
        for value in vars(loaded).values():
            if isinstance(value, logging.Logger):
                names[module.name] = value.name
    assert names, "no module logger found"
    assert {m: n for m, n in names.items() if n != "topology_agent" and not n.startswith("topology_agent.")} == {}
