"""``topology-agent demo``: the agent at work on an example Volcano job, with no cluster.

Starts the sandbox API server playing the controllers (``sandbox --controllers``: Volcano, the scheduler and the
kubelet) and the admission webhook (``topology-agent webhook``, a real process the sandbox calls over TLS,
installed from manifests/webhook), labels the namespace (the one line of adoption, its settings as annotations),
creates two racks of Nodes, and applies a Volcano PyTorch job (master, 3 workers, 1 non-training task) whose
templates hold no agent: the sandbox creates its pods as Volcano does, the webhook injects the agent, and the
sandbox's scheduler spreads them over the Nodes, racks in turn, and runs them at loopback IPs. One real
``topology-agent init`` process per pod then runs with the arguments the webhook wrote (each sees the sandbox as
its in-cluster API server, ``--rank-order topology`` from the namespace), writes ``./demo-out/<pod>/``, and the
demo prints what each pod got: ranks in rack order, rank 0 still the master. Then the job is scaled up and the
sidecars follow. The pods and Nodes are saved as kubectl prints them (``pods.json``, ``nodes.json``), so
``explain`` on them shows what a pod's files say.

The output folder is the demo's own: a marker file says so, and a second run removes only what the demo writes
there (``OWN``); a non-empty folder without the marker, or with anything else in it, is refused, so the demo never
deletes a file it did not make.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any, TextIO, cast

from agent import examples
from agent.files.writing import write_files
from agent.k8s.client import Client
from agent.sandbox.store import clone
from agent.sandbox.threaded import SandboxThread

NAMESPACE = "default"
JOBS = "batch.volcano.sh/v1alpha1"
PODS = "/v1/pods"
VOLCANO_JOB = "volcano.sh/job-name"
JOB = "demo"
TASKS = (("master", 1), ("worker", 3), ("extras", 1))
TOPOLOGY = ("--rank-order", "topology", "--topology-levels", f"{examples.ZONE},{examples.RACK}")
NEWCOMER = "demo-worker-3"  # the worker the scale-up adds
MARKER = ".made-by-topology-agent-demo"  # in the output folder: the demo made it (no writer's temp prefix)
# Everything the demo writes in its output folder: one folder per pod, the sandbox's state, the saved objects.
OWN = frozenset({MARKER, ".sandbox", "pods.json", "nodes.json", NEWCOMER,
                 *(f"{JOB}-{task}-{i}" for task, n in TASKS for i in range(n))})


def volcano_owner() -> dict[str, object]:
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": JOB, "namespace": NAMESPACE, "uid": examples.owner_uid("vcjob", NAMESPACE, JOB)},
        "spec": {"minAvailable": 5, "schedulerName": "volcano",
                 "plugins": {"pytorch": ["--master=master", "--worker=worker", "--port=23456"], "svc": [], "env": []},
                 "tasks": [{"name": name, "replicas": n, "template": {}} for name, n in TASKS]},
    }


# The shipped MutatingWebhookConfiguration, as package data: agent/runtime/ holds a link to the one in
# manifests/webhook, and the wheel carries the file itself (pyproject.toml's package-data), so an installed agent
# reads it from its own package and never from a source tree.
WEBHOOK_CONFIG = "mutatingwebhookconfiguration.yaml"
SHIPPED_AS = "manifests/webhook/mutatingwebhookconfiguration.yaml"
WEBHOOK_SERVICE = "topology-agent-system/topology-agent-webhook"
# The namespace's settings for every job in it (the webhook reads them): pods found by IP (the sandbox has no DNS),
# ranks in rack order.
SETTINGS = {"address": "ip", "timeout": "120", "rank-order": "topology",
            "topology-levels": f"{examples.ZONE},{examples.RACK}"}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def job_manifest() -> dict[str, Any]:
    """The demo's Volcano Job as a user writes it: the tasks' templates hold the trainer only (no agent), and
    the namespace's webhook adds the agent to each pod Volcano creates."""
    import copy

    trainer = examples.trainer_container(port=23456, cpu="1")
    trainer.pop("volumeMounts")
    template = {"spec": {"containers": [trainer], "restartPolicy": "Never"}}
    job = cast(dict[str, Any], volcano_owner())
    job["metadata"].pop("uid")
    for task in job["spec"]["tasks"]:
        task["template"] = copy.deepcopy(template)
    return job


def nodes() -> list[dict[str, Any]]:
    """Five Nodes, racks a and b in turn: the sandbox's scheduler puts one pod on each in the job's order, the
    placement a spreading scheduler gives and the worst case for index order (every ring hop crosses racks)."""
    return [examples.node(f"node-{k}", {examples.ZONE: "zone-a", examples.RACK: f"rack-{'ab'[k % 2]}"})
            for k in range(sum(n for _, n in TASKS))]


def _running(sandbox: SandboxThread, count: int, what: Any = None) -> dict[str, dict[str, Any]]:
    """The job's pods once ``count`` of them run (``what``: a pod name that must be among them), as stored;
    OutputError, with the job's Warning Events, if they do not within 30 s."""
    import concurrent.futures

    from agent.errors import OutputError

    def test(store: Any) -> dict[str, dict[str, Any]] | None:
        pods = {p["metadata"]["name"]: clone(p) for p in store.list(PODS, NAMESPACE)
                if p["metadata"]["labels"].get(VOLCANO_JOB) == JOB and p["status"].get("podIP")}
        return pods if len(pods) == count and (what is None or what in pods) else None

    try:
        return cast(dict[str, dict[str, Any]], sandbox.wait_for(PODS, test))
    except (TimeoutError, concurrent.futures.TimeoutError):
        events = sandbox.call(_warnings(sandbox))
        raise OutputError(f"the sandbox did not run {count} pods of Volcano Job '{JOB}' within 30 s"
                          + (f": {events}" if events else "")) from None


async def _warnings(sandbox: SandboxThread) -> str:
    """The Warning Events of the demo's namespace, one line (the controllers' FailedCreate says why)."""
    return "; ".join(f"{e.get('reason')}: {e.get('message')}" for e in sandbox.sandbox.store.list("/v1/events",
                                                                                                 NAMESPACE)
                     if e.get("type") == "Warning")[:600]


def start_webhook(sandbox: SandboxThread, port: int, write: Any) -> subprocess.Popen[str] | None:
    """Install the shipped MutatingWebhookConfiguration and run `topology-agent webhook` for it; None if it
    does not serve within 30 s (what it printed is shown)."""
    import yaml

    sandbox.create("/v1/namespaces", "", {"apiVersion": "v1", "kind": "Namespace",
                                          "metadata": {"name": "topology-agent-system"}})
    sandbox.create("admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", "",
                   yaml.safe_load(resources.files("agent.runtime").joinpath(WEBHOOK_CONFIG).read_text()))
    env = {**os.environ, "KUBECONFIG": str(sandbox.sandbox.kubeconfig), "POD_NAMESPACE": "topology-agent-system"}
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "webhook", "--host", "127.0.0.1", "--port",
                             str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        config = sandbox.sandbox.store.get("admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", "",
                                           "topology-agent")
        if all(h.get("clientConfig", {}).get("caBundle") for h in config["webhooks"]) and _answers(port):
            write(f"webhook: installed {SHIPPED_AS} and started `topology-agent webhook` on "
                  f"127.0.0.1:{port} (the Service {WEBHOOK_SERVICE}); it made its CA and wrote the caBundle\n")
            return proc
        time.sleep(0.05)
    proc.terminate()
    write(f"the webhook did not start: {(proc.communicate(timeout=15)[1] or '').strip()[-300:]}\n")
    return None


def _answers(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def label_namespace(api: Client, write: Any) -> None:
    """The one line of adoption: the namespace's label, and its jobs' settings as its annotations."""
    from agent.core.adoption.injection import INJECT_LABEL, PREFIX

    namespace = api.get_object(f"/api/v1/namespaces/{NAMESPACE}")
    namespace["metadata"].setdefault("labels", {})[INJECT_LABEL] = "enabled"
    namespace["metadata"].setdefault("annotations", {}).update({PREFIX + k: v for k, v in SETTINGS.items()})
    api.replace(f"/api/v1/namespaces/{NAMESPACE}", namespace)
    write(f"labelled namespace '{NAMESPACE}' {INJECT_LABEL}=enabled: the one line; its jobs' settings are "
          f"its annotations: {', '.join(f'{k}={v}' for k, v in SETTINGS.items())}\n")


def apply_job(sandbox: SandboxThread, api: Client, write: Any) -> dict[str, dict[str, Any]]:
    """Create the Volcano Job as ``kubectl apply`` does; the sandbox, playing Volcano, the scheduler and the
    kubelet, creates its pods through the webhook and runs them on the Nodes: each pod as stored."""
    api.create(f"/apis/{JOBS}/namespaces/{NAMESPACE}/jobs", job_manifest())
    stored = _running(sandbox, sum(n for _, n in TASKS))
    first = stored[f"{JOB}-master-0"]
    init = first["spec"]["initContainers"][0]
    write(f"applied Volcano Job '{JOB}' ({', '.join(f'{t} x{n}' for t, n in TASKS)}); the sandbox, playing Volcano, "
          "the scheduler and the kubelet, created its pods from templates with no agent in them\n")
    write(f"  the webhook added to each pod: init container '{init['name']}' ({' '.join(init['args'])}), "
          f"volume topology-agent-shared mounted at /shared, ServiceAccount {first['spec']['serviceAccountName']}\n")
    return stored


def run_inits(sandbox: SandboxThread, stored: dict[str, dict[str, Any]], racks: dict[str, str], out: Path,
              write: Any) -> int:
    """Start each pod's init with the arguments the webhook wrote, and wait for them all: the number that
    failed."""
    procs = {}
    write("the pods run, one a Node; each pod's init container starts with the arguments the webhook wrote...\n")
    for name, pod in stored.items():
        args = pod["spec"]["initContainers"][0]["args"]
        args = [a for i, a in enumerate(args) if a != "--out" and (i == 0 or args[i - 1] != "--out")]
        env = {**os.environ, **sandbox.client_env(), "POD_NAME": name, "POD_NAMESPACE": NAMESPACE}
        env.pop("KUBECONFIG", None)
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", *args, "--out", str(out / name)], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        node = pod["spec"]["nodeName"]
        write(f"  {name} is Running at {pod['status']['podIP']} on {node} ({racks[node]}); its init reads the "
              "gang\n")
    failed = 0
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=180)
        if proc.returncode != 0:
            failed += 1
            write(f"init for {name} failed ({proc.returncode}): {err.strip().splitlines()[-1:]}\n")
    return failed


def clean_output(out: Path) -> list[str]:
    """Make ``out`` the demo's own and empty of an earlier run's files: the names removed. A folder with
    anything in it that the demo did not make is refused, and nothing is removed."""
    import shutil

    from agent.errors import OutputError

    out.mkdir(parents=True, exist_ok=True)
    present = sorted(p.name for p in out.iterdir())
    foreign = [name for name in present if name not in OWN]
    if present and (MARKER not in present or foreign):
        shown = ", ".join((foreign or present)[:5]) + (" ..." if len(foreign or present) > 5 else "")
        raise OutputError(f"--out {out} holds files the demo did not make ({shown}); the demo starts from an empty "
                          "folder and removes only its own files: give a new or empty folder, e.g. --out ./demo-out")
    removed = [name for name in present if name != MARKER]
    for name in removed:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    (out / MARKER).write_text("made by topology-agent demo: a second run removes what it wrote here\n")
    return removed


def run_demo(out: Path, *, stream: TextIO | None = None) -> int:
    from agent.k8s.config import load_config

    write = (stream or sys.stdout).write
    out = out.resolve()
    removed = clean_output(out)
    if removed:
        write(f"removed the files of an earlier demo from {out}: {', '.join(removed)}\n")
    made = nodes()
    racks = {n["metadata"]["name"]: n["metadata"]["labels"][examples.RACK] for n in made}
    with SandboxThread(out / ".sandbox", controllers=True, nodes=0) as sandbox:
        write(f"sandbox API server at {sandbox.sandbox.url} (kubeconfig: {sandbox.sandbox.kubeconfig})\n")
        # The webhook's port is picked once the sandbox listens: picked before, the sandbox's own port could be
        # the one just let go, and the sandbox then answered the webhook's calls itself (a CI run's failure).
        port = _free_port()
        sandbox.sandbox.admission.services[WEBHOOK_SERVICE] = f"127.0.0.1:{port}"
        webhook = start_webhook(sandbox, port, write)
        if webhook is None:
            return 1
        try:
            api = Client(load_config(str(sandbox.sandbox.kubeconfig)), user_agent="topology-agent demo")
            label_namespace(api, write)
            for node in made:
                sandbox.create_node(node)
            write(f"created {len(made)} Nodes in two racks (label {examples.RACK}): "
                  + ", ".join(f"{name}={rack}" for name, rack in racks.items()) + "\n")
            stored = apply_job(sandbox, api, write)
            sandbox.reset_stats()
            failed = run_inits(sandbox, stored, racks, out, write)
            stats = sandbox.stats()
            if failed:
                return 1
            write("\n" + format_table(out, list(stored)) + "\n")
            write(rack_summary(out / "demo-worker-0") + "\n")
            if not show_sidecar(sandbox, api, out, write):  # the scale-up's pod meets the webhook too
                return 1
        finally:
            webhook.terminate()
            webhook.wait(15)
        # kubectl get pods -o json and get nodes -o json, for explain: the demo's own job, as it is at the end
        write_files(out, {
            "pods.json": json.dumps(api.get_object(f"/api/v1/namespaces/{NAMESPACE}/pods"), indent=1).encode(),
            "nodes.json": json.dumps(api.get_object("/api/v1/nodes"), indent=1).encode()})
    write("\n" + api_load(stats, len(stored)) + "\n")
    write(f"Try: cat {out / 'demo-worker-0' / 'torch.env'}  |  topology-agent explain --pods {out / 'pods.json'} "
          f"--nodes {out / 'nodes.json'} --self demo-worker-0   (the same values, each with its rule; explain "
          "takes the pod's options from its init container)\n")
    return 0


def api_load(stats: dict[str, Any], pods: int) -> str:
    """The init step's requests, and why the count moves between runs."""
    events = sum(entry["requests"] for agent, entry in stats["byAgent"].items() if " events (" in agent)
    return (f"API load of the init step: {stats['requests']} requests for {pods} pods ({events} of them Event "
            f"writes; {stats['watches']} watches); bytes sent {stats['bytes']}. The count moves by a few between "
            "runs: an init that starts once its whole gang is there lists the pods once, one that starts earlier "
            "watches until the gang is complete, and which does depends on when the processes start")


def _generation(directory: Path) -> int:
    try:
        return int((directory / "generation").read_text())
    except (OSError, ValueError):
        return 0


def _joined(shared: Path, name: str) -> dict[str, Any] | None:
    """The pod's topology.json once it names ``name`` a member (files are renamed into place: never half)."""
    try:
        document = json.loads((shared / "topology.json").read_text())
    except (OSError, ValueError):
        return None
    return document if any(m["name"] == name for m in document["members"]) else None


def _start_sidecar(sandbox: SandboxThread, shared: Path) -> subprocess.Popen[str]:
    env = {**os.environ, **sandbox.client_env(), "POD_NAME": shared.name, "POD_NAMESPACE": NAMESPACE}
    env.pop("KUBECONFIG", None)
    return subprocess.Popen([sys.executable, "-m", "agent.cli", "sidecar", "--out", str(shared), "--address", "ip",
                             "--debounce", "0.2", "--signal", "none", "--health-port", "0", *TOPOLOGY],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)


def show_sidecar(sandbox: SandboxThread, api: Client, out: Path, write: Any) -> bool:
    """Run the sidecars of the publisher (demo-master-0) and of demo-worker-0, add a Node in rack-a and scale
    the job to 4 workers, and show demo-worker-0's files following: the newcomer joins rack-a's block."""
    shared = out / "demo-worker-0"
    before = _generation(shared)
    write(f"\nstarting the sidecars of demo-master-0 (it publishes) and {shared.name} (generation "
          f"{before}, written by its init); adding a Node in rack-a and a worker...\n")
    procs = [_start_sidecar(sandbox, out / "demo-master-0"), _start_sidecar(sandbox, shared)]
    try:
        time.sleep(1.5)
        settled = _generation(shared)  # a generation the sidecar wrote at its start, before the scale-up
        sandbox.create_node(examples.node("node-5", {examples.ZONE: "zone-a", examples.RACK: "rack-a"}))
        path = f"/apis/{JOBS}/namespaces/{NAMESPACE}/jobs/{JOB}"
        job = api.get_object(path)
        worker = next(t for t in job["spec"]["tasks"] if t["name"] == "worker")
        worker["replicas"] += 1
        started = time.monotonic()
        api.replace(path, job)
        pod = _running(sandbox, sum(n for _, n in TASKS) + 1, NEWCOMER)[NEWCOMER]
        write(f"  scaled Volcano Job '{JOB}' to {worker['replicas']} workers: {NEWCOMER} runs at "
              f"{pod['status']['podIP']} on {pod['spec']['nodeName']} (rack-a), the Node with no pod yet\n")
        deadline = started + 20
        # the newcomer's generation, not an earlier one: its Node arrived first
        while (document := _joined(shared, pod["metadata"]["name"])) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if document is None:
            write("  the sidecar did not follow within 20 s\n")
            return False
        env_now = document["env"]
        write(f"  generation {document['generation']} after {time.monotonic() - started:.2f} s "
              f"({_why_generation(before, settled, document['generation'])}): WORLD_SIZE={env_now['WORLD_SIZE']}, "
              f"NNODES={env_now['NNODES']}, {shared.name} is now NODE_RANK {env_now['NODE_RANK']}; hostfile in rank "
              "order:\n")
        racks = {m["address"]: (m["domains"] or {}).get("rack", "?") for m in document["members"]}
        for line in (shared / "hostfile").read_text().splitlines():
            write(f"    {line:<24} # {racks.get(line.split()[0], '?')}\n")
        return True
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(15)


def _why_generation(init: int, settled: int, now: int) -> str:
    """Why the generation shown is the number it is: each write of a pod's files is one generation."""
    why = f"init wrote {init}; the scale-up is one more"
    if settled > init:
        why += f"; the sidecar's first look had written {settled} (a pod's address changed since init)"
    if now > max(init, settled) + 1:
        why += f"; {now - max(init, settled) - 1} more while the newcomer's node and pod arrived one after the other"
    return why


def rack_summary(shared: Path) -> str:
    """Ring hops that cross racks: the controller's index order against the order the pods were given."""
    from agent.core.pods.placement import ring_crossings

    members = [m for m in json.loads((shared / "topology.json").read_text())["members"] if m["training"]]
    by_index = sorted(members, key=lambda m: (m["role"] != "master", m["index"]))
    paths = [((m["domains"] or {}).get("rack", ""),) for m in members]
    index_paths = [((m["domains"] or {}).get("rack", ""),) for m in by_index]
    return (f"ring hops between racks (NCCL builds its ring in rank order): index order "
            f"{ring_crossings(index_paths, 1)}, topology order {ring_crossings(paths, 1)} of {len(paths)}; "
            f"rank 0 is still {members[0]['name']}")


def format_table(out: Path, names: list[str]) -> str:
    header = (f"{'POD':<16} {'ROLE':<8} {'RACK':<7} {'NODE_RANK':>9} {'RANK':>5} {'WORLD_SIZE':>10}  "
              f"{'ADDRESS':<12} FILES")
    rows = [header]
    for name in names:
        doc = json.loads((out / name / "topology.json").read_text())
        env = doc["env"]
        me = next(m for m in doc["members"] if m["name"] == name)
        files = ", ".join(sorted(p.name for p in (out / name).iterdir() if not p.name.startswith(".")))
        rows.append(f"{name:<16} {me['role']:<8} {env.get('TOPOLOGY_RACK', '-'):<7} {env.get('NODE_RANK', '-'):>9} "
                    f"{env.get('RANK', '-'):>5} "
                    f"{env.get('WORLD_SIZE', '-'):>10}  {me['address']:<12} {out / name}/{{{files}}}")
    return "\n".join(rows)
