"""XGBoost's collective from the agent's files, formed again between rounds when the membership changes.

XGBoost can leave its collective and form a new one in the same process, so a job that grows keeps its model and
its process (docs/frameworks.md). What the agent gives: ``xgboost.json`` (``CommunicatorContext``'s arguments:
rank 0's address, the tracker port, this pod's task id) and ``DMLC_NUM_WORKER`` in topology.json; the tracker port
is derived from the membership, so a new membership is a new port on every pod without their talking. What is
left to the trainer, and done here:

- rank 0 (task id 0) starts the tracker, ``RabitTracker(n_workers=DMLC_NUM_WORKER, sortby="task")``, so that each
  rank is its task id;
- every other process waits until the tracker's port accepts a connection before joining: a worker that comes
  first uses up its retries and the group never forms;
- at a round boundary the processes agree (one small all-reduce) whether any of them has seen a new generation;
  if so all leave together, wait for the new files (a new tracker port), form the new group, and take the model
  of the process that has trained the most rounds (a joining process has none).

Use::

    from agent.trainer.xgboost import Group

    group = Group("/shared")
    booster = group.form(None)                     # None, or the model of whoever has one
    while booster is None or booster.num_boosted_rounds() < rounds:
        if group.changed():                        # every process gets the same answer
            booster = group.form(booster)          # the new world, the model carried over
        booster = xgb.train(params, dmatrix_for(group.rank, group.world_size), 1, xgb_model=booster)
    group.close()

A process that leaves during a round breaks that round (XGBoost raises): start the pod's command again (the
launcher, ``python -m agent.trainer run``) from a checkpoint. xgboost and numpy are imported when a group is
formed, not with this module.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import time
from pathlib import Path
from typing import Any

from agent.trainer import TopologyWatcher

log = logging.getLogger("topology_agent.xgboost")


class GroupError(Exception):
    """The files do not say how to form the group, or it did not form in time."""


def read_arguments(directory: Path, *, settle: float = 5.0) -> tuple[dict[str, Any], int, int]:
    """``CommunicatorContext``'s arguments, the tracker's ``n_workers``, and the generation they belong to.

    The sidecar writes ``xgboost.json`` before ``topology.json``: a read between the two renames would take the
    new tracker port with the old ``n_workers`` (a tracker for 2 that 3 workers join: one of them is dropped, a
    broken pipe at init). The two agree on the tracker's address, port and task id when they are one
    generation's, so a read that finds them apart reads again until they agree (``settle`` seconds at most)."""
    deadline = time.monotonic() + settle
    while True:
        try:
            arguments = json.loads((directory / "xgboost.json").read_text())
            document = json.loads((directory / "topology.json").read_text())
            spec = document["frameworks"]["xgboost"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise GroupError(f"{directory}: no XGBoost files ({err}); select the framework for the job "
                             "(--frameworks xgboost)") from None
        if not isinstance(arguments, dict) or spec.get("withheld"):
            raise GroupError(f"{directory}/xgboost.json has no values: {spec.get('withheld')}")
        env = spec["env"]
        said = (str(env.get("DMLC_TRACKER_URI")), str(env.get("DMLC_TRACKER_PORT")), str(env.get("DMLC_TASK_ID")))
        if said == (str(arguments.get("dmlc_tracker_uri")), str(arguments.get("dmlc_tracker_port")),
                    str(arguments.get("dmlc_task_id"))):
            return arguments, int(env["DMLC_NUM_WORKER"]), int(document.get("generation", _generation(directory)))
        if time.monotonic() > deadline:
            raise GroupError(f"{directory}/xgboost.json names tracker {arguments.get('dmlc_tracker_uri')}:"
                             f"{arguments.get('dmlc_tracker_port')} but topology.json {said[0]}:{said[1]} for "
                             f"{settle:.0f} s; is something other than this pod's sidecar writing {directory}?")
        time.sleep(0.05)


def _generation(directory: Path) -> int:
    try:
        return int((directory / "generation").read_text().strip())
    except (OSError, ValueError):
        return -1


def _bind_address(uri: str) -> str:
    """The tracker listens on rank 0's address when it is an IP, else everywhere."""
    try:
        return str(ipaddress.ip_address(uri.strip("[]")))
    except ValueError:
        return "0.0.0.0"


def wait_for_port(host: str, port: int, timeout: float) -> None:
    """Until the tracker accepts a connection: XGBoost's own retries run out before a slow rank 0 starts it."""
    deadline = time.monotonic() + timeout
    pause = 0.05
    while True:
        try:
            with socket.create_connection((host.strip("[]"), port), timeout=2):
                return
        except OSError as err:
            if time.monotonic() > deadline:
                raise GroupError(f"the XGBoost tracker at {host}:{port} did not listen within {timeout:.0f} s "
                                 f"({err}); is rank 0's process running?") from None
        time.sleep(pause)
        pause = min(pause * 2, 1.0)


class Group:
    """This process's place in the XGBoost collective, one generation of the files at a time."""

    def __init__(self, directory: Path | str = "/shared", *, timeout: float = 300.0,
                 pid_file: Path | str | None = None) -> None:
        self.directory = Path(directory)
        self.timeout = timeout
        self.watcher = TopologyWatcher(self.directory, pid_file=pid_file)  # SIGUSR1 and the generation file
        self.arguments: dict[str, Any] | None = None  # the group this process is in
        self.tracker: Any = None
        self.rank, self.world_size, self.generation = -1, 0, -1
        # A process that joins calls form() then changed(); the members call changed() (True) then form(): the
        # first changed() after a form() that no changed() asked for answers False with no collective call, so
        # that the calls pair up in the new group.
        self.fresh, self.reforming = False, False

    def _next_arguments(self) -> tuple[dict[str, Any], int, int]:
        """The files of a group other than the current one (a new tracker port), once this pod's sidecar has
        written them: another pod may have seen the change first."""
        deadline = time.monotonic() + self.timeout
        while True:
            arguments, workers, generation = read_arguments(self.directory)
            if arguments != self.arguments:
                return arguments, workers, generation
            if time.monotonic() > deadline:
                raise GroupError(f"another process saw a new membership, but {self.directory}/xgboost.json still "
                                 f"names the old group after {self.timeout:.0f} s; is this pod's sidecar running?")
            time.sleep(0.1)

    def form(self, booster: Any) -> Any:
        """Leave the current group (if any), form the one the files name, and return the model of the process
        that has trained the most rounds (``booster`` is this process's, or None)."""
        import xgboost
        from xgboost import collective
        from xgboost.tracker import RabitTracker

        self._leave()
        arguments, workers, generation = self._next_arguments()
        self.watcher.reload()
        uri, port = str(arguments["dmlc_tracker_uri"]), int(arguments["dmlc_tracker_port"])
        with self.watcher.held():  # the tracker's threads and the bootstrap's socket reads never get the signal
            if str(arguments["dmlc_task_id"]) == "0":
                self.tracker = RabitTracker(n_workers=workers, host_ip=_bind_address(uri), port=port, sortby="task",
                                            timeout=int(self.timeout))
                self.tracker.start()
            else:
                wait_for_port(uri, port, self.timeout)
            collective.init(**arguments)
        self.arguments, self.generation = arguments, generation
        self.fresh, self.reforming = not self.reforming, False
        self.rank, self.world_size = collective.get_rank(), collective.get_world_size()
        log.info("generation %d: rank %d of %d (tracker %s:%d)", generation, self.rank, self.world_size, uri, port)
        return self._take_model(booster, xgboost, collective)

    def _take_model(self, booster: Any, xgboost: Any, collective: Any) -> Any:
        import numpy as np

        rounds = np.zeros(self.world_size, dtype=np.float64)
        rounds[self.rank] = 0 if booster is None else booster.num_boosted_rounds() + 1
        rounds = collective.allreduce(rounds, collective.Op.SUM)
        if rounds.max() == 0:
            return None
        root = int(rounds.argmax())  # the lowest rank among those that trained the most
        raw = collective.broadcast(bytes(booster.save_raw()) if self.rank == root else None, root)
        return xgboost.Booster(model_file=bytearray(raw))

    def changed(self) -> bool:
        """Whether any process of the group has seen a new generation; the same answer on every process, so call
        it at the top of every round, and ``form`` when it says True."""
        if self.fresh:
            self.fresh = False
            return False
        import numpy as np
        from xgboost import collective

        moved = False
        if self.watcher.changed():
            moved = read_arguments(self.directory)[0] != self.arguments  # a generation for others' sake: stay
            if not moved:
                self.watcher.reload()
        seen = np.array([1.0 if moved else 0.0])
        self.reforming = bool(collective.allreduce(seen, collective.Op.MAX)[0] > 0)
        return self.reforming

    def _leave(self) -> None:
        if self.arguments is None:
            return
        from xgboost import collective

        collective.finalize()
        if self.tracker is not None:
            self.tracker.wait_for(int(self.timeout))
            self.tracker = None
        self.rank, self.world_size = -1, 0

    def close(self) -> None:
        """Leave the group (rank 0 waits for its tracker to see everyone go) and stop following the files."""
        self._leave()
        self.arguments = None
        self.watcher.close()
