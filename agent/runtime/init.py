"""``topology-agent init``: read my pod, find my peers, wait for the gang with one watch, write the files.

API cost is fixed whatever the job size: GET own pod, GET the owner object (skipped with ``--expect`` and
for LeaderWorkerSets), one LIST of the job's pods, then one WATCH from the list's resourceVersion until the
gang is complete. A watch that the server ends or that breaks resumes from the last resourceVersion seen; a
410 Gone relists. No polling.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.core import Memo, Options, Rendered, render_plan, render_pod
from agent.core.controllers import detect_controller
from agent.core.gang import (
    Expectation,
    GangStatus,
    GangTracker,
    Roster,
    expectation_from_job,
    expectation_from_pod,
    roster_of,
)
from agent.core.journal import STANDBYS
from agent.core.model import RawPod
from agent.core.provenance import Writer, WriterCheck
from agent.core.published import Compactor, configmap_name, is_leader, leader_identity
from agent.core.summary import own_view, why_full_view
from agent.core.topology import Planner, pod_name
from agent.core.validation import check_pod
from agent.core.variables import warnings_for
from agent.errors import ApiError, ApiNotFound, GangTimeout, InputError
from agent.k8s.client import Api
from agent.k8s.core import WatchEvent
from agent.k8s.reflector import BlockingOps, Reflector, run
from agent.k8s.reflector import Settings as ReflectorSettings
from agent.k8s.retrying import DeadlineExceeded, with_retries
from agent.k8s.transport import IDLE
from agent.runtime.intake import usable_pods
from agent.runtime.jobs import read_job
from agent.runtime.nodes import read_nodes, wanted_nodes
from agent.runtime.output import write_generation
from agent.runtime.publishing import first_publisher, publish_first, read_light, read_published

log = logging.getLogger("topology_agent.init")
Resolver = Callable[[str], bool]


def resolves(name: str) -> bool:
    try:
        socket.getaddrinfo(name, None)
    except OSError:
        return False
    return True


@dataclass
class InitSettings:
    namespace: str
    pod_name: str
    options: Options
    out_dir: Path
    expect: int | None = None
    timeout: float = 600.0
    wait_dns: bool = False
    source: str = "auto"  # pods | published | auto (published from PUBLISH_THRESHOLD training pods up)
    watch_idle: float | None = None  # seconds without progress before a watch counts as dead (None: derived)


PUBLISH_THRESHOLD = 256
LINGER = 0.1  # seconds: while many pods are awaited and events come densely, let them pile up between reads
BLOCKED = 0.001  # a read that took longer than this waited for the network


class GangWaiter:
    """Holds the job's pods as the API reports them, and decides when the gang is complete."""

    def __init__(self, api: Api, settings: InitSettings, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.api = api
        self.settings = settings
        self.clock = clock
        self.sleep = sleep
        self.started = clock()
        self.deadline = self.started + settings.timeout
        self.pods: dict[str, RawPod] = {}
        self.memo = Memo(settings.options)  # each pod's facts are computed once per resourceVersion
        self.objects: tuple[Mapping[str, Any], ...] = ()  # the job's objects as read (the owner first)
        self.roster: Roster | None = None  # who may be a member, once the owner is read
        self.me: RawPod | None = None
        self.compactor: Compactor | None = None
        self.staging: Callable[[RawPod], None] | None = None  # given each pod kept (the leader stages its rows)
        self.planner: Planner | None = None  # follows the pods held, so the plan is ready when the gang is
        # A watch that shows no progress for a third of --timeout is dead (60 s at most): init sees a hung watch
        # in time to list again before its deadline.
        self.reflecting = ReflectorSettings.with_idle(settings.watch_idle or min(IDLE, max(3.0, settings.timeout / 3)))
        budget = getattr(api, "budget", None)
        if budget is not None:
            budget.deadline = self.deadline  # every request ends by --timeout, connect included

    def _retry(self, call: Callable[[], object], what: str) -> object:
        try:
            return with_retries(call, what=what, deadline=self.deadline, sleep=self.sleep, clock=self.clock)
        except DeadlineExceeded as err:
            raise GangTimeout(f"timed out after {self.elapsed():.1f} s: the API server kept failing "
                              f"({err.last}); check the API server and the pod's network") from err

    def elapsed(self) -> float:
        return self.clock() - self.started

    def own_pod(self) -> RawPod:
        s = self.settings
        try:
            me: RawPod = self._retry(lambda: self.api.get_pod(s.namespace, s.pod_name), "get own pod")  # type: ignore
            self.me = check_pod(me)  # type: ignore[assignment]  # a malformed own pod: one line, nothing to wait for
            return me
        except ApiNotFound as err:
            raise InputError(
                f"own pod '{s.pod_name}' not found in namespace '{s.namespace}'; set POD_NAME and POD_NAMESPACE "
                "from the downward API (metadata.name, metadata.namespace)"
            ) from err

    def expectation(self, me: RawPod) -> Expectation:
        s = self.settings
        if s.expect is not None:
            return Expectation(total=s.expect, per_role=None, source="--expect")
        controller = detect_controller(me, s.options)
        from_pod = expectation_from_pod(controller, me)
        if from_pod is not None:
            return from_pod
        if controller.owner_path(me) is None:
            raise InputError(
                f"pod '{s.pod_name}': cannot tell how many pods the {controller.title} has (no owner to read); "
                "pass --expect N"
            )

        def get(path: str) -> dict[str, Any]:
            return self._retry(lambda: self.api.get_object(path), f"get {path}")  # type: ignore[return-value]

        try:
            view = read_job(get, me, s.options)
        except ApiNotFound as err:
            raise InputError(f"owner {controller.owner_path(me)} of pod '{s.pod_name}' not found; pass --expect N") \
                from err
        self.objects = view.objects
        self.roster = roster_of(view)
        for note in view.notes:
            log.info("%s", note)
        if view.options != s.options:
            self.settings = s = dataclasses.replace(s, options=view.options)
            self.memo = Memo(view.options)
        role = view.controller.identify(me, s.options).role
        return expectation_from_job(view.controller, view.objects, view.controller.training_roles(s.options),
                                    s.options, role=role)

    def take_list(self, items: list[RawPod]) -> None:
        """A LIST's pods (each kept by ``_intake`` as its page was read) replace those held."""
        self.pods = {p["metadata"]["name"]: p for p in items}
        if self.settings.pod_name not in self.pods and self.me is not None:
            self.pods[self.settings.pod_name] = self.me  # not listed yet (a cache behind the GET): a member anyway

    def _intake(self, items: list[dict[str, object]]) -> list[RawPod]:
        """What init keeps of each LIST page, before the next page is read."""
        return [self._keep(p) for p in usable_pods(items, self.roster, own=self.settings.pod_name)]

    def _keep(self, pod: RawPod) -> RawPod:
        """Peers as followers see them, from fresh strings (a 4096-pod job's full objects held 290 MB, and a
        kept string of the parsed page keeps the page's memory); the own pod whole."""
        if pod_name(pod) != self.settings.pod_name:
            if self.compactor is None or self.compactor.options != self.settings.options:
                self.compactor = Compactor(self.settings.options)
            pod = self.compactor.pod(pod)
        if self.staging is not None:
            self.staging(pod)
        return pod

    def track(self, expected: Expectation) -> GangTracker:
        """A tracker over the pods held now (after a LIST); events then update it one pod at a time."""
        s = self.settings
        tracker = GangTracker(self.pods[s.pod_name], s.pod_name, s.options, expected, memo=self.memo,
                              checked=True)  # every pod held passed usable_pods
        for pod in self.pods.values():
            tracker.put(pod)
        return tracker

    def wait(self, selector: str, expected: Expectation) -> GangStatus:
        """List the job's pods, then watch until the gang is complete (the reflector: reflector.py); raise
        ``GangTimeout`` naming what is missing at the deadline. Each event costs O(1) (``GangTracker``): with every
        pod of a 4096-pod job arriving late, the wait used to recompute the whole job per event."""
        s = self.settings
        gang = _Gang(self, expected)
        reflector = Reflector(f"pods of {selector}", self.reflecting, now=self.clock())
        ops = BlockingOps(lambda: self.api.list_pods(s.namespace, selector, keep=self._intake),
                          lambda rv, timeout, idle: self.api.watch_pods(s.namespace, selector, rv, timeout=timeout,
                                                                        idle=idle),
                          sleep=self.sleep, clock=self.clock)
        if not run(reflector, ops, gang, deadline=self.deadline, done=gang.ready):
            if gang.tracker is None:
                raise GangTimeout(f"timed out after {self.elapsed():.1f} s (--timeout {s.timeout:g}): the API server "
                                  f"kept failing ({reflector.last_error}); check the API server and the pod's network")
            why = f"; last API error: {reflector.last_error}" if reflector.last_error else ""
            raise GangTimeout(self._timeout_message(gang.tracker.status(), selector) + why)
        assert gang.tracker is not None
        return gang.tracker.status()

    def _timeout_message(self, current: GangStatus, selector: str) -> str:
        s = self.settings
        return (f"timed out after {self.elapsed():.1f} s (--timeout {s.timeout:g}) waiting for the gang: "
                f"{current.describe()}; see "
                f"kubectl get pods -n {s.namespace} -l {selector} (unscheduled pods? quota? wrong --expect?)")


class _Gang:
    """init's side of the reflector: the pods as listed and watched, folded into a ``GangTracker``."""

    def __init__(self, waiter: GangWaiter, expected: Expectation) -> None:
        self.waiter, self.expected = waiter, expected
        self.tracker: GangTracker | None = None
        self.read_from = 0.0

    def ready(self) -> bool:
        return self.tracker is not None and self.tracker.ready()

    def on_list(self, items: list[RawPod]) -> None:
        self.waiter.take_list(items)
        self.tracker = self.waiter.track(self.expected)
        if self.waiter.planner is not None:
            self.waiter.planner.follow(self.waiter.pods)
        log.info("waiting for the gang: %s", self.tracker.status().describe())
        self.read_from = self.waiter.clock()

    def on_event(self, event: WatchEvent) -> bool:
        waiter, tracker = self.waiter, self.tracker
        assert tracker is not None
        waited = waiter.clock() - self.read_from
        if event.type == "BOOKMARK":
            return False
        name = pod_name(event.object)  # type: ignore[arg-type]
        if event.type == "DELETED" or not usable_pods([event.object], waiter.roster, own=waiter.settings.pod_name):
            waiter.pods.pop(name, None)
            tracker.remove(name)
        else:
            pod = waiter.pods[name] = waiter._keep(event.object)  # type: ignore[arg-type]
            tracker.put(pod)
        if waiter.planner is not None:
            waiter.planner.follow(waiter.pods, (name,))
        if tracker.ready():
            return True
        if BLOCKED < waited < LINGER and tracker.pending() > max(2, self.expected.total // 100):
            # Pods are arriving densely and many are still awaited: read them in batches. Each read that waits is
            # a wakeup, and on a VM a wakeup costs more than the event's parsing (every pod of a 4096-pod job
            # late: 2.3 s of CPU against 0.7 s with none). The last 1 % are read as they come; before them, a pod
            # is read at most LINGER late.
            waiter.sleep(LINGER)
        self.read_from = waiter.clock()
        return False


def check_dns(api: Api, rendered: Rendered, settings: InitSettings, *, resolver: Resolver,
              clock: Callable[[], float], sleep: Callable[[float], None], deadline: float) -> None:
    """Wait until every peer's name resolves, after ruling out the headless-Service trap."""
    topo = rendered.plan.topology
    names = [m.address for m in topo.members if m.dns_name and m.address == m.dns_name]
    subdomains = {rendered.plan.self_pod.get("spec", {}).get("subdomain")} - {None}
    for subdomain in subdomains:
        path = f"/api/v1/namespaces/{settings.namespace}/services/{subdomain}"
        try:
            service = api.get_object(path)
        except ApiNotFound as err:
            raise InputError(f"--wait-dns: headless Service '{subdomain}' (the pods' spec.subdomain) does not exist; "
                             "create it (clusterIP: None, selecting the job's pods) or drop --wait-dns") from err
        except ApiError as err:
            log.warning("cannot read Service '%s' to check publishNotReadyAddresses: %s", subdomain, err)
            continue
        if not service.get("spec", {}).get("publishNotReadyAddresses"):
            raise InputError(
                f"--wait-dns would wait forever: headless Service '{subdomain}' has no publishNotReadyAddresses, "
                "so pods still in their init containers get no DNS record; set spec.publishNotReadyAddresses: true "
                "(Volcano: svc plugin --publish-not-ready-addresses=true) or drop --wait-dns"
            )
    pending = list(names)
    delay = 0.2
    while pending:
        pending = [name for name in pending if not resolver(name)]
        if not pending:
            break
        if clock() + delay > deadline:
            elapsed = settings.timeout - (deadline - clock())
            raise GangTimeout(f"timed out after {elapsed:.1f} s waiting for DNS: "
                              f"{', '.join(pending[:8])} do not resolve; check the headless Service and CoreDNS")
        log.info("waiting for DNS: %d name(s) do not resolve yet (%s)", len(pending), pending[0])
        sleep(delay)
        delay = min(delay * 2, 5.0)


def choose_source(settings: InitSettings, expected: Expectation) -> str:
    if settings.source != "auto":
        return settings.source
    if settings.options.levels is not None:
        return "published"  # one pod reads the Nodes and publishes their labels with the pods, whatever the size
    return "published" if expected.total >= PUBLISH_THRESHOLD else "pods"


def run_init(api: Api, settings: InitSettings, *, resolver: Resolver = resolves,
             clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
             ssh: object | None = None, keep: list[object] | None = None) -> Rendered:
    """Configure this pod (the module's docstring). ``keep``: where to leave what this init held (its pods, plan
    and publisher), for a process that ends without freeing them (cli.console)."""
    waiter = GangWaiter(api, settings, clock=clock, sleep=sleep)
    me = waiter.own_pod()
    expected = waiter.expectation(me)
    settings = waiter.settings  # the job's objects may have filled options the user left open (MPI roles, slots)
    controller = detect_controller(me, settings.options)
    selector = controller.selector(me, settings.options)
    me_id = controller.identify(me, settings.options)
    me_role = me_id.role
    source = choose_source(settings, expected)
    leader = None
    if source == "published" and me_role in controller.waits_for(waiter.objects):
        # Created once others are Ready (JobSet dependsOn): the leader published before this pod existed.
        log.info("role %s starts once %s are Ready; reading the pods directly", me_role,
                 ", ".join(sorted(controller.waits_for(waiter.objects)[me_role])))
        source = "pods"
    if source == "published":
        leader = leader_identity(controller, expected, waiter.objects, controller.training_roles(settings.options))
        if leader is None:
            log.info("cannot tell which pod leads (no per-role counts); reading the pods directly")
            source = "pods"
    cm_name = configmap_name(me_id.job)
    log.info("pod %s: %s, selector %s, expecting %d training pods (%s); topology from %s", settings.pod_name,
             controller.title, selector, expected.total, expected.source,
             "the pods" if source == "pods" else ("the pods, published for the others (leader)"
                                                    if is_leader(me_id, leader) else f"configmap {cm_name}"))
    lead = source == "published" and is_leader(me_id, leader)
    files_dir = str(settings.out_dir.absolute())
    rendered: Rendered | None = None
    why_full = why_full_view(settings.options, ssh=ssh is not None)
    if source == "published" and not lead:
        me_uid = me.get("metadata", {}).get("uid") or ""
        check = WriterCheck(controller, settings.options, me_id.job, settings.namespace, waiter.roster,
                            me=Writer(settings.pod_name, me_uid))
        light = None
        if settings.options.view == "own" and why_full is not None:
            log.warning("--view own not used: %s; reading the whole topology", why_full)
        elif settings.options.view == "own":
            light = read_light(api, settings.namespace, cm_name, me, settings.options, check=check,
                               deadline=waiter.deadline, clock=clock, sleep=sleep, settings=waiter.reflecting)
        if light is not None:
            rendered = render_plan(light, settings.options, files_dir=files_dir)
        published = None if light is not None else read_published(
            api, settings.namespace, cm_name, settings.pod_name, check=check, deadline=waiter.deadline, clock=clock,
            sleep=sleep, settings=waiter.reflecting)
        if published is not None:
            mine = with_placement(me, published.pods[settings.pod_name])
            pods = [mine if p.get("metadata", {}).get("name") == settings.pod_name else p
                    for p in published.pods.values()]
            rendered = render_pod(pods, settings.pod_name, settings.options, memo=waiter.memo, files_dir=files_dir,
                                  nodes=published.node_labels(), checked=True)  # the published rows were checked
    if rendered is None:  # the pods themselves: a small job, the leader, or a publication not to be used
        publisher = first_publisher(settings.namespace, settings.options, job=me_id.job, leader=settings.pod_name,
                                    leader_uid=me.get("metadata", {}).get("uid") or "") if lead else None
        waiter.staging = publisher.stage if publisher is not None else None  # its rows, as the pods arrive
        waiter.planner = planner = Planner(settings.options, settings.pod_name, checked=True,  # the intake checked
                                           memo=waiter.memo)                                # every pod
        status = waiter.wait(selector, expected)
        log.info("gang complete: %s", status.describe())
        if status.present > status.expected and settings.expect is not None:
            log.warning("--expect %d, but %d training pods are present: the files name all of them; give --expect "
                        "the job's size, or delete the pods that are not the job's", status.expected, status.present)
        pods = list(waiter.pods.values())
        names = wanted_nodes(pods, settings.options, {})
        nodes = waiter._retry(lambda: read_nodes(api, names, settings.options), "read nodes") if names else None
        # The layout the wait carried over (one change away), or from scratch: build_plan's plan either way.
        plan = planner.plan(waiter.pods, nodes=nodes)  # type: ignore[arg-type]
        log.debug("plan: %d changes followed during the wait, %s", planner.followed,
                  "carried over" if planner.incremental else "made from scratch")
        if lead:  # publish first (a valid plan): every other pod of the job is waiting for it
            owners = [o for o in me.get("metadata", {}).get("ownerReferences", []) if o.get("controller")]
            training = plan.topology.training
            # The leader's own files come from the pods it has just listed, whether or not its snapshot was
            # created: a `<job>-topology` that exists already (an earlier run of this init, or anyone else's
            # ConfigMap) is never followed by the pod that leads (issue 23: a copy made before the job started
            # captured the leader, the pod that runs the SSH launcher).
            publish_first(api, settings.namespace, cm_name, pods, settings.options, job=me_id.job,
                          leader=settings.pod_name, leader_uid=me.get("metadata", {}).get("uid") or "",
                          owner=dict(owners[0]) if owners else None,
                          standby=tuple(m.name for m in training[1:1 + STANDBYS]),
                          nodes=nodes, plan=plan, publisher=publisher)  # type: ignore[arg-type]
        own, why = own_view(plan, settings.options, ssh=ssh is not None) if settings.options.view == "own" \
            else (None, "")
        said = why_full if source == "published" and not lead else None  # a follower that read no publication
        if why and why != said:
            log.warning("--view own not used: %s; this pod's files hold the whole topology", why)
        rendered = render_plan(own or plan, settings.options, files_dir=files_dir)
    assert rendered is not None
    if settings.wait_dns:
        check_dns(api, rendered, settings, resolver=resolver, clock=clock, sleep=sleep, deadline=waiter.deadline)
    for warning in warnings_for(rendered.plan, rendered.variables):
        log.warning("%s", warning)
    names = write_generation(settings.out_dir, rendered, settings.options, ssh)
    me_member = rendered.plan.topology.me
    log.info("wrote %s to %s: role %s, node rank %s of %d (peak RSS %s MB)", ", ".join(names),
             settings.out_dir, me_member.role, me_member.node_rank, rendered.plan.topology.nnodes,
             peak_rss_mb())
    if keep is not None:
        # Freeing a 16384-pod job's objects one by one as this frame ends took ~50 ms after the files were in
        # place, on the job's start-up path. All of the frame's locals: whatever is added later is kept too.
        keep.append(locals())
    return rendered


def with_placement(me: RawPod, published: RawPod) -> RawPod:
    """The own pod as read at start (its env is the user's), with the node and IP the leader saw later: an init
    started before its pod was bound (the demo, tests) read it without them."""
    spec, status = me.get("spec", {}), me.get("status", {})
    if spec.get("nodeName") and status.get("podIP"):
        return me
    return {**me, "spec": {**spec, "nodeName": spec.get("nodeName") or published.get("spec", {}).get("nodeName", "")},
            "status": status if status.get("podIP") else published.get("status", {})}  # type: ignore[typeddict-item]


def peak_rss_mb() -> str:
    """This process's own peak RSS (VmHWM): rusage would include the parent's memory at fork."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return f"{int(line.split()[1]) / 1024:.0f}"
    except OSError:
        pass
    return "?"
