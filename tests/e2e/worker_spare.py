"""A static trainer as torchrun runs it under ``python -m agent.trainer run``: it resumes from the step in the
checkpoint file rank 0 keeps in the shared directory, then steps (one gloo all_reduce each), writing the checkpoint
after each step and one line per step to the record. Arguments: the checkpoint file, the record file."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

checkpoint, record = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
start = torch.tensor([0])
if rank == 0:
    try:
        with open(checkpoint) as held:
            start[0] = json.load(held)["step"]
    except FileNotFoundError:
        pass
dist.broadcast(start, 0)
step = int(start[0])
pod = os.environ["POD"]
with open(record, "a") as out:
    out.write(json.dumps({"pod": pod, "rank": rank, "world": world, "start": step, "at": time.time()}) + "\n")
while True:
    value = torch.tensor([1.0])
    dist.all_reduce(value)
    step += 1
    if rank == 0:
        with open(checkpoint + ".tmp", "w") as held:
            json.dump({"step": step}, held)
        os.replace(checkpoint + ".tmp", checkpoint)
    with open(record, "a") as out:
        out.write(json.dumps({"pod": pod, "rank": rank, "world": world, "step": step, "sum": value.item(),
                              "at": time.time()}) + "\n")
    time.sleep(0.2)
