"""What someone else wrote, as a user sees it: a published topology whose writer uid carries a BEL, a line feed
and a forged Event row is refused by real init processes, and real ``kubectl describe pod`` shows their Event's
note on one line with the characters escaped (kubectl itself escapes only ESC and CR); their log lines likewise.
The escaping itself: tests/core/test_escaping.py."""

from __future__ import annotations

from agent import examples
from tests.integration.conftest import finish, start_init
from tests.integration.test_events import describe_events
from tests.jobs import create_volcano_job, forge_publication

FORGED_UID = "uid\x07\nWarning  GangComplete  1s  topology-agent.io/agent  forged: all is well\x1b]0;owned\x07"


def test_kubectl_describe_and_the_log_show_a_forged_writer_uid_escaped_on_one_line(sandbox, kubectl, tmp_path):
    pods = create_volcano_job(sandbox, (("master", 1), ("worker", 1)))
    sandbox.create_pod(examples.volcano_job("other", (("master", 1),))[0])  # a pod of another job: its uid is not
    forge_publication(sandbox, pods, writer="other-master-0", writer_uid=FORGED_UID)  # the one the copy names
    names = [p["metadata"]["name"] for p in pods]
    procs = {n: start_init(sandbox, n, tmp_path / n, "--source", "published", "--address", "ip", "--timeout", "30")
             for n in names}
    ran = {n: finish(proc) for n, proc in procs.items()}
    assert all(code == 0 for code, _ in ran.values()), ran
    refused = [n for n, (_, err) in ran.items() if "the published topology is not used" in err]
    assert refused, ran  # the pod that did not lead read the forged copy and refused it
    for name in refused:
        err = ran[name][1]
        assert "\x07" not in err and "\x1b" not in err and "\nWarning  GangComplete" not in err
        assert "its writer's uid uid\\x07\\nWarning  GangComplete  1s" in err
        events = describe_events(kubectl, name)
        print(events)  # the report quotes it
        assert "PublicationRefused" in events and "its writer's uid uid\\x07\\nWarning  GangComplete  1s" in events
        assert "\x07" not in events and "\x1b" not in events
        assert not any(line.lstrip().startswith("Warning  GangComplete") for line in events.splitlines())
