"""What ``agent.trainer.xgboost`` reads from the files, around the sidecar's renames (no xgboost needed)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from agent import examples
from agent.core import Options, render_pod
from agent.core.model import FrameworkOptions
from agent.trainer.xgboost import GroupError, read_arguments

OPTIONS = Options(address="ip", frameworks=FrameworkOptions(names=("xgboost",)))


def files(workers: int, generation: int) -> dict[str, bytes]:
    pods = examples.volcano_job("demo", (("master", 1), ("worker", workers)))
    return render_pod(pods, "demo-worker-0", OPTIONS, generation=generation).files


def write(out: Path, rendered: dict[str, bytes], *names: str) -> None:
    for name in names:
        (out / name).write_bytes(rendered[name])


def test_one_generations_files_give_its_arguments_and_size(tmp_path):
    write(tmp_path, files(2, 4), "xgboost.json", "topology.json", "generation")
    arguments, workers, generation = read_arguments(tmp_path)
    assert (workers, generation) == (3, 4)
    assert arguments["dmlc_task_id"] == "1" and int(arguments["dmlc_tracker_port"]) > 0


def test_a_read_between_the_two_renames_waits_for_the_second(tmp_path):
    """The new xgboost.json beside the old topology.json: the new port with the old n_workers would start a
    tracker for the wrong number of workers (XGBoost: a broken pipe at init). The read waits until both say
    the same tracker."""
    old, new = files(1, 1), files(2, 2)
    assert old["xgboost.json"] != new["xgboost.json"]
    write(tmp_path, old, "xgboost.json", "topology.json", "generation")
    write(tmp_path, new, "xgboost.json")  # the sidecar between its renames
    later = threading.Timer(0.3, lambda: write(tmp_path, new, "topology.json", "generation"))
    later.start()
    started = time.monotonic()
    arguments, workers, generation = read_arguments(tmp_path)
    later.join()
    assert time.monotonic() - started >= 0.25
    assert (workers, generation) == (3, 2)
    assert arguments == read_arguments(tmp_path)[0]


def test_files_that_never_agree_are_refused_in_one_line(tmp_path):
    write(tmp_path, files(1, 1), "topology.json", "generation")
    write(tmp_path, files(2, 2), "xgboost.json")
    with pytest.raises(GroupError, match=r"xgboost.json names tracker .* but topology.json .* for 0 s"):
        read_arguments(tmp_path, settle=0.2)
