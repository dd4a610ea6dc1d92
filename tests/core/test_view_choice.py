"""Which view each pod writes (agent/core/publication/view_choice.py): one row per kind of pod, from its role, its
controller, the frameworks selected, its SSH material and whether its job publishes; the plan it is asked with is its
whole plan (a pod that holds every member) or the one its own view makes from the leader's summary (a follower)."""

from __future__ import annotations

from typing import Any

import pytest

from agent import examples
from agent.core import Options, render_pod
from agent.core.controllers import VOLCANO
from agent.core.model import FrameworkOptions
from agent.core.plan.layout import Plan
from agent.core.pods.placement import DEFAULT_LEVELS
from agent.core.publication.summary import light_plan, own_view, read_summary, summarize, summary_text
from agent.core.publication.view_choice import SMALL_JOB, choose_view

OWN = None  # the pod writes its own view

LAUNCHES = "it launches over SSH"
ROWS: list[tuple[str, Any, str, dict[str, Any], bool, bool, str | None]] = [
    # id, pods, the pod, options (frameworks: names), ssh, published, why it writes every member (OWN: it does not)
    ("small job: every pod reads the pods", examples.volcano_job, "demo-worker-1", {}, False, False, SMALL_JOB),
    ("small job, --view own", examples.volcano_job, "demo-worker-1", {"view": "own"}, False, False, OWN),
    ("large job: a worker", examples.volcano_job, "demo-worker-1", {}, False, True, OWN),
    ("large job: rank 0 without SSH", examples.volcano_job, "demo-master-0", {}, False, True, OWN),
    ("large job: rank 0 with SSH launches", examples.volcano_job, "demo-master-0", {}, True, True, LAUNCHES),
    ("large job: a worker with SSH is launched", examples.volcano_job, "demo-worker-2", {}, True, True, OWN),
    # its hostfile from the summary where every host's DNS name follows its index, in rank 0's domain
    ("large job: rank 0 with SSH, hosts named by DNS after their indices", lambda: _ds_job(40), "demo-master-0",
     {"address": "dns"}, True, True, OWN),
    ("large job: rank 0 with SSH, 40 hosts by IP", lambda: _ds_job(40), "demo-master-0", {}, True, True, LAUNCHES),
    ("PyTorchJob: the master with SSH, one-label DNS names", examples.pytorchjob, "mnist-master-0",
     {"address": "dns"}, True, True, LAUNCHES),
    ("large job: a role that does not train", examples.volcano_job, "demo-extras-0", {}, False, True,
     "role 'extras' does not train"),
    ("--view full", examples.volcano_job, "demo-worker-1", {"view": "full"}, False, True, "--view full"),
    ("--view own, rank 0 with SSH", examples.volcano_job, "demo-master-0", {"view": "own"}, True, True, OWN),
    # its own domains from its own Node, its place from its block of the rank order (core/publication/blocks.py)
    ("--view own with --topology-levels", examples.volcano_job, "demo-worker-1",
     {"view": "own", "levels": DEFAULT_LEVELS}, False, True, OWN),
    ("--rank-order topology, a small job: every member, as always", examples.volcano_job, "demo-worker-1",
     {"rank_order": "topology", "levels": DEFAULT_LEVELS}, False, True, "ranks by Node labels"),
    ("large job: --rank-order topology", lambda: _ds_job(299), "demo-worker-1",
     {"rank_order": "topology", "levels": DEFAULT_LEVELS}, False, True, OWN),
    ("large job: --topology-levels", lambda: _ds_job(299), "demo-worker-1", {"levels": DEFAULT_LEVELS}, False,
     True, OWN),
    ("PyTorchJob: the master", examples.pytorchjob, "mnist-master-0", {}, False, True, OWN),
    ("PyTorchJob: the master with SSH", examples.pytorchjob, "mnist-master-0", {}, True, True, LAUNCHES),
    ("MPIJob: the launcher", examples.mpijob, "allreduce-launcher", {}, True, True, "role 'launcher'"),
    ("MPIJob: worker 0 with SSH, the launcher is another pod", examples.mpijob, "allreduce-worker-0", {}, True,
     True, OWN),
    # TF_CONFIG names every task by address: the summary lists a small role's, and gives a large role's as a
    # template where the pods' names follow their indices (DNS names); IPs follow nothing
    ("TFJob: a worker (TF_CONFIG, small roles)", examples.tfjob, "mnist-tf-worker-1", {}, False, True, OWN),
    ("TFJob: the chief (TF_CONFIG, small roles)", examples.tfjob, "mnist-tf-chief-0", {}, False, True, OWN),
    ("--frameworks tf, 40 workers by DNS name: a template", lambda: _tf_job(40), "demo-worker-7",
     {"frameworks": ("tf",), "address": "dns"}, False, True, OWN),
    ("--frameworks tf, 40 workers by IP: no template", lambda: _tf_job(40), "demo-worker-7",
     {"frameworks": ("tf",)}, False, True, "TensorFlow files"),
    ("--frameworks tf, 40 workers by DNS name, --view full", lambda: _tf_job(40), "demo-worker-7",
     {"frameworks": ("tf",), "address": "dns", "view": "full"}, False, True, "--view full"),
    ("--frameworks mlx: the ring hostfile", examples.volcano_job, "demo-worker-1", {"frameworks": ("mlx",)}, False,
     True, "MLX (ring) files"),
    ("--frameworks mpi: every training pod's hostfile", examples.volcano_job, "demo-worker-1",
     {"frameworks": ("mpi",)}, False, True, "MPI (OpenMPI, Intel MPI, MPICH) files"),
    ("--frameworks jax,paddle,ray,xgboost: rank 0 and the sizes", examples.volcano_job, "demo-worker-1",
     {"frameworks": ("jax", "paddle", "ray", "xgboost")}, False, True, OWN),
    ("--frameworks tf --view own: written without values", examples.volcano_job, "demo-worker-1",
     {"frameworks": ("tf",), "view": "own"}, False, True, OWN),
    ("JAXJob: a worker", examples.jaxjob, "jax-worker-1", {}, False, True, OWN),
    ("XGBoostJob: a worker", examples.xgboostjob, "xgb-worker-1", {}, False, True, OWN),
]


def _ds_job(workers: int) -> list[dict[str, Any]]:
    return examples.volcano_job("demo", (("master", 1), ("worker", workers)))


def _tf_job(workers: int) -> list[dict[str, Any]]:
    return examples.volcano_job("demo", (("chief", 1), ("worker", workers)))


def _find(pods: list[dict[str, Any]], start: str) -> str:
    """The pod whose name is ``start`` or begins with it (a launcher's name ends in a hash)."""
    return next(p["metadata"]["name"] for p in pods if p["metadata"]["name"].startswith(start))


def _options(settings: dict[str, Any]) -> Options:
    settings = {"address": "ip", **settings}
    return Options(frameworks=FrameworkOptions(names=settings.pop("frameworks", ())), **settings)


def _own_plan(pods: list[dict[str, Any]], me: str, options: Options, *, ssh: bool = False) -> Plan | None:
    """The plan a follower makes from the summary the leader (the first pod, which holds every member) publishes."""
    leader = render_pod(pods, pods[0]["metadata"]["name"], options).plan
    raw = summarize(leader, seq=1, options=options, ssh=ssh)
    summary = read_summary(summary_text(raw)) if raw is not None else None
    own = next(p for p in pods if p["metadata"]["name"] == me)
    return light_plan(summary, own, options, ssh=ssh) if summary is not None else None


@pytest.mark.parametrize(("make", "start", "settings", "ssh", "published", "why"), [r[1:] for r in ROWS],
                         ids=[r[0] for r in ROWS])
def test_each_pod_writes_the_view_its_files_need(make, start, settings, ssh, published, why):
    pods = make()
    me, options = _find(pods, start), _options(settings)
    nodes = None
    if "levels" in settings:  # every pod on a Node of its own, in one zone
        for k, pod in enumerate(pods):
            pod["spec"]["nodeName"] = f"node-{k}"
        nodes = {f"node-{k}": {"topology.kubernetes.io/zone": "z"} for k in range(len(pods))}
    whole = render_pod(pods, me, options, nodes=nodes).plan
    chosen = choose_view(whole, options, ssh=ssh, published=published)
    if why is None:
        assert chosen is None, chosen
    else:
        assert chosen is not None and why in chosen, chosen
    own = _own_plan(pods, me, options, ssh=ssh) if whole.topology.me.training and "levels" not in settings else None
    if own is not None and published:  # a follower asks with its own view's plan, and must be told the same
        assert choose_view(own, options, ssh=ssh, published=True) == chosen
    made, said = own_view(whole, options, ssh=ssh, published=published)  # a pod that holds every member
    assert (made is None) == (why is not None) and (said == (chosen or ""))


def test_a_port_only_rank_0_names_sends_a_follower_to_every_member(monkeypatch):
    """A framework the leader did not select publishes no port; a follower that selects it cannot find the port
    named on rank 0's container: its files would be written without values, so it holds every member instead."""
    monkeypatch.setattr(VOLCANO, "framework_port", lambda key: ("jaxjob-port", 6666) if key == "jax" else None)
    pods = examples.volcano_job()
    pods[0]["spec"]["containers"][0]["ports"].append({"name": "jaxjob-port", "containerPort": 6001})
    own = _own_plan(pods, "demo-worker-1", Options(address="ip"))
    assert own is not None and own.published_ports == {}
    jax = Options(address="ip", frameworks=FrameworkOptions(names=("jax",)))
    why = choose_view(own, jax, ssh=False, published=True)
    assert why is not None and "JAX files (jax.env) need more than its own view" in why and "--jax-port" in why
    assert choose_view(render_pod(pods, "demo-worker-1", jax).plan, jax, ssh=False, published=True) is None
    assert choose_view(own, Options(address="ip", view="own", frameworks=jax.frameworks), ssh=False,
                       published=True) is None  # --view own: written without values, as asked
