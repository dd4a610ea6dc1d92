"""The job's pods as one sidecar holds them, whatever it follows (the pods themselves, or the published journal):
the evaluator renders them, the publisher publishes what changed in them."""

from __future__ import annotations

from collections.abc import Mapping

from agent.core.model import RawPod
from agent.core.topology import Plan, pod_ip, slim_pod
from agent.runtime.nodes import NodeMap


class Membership:
    def __init__(self, pod_name: str) -> None:
        self.pod_name = pod_name
        self.me: RawPod | None = None  # the own pod as read at start: its containers' env is the user's
        self.pods: dict[str, RawPod] = {}
        self.unaddressed: set[str] = set()  # pods without an IP yet (kept per event, not rescanned per change)
        self.touched: set[str] = set()  # pods changed since the last publication
        self.nodes: NodeMap = {}  # labels of the Nodes the pods run on (read when --topology-levels asks)
        self.light: Plan | None = None  # --view own: this pod's plan from the published summary, held instead
        self.listed = False  # every pod was held at once (a LIST, a snapshot): before that, nothing to evaluate

    def _address(self, name: str, pod: RawPod) -> None:
        if pod_ip(pod) or name == self.pod_name:
            self.unaddressed.discard(name)
        else:
            self.unaddressed.add(name)

    def replace(self, pods: dict[str, RawPod], *, own: bool = False) -> None:
        """Every pod at once (a LIST, a snapshot). ``own``: put the own pod as read at start in place of its
        published row (the user's env is read from it)."""
        self.light = None  # every pod is held again: the summary's plan no longer stands for them
        if own and self.me is not None and self.pod_name in pods:
            pods[self.pod_name] = slim_pod(self.me)
        self.touched |= set(self.pods) | set(pods)
        self.pods = pods
        self.listed = True
        self.unaddressed = set()
        for name, pod in pods.items():
            self._address(name, pod)

    def put(self, name: str, pod: RawPod, *, own: bool = False) -> None:
        self.touched.add(name)
        self.pods[name] = slim_pod(self.me) if own and name == self.pod_name and self.me is not None else pod
        self._address(name, pod)

    def remove(self, name: str) -> None:
        self.touched.add(name)
        self.pods.pop(name, None)
        self.unaddressed.discard(name)

    def placed(self, *, by_ip: bool) -> Mapping[str, RawPod]:
        """The pods that can be placed: with ``--address ip`` a pod joins once it has an address."""
        if by_ip and self.unaddressed:
            return {name: pod for name, pod in self.pods.items() if name not in self.unaddressed}
        return self.pods
