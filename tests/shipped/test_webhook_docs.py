"""The webhook's documented bounds are the code's: docs/adopt.md's table of what a caller can make it do, the
Deployment's memory it states, docs/security.md's row for whoever can reach port 8443, and the benchmark section
both link to."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import yaml

from agent.core.adoption.admission import MAX_VALUES
from agent.core.adoption.injection import MAX_VALUE
from agent.runtime.webhook import serving, webhook
from agent.runtime.webhook.reviewing import SMALL

ROOT = Path(__file__).resolve().parents[2]


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    following = re.search(r"^#{1,3} ", text[start + len(heading):], re.MULTILINE)
    return text[start:start + len(heading) + following.start()] if following else text[start:]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def caller_table() -> dict[str, str]:
    text = (ROOT / "docs" / "adopt.md").read_text()
    rows = re.findall(r"^\| ([A-Za-z ]+) \| (.+) \|$", section(text, "### What a caller can make it do"), re.MULTILINE)
    return dict(rows)


def test_the_table_of_what_a_caller_can_make_the_webhook_do_states_the_codes_bounds():
    rows, limits = caller_table(), serving.Limits()
    remembered = inspect.signature(webhook._remembering).parameters["size"].default
    wanted = {
        "connections": [f"{limits.connections} open at once"],
        "TLS": [f"{serving._TLS.max_size // 1024} KiB of read buffer", f"handshake within {limits.handshake:g} s"],
        "request head": [f"within {limits.head:g} s", f"at most {limits.head_bytes} bytes, {limits.headers} fields"],
        "body": [f"at most {webhook.MAX_BODY >> 20} MiB", f"stay under {webhook.BODIES >> 20} MiB"],
        "parsing": [f"at most {MAX_VALUES} JSON values", f"a body over {SMALL // 1024} KiB"],
        "time": [f"less {webhook.MARGIN:g} s"],
        "namespaces": [f"{webhook.WebhookSettings().namespaces} are kept"],
        "settings": [f"at most {remembered}"],
    }
    assert set(wanted) <= set(rows), sorted(rows)
    for what, phrases in wanted.items():
        for phrase in phrases:
            assert phrase in rows[what], (what, phrase, rows[what])
    words = " ".join((ROOT / "docs" / "adopt.md").read_text().split())
    assert f"Every setting's value is at most {MAX_VALUE} characters" in words


def test_the_memory_adopt_md_states_is_the_deployments_and_its_figures_come_from_the_benchmark_section():
    text = (ROOT / "docs" / "adopt.md").read_text()
    deployment = yaml.safe_load((ROOT / "manifests" / "webhook" / "deployment.yaml").read_text())
    memory = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]
    resources = section(text, "### What a caller can make it do")
    assert (f"{memory['requests']['memory']} requested and a {memory['limits']['memory']} limit per replica"
            in resources.replace("\n", " "))
    heading = "### Admission webhook under hostile callers"
    assert f"(benchmarks.md#{anchor(heading[4:])})" in resources
    benchmarks = (ROOT / "docs" / "benchmarks.md").read_text()
    assert heading in benchmarks and "python bench/webhook_attack_bench.py" in section(benchmarks, heading)


def test_security_md_has_the_row_for_whoever_can_reach_the_webhooks_port():
    """The threat model has a row for a pod that can reach 8443, the webhook's most exposed side: a caller that
    is not the API server."""
    text = (ROOT / "docs" / "security.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| any pod that can reach the webhook's port "
                                                                        "8443"))
    heading = "### What a caller can make it do, and its resources"
    assert f"(adopt.md#{anchor(heading[4:])})" in row
    assert heading in (ROOT / "docs" / "adopt.md").read_text()
    assert "GET /api/v1/namespaces/<label>" in row
