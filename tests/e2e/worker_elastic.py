"""An elastic trainer as torchrun runs it: each time torchrun (re)starts it, it joins the world torchrun formed,
records the world it sees, then keeps reducing until torchrun stops it (a change of members fails or stops it).
Argument: the file to record in (one line per world: pod, world size, the all_reduce sum)."""

import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
world = dist.get_world_size()
value = torch.tensor([1.0])
dist.all_reduce(value)
with open(sys.argv[1], "a") as record:
    record.write(f"{os.environ['TOPOLOGY_ROLE']} world={world} sum={value.item():.0f} "
                 f"restart={os.environ.get('TORCHELASTIC_RESTART_COUNT', '?')}\n")
while True:  # a peer that leaves breaks the next all_reduce; a peer that joins makes torchrun restart us
    time.sleep(0.2)
    dist.all_reduce(torch.tensor([1.0]))
