"""A torchft trainer of one replica group, configured by torch.env alone (the launcher's environment).

    python worker_torchft.py RECORD

Its group's world is MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK; REPLICA_GROUP_ID names the group to the
lighthouse at TORCHFT_LIGHTHOUSE. The group's rank 0 starts the group's TCPStore (torchrun's agent would, as
torchft's Manager expects it started), and the Manager advertises this pod's address (its host name resolves to
it in the pod, and not in the others). Each step: a quorum, a fault-tolerant all-reduce of ones across the groups
in the quorum, a commit; one line per step in RECORD:
``group=G step=S participants=P world=W pid=PID``.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from datetime import timedelta

import torch
from torch.distributed import TCPStore
from torchft import Manager, ProcessGroupGloo


def main() -> None:
    record = sys.argv[1]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    group = os.environ["REPLICA_GROUP_ID"]
    if rank == 0:  # held by this frame for the process's life
        store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=True,
                         wait_for_workers=False)
        assert store is not None
    weights = torch.zeros(1)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=5)), min_replica_size=1,
        load_state_dict=lambda state: weights.copy_(state["weights"]),
        state_dict=lambda: {"weights": weights},
        replica_id=f"group-{group}", hostname=socket.gethostbyname(socket.gethostname()),
        timeout=timedelta(seconds=5), quorum_timeout=timedelta(seconds=20), connect_timeout=timedelta(seconds=10))
    while True:
        manager.start_quorum()
        grad = torch.ones(1)
        manager.allreduce(grad).wait()
        if manager.should_commit():
            weights.add_(grad)
            with open(record, "a") as out:
                out.write(f"group={group} step={manager.current_step()} participants={manager.num_participants()} "
                          f"world={world} pid={os.getpid()}\n")
        time.sleep(0.1)


if __name__ == "__main__":
    main()
