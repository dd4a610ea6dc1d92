"""How a sidecar gathers changes, by mode (issue 24): a follower of the published journal rewrites at each entry,
which the publisher gathered already; a sidecar watching pods waits for a burst to end (``--debounce``)."""

from __future__ import annotations

from pathlib import Path

from agent.core import Options
from agent.runtime.sidecar import Sidecar, SidecarSettings
from agent.runtime.sidecar.following import Mode


def test_only_sidecars_that_watch_pods_wait_for_a_burst_to_end(tmp_path: Path) -> None:
    sidecar = Sidecar(None, SidecarSettings("default", "demo-worker-2", Options(), tmp_path))  # type: ignore[arg-type]
    gathered = {}
    for mode in Mode:
        sidecar.mode = mode
        gathered[mode] = sidecar.gathers
    assert gathered == {Mode.PODS: True, Mode.CANDIDATE: True, Mode.FOLLOWER: False}
    sidecar.settings = SidecarSettings("default", "demo-worker-2", Options(), tmp_path, debounce=0)
    sidecar.mode = Mode.PODS
    assert not sidecar.gathers  # --debounce 0: never
