"""runtime/views.py: what a pod in its own view makes of a LIST without the summary."""

from __future__ import annotations

import asyncio

import pytest

from agent.runtime.views import journal_if_summary_gone, summary_gone

COLLECTION = "/api/v1/namespaces/default/configmaps"


class Api:
    """Answers the metadata LISTs by the full view's label from ``present``, and records them."""

    def __init__(self, present: set[str]) -> None:
        self.present, self.asked = present, []

    async def list_objects(self, collection, *, label_selector="", metadata_only=False):  # type: ignore[no-untyped-def]
        self.asked.append((label_selector, metadata_only))
        assert label_selector == "topology-agent.io/topology=demo-topology"
        return [{"metadata": {"name": name}} for name in sorted(self.present)], "9"


@pytest.mark.parametrize(("present", "gone"), [
    (set(), False),  # nothing published yet: wait
    ({"demo-topology"}, False),  # the snapshot alone: the journal (and the summary before it) on their way
    ({"demo-topology", "demo-topology-journal"}, True),  # the journal without the summary: deleted
    ({"demo-topology", "demo-topology-journal", "demo-topology-summary"}, False),  # published after the first LIST
])
def test_a_summary_published_after_the_first_list_is_not_taken_for_deleted(present, gone):
    api = Api(present)
    looked = asyncio.run(journal_if_summary_gone(api, COLLECTION, "demo-topology", []))
    assert (summary_gone(looked, "demo-topology") is not None) == gone
    assert len(api.asked) == 1 and api.asked[0][1]  # one LIST, names only: never the journal's changes


def test_a_listed_summary_asks_nothing_more():
    api = Api(set())
    assert asyncio.run(journal_if_summary_gone(api, COLLECTION, "demo-topology",
                                               [{"metadata": {"name": "demo-topology-summary"}}])) == []
    assert api.asked == []


def test_a_new_snapshot_leaves_one_object_per_unchanged_pod():
    """The journal follower's state and the view held two copies of every pod after a new snapshot (the view
    keeps the objects it held for the planner): the state takes the view's."""
    from types import SimpleNamespace

    from agent import examples
    from agent.core.model import Options
    from agent.core.publication.journal import PublishedState, Publisher
    from agent.core.publication.published import Compactor
    from agent.runtime.sidecar.following import JournalFollower
    from agent.runtime.views import PodView

    options = Options(address="ip")
    compactor = Compactor(options)
    raw = examples.volcano_job("demo", (("master", 1), ("worker", 7)))
    view = PodView("demo-worker-3", options, me=raw[4])
    sink = SimpleNamespace(changed=lambda: None)
    follower = JournalFollower(sink, None, view, namespace="default", configmap="demo-topology",  # type: ignore[arg-type]
                               check=None, settings=None, clock=lambda: 0.0)  # type: ignore[arg-type]

    def snapshot() -> PublishedState:
        publisher = Publisher(PublishedState(job="demo", namespace="default"), options, leader="demo-master-0")
        pods = {p["metadata"]["name"]: compactor.pod(p) for p in raw}
        publisher.change(pods, list(pods), journal=False)
        return PublishedState.from_document(publisher.snapshot_document())

    for _ in range(2):  # the first snapshot, then a new one that changes nothing
        follower.published.state = snapshot()
        follower._rows(None)
    state = follower.published.state
    assert all(state.pods[name] is view.pods[name] for name in state.pods if name != "demo-worker-3")
    # A follower publishes nothing: the names changed are not kept for a publisher (every pod's, for the pod's
    # life: a standby that takes over lists the pods, and its publisher compares every row)
    assert view.drain() == set()


def test_a_pod_view_renews_its_pods_for_the_publisher_and_the_planner_through_its_own_methods() -> None:
    """The publisher's log (``drain``) and the planner's (``take_unplanned``) are the view's: a failed publication
    renews every pod for the publisher alone, learned Node labels renew their pods for both, and a watcher
    added later hears of each change until it is taken off."""
    from agent.core.model import Options
    from agent.runtime.views import PodView

    pods = [{"metadata": {"name": f"w-{i}", "namespace": "default"}, "spec": {"nodeName": f"n-{i}"},
             "status": {"podIP": f"10.0.0.{i + 1}"}} for i in range(3)]
    heard: list[str] = []
    listed: list[int] = []

    class Told:
        def reset(self, held: object) -> None:
            listed.append(len(held))  # type: ignore[arg-type]

        def changed(self, name: str, pod: object) -> None:
            heard.append(name)

    view = PodView("w-0", Options(), me=pods[0], watchers=[Told()])
    view.replace(view.intake(pods[1:]))  # the own pod, not listed yet, is held from ``me``
    assert set(view.pods) == {"w-0", "w-1", "w-2"} and listed == [3]
    assert view.drain() == {"w-0", "w-1", "w-2"} and view.take_unplanned() is None

    view.renew_all()
    assert view.drain() == {"w-0", "w-1", "w-2"} and view.take_unplanned() == set()

    view.renew_placement({"w-1"})
    assert view.drain() == {"w-1"} and view.take_unplanned() is None

    late = Told()
    view.watch(late)
    view.remove("w-2")
    view.unwatch(late)
    view.remove("w-1")
    assert heard == ["w-2", "w-2", "w-1"]  # the first watcher hears both, the late one only while watching


def test_a_snapshot_read_again_keeps_the_pods_held_for_the_rows_that_say_nothing_new():
    """A follower that lists the publication again (its journal moved past the snapshot held: a burst the
    leader put in a new snapshot) held every pod of the job twice while the new snapshot was read. The rows
    that say nothing new now keep the held objects, and a row that changed is the new pod."""
    import base64

    from agent import examples
    from agent.core.model import Options
    from agent.core.publication.journal import PublishedState, Publisher
    from agent.core.publication.published import Compactor
    from agent.runtime.views import PublicationView

    options = Options(address="ip")
    compactor = Compactor(options)
    raw = examples.volcano_job("demo", (("master", 1), ("worker", 7)))
    publisher = Publisher(PublishedState(job="demo", namespace="default"), options, leader="demo-master-0")
    pods = {p["metadata"]["name"]: compactor.pod(p) for p in raw}

    def listed() -> list[dict]:
        packed = base64.b64encode(publisher.snapshot_packed()).decode()
        return [{"metadata": {"name": "demo-topology"}, "binaryData": {"topology.json.gz": packed}}]

    publisher.change(pods, list(pods), journal=False)
    view = PublicationView("demo-topology")
    view.replace(listed())
    before = view.held
    assert before is not None and len(before) == 8
    moved = raw[5]
    moved["status"]["podIP"] = moved["status"]["podIPs"][0]["ip"] = "10.9.9.9"
    pods[moved["metadata"]["name"]] = compactor.pod(moved)
    publisher.change(pods, [moved["metadata"]["name"]], journal=False)
    view.replace(listed())
    after = view.held
    assert after is not None and after is not before and set(after) == set(before)
    for name, pod in after.items():
        assert (pod is before[name]) == (name != moved["metadata"]["name"])
    assert after[moved["metadata"]["name"]]["status"]["podIP"] == "10.9.9.9"


def test_a_pods_next_version_holds_what_it_says_as_before_in_the_objects_of_the_version_held() -> None:
    """A pod that holds every member keeps, in its plan, the objects of the version each member was laid out
    from: a new version (the kubelet's writes) holds the same name, IP and labels in those objects, not in copies
    of its own; what changed is the new version's, and it reads as the pod the API sent."""
    import copy
    import json

    from agent import examples
    from agent.core.model import Options
    from agent.k8s.core import WatchEvent
    from agent.runtime.views import PodView

    pod = examples.volcano_job(tasks=(("master", 1), ("worker", 3)))[2]
    pod["metadata"]["resourceVersion"] = "10"
    pod["status"] = {"phase": "Pending", "podIP": "10.0.0.7"}
    view = PodView("demo-master-0", Options())
    view.replace(view.intake([pod]))
    name = pod["metadata"]["name"]
    first = view.pods[name]
    running = json.loads(json.dumps(pod))  # from fresh strings, as a watch event is parsed
    running["metadata"]["resourceVersion"] = "11"
    running["status"]["phase"] = "Running"
    view.apply(WatchEvent("MODIFIED", copy.deepcopy(running)))
    later = view.pods[name]
    assert later is not first and later["status"]["phase"] == "Running" and later["metadata"]["resourceVersion"] == "11"
    assert later == view.compactor.pod(running)  # the same pod to every reader
    for part in ("name", "ip", "labels", "hostname", "node", "created"):
        assert getattr(later, part) is getattr(first, part), part
    assert later.phase is not first.phase and later.version is not first.version


def test_a_journal_follower_lets_go_of_what_it_derived_before_it_reads_the_snapshot_again():
    """A snapshot read again (the journal moved past the one held) is planned from scratch: the sink hears of it
    before the snapshot is decoded, while the state held is the last one (so the sidecar lets go of its planner's
    layout and the members' texts first, not beside the new pods), and not at the first LIST nor in its own view."""
    from types import SimpleNamespace

    from agent import examples
    from agent.core.model import Options
    from agent.core.publication.journal import PublishedState, Publisher, journal_body
    from agent.core.publication.published import Compactor, configmap_body
    from agent.runtime.sidecar.following import JournalFollower, _Journal
    from agent.runtime.views import PodView

    options = Options()
    raw = examples.volcano_job("demo", (("master", 1), ("worker", 7)))
    compactor = Compactor(options)
    pods = {p["metadata"]["name"]: compactor.pod(p) for p in raw}
    publisher = Publisher(PublishedState(job="demo", namespace="default", snapshot_seq=-1), options,
                          leader="demo-master-0")
    publisher.change(pods, set(pods), journal=False)

    def listed() -> list[dict]:
        snapshot = configmap_body("demo-topology", publisher.snapshot_packed(), generation=publisher.state.seq,
                                  leader="demo-master-0", owner=None)
        publisher.snapshot_written(publisher.state.seq)
        return [snapshot, journal_body("demo-topology", publisher.journal_data(), owner=None)]

    seen: list[object] = []
    view = PodView("demo-worker-3", options, me=raw[4])
    follower = JournalFollower(SimpleNamespace(changed=lambda: None), None, view,  # type: ignore[arg-type]
                               namespace="default", configmap="demo-topology", check=None,
                               settings=None, clock=lambda: 0.0)  # type: ignore[arg-type]
    follower.sink.replacing = lambda: seen.append(follower.published.state)  # type: ignore[attr-defined]
    store = _Journal(follower)
    store.replace(listed())
    first = follower.published.state
    assert first is not None and seen == []  # the first LIST: nothing derived yet
    store.replace(listed())
    assert seen == [first] and follower.published.state is not first  # told while the last state was held
    follower.light = True
    store.replace(listed())
    assert len(seen) == 1  # in its own view the summary is read: no pod is held
