"""A Ray driver on the head pod, from ray.env alone (``ray.init()`` reads RAY_ADDRESS): waits until the cluster
has the expected nodes alive, runs one task pinned to each node, and records the IPs the tasks ran at and the sum
of what they returned. Arguments: the expected node count, the record file."""

import sys
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

expected, record = int(sys.argv[1]), sys.argv[2]
ray.init()
deadline = time.monotonic() + 180
while len(nodes := [n for n in ray.nodes() if n["Alive"]]) < expected:
    if time.monotonic() > deadline:
        raise SystemExit(f"only {len(nodes)} of {expected} Ray nodes alive after 180 s")
    time.sleep(0.2)


@ray.remote(num_cpus=1)
def where(value: int) -> tuple[str, int]:
    return ray.util.get_node_ip_address(), value


results = ray.get([where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                   .remote(k + 1) for k, n in enumerate(nodes)])
with open(record, "a") as handle:
    handle.write(f"world={len(nodes)} nodes={','.join(sorted(ip for ip, _ in results))} "
                 f"sum={sum(v for _, v in results)}\n")
