"""Every error message in the code is explained in docs/troubleshooting.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RAISE = re.compile(r"(InputError|GangTimeout|OutputError|ApiError|ApiForbidden|ApiNotFound|ApiGone|ApiUnavailable"
                   r"|LaunchError|GroupError)"
                   r"\(\s*(f?\"(?:[^\"\\]|\\.)*\"(?:\s*f?\"(?:[^\"\\]|\\.)*\")*)", re.S)


def messages():
    for path in sorted((ROOT / "agent").rglob("*.py")):
        for match in RAISE.finditer(path.read_text()):
            text = "".join(re.findall(r'f?"((?:[^"\\]|\\.)*)"', match.group(2)))
            fixed = [chunk.strip(" ;,:()'") for chunk in re.split(r"\{[^}]*\}", text)]
            yield path.name, text, [c for c in fixed if len(c) >= 8]


def test_every_error_message_is_in_the_troubleshooting_page():
    doc = (ROOT / "docs" / "troubleshooting.md").read_text().replace("\n  ", " ")
    found = list(messages())
    assert len(found) > 50  # the extraction itself works
    missing = [(name, text) for name, text, chunks in found if not all(chunk in doc for chunk in chunks)]
    assert not missing, "\n".join(f"{name}: {text}" for name, text in missing)


def test_every_event_reason_the_agent_records_is_explained():
    from agent.core.report.events import REASONS

    doc = (ROOT / "docs" / "troubleshooting.md").read_text()
    section = doc[doc.index("## The pod's Events"):doc.index("## `topology-agent status JOB`")]
    rows = {line.split("|")[1].strip().strip("`"): line for line in section.splitlines()
            if line.startswith("| `")}
    assert set(rows) == set(REASONS)
    for reason, kind in REASONS.items():
        assert f"| {kind.type} |" in rows[reason], reason
    source = (ROOT / "agent" / "runtime" / "events.py").read_text()
    said = re.findall(r'log\.(?:warning|info)\(\s*"((?:[^"\\]|\\.)*)"', source)
    assert len(said) >= 5
    for line in said:  # each log line's fixed words, before the first value
        assert line.split("%")[0].split("'")[0].strip() in section, line
