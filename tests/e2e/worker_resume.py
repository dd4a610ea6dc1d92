"""A trainer that resumes from the job's checkpoint: each time the launcher starts it, it joins the world torch.env
gives (gloo, one process per pod), takes up from the step rank 0 last saved (broadcast from rank 0: the checkpoint
is the job's, as on shared storage), records where it started, then steps: an all_reduce each, rank 0 saving the
step after each one. Arguments: the file to record in (one line per start), the job's checkpoint file."""

import datetime
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

record, checkpoint = Path(sys.argv[1]), Path(sys.argv[2])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
world, rank = dist.get_world_size(), dist.get_rank()
start = torch.tensor([float(checkpoint.read_text()) if rank == 0 and checkpoint.exists() else 0.0])
dist.broadcast(start, 0)
step = int(start.item())
with record.open("a") as handle:
    handle.write(f"world={world} rank={rank} start={step} pid={os.getpid()} at={time.time():.3f}\n")
while True:  # a member that stops answering holds the next all_reduce: the launcher's restart ends it
    total = torch.tensor([1.0])
    dist.all_reduce(total)
    if int(total.item()) != world:
        sys.exit(f"all_reduce summed {total.item()} in a world of {world}")
    step += 1
    if rank == 0:
        saved = checkpoint.with_suffix(".tmp")
        saved.write_text(str(step))
        os.replace(saved, checkpoint)
    time.sleep(0.1)
