"""A trainer that builds its process groups from where its pods landed: DeviceMesh rows are racks."""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from agent.trainer import read_world

world = read_world(sys.argv[1])
dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
everyone = torch.tensor([float(rank + 1)])
dist.all_reduce(everyone)
rows = world.mesh("rack")
mesh = DeviceMesh("cpu", rows, mesh_dim_names=("across", "rack"))
within = torch.tensor([float(rank)])
dist.all_reduce(within, group=mesh.get_group("rack"))
across = torch.tensor([float(rank)])
dist.all_reduce(across, group=mesh.get_group("across"))
print(json.dumps({"rank": rank, "env_rank": int(os.environ["RANK"]), "world": dist.get_world_size(),
                  "sum": everyone.item(), "mesh": rows, "rack": os.environ["TOPOLOGY_RACK"],
                  "within": within.item(), "across": across.item()}), flush=True)
dist.destroy_process_group()
