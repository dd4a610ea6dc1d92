"""Paddle's collective from paddle.env alone: run by ``python -m paddle.distributed.launch`` (which reads
PADDLE_MASTER, PADDLE_NNODES, PADDLE_RANK, POD_IP ...), all_reduce of every rank's rank + 1 over gloo, recorded,
then idle until the launcher stops it. Argument: the record file."""

import os
import signal
import sys
import time

import paddle
import paddle.distributed as dist

dist.init_parallel_env()
value = paddle.to_tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
with open(sys.argv[1], "a") as record:
    record.write(f"world={dist.get_world_size()} rank={dist.get_rank()} sum={float(value.numpy()[0]):.0f}\n")
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # a trainer would save its checkpoint here
while True:
    time.sleep(1)
