"""A trainer in pytorch/examples' ImageNet convention, started without a launcher: WORLD_SIZE counts the nodes and
RANK is this node's rank; the node spawns one process per device itself (here NPROC_PER_NODE, which the agent
resolved from the pod's CPU limit) and gives each the global rank RANK x processes + its local index."""

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def main_worker(local: int, per_node: int, nodes: int) -> None:
    world = nodes * per_node
    rank = int(os.environ["RANK"]) * per_node + local
    dist.init_process_group("gloo", init_method="env://", world_size=world, rank=rank)
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    print(f"rank={dist.get_rank()} world={dist.get_world_size()} node={os.environ['RANK']} local={local} "
          f"sum={value.item():.0f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    per_node = int(os.environ["NPROC_PER_NODE"])
    mp.spawn(main_worker, nprocs=per_node, args=(per_node, int(os.environ["WORLD_SIZE"])))
