"""A trainer as users write it: everything it knows of the job comes from the sourced torch.env."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
print(f"rank={rank} node_rank={os.environ['NODE_RANK']} world={world} sum={value.item():.0f}", flush=True)
dist.destroy_process_group()
