"""One MLX process per pod on the ring backend, from mlx.env (MLX_HOSTFILE, MLX_RANK) alone: all_sum of every
process's rank + 1, recorded, then idle until the launcher stops it. Argument: the record file."""

import os
import signal
import sys
import time

import mlx.core as mx

group = mx.distributed.init(backend="ring", strict=True)
total = mx.distributed.all_sum(mx.array([float(group.rank() + 1)]), group=group)
mx.eval(total)
with open(sys.argv[1], "a") as record:
    record.write(f"world={group.size()} rank={group.rank()} sum={total.item():.0f}\n")
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # a trainer would save its checkpoint here
while True:
    time.sleep(1)
