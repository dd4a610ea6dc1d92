"""The sandbox's Nodes, and what the scheduler and the kubelet do to a pod: bind it to a Node, then report it
Running at an IP.

Node ``node-K`` sits in rack ``rack-<K // 2>`` (two nodes a rack) and zone ``zone-<K // 4>``, labelled as
clouds and the agent's examples label them (``kubernetes.io/hostname``, ``topology.kubernetes.io/zone``,
``example.com/rack``); its InternalIP is ``127.0.1.<K+1>`` and its podCIDR ``127.<10 + K // 256>.<K % 256>.0/24``,
so every address is loopback. The scheduler spreads: a pod goes to the Node with the fewest pods (the lowest
index among equals), as the default scheduler's balanced allocation does for equal pods; the kubelet gives it
the first free address of the Node's podCIDR. A Node created by hand, without a podCIDR in 127.0.0.0/8, takes
its pods' addresses from one pool (127.1.0.1 and up, as a network plugin with cluster-wide address management
does), and reports 127.0.0.1 as its own address when it has no InternalIP.
"""

from __future__ import annotations

import ipaddress
import itertools

from agent.examples import RACK, ZONE, container_statuses, loopback_ip
from agent.sandbox.store import Obj, Store, clone, now

NODES = "/v1/nodes"
PODS = "/v1/pods"
EVENTS = "/v1/events"
MAX_NODES = 1000
SCHEDULER = "default-scheduler"
LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")


def _letters(n: int) -> str:
    """a, b, ..., z, ba, bb, ...: a short name for the n-th rack or zone."""
    out = ""
    while True:
        n, k = divmod(n, 26)
        out = chr(ord("a") + k) + out
        if n == 0:
            return out


def node_ip(index: int) -> str:
    return f"127.0.{1 + index // 254}.{index % 254 + 1}"


def make_node(index: int) -> Obj:
    """Node ``node-<index>`` as the kubelet registers it, with its topology labels."""
    name = f"node-{index}"
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", ZONE: f"zone-{_letters(index // 4)}",
                RACK: f"rack-{_letters(index // 2)}"}},
            "spec": {"podCIDR": f"127.{10 + index // 256}.{index % 256}.0/24"},
            "status": {"addresses": [{"type": "InternalIP", "address": node_ip(index)},
                                     {"type": "Hostname", "address": name}],
                       "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                       "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "kubelet is posting ready status"}]}}


def create_nodes(store: Store, count: int) -> None:
    for index in range(count):
        store.create(NODES, "", make_node(index))


def _node_ip(node: Obj) -> str:
    addresses = (node.get("status") or {}).get("addresses") or []
    found = next((a.get("address") for a in addresses if a.get("type") == "InternalIP"), None)
    return str(found) if found and _loopback_network(found) is not None else "127.0.0.1"


def _pick(store: Store) -> Obj | None:
    """The Ready Node with the fewest pods, the first of equals; None without one."""
    load: dict[str, int] = {}
    for pod in store.list(PODS, None):
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            load[node] = load.get(node, 0) + 1
    ready = [n for n in store.list(NODES, "") if any(c.get("type") == "Ready" and c.get("status") == "True"
                                                      for c in (n.get("status") or {}).get("conditions") or [])]
    ready.sort(key=lambda n: (load.get(n["metadata"]["name"], 0), int(n["metadata"]["name"].rpartition("-")[2])
                              if n["metadata"]["name"].rpartition("-")[2].isdigit() else 0, n["metadata"]["name"]))
    return ready[0] if ready else None


def _free_ip(store: Store, node: Obj) -> str | None:
    used = {(p.get("status") or {}).get("podIP") for p in store.list(PODS, None)}
    network = _loopback_network((node.get("spec") or {}).get("podCIDR"))
    if network is None:  # the pool: 127.1.0.1 and up, never a .0 or .255 host
        return next(ip for ip in (loopback_ip(n) for n in range(len(used) + 1)) if ip not in used)
    return next((str(ip) for ip in itertools.islice(network.hosts(), 65536) if str(ip) not in used), None)


def _loopback_network(cidr: object) -> ipaddress.IPv4Network | None:
    """An address or podCIDR the sandbox may use: inside 127.0.0.0/8 only (never another address)."""
    try:
        network = ipaddress.ip_network(str(cidr), strict=False) if cidr else None
    except ValueError:
        return None
    return network if isinstance(network, ipaddress.IPv4Network) and network.subnet_of(LOOPBACK) else None


def place(store: Store, namespace: str, name: str) -> Obj | None:
    """Bind a Pending pod to a Node, then run it there (two writes, as the scheduler's binding and the kubelet's
    status are); None when no Node has room."""
    node = _pick(store)
    ip = _free_ip(store, node) if node else None
    if node is None or ip is None:
        return None
    node_name = node["metadata"]["name"]
    pod = clone(store.get(PODS, namespace, name))
    pod["spec"]["nodeName"] = node_name
    pod.setdefault("status", {})["conditions"] = [_condition("PodScheduled")]
    pod["metadata"].pop("resourceVersion", None)
    store.replace(PODS, namespace, name, pod)
    record_event(store, store.get(PODS, namespace, name), "Scheduled",
           f"Successfully assigned {namespace}/{name} to {node_name}")
    pod = clone(store.get(PODS, namespace, name))
    host = _node_ip(node)
    started = now()
    pod["status"] = {
        "phase": "Running", "hostIP": host, "hostIPs": [{"ip": host}], "podIP": ip, "podIPs": [{"ip": ip}],
        "startTime": started, "qosClass": "BestEffort",
        "conditions": [_condition(kind) for kind in ("PodReadyToStartContainers", "Initialized", "Ready",
                                                     "ContainersReady", "PodScheduled")],
        "containerStatuses": container_statuses(pod["spec"].get("containers") or []),
        **({"initContainerStatuses": [_completed(c) for c in pod["spec"]["initContainers"]]}
           if pod["spec"].get("initContainers") else {})}
    pod["metadata"].pop("resourceVersion", None)
    return store.replace(PODS, namespace, name, pod)


def _condition(kind: str) -> Obj:
    return {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": now()}


def _completed(container: Obj) -> Obj:
    return {"name": container.get("name", ""), "image": container.get("image", ""), "ready": True, "restartCount": 0,
            "started": False, "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now(),
                                                        "finishedAt": now()}}}


def record_event(store: Store, obj: Obj, reason: str, message: str, *, kind: str = "Normal",
           source: str = SCHEDULER) -> None:
    """A v1 Event about ``obj``, as the component ``source`` records it (kubectl describe lists it)."""
    meta = obj["metadata"]
    stamp = now()
    store.create(EVENTS, meta.get("namespace", ""), {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}."},
        "involvedObject": {"apiVersion": obj.get("apiVersion", ""), "kind": obj.get("kind", ""),
                           "name": meta["name"], "namespace": meta.get("namespace", ""), "uid": meta.get("uid", ""),
                           "resourceVersion": meta.get("resourceVersion", "")},
        "reason": reason, "message": message, "type": kind, "source": {"component": source},
        "reportingComponent": source, "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1})


