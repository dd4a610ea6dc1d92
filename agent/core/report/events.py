"""What a pod tells its users through its Events (events.k8s.io/v1), and how often: the reasons, the Event
objects, and the correlator that turns occurrences into API writes within a budget. Pure: the caller gives the
time; runtime/events.py sends the writes.

Aggregation follows client-go's events library (tools/events/event_broadcaster.go) and its older correlator
(tools/record/events_cache.go). An occurrence isomorphic to one already recorded (same regarding object, reason,
action, type, reporting controller and instance, related object and note: the older correlator's key, which
keeps the note, since events.k8s.io/v1 makes the note immutable) becomes a ``series``: its count and
lastObservedTime are PATCHed, never a new object; the first repeat at once (as client-go), later counts at most
once per ``series_every``. A new Event is created only when a token of the pod's bucket is left (client-go's
spam filter: a token bucket per source and object); an occurrence that finds none waits, and a newer one of the
same reason (and related object) replaces it, so when a token comes the latest state is written, not a backlog.
The occurrences waiting are bounded whatever arrives (``Budget.hold`` per reason, the newest kept; the rest
counted in the note of the next Event of their reason), and one about a pod gone is let go (``gone``). The final
occurrence of a process (init's outcome) is always written: it is once per process.

The budget per pod, per process (init, then the sidecar): at most ``burst`` + 1 Events created in its first
``refill`` seconds, then one per ``refill`` seconds; one series write per ``series_every`` seconds per series
(docs/benchmarks.md, Events).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agent.core.escaping import printable
from agent.core.model import Takeover
from agent.core.plan.gang import GangStatus
from agent.core.plan.layout import Plan
from agent.core.pods.validation import is_label_value

CONTROLLER = "topology-agent.io/agent"  # reportingController: a qualified name, as the API server requires
NOTE_LIMIT = 1024  # characters of a note (kube-apiserver's NoteLengthLimit)
GENERATION_LABEL = "topology-agent.io/generation"  # on the Events that say which generation a pod wrote
GENERATION_REASONS = frozenset({"GangComplete", "NewGeneration"})  # the reasons of those Events
JOB_LABEL = "topology-agent.io/job"  # on every Event the agent records: the job whose pod it is


@dataclass(frozen=True)
class Reason:
    """One reason the agent records, as Kubernetes components write theirs (CamelCase reason and action)."""

    action: str
    type: str  # Normal | Warning
    by: str  # "init", "sidecar" or "init, sidecar": who records it
    final: bool = False  # a process's outcome, recorded once: never held back by the bucket


REASONS: dict[str, Reason] = {
    "WaitingForGang": Reason("WaitForGang", "Normal", "init"),
    "WaitingForPublication": Reason("ReadPublication", "Normal", "init"),
    "WaitingForRestart": Reason("WaitForRestart", "Normal", "init"),
    "GangComplete": Reason("WaitForGang", "Normal", "init", final=True),
    "GangTimeout": Reason("WaitForGang", "Warning", "init", final=True),
    "InitFailed": Reason("Configure", "Warning", "init", final=True),
    "PublicationRefused": Reason("ReadPublication", "Warning", "init, sidecar"),
    "NewGeneration": Reason("Rewrite", "Normal", "sidecar"),
    "PodRefused": Reason("Admit", "Warning", "sidecar"),
}


@dataclass(frozen=True)
class Ref:
    """An ObjectReference: the pod an Event is about (``regarding``), or another pod it names (``related``)."""

    name: str
    namespace: str
    uid: str = ""
    kind: str = "Pod"
    api_version: str = "v1"

    def body(self) -> dict[str, str]:
        out = {"apiVersion": self.api_version, "kind": self.kind, "namespace": self.namespace, "name": self.name}
        if self.uid:
            out["uid"] = self.uid
        return out


@dataclass(frozen=True)
class Occurrence:
    """Something to tell: a reason of ``REASONS`` and a note (escaped, core/escaping.py: its values come from
    objects; then cut to the API's limit); ``generation`` labels the
    Events that say which generation of files a pod wrote (``topology-agent status`` reads it)."""

    reason: str
    note: str
    related: Ref | None = None
    generation: int | None = None

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"unknown event reason {self.reason!r}")
        if self.generation is not None and self.reason not in GENERATION_REASONS:
            raise ValueError(f"event reason {self.reason!r} says no generation")
        object.__setattr__(self, "note", printable(self.note))  # ``kubectl describe`` prints a note as it is
        if len(self.note) > NOTE_LIMIT:
            object.__setattr__(self, "note", self.note[:NOTE_LIMIT - 3] + "...")

    @property
    def kind(self) -> Reason:
        return REASONS[self.reason]


@dataclass(frozen=True)
class Budget:
    burst: int = 3  # Events a process may create at once about its pod (besides its outcome)
    refill: float = 300.0  # seconds per further Event (client-go's spam filter: one per 5 minutes)
    series_every: float = 300.0  # seconds between two writes of one series' count, after the first repeat
    keep: int = 64  # series remembered per process (client-go keeps an LRU cache of them)
    hold: int = 10  # occurrences of one reason waiting for a token, the newest (``Correlator``)


BUDGET = Budget()


class Bucket:
    """A token bucket: ``burst`` tokens, one more every ``refill`` seconds."""

    def __init__(self, burst: int, refill: float, now: float) -> None:
        self.burst, self.refill = burst, refill
        self.tokens, self.at = float(burst), now

    def _fill(self, now: float) -> None:
        if now > self.at:
            self.tokens = min(float(self.burst), self.tokens + (now - self.at) / self.refill)
        self.at = max(self.at, now)

    def take(self, now: float) -> bool:
        self._fill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def next_at(self, now: float) -> float:
        """When the next token is there."""
        self._fill(now)
        return now if self.tokens >= 1.0 else now + (1.0 - self.tokens) * self.refill


Key = tuple[str, str, str, str, Ref | None]  # reason, action, type, note, related (regarding and source fixed)
Slot = tuple[str, Ref | None]  # a waiting occurrence's place: its reason and related object


@dataclass
class Series:
    name: str
    occurrence: Occurrence
    first: float
    count: int = 1
    observed: float = 0.0  # the last observation
    written_count: int = 1
    written_at: float = 0.0


@dataclass(frozen=True)
class Write:
    """One API write: ``create`` an Event (``body``), or ``patch`` a series' count (``body``), with the whole
    Event to create instead (``fallback``) if the recorded one is gone (expired: the API server keeps Events an
    hour by default)."""

    verb: str  # create | patch
    name: str
    body: dict[str, Any]
    fallback: dict[str, Any] | None = None
    reason: str = ""


def job_label(job: str) -> str | None:
    """The ``JOB_LABEL`` value of a job's Events: its object's name (a LeaderWorkerSet's pods name their group
    too: ``name/group``), if it makes a label value."""
    name = job.split("/")[0]
    return name if is_label_value(name) else None


def micro_time(now: float) -> str:
    """A MicroTime, as the API server reads one: RFC 3339 with microseconds, in UTC."""
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Correlator:
    """One process's Events about its pod: occurrences in, writes out (``observe``, ``due``).

    What waits for a token is bounded by reasons, not by what arrives: the pods a sidecar refuses each wait
    apart (their related object differs), and a namespace can hold any number of them. client-go's correlator is
    the model: every cache it keeps is an LRU of fixed size (4096 keys), and once it has seen more than 10
    Events of one object and reason that differ only in their message within 10 minutes, it writes one Event
    that says they were combined instead of each (tools/record/events_cache.go, ``defaultAggregateMaxEvents``).
    So ``Budget.hold`` (10, that number) occurrences of a reason wait, the newest: the bucket writes one Event
    per ``refill`` seconds, so ten already take most of the hour the API server keeps an Event, and the newest
    say the state now. An older one let go is counted, and the next Event of its reason created says how many
    were not recorded. Eight reasons of at most ``hold`` occurrences, each note at most ``NOTE_LIMIT``
    characters, is the most that waits; an occurrence about a pod that is gone (``gone``) is let go unwritten
    and uncounted in any note (nothing is left to tell of it)."""

    regarding: Ref
    instance: str  # reportingInstance: the pod's name
    now: float  # when the process started: the bucket starts full
    job: str = ""
    budget: Budget = BUDGET
    series: collections.OrderedDict[Key, Series] = field(default_factory=collections.OrderedDict)
    waiting: dict[Slot, Occurrence] = field(default_factory=dict)  # held back (no token), least recent first
    bucket: Bucket | None = None
    last_nanos: int = 0
    held: collections.Counter[str] = field(default_factory=collections.Counter)  # waiting, per reason
    about: collections.Counter[str] = field(default_factory=collections.Counter)  # waiting, per related pod name
    untold: collections.Counter[str] = field(default_factory=collections.Counter)  # let go for ``hold``, per
    # reason, not yet said in a note
    given_up: int = 0  # occurrences let go unwritten: beyond ``hold``, or about a pod gone

    def __post_init__(self) -> None:
        self.bucket = Bucket(self.budget.burst, self.budget.refill, self.now)

    @staticmethod
    def key(occurrence: Occurrence) -> Key:
        kind = occurrence.kind
        return occurrence.reason, kind.action, kind.type, occurrence.note, occurrence.related

    def observe(self, occurrence: Occurrence, now: float) -> Write | None:
        """The write ``occurrence`` makes now, if any: a series' count, or a new Event if the bucket allows
        (else it waits for ``due``, replacing an older one of its reason and related object, and letting go the
        oldest of its reason beyond ``Budget.hold``)."""
        recorded = self.series.get(self.key(occurrence))
        if recorded is not None:
            self.series.move_to_end(self.key(occurrence))
            recorded.count += 1
            recorded.observed = now
            if recorded.written_count == 1:  # the first repeat makes it a series at once, as client-go
                return self._patch(recorded, now)
            return None  # counted; written by ``due``
        slot = (occurrence.reason, occurrence.related)
        assert self.bucket is not None
        if occurrence.kind.final or (slot not in self.waiting and self.bucket.take(now)):
            self._release(slot)
            return self._create(occurrence, now)
        self._release(slot)
        self._wait(slot, occurrence)
        if self.held[occurrence.reason] > self.budget.hold:
            oldest = next(s for s in self.waiting if s[0] == occurrence.reason)
            self._release(oldest)
            self.untold[occurrence.reason] += 1
            self.given_up += 1
        return None

    def gone(self, name: str) -> int:
        """The pod ``name`` (of the pod's namespace) is gone: the occurrences waiting about it are let go.
        How many."""
        if name not in self.about:
            return 0
        slots = [s for s in self.waiting if s[1] is not None and s[1].name == name]
        for slot in slots:
            self._release(slot)
        self.given_up += len(slots)
        return len(slots)

    def due(self, now: float) -> list[Write]:
        """The writes whose time has come: held-back Events a token now allows (least recently observed
        first), series whose count changed ``series_every`` after their last write."""
        writes: list[Write] = []
        assert self.bucket is not None
        for slot in list(self.waiting):
            if not self.bucket.take(now):
                break
            occurrence = self._release(slot)
            assert occurrence is not None
            writes.append(self._create(occurrence, now))
        for recorded in self.series.values():
            if recorded.count > recorded.written_count and now - recorded.written_at >= self.budget.series_every:
                writes.append(self._patch(recorded, now))
        return writes

    def next_due(self, now: float) -> float | None:
        """When ``due`` next has something to write (None: nothing pending)."""
        times = []
        if self.waiting:
            assert self.bucket is not None
            times.append(self.bucket.next_at(now))
        times += [s.written_at + self.budget.series_every for s in self.series.values()
                  if s.count > s.written_count]
        return min(times) if times else None

    def _wait(self, slot: Slot, occurrence: Occurrence) -> None:
        self.waiting[slot] = occurrence
        self.held[slot[0]] += 1
        if slot[1] is not None:
            self.about[slot[1].name] += 1

    def _release(self, slot: Slot) -> Occurrence | None:
        """``slot``'s waiting occurrence (if any), no longer waiting."""
        occurrence = self.waiting.pop(slot, None)
        if occurrence is None:
            return None
        for counter, key in ((self.held, slot[0]), (self.about, slot[1].name if slot[1] is not None else None)):
            if key is not None:
                counter[key] -= 1
                if counter[key] <= 0:
                    del counter[key]
        return occurrence

    def forget(self, write: Write) -> None:
        """A write that failed: its series is forgotten, so the next occurrence creates the Event again."""
        for key, recorded in list(self.series.items()):
            if recorded.name == write.name:
                del self.series[key]

    # --- the bodies ----------------------------------------------------------------------------------------

    def _name(self, now: float) -> str:
        """``<pod>.<nanoseconds in hex>``, as client-go names Events; never the same twice in one process."""
        self.last_nanos = max(int(now * 1e9), self.last_nanos + 1)
        return f"{self.regarding.name}.{self.last_nanos:x}"

    def _create(self, occurrence: Occurrence, now: float) -> Write:
        """A new Event; the first of a reason after some were let go for ``Budget.hold`` says how many (its
        series is still the occurrence's: a repeat of it counts there)."""
        name = self._name(now)
        key = self.key(occurrence)
        untold = self.untold.pop(occurrence.reason, 0)
        if untold:
            occurrence = dataclasses.replace(occurrence, note=f"({untold} more {occurrence.reason} not recorded: "
                                                              f"too many at once) {occurrence.note}")
        recorded = Series(name, occurrence, first=now, observed=now, written_at=now)
        self.series[key] = recorded
        while len(self.series) > self.budget.keep:
            self.series.popitem(last=False)
        return Write("create", name, self.body(recorded), reason=occurrence.reason)

    def _patch(self, recorded: Series, now: float) -> Write:
        recorded.written_count, recorded.written_at = recorded.count, now
        series = {"count": recorded.count, "lastObservedTime": micro_time(recorded.observed)}
        return Write("patch", recorded.name, {"series": series}, fallback=self.body(recorded),
                     reason=recorded.occurrence.reason)

    def body(self, recorded: Series) -> dict[str, Any]:
        """The whole events.k8s.io/v1 Event of a series (with its count once it repeats)."""
        occurrence, kind = recorded.occurrence, recorded.occurrence.kind
        label = job_label(self.job)
        labels = {JOB_LABEL: label} if label else {}
        if occurrence.generation is not None:
            labels[GENERATION_LABEL] = str(occurrence.generation)
        body: dict[str, Any] = {
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": recorded.name, "namespace": self.regarding.namespace,
                         **({"labels": labels} if labels else {})},
            "eventTime": micro_time(recorded.first), "reportingController": CONTROLLER,
            "reportingInstance": self.instance[:128], "action": kind.action, "reason": occurrence.reason,
            "type": kind.type, "note": occurrence.note, "regarding": self.regarding.body()}
        if occurrence.related is not None:
            body["related"] = occurrence.related.body()
        if recorded.count > 1:
            body["series"] = {"count": recorded.count, "lastObservedTime": micro_time(recorded.observed)}
        return body


# --- the notes ------------------------------------------------------------------------------------------------

SHOW = 5  # pods a note names per kind of absence before it says how many more


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:SHOW])
    return shown + (f" and {len(names) - SHOW} more" if len(names) > SHOW else "")


def waiting_note(status: GangStatus, *, source: str, unscheduled: Sequence[str], no_ip: Sequence[str],
                 refused: Mapping[str, str]) -> str:
    """Why init waits, from the gang tracker's own answers: how many of how many, then each kind of absence
    with the first pods of it: not created (the roles' indices the tracker misses), not scheduled, scheduled but
    without an IP yet, and refused (the roster's line for each)."""
    parts = [f"waiting for the gang: {status.present} of {status.expected} training pods present ({source})"]
    if status.missing:
        parts.append(f"not created: {'; '.join(status.missing)}")
    if unscheduled:
        parts.append(f"not scheduled: {_names(unscheduled)}")
    if no_ip:
        parts.append(f"no IP yet: {_names(no_ip)}")
    if refused:
        lines = [why if len(why) <= 240 else why[:237] + "..." for _, why in sorted(refused.items())[:3]]
        more = f" (and {len(refused) - 3} more)" if len(refused) > 3 else ""
        parts.append(f"refused: {'; '.join(lines)}{more}")
    return "; ".join(parts)


def outcome_note(plan: Plan, *, how: str, generation: int = 1) -> str:
    """What init writes, for its last Event: ``how`` it got there, then this pod's place."""
    topology = plan.topology
    me = topology.me
    if me.node_rank is None:
        place = f"role {me.role} (not a training pod)"
    else:
        first = me.first_rank if me.first_rank is not None else 0
        ranks = f"rank {first}" if me.slots == 1 else f"ranks {first}-{first + me.slots - 1}"
        place = f"role {me.role}, node rank {me.node_rank} of {topology.nnodes}, {ranks} of {topology.processes}"
    return f"{how}; generation {generation}: {place}"


def generation_note(generation: int, before: tuple[int, int] | None, after: tuple[int, int], *,
                    left: Sequence[tuple[str, str]] = (), back: Sequence[str] = (),
                    took: Sequence[Takeover] = ()) -> str:
    """A sidecar's new generation: what changed, world size and training pods from -> to; then the pods that
    left the job's members since the files before, each with why (a lost member: its condition), the pods
    that were lost and are members again, and the hot spares that took a seat (--world-size)."""
    pods, world = after
    if before is None:
        note = f"generation {generation}: world size {world}, {pods} training pods"
    else:
        note = f"generation {generation}: world size {before[1]} -> {world}, training pods {before[0]} -> {pods}"
    if left:
        shown = "; ".join(f"{name}: {why}" for name, why in left[:SHOW])
        more = f" (and {len(left) - SHOW} more)" if len(left) > SHOW else ""
        note += f"; left out: {shown}{more}"
    if back:
        note += f"; back: {_names(back)}"
    if took:
        shown = "; ".join(f"{t.name} node rank {t.node_rank}" + (f" (was {t.replaced})" if t.replaced else "")
                          for t in took[:SHOW])
        note += f"; spares took seats: {shown}" + (f" (and {len(took) - SHOW} more)" if len(took) > SHOW else "")
    return note
