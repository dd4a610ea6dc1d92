"""The pods held -> the files: a new generation only when who-is-where changed, then a signal.

The last complete files always stay: a topology error keeps them (the pods will make sense again), and so does a
write that fails (a full disk, a replaced ``ssh/`` directory): the generation is not advanced, the sidecar says
why it is not ready, and the next evaluation writes again. A trainer cannot stop its sidecar this way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent.core import NodeLabels, Rendered, Renderer, render_plan
from agent.core.files.rendering import KeyDigest, MembershipKey, hosts_digest, key_digest, read_topology_json
from agent.core.files.variables import warnings_for
from agent.core.model import RawPod, Takeover
from agent.core.plan.layout import Plan
from agent.core.pods.lost import LOST
from agent.core.publication.blocks import BlockMaker
from agent.core.publication.leading import standbys
from agent.core.publication.summary import own_view, view_key
from agent.core.report.events import Occurrence, generation_note
from agent.errors import InputError, OutputError
from agent.files.reading import Unreadable, read_untrusted
from agent.files.writing import write_files
from agent.k8s.retrying import Backoff
from agent.runtime.metrics import SidecarMetrics
from agent.runtime.output import write_generation
from agent.runtime.signalling import TrainerFinder, signal_trainer
from agent.runtime.views import HOLDING, full_view_line

if TYPE_CHECKING:
    from agent.core.files.ssh_config import SshTexts

log = logging.getLogger("topology_agent.sidecar")


PREVIOUS_LIMIT = 32 * 1024 * 1024  # topology.json is ~1.2 MB at 4096 pods, ~5 MB at 16384
# What a plan's files say about membership: the whole job's (``Renderer.membership_key``), or a --view own pod's.
Key = MembershipKey | tuple[tuple[object, ...], ...]



def _own_key(rendered: Rendered) -> tuple[tuple[str, str], ...]:
    """What a --view own pod's files say about it: a change elsewhere in the job that alters none of it is no
    rewrite and no signal."""
    topology = rendered.plan.topology
    return view_key({v.name: v.value for v in rendered.variables if v.written and not v.unset},
                    {r.key: r.document() for r in rendered.frameworks},
                    hosts_digest(topology) if topology.whole is not None and topology.whole.hosts else None)


def _shape(document: Any) -> tuple[int, int] | None:
    """Training pods and their processes, as a previous topology.json says them (None: it does not)."""
    try:
        return int(document["nnodes"]), int(document["processes"])
    except (TypeError, KeyError, ValueError):
        return None


NOT_EVALUATED = "the first evaluation has not run yet"


def _left_out(plan: Plan) -> dict[str, str]:
    """The pods ``plan`` leaves out, with why: the whole job's plan where this pod holds every pod (the publisher,
    a small job's pod in its own view, whose files are rendered from a plan of rank 0 and itself)."""
    return {gone.name: gone.reason for gone in plan.topology.excluded}


def _changes(before: dict[str, str] | None, now: dict[str, str],
             plan: Plan) -> tuple[list[tuple[str, str]], list[str]]:
    """The pods left out now and not before (with why), and the pods lost before that are members now. Nothing
    when what the files before left out is not known (the sidecar's first plan)."""
    if before is None:
        return [], []
    left = sorted((name, why) for name, why in now.items() if name not in before)
    lost = [name for name, why in before.items() if name not in now and why.startswith(LOST)]
    if not lost:
        return left, []
    members = {member.name for member in plan.topology.members}
    return left, sorted(name for name in lost if name in members)


def _decoded(data: bytes | str) -> str:
    return data.decode() if isinstance(data, bytes) else data


def _same_key(key: Key, held: Key | KeyDigest | None) -> bool:
    return key_digest(key) == held if isinstance(held, KeyDigest) else key == held


@dataclass
class InPlace:
    """The generation of files in place, as the sidecar knows it: what a new evaluation is compared with, and what
    its Event says changed since."""

    generation: int = 0
    # The membership it was written for; as read back from topology.json (``load_previous``), its digest until
    # the first plan.
    key: Key | KeyDigest | None = None
    shape: tuple[int, int] | None = None  # its training pods and processes
    # The pods it leaves out, with why (None: not planned yet): a new generation's Event names those that left
    # since, and the lost ones that are members again.
    left_out: dict[str, str] | None = None
    # --world-size: (spare, node rank) of each seat a spare held in it (None: not planned yet)
    takeovers: frozenset[tuple[str, int]] | None = None


@dataclass
class OwnView:
    """The own view of this pod while it holds every member (core/publication/summary.own_view): whether the job
    publishes (the default view is each pod's own there), why the last plan's own view did not apply (said once per
    reason), and the maker of the plans' blocks, which the leader's summary of the same plan shares (its blocks are
    made once)."""

    published: bool = False
    why: str = ""
    blocks: BlockMaker = field(default_factory=BlockMaker)

    def of(self, plan: Plan, options: Any, *, ssh: bool) -> Plan | None:
        own, why = own_view(plan, options, ssh=ssh, published=self.published, blocks=self.blocks)
        if why != self.why and why:
            log.log(*full_view_line(options.view, why, HOLDING))
        self.why = why
        return own


class Evaluator:
    def __init__(self, settings: Any, metrics: SidecarMetrics, *,
                 clock: Callable[[], float] = time.monotonic, keep_document: bool = True) -> None:
        self.settings, self.metrics, self.clock = settings, metrics, clock
        self.renderer = Renderer(settings.options, settings.pod_name, checked=True)  # pods passed the intake
        self.in_place = InPlace()  # the files in place, as this sidecar knows them
        self.document: bytes | None = None  # topology.json as this sidecar planned it, served by /topology
        self.keep_document = keep_document  # False when /topology is not served: 4.5 MB less held at 16384 pods
        self.problem: str | None = NOT_EVALUATED  # why the files in place may not be the membership's (None: they are)
        self.write_failed = Backoff(base=1.0)  # a write that failed is tried again after this
        self.plan: Plan | None = None  # the last evaluation's plan (None: it made none): the leader summarizes it
        self.own = OwnView()
        self.tell: Callable[[Occurrence], None] = lambda _: None  # the pod's Events (runtime/events.py)
        # Each generation written, kept where a rerun of init reads it (runtime/restarts.py): its numbering goes on.
        self.recorded: Callable[[int], None] = lambda _: None
        self.ssh_texts: SshTexts | None = None  # what each member adds to the SSH files (made at the first write)

    @property
    def generation(self) -> int:
        return self.in_place.generation

    @property
    def valid(self) -> bool:
        return self.problem is None

    @property
    def evaluated(self) -> bool:
        return self.problem != NOT_EVALUATED

    @property
    def standby_now(self) -> tuple[str, ...]:
        """The first training members of the last valid plan other than this pod: the publisher names them its
        standbys (core/publication/leading.py)."""
        plan = self.plan
        return () if plan is None else standbys((m.name for m in plan.topology.training), self.settings.pod_name)

    def load_previous(self) -> None:
        """Continue from init's (or a previous sidecar's) generation: same membership -> no rewrite. The files
        are in the trainer's directory: read as untrusted (files/reading.py), parsed strictly, and anything
        else starts from generation 0 with one line. What they say decides only whether the trainer's own files
        are rewritten: /topology never serves them (the trainer can write them), it serves what this sidecar
        plans (``evaluate``). A ``generation`` marker that lags topology.json (the process died between the
        two renames) is written again."""
        out = self.settings.out_dir
        try:
            # the file's bytes let go once decoded: not held beside its text while the members are read
            document, members = read_topology_json(_decoded(read_untrusted(out / "topology.json", PREVIOUS_LIMIT)))
            generation = document.get("generation")
            if not isinstance(generation, int) or isinstance(generation, bool) or not 0 <= generation < 2**53:
                raise ValueError(f"its generation is {str(generation)[:20]}, not a whole number")
            key = view_key(document.get("env", {}), document.get("frameworks"), document.get("hosts")) \
                if document.get("view") == "own" else members
        except FileNotFoundError:
            return
        except (Unreadable, OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as err:
            log.warning("the previous topology.json cannot be continued from (%s); starting from generation 0",
                        str(err)[:200])
            return
        self.in_place.generation, self.in_place.key = generation, key
        self.in_place.shape = _shape(document)
        self.metrics.generation.set(self.generation)
        try:
            marker = read_untrusted(out / "generation", 32).decode("ascii", "replace").strip()
        except (OSError, Unreadable):
            marker = ""
        if marker != str(generation):
            try:
                write_files(out, {"generation": f"{generation}\n".encode()})
            except OutputError as err:
                log.warning("the generation marker says %r, topology.json %d, and it cannot be rewritten (%s)",
                            marker[:20], generation, err)
            else:
                log.info("generation marker %r repaired to %d (topology.json's): a write was cut between the two "
                         "renames", marker[:20], generation)

    def evaluate(self, since: float, *, pods: Mapping[str, RawPod] | None, light: Plan | None, nodes: NodeLabels,
                 note: str, touched: set[str] | None = None) -> float | None:
        """Recompute from the pods that can be placed, or from this pod's plan (``--view own``: the published
        summary's); rewrite and signal only if membership changed. Returns None, or the seconds after which a
        failed write is to be tried again. ``touched``: the pods that can have changed since the last
        evaluation (None: any), so that the planner does not compare every pod held."""
        try:
            plan, key, rendering = self._render(pods, light, nodes, touched)
            rendered = None if _same_key(key, self.in_place.key) else rendering()
        except InputError as err:
            self.problem = f"the current pods make no valid topology ({err})"
            log.warning("current pods make no valid topology (%s); keeping generation %d", err, self.generation)
            return None
        if rendered is not None:
            return self._write(rendered, key, since, note)
        self.in_place.key = key  # the plan's own, not the digest read back (``load_previous``)
        self.problem = None
        self.in_place.left_out = _left_out(self.plan or plan)
        self.in_place.takeovers = _seats_taken(plan.topology.takeovers)
        if self.document is None and self.keep_document:  # the first plan since the start: served from now on
            self.document = self._document_at(plan, self.generation)
        return None

    def _document_at(self, plan: Plan, generation: int) -> bytes:
        """topology.json of ``plan`` (as rendered) at ``generation`` (the members in place: no new generation)."""
        s = self.settings
        files_dir = str(s.out_dir.absolute())
        if plan.topology.whole is not None:  # an own view's plan, from the summary or from every pod held
            again = render_plan(plan, s.options, generation=generation, files_dir=files_dir)
        else:
            again = self.renderer.render_planned(plan, generation=generation, files_dir=files_dir)
        return again.files["topology.json"]

    def _render(self, pods: Mapping[str, RawPod] | None, light: Plan | None, nodes: NodeLabels,
                touched: set[str] | None = None) -> tuple[Plan, Key, Callable[[], Rendered]]:
        """The next generation's plan as rendered, what its files say about membership (equal keys: nothing to
        rewrite), and what makes its files. A pod that renders the whole job makes them only when the key
        changed: most changes of a large job (a peer's new IP under --address dns) alter none of its files."""
        s = self.settings
        files_dir = str(s.out_dir.absolute())
        if light is not None:  # --view own: rank 0, this pod and the job's numbers, from the published summary
            rendered = render_plan(light, s.options, generation=self.generation + 1, files_dir=files_dir)
            self._planned(rendered.plan)
            return rendered.plan, _own_key(rendered), lambda: rendered
        assert pods is not None
        # Not held while the next plan is made: a plan from scratch (a burst of a quarter of the job) was made
        # beside the last one, 3.7 MB more at the publisher's peak of a 16384-pod job. A plan that fails leaves
        # none: the files stay, nothing is published while the pods make no plan.
        self.plan = None
        plan = self.renderer.planner.plan(pods, nodes=nodes, touched=touched)
        own = self.own.of(plan, s.options, ssh=s.ssh is not None)
        self._planned(plan)
        if own is not None:  # --view own, holding every pod: the files a follower makes from the summary
            mine = render_plan(own, s.options, generation=self.generation + 1, files_dir=files_dir)
            return mine.plan, _own_key(mine), lambda: mine
        staged = self.renderer.stage(plan, files_dir=files_dir)
        return staged.plan, self.renderer.membership_key(staged), \
            lambda: self.renderer.render_staged(staged, generation=self.generation + 1, files_dir=files_dir)

    def use_options(self, settings: Any) -> None:
        """New options (the DRA claims read again): the next evaluation plans every pod from scratch with them."""
        self.settings = settings
        self.renderer = Renderer(settings.options, settings.pod_name, checked=True)

    def forget_pods(self) -> None:
        """Let go of the plan, the planner's layout of every pod and the members' texts (a standby that stands
        down, a follower about to read the snapshot again); the next evaluation plans from what the pod then
        follows."""
        self.renderer = Renderer(self.settings.options, self.settings.pod_name, checked=True)
        self.plan = None

    def _planned(self, plan: Plan) -> None:
        self.plan = plan  # the whole job's when it holds every pod: the leader publishes it, names standbys from it

    def _write(self, rendered: Rendered, key: Key, since: float, note: str) -> float | None:
        s = self.settings
        if s.ssh is not None and self.ssh_texts is None:
            from agent.core.files.ssh_config import SshTexts  # with the SSH material only: most pods have none

            self.ssh_texts = SshTexts()
        try:
            write_generation(s.out_dir, rendered, s.options, s.ssh, ssh_membership_only=True, ssh_texts=self.ssh_texts)
        except OutputError as err:
            retry = self.write_failed.next_delay()
            self.problem = f"cannot write the files ({err}); generation {self.generation} stays, retrying"
            log.warning("%s in %.1f s", self.problem, retry)
            return retry
        self.write_failed.reset()
        self.problem = None
        written = self.clock()
        self.in_place.generation += 1
        self.in_place.key = key
        self.document = rendered.files["topology.json"] if self.keep_document else None
        self.metrics.rewrites.inc()
        self.metrics.generation.set(self.generation)
        self.recorded(self.generation)
        self.metrics.latency.observe(max(0.0, written - since))
        topo = rendered.plan.topology
        log.info("generation %d written: %d training pods, %d processes (%s files_at=%.6f)", self.generation,
                 topo.nnodes, topo.processes, note, written)
        shape = (topo.nnodes, topo.processes)
        left_out = _left_out(self.plan or rendered.plan)
        left, back = _changes(self.in_place.left_out, left_out, self.plan or rendered.plan)
        seats = self.in_place.takeovers
        took = [t for t in topo.takeovers if seats is not None and t[:2] not in seats]
        self.tell(Occurrence("NewGeneration", generation_note(self.generation, self.in_place.shape, shape, left=left,
                                                              back=back, took=took), generation=self.generation))
        for name, why in left:
            log.info("pod %s left the world: %s", name, why)
        for takeover in took:
            log.info("hot spare %s took node rank %d%s", takeover.name, takeover.node_rank,
                     f" in place of {takeover.replaced}" if takeover.replaced else "")
        self.in_place.shape, self.in_place.left_out = shape, left_out
        self.in_place.takeovers = _seats_taken(topo.takeovers)
        for warning in warnings_for(rendered.plan, rendered.variables):
            log.warning("%s", warning)
        result = signal_trainer(s.finder or TrainerFinder(), s.signal)
        self.metrics.signals.labels(result).inc()
        if result == "sent":
            log.info("trainer signalled for generation %d (signal_at=%.6f)", self.generation, self.clock())
        return None


def _seats_taken(takeovers: Iterable[Takeover]) -> frozenset[tuple[str, int]]:
    """Each promoted spare and its seat (the pod it replaced may be named, then gone: the same takeover)."""
    return frozenset((t.name, t.node_rank) for t in takeovers)
