"""A Ray node from ray.env alone, as KubeRay starts one: on the head (RAY_ADDRESS is 127.0.0.1:<port>, as KubeRay
gives its head) ``ray start --head`` on RAY_PORT, elsewhere ``ray start --address=$RAY_ADDRESS``. The node's IP
is the pod's (its host name resolves to it, as in a pod). Ray follows membership itself: a node that reaches the
head joins, nobody restarts anything."""

import os
import socket

common = ["--block", f"--node-ip-address={socket.gethostbyname(socket.gethostname())}", "--num-cpus=1",
          "--object-store-memory=100000000", "--disable-usage-stats"]
address = os.environ["RAY_ADDRESS"]
if address.startswith("127.0.0.1:"):
    argv = ["ray", "start", "--head", f"--port={os.environ['RAY_PORT']}", "--include-dashboard=false", *common]
else:
    argv = ["ray", "start", f"--address={address}", *common]
os.execvp("ray", argv)
