"""Pods of about 1 MB (big env values, under etcd's 1.5 MiB) that anyone allowed to create pods can make with the
job's labels and no ownerReference: init and the sidecar, real processes against the sandbox over HTTPS, stay
within the memory limit ``inject`` gives them and write the job's files as if the pods were not there."""

from __future__ import annotations

import re
from pathlib import Path

from agent import examples
from tests.integration.conftest import finish, start_init
from tests.integration.test_sidecar import Running, wait_for
from tests.jobs import add_worker, create_volcano_job, generation, rogue, world

LIMIT_MIB = 128  # inject's memory limit for a job of up to 4096 pods
ROGUES = 40


def big_rogue(index: int) -> dict:
    """A pod of about 1 MB: four env values of 250,000 characters each."""
    pod = rogue(f"rogue-{index}", "worker", 100 + index, 100 + index)
    pod["spec"]["containers"][0]["env"] += [{"name": f"BLOB_{n}", "value": f"{n}" * 250_000} for n in range(4)]
    return pod


def peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def test_forty_rogue_pods_of_a_megabyte_stay_within_the_memory_limit(sandbox, tmp_path):
    create_volcano_job(sandbox, (("master", 1), ("worker", 2)))
    for index in range(ROGUES):
        sandbox.create_pod(big_rogue(index))

    code, err = finish(start_init(sandbox, "demo-master-0", tmp_path / "init", "--address", "ip"))
    assert code == 0, err
    assert world(tmp_path / "init")[0] == "3"
    peak = re.search(r"peak RSS (\d+) MB", err)
    assert peak is not None, err
    assert int(peak.group(1)) < LIMIT_MIB, err
    assert err.count("ignoring pod 'default/rogue-") == ROGUES, err  # what was dropped is said, once each

    running = Running(sandbox, tmp_path)  # init and the sidecar of demo-worker-0
    try:
        assert world(running.out)[0] == "3"
        for index in range(ROGUES):  # each rogue changed: an event of about 1 MB in the sidecar's watch
            sandbox.update_pod("default", f"rogue-{index}",
                               lambda pod: pod["metadata"]["labels"].update({"changed": "yes"}))
        wait_for(lambda: "'default/rogue-39'" in running.log.read_text(), timeout=30, what="the last event read")
        sandbox.faults(drop_watches=True, compact=True)  # 410 Gone: the sidecar lists the pods again
        wait_for(lambda: "listing again" in running.log.read_text(), timeout=30, what="a relist")
        add_worker(sandbox, 2, 10)
        wait_for(lambda: generation(running.out) == 2, timeout=60, what="generation 2")
        assert world(running.out)[0] == "4"
        assert (running.out / "hostfile").read_text().splitlines()[-1] == f"{examples.loopback_ip(10)} slots=1"
        sidecar_peak = peak_mib(running.proc.pid)
        print(f"init peak {peak.group(1)} MiB, sidecar peak {sidecar_peak:.0f} MiB")
        assert sidecar_peak < LIMIT_MIB
    finally:
        assert running.stop() == 0
    log = running.log.read_text()
    assert log.count("ignoring pod 'default/rogue-0'") == 1, log  # said once, not at each LIST or event
