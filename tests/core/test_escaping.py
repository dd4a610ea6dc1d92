"""Values read from objects, as the agent prints and logs them (core/escaping.py): whatever characters someone put
in a Lease's holder, a journal's leader or a writer's uid, what reaches a terminal, a log line or an Event's note
is one line of inert characters, and a name that is no pod name says so."""

from __future__ import annotations

import pytest

from agent.core.escaping import pod_name_shown, printable
from agent.core.report.events import CONTROLLER, Correlator, Occurrence, Ref
from agent.core.report.status import JobStatus, Publication, table

OSC8 = "\x1b]8;;https://evil.example/\x07demo-worker-0\x1b]8;;\x07"  # a link that shows a pod's name
CLEAR = "\x1b[2J\x1b[H"  # clear the screen, cursor home
FAKE_ROW = "x\r\ndemo-rogue-0   master   0      0"  # a row of its own
NOW = 1_800_000_000.0


@pytest.mark.parametrize(("given", "shown"), [
    ("demo-worker-0", "demo-worker-0"),
    ("plain text, with spaces and a \\ backslash", "plain text, with spaces and a \\ backslash"),
    ("naïve 名前", "naïve 名前"),  # letters of any script are kept
    ("a\u00a0b", "a\u00a0b"),  # a no-break space is a space
    (OSC8, "\\x1b]8;;https://evil.example/\\x07demo-worker-0\\x1b]8;;\\x07"),
    (CLEAR, "\\x1b[2J\\x1b[H"),
    (FAKE_ROW, "x\\r\\ndemo-rogue-0   master   0      0"),
    ("tab\there", "tab\\there"),
    ("\x00\x7f", "\\x00\\x7f"),
    ("\x9b31m", "\\x9b31m"),  # a C1 CSI: an 8-bit escape
    ("\u202eevil", "\\u202eevil"),  # a bidi override
    ("a\u2028b\u2029c", "a\\u2028b\\u2029c"),  # line and paragraph separators
    ("\ud800", "\\ud800"),  # a lone surrogate (a JSON \\ud800 decodes to one; no UTF-8 stream can carry it)
    ("\U000e0041", "\\U000e0041"),  # a tag character
], ids=["name", "plain", "letters", "nbsp", "osc8-link", "clear-screen", "cr-lf-row", "tab", "nul-del", "c1-csi",
        "bidi", "separators", "surrogate", "tag"])
def test_every_character_a_terminal_acts_on_is_shown_escaped_and_the_rest_kept(given, shown):
    assert printable(given) == shown
    assert printable(shown) == shown  # escaping twice changes nothing
    assert shown.isprintable() or "\u00a0" in shown


@pytest.mark.parametrize(("given", "shown"), [
    ("demo-worker-0", "demo-worker-0"),
    ("a.b-c", "a.b-c"),
    ("Demo", "<invalid: Demo>"),
    ("demo\nINFO x", "<invalid: demo\\nINFO x>"),
    ("\x1b[2J" + "a" * 300, "<invalid: \\x1b[2J" + "a" * 76 + "...>"),
], ids=["pod-name", "subdomain", "upper-case", "line-feed", "long"])
def test_a_name_that_is_no_pod_name_shows_as_invalid_and_cut(given, shown):
    assert pod_name_shown(given) == shown


def hostile_publication(**given: object) -> Publication:
    fields = {"configmap": "demo-topology", "sequence": 3, "publisher": OSC8, "standbys": (CLEAR, FAKE_ROW),
              "holder": "demo-worker-1\x07\x1b]0;owned\x07", "renewed": NOW - 4, **given}
    return Publication(**fields)  # type: ignore[arg-type]


def test_status_prints_a_hostile_holder_publisher_and_standbys_escaped_and_invalid_and_pod_names_as_they_are():
    status = JobStatus("demo", "Volcano Job 'demo'", "default", (), (), 2, 0, None, hostile_publication(),
                       problem="pod 'x': label \x1b[31mred\x1b[0m")
    text = table(status, now=NOW)
    assert all(line.isprintable() for line in text.splitlines())
    assert "\r" not in text and "\x1b" not in text and "\x07" not in text
    lines = text.splitlines()
    assert lines[1] == "no plan: pod 'x': label \\x1b[31mred\\x1b[0m"
    assert lines[-3:] == [
        "PUBLISHED   configmap demo-topology, sequence 3",
        "PUBLISHER   <invalid: \\x1b]8;;https://evil.example/\\x07demo-worker-0\\x1b]8;;\\x07> (Lease held by "
        "<invalid: demo-worker-1\\x07\\x1b]0;owned\\x07>, renewed 4s ago)",
        "STANDBYS    <invalid: \\x1b[2J\\x1b[H>, <invalid: x\\r\\ndemo-rogue-0   master   0      0>"]
    publication = hostile_publication(publisher="demo-worker-0", standbys=("demo-worker-1",), holder="demo-worker-0")
    text = table(JobStatus("demo", "Volcano Job 'demo'", "default", (), (), 2, 0, None, publication), now=NOW)
    assert "PUBLISHER   demo-worker-0 (Lease held by demo-worker-0, renewed 4s ago)" in text
    assert "STANDBYS    demo-worker-1" in text


def test_an_events_note_is_escaped_before_it_is_cut_so_kubectl_describe_prints_one_line():
    occurrence = Occurrence("PublicationRefused", f"lease demo-topology is held by '{FAKE_ROW}\x07'")
    assert occurrence.note == "lease demo-topology is held by 'x\\r\\ndemo-rogue-0   master   0      0\\x07'"
    long = Occurrence("PublicationRefused", "\n" * 2000)
    assert len(long.note) == 1024 and "\n" not in long.note
    correlator = Correlator(Ref("demo-worker-0", "default", "uid-0"), "demo-worker-0", NOW)
    write = correlator.observe(occurrence, NOW)
    assert write is not None and write.body["note"] == occurrence.note
    assert write.body["reportingController"] == CONTROLLER
