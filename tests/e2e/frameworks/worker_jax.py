"""One JAX process per pod from jax.env alone: a global sum over every process's value (process index + 1),
recorded, then idle until the launcher stops it. Argument: the record file."""

import os
import signal
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

# jax reads JAX_COORDINATOR_ADDRESS itself; the count and the id it does not (docs/frameworks.md).
jax.distributed.initialize(num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                           process_id=int(os.environ["JAX_PROCESS_ID"]))
mesh = jax.make_mesh((jax.device_count(),), ("i",))
values = np.full((jax.local_device_count(),), float(jax.process_index() + 1), np.float32)
array = jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), values)
total = float(jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(array))
with open(sys.argv[1], "a") as record:
    record.write(f"world={jax.process_count()} rank={jax.process_index()} sum={total:.0f}\n")
# jax's preemption notifier takes SIGTERM; a trainer saves its checkpoint here and exits (the launcher's SIGTERM).
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
while True:
    time.sleep(1)
