"""A tiny DDP job: every rank adds its rank + 1; rank 0 checks the sum over the world."""

import os

import torch
import torch.distributed as dist

backend = "nccl" if torch.cuda.is_available() else "gloo"
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
if backend == "nccl":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
value = torch.tensor([float(rank + 1)], device="cuda" if backend == "nccl" else "cpu")
dist.all_reduce(value)
expected = world * (world + 1) / 2
print(f"rank {rank}/{world} on node {os.environ.get('NODE_RANK')}: sum {value.item():.0f} (expected {expected:.0f})")
assert value.item() == expected
dist.destroy_process_group()
