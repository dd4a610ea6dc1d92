"""How the frameworks' files reach a pod: which frameworks are selected, where each port comes from, ``--view
own``, the sidecar's rewrite decision, the file order, topology.json, explain, the settings, and the invariants
every pod of a job must share (a property test over random jobs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import examples
from agent.core import Options, Renderer, render_plan, render_pod
from agent.core.adoption.injection import COMMON_FLAGS, Settings, inject_document
from agent.core.controllers import CONTROLLERS, VOLCANO
from agent.core.files.explaining import format_explanation
from agent.core.files.frameworks import FRAMEWORKS, PORTED, selected
from agent.core.files.rendering import MARKERS, key_digest, membership_key_of_document, read_topology_json
from agent.core.files.variables import bracketed
from agent.core.model import FrameworkOptions, Processes
from agent.core.publication.summary import light_plan, own_view, read_summary, summarize, summary_text, view_key
from tests.core.test_frameworks import ALL, ipv6, part, rendered_with, volcano, written

GOLDEN = Path(__file__).parent / "golden" / "frameworks"


def _options(*names: str, **options: Any) -> Options:
    return Options(frameworks=FrameworkOptions(names=names), **options)


# --- selection and the torch-only path -----------------------------------------------------------------------------

def test_a_torch_only_job_selects_nothing_and_its_files_are_todays():
    rendered = render_pod(volcano(), "demo-worker-0", Options())
    assert selected(rendered.plan, Options()) == [] and rendered.frameworks == ()
    assert "frameworks" not in json.loads(rendered.files["topology.json"])
    assert list(rendered.files) == ["torch.env", "hostfile", "master.host", "worker.host", "extras.host",
                                    "discover_hosts.sh", "topology.json", "generation"]


def test_framework_files_come_before_the_markers_in_registry_order():
    names = list(rendered_with(volcano(), "demo-master-0").files)
    assert names[-2:] == list(MARKERS)
    assert names[6:-2] == ["jax.env", "tf.env", "tf_config.json", "xgboost.env", "xgboost.json", "paddle.env",
                           "mlx.env", "mlx_hostfile.json", "mpi.env", "hydra_hostfile", "ray.env"]


def test_every_framework_a_controller_implies_is_known_and_mpijob_implies_mpi():
    for controller in CONTROLLERS.values():
        assert set(controller.frameworks(())) <= set(FRAMEWORKS), controller.key
    assert CONTROLLERS["mpijob"].frameworks(()) == ("mpi",)
    implied = {c.key: c.frameworks(()) for c in CONTROLLERS.values() if c.frameworks(())}
    assert implied == {"tfjob": ("tf",), "xgboostjob": ("xgboost",), "paddlejob": ("paddle",), "jaxjob": ("jax",),
                       "mpijob": ("mpi",)}


def test_init_records_what_the_job_objects_imply():
    from agent.core.plan.gang import job_reads

    pods = examples.mpijob()
    reads = job_reads(pods[1], Options())
    next(reads)
    mpijob = {"kind": "MPIJob", "metadata": {"name": "allreduce", "uid": "u"},
              "spec": {"mpiReplicaSpecs": {"Launcher": {"replicas": 1}, "Worker": {"replicas": 3}}}}
    with pytest.raises(StopIteration) as done:
        reads.send(mpijob)
    assert done.value.value.options.frameworks.implied == (("mpi", "MPIJob 'allreduce'"),)


def test_every_port_has_a_setting_of_each_kind():
    assert {f"{key}-port" for key in PORTED} | {"frameworks"} <= set(COMMON_FLAGS)
    assert set(PORTED) == {"jax", "tf", "xgboost", "paddle", "mlx", "ray"}


def test_each_registry_row_names_its_frameworks_module_and_says_whether_it_has_a_port():
    # The registry imports a framework on first use, so its rows say what the parser needs before: held here to
    # the instances they name.
    for key, row in FRAMEWORKS.rows.items():
        framework = FRAMEWORKS[key]
        assert type(framework).__module__ == f"agent.core.files.frameworks.{key}"
        assert (framework.key, framework.has_port) == (key, row.ported)
    assert list(FRAMEWORKS) == ["jax", "tf", "xgboost", "paddle", "mlx", "mpi", "ray"]
    assert "torch" not in FRAMEWORKS and len(FRAMEWORKS) == 7


# --- ports: the precedence of MASTER_PORT ----------------------------------------------------------------------------

def _named_port(pods: list[dict[str, Any]], name: str, number: int) -> None:
    pods[0]["spec"]["containers"][0]["ports"].append({"name": name, "containerPort": number})


PORT_CASES = [
    ("the setting wins over the controller's named port", True, True, (("jax", 7000),), 7000, "--jax-port"),
    ("the controller's named port on rank 0's trainer container", True, True, (), 6001,
     "port 'jaxjob-port' of container 'trainer' in pod 'demo-master-0'"),
    ("no such port on rank 0: the controller's convention", True, False, (), 6666, "Volcano Job convention 6666"),
    ("a controller without a convention: the framework's own default", False, True, (), 55527,
     "jax's own Kubernetes port 55527 (jax/_src/clusters/k8s_cluster.py)"),
]


@pytest.mark.parametrize(("hook", "named", "ports", "number", "source"), [c[1:] for c in PORT_CASES],
                         ids=[c[0] for c in PORT_CASES])
def test_a_framework_port_comes_from_the_first_source_that_has_one(monkeypatch, hook, named, ports, number,
                                                                    source):
    if hook:  # as a JAXJob controller will say: port 'jaxjob-port', else 6666 (training-operator v1.9)
        monkeypatch.setattr(VOLCANO, "framework_port", lambda key: ("jaxjob-port", 6666) if key == "jax" else None)
    pods = volcano()
    if named:
        _named_port(pods, "jaxjob-port", 6001)
    rendition = part(rendered_with(pods, "demo-worker-0", ("jax",), ports=ports), "jax")
    assert rendition.port is not None and (rendition.port.number, rendition.port.source) == (number, source)
    assert written(rendition)["COORDINATOR_PORT"] == str(number)
    document = json.loads(rendered_with(pods, "demo-worker-0", ("jax",), ports=ports).files["topology.json"])
    assert document["frameworks"]["jax"]["port"] == number and document["frameworks"]["jax"]["portSource"] == source


# --- --view own: rank 0 and this pod ---------------------------------------------------------------------------

def _light(pods: list[dict[str, Any]], me: str, options: Options):
    """The plan a --view own pod makes from the summary its leader publishes (the leader holds every pod)."""
    leader = render_pod(pods, pods[0]["metadata"]["name"], options).plan
    summary = read_summary(summary_text(summarize(leader, seq=3, options=options)))  # type: ignore[arg-type]
    assert summary is not None
    own = next(p for p in pods if p["metadata"]["name"] == me)
    return light_plan(summary, own, options)


@pytest.mark.parametrize("address", ["dns", "ip"])
@pytest.mark.parametrize("me", ["demo-master-0", "demo-worker-1"])
def test_view_own_writes_what_rank_0_and_this_pod_decide_and_holds_back_the_rest(address, me):
    pods, options = volcano("2"), _options(*ALL, address=address, view="own")
    full = render_pod(pods, me, options)
    plan = _light(pods, me, options)
    assert plan is not None
    light = render_plan(plan, options)
    by_key = {r.key: r for r in light.frameworks}
    for key in ("jax", "paddle", "ray", "xgboost"):
        expected = written(part(full, key))
        expected.pop("WORKER_ADDRS", None)
        assert written(by_key[key]) == expected, key
        assert by_key[key].files.get("xgboost.json", b"") == part(full, key).files.get("xgboost.json", b"")
    assert by_key["xgboost"].port.number == part(full, "xgboost").port.number  # type: ignore[union-attr]
    assert "published by the job's leader" in by_key["xgboost"].port.source  # type: ignore[union-attr]
    # TF_CONFIG names the tasks by address, and the summary lists the addresses of roles this small: the same
    # files as the full view's (a large role's come as a template: test_summary.py)
    assert by_key["tf"].withheld is None and written(by_key["tf"]) == written(part(full, "tf"))
    assert by_key["tf"].files == part(full, "tf").files
    for key in ("mlx", "mpi"):  # their files name every member (mpi.env: the hostfile, not written here)
        rendition = by_key[key]
        assert rendition.withheld and "--view own holds rank 0 and this pod only" in rendition.withheld
        env_file = FRAMEWORKS[key].env_file
        assert b"export" not in rendition.files[env_file] and b"# not written: " in rendition.files[env_file]
        assert all(data in (b"null\n", b"") for name, data in rendition.files.items() if name != env_file)
    own, why = own_view(full.plan, options, ssh=False, published=True)
    assert why == "" and render_plan(own, options).files == light.files  # type: ignore[arg-type]


def test_view_own_with_a_named_port_the_leader_did_not_publish_holds_the_file_back(monkeypatch):
    monkeypatch.setattr(VOLCANO, "framework_port", lambda key: ("jaxjob-port", 6666) if key == "jax" else None)
    pods = volcano()
    _named_port(pods, "jaxjob-port", 6001)
    plan = _light(pods, "demo-worker-1", _options(view="own"))  # the leader selected no framework
    assert plan is not None and plan.published_ports == {}
    rendition = part(render_plan(plan, _options("jax", view="own")), "jax")
    assert rendition.withheld and "set --jax-port" in rendition.withheld
    asked = Options(view="own", frameworks=FrameworkOptions(names=("jax",), ports=(("jax", 6001),)))
    assert written(part(render_plan(plan, asked), "jax"))["COORDINATOR_PORT"] == "6001"
    published = _light(pods, "demo-worker-1", _options("jax", view="own"))
    assert published is not None and published.published_ports["jax"][0] == 6001
    assert written(part(render_plan(published, _options("jax", view="own")), "jax"))["COORDINATOR_PORT"] == "6001"


def test_a_summary_with_a_port_of_no_framework_is_refused():
    from agent.errors import InputError

    leader = render_pod(volcano(), "demo-master-0", _options("jax", view="own")).plan
    raw = summarize(leader, seq=1, options=_options("jax", view="own"))
    assert raw is not None and raw["ports"] == {"jax": [55527, "jax's own Kubernetes port 55527 "
                                                        "(jax/_src/clusters/k8s_cluster.py)"]}
    raw["ports"]["pytorch"] = [1, "x"]
    with pytest.raises(InputError, match="ports names 'pytorch'"):
        read_summary(summary_text(raw))
    assert "ports" not in summarize(leader, seq=1)  # type: ignore[operator]  # torch-only: the summary of today


# --- the sidecar: a rewrite exactly when a framework's files change ----------------------------------------------

def test_the_sidecars_key_follows_an_ip_in_mlx_hostfile_which_no_member_key_holds():
    options = _options("mlx")
    renderer = Renderer(options, "demo-worker-0")
    pods = {p["metadata"]["name"]: p for p in volcano()}
    first = renderer.render(pods, generation=1)
    moved = dict(pods)
    worker = json.loads(json.dumps(pods["demo-worker-2"]))
    worker["status"]["podIP"] = "127.1.9.9"
    worker["status"]["podIPs"] = [{"ip": "127.1.9.9"}]
    moved["demo-worker-2"] = worker
    second = renderer.render(moved, generation=2)
    assert renderer.membership_key(first) != renderer.membership_key(second)
    torch_only = Renderer(Options(), "demo-worker-0")
    assert torch_only.membership_key(torch_only.render(pods, generation=1)) == \
        torch_only.membership_key(torch_only.render(moved, generation=2))  # torch.env names no IP with dns


@pytest.mark.parametrize("names", [(), ALL], ids=["torch only", "every framework"])
def test_the_sidecar_continues_from_init_s_topology_json_without_a_new_generation(names):
    options = _options(*names)
    renderer = Renderer(options, "demo-worker-1")
    rendered = renderer.render({p["metadata"]["name"]: p for p in volcano()}, generation=4)
    document = json.loads(rendered.files["topology.json"])
    assert membership_key_of_document(document) == tuple(renderer.membership_key(rendered))
    header, key = read_topology_json(rendered.files["topology.json"].decode())  # the sidecar's streamed read
    assert key == key_digest(renderer.membership_key(rendered))
    assert header == {k: v for k, v in document.items() if k != "members"}


def test_a_view_own_pod_s_key_read_back_from_topology_json_is_the_rendered_one():
    from agent.runtime.sidecar.evaluating import _own_key

    options = _options(*ALL, view="own")
    plan = _light(volcano(), "demo-worker-1", options)
    rendered = render_plan(plan, options)  # type: ignore[arg-type]
    document = json.loads(rendered.files["topology.json"])
    assert view_key(document["env"], document["frameworks"]) == _own_key(rendered)


# --- explain, topology.json, the settings ----------------------------------------------------------------------

def test_explain_names_the_source_of_every_framework_variable_and_who_gets_nothing():
    worker = format_explanation(rendered_with(volcano(), "demo-worker-1"))
    for line in ("framework jax (selected by --frameworks): files jax.env; port 55527",
                 "JAX_COORDINATOR_ADDRESS=demo-master-0.demo:55527", "# address of node rank 0, pod 'demo-master-0'",
                 "framework tf (selected by --frameworks): files tf.env, tf_config.json",
                 "PADDLE_RANK=2", "# NODE_RANK (PaddleJob writes none)", "RAY_ADDRESS=demo-master-0.demo:6379"):
        assert line in worker, line
    rendered = rendered_with(volcano(), "demo-worker-1")
    for rendition in rendered.frameworks:
        assert all(v.source for v in rendition.variables), rendition.key
    extras = format_explanation(rendered_with(volcano(), "demo-extras-0"))
    assert "framework jax (selected by --frameworks): files none" in extras
    assert "note: not written to this pod: role 'extras' is not a training role (master, worker)" in extras


def test_topology_json_holds_each_frameworks_values_and_port_source():
    document = json.loads(rendered_with(volcano(), "demo-worker-1", ("paddle", "tf")).files["topology.json"])
    paddle = document["frameworks"]["paddle"]
    assert paddle["env"]["PADDLE_RANK"] == "2" and paddle["port"] == 36543
    assert paddle["portSource"] == "PaddleJob's default 36543" and paddle["files"] == ["paddle.env"]
    assert paddle["selectedBy"] == "--frameworks" and paddle["withheld"] is None
    assert set(document["frameworks"]) == {"tf", "paddle"}


def test_the_settings_come_from_flags_variables_and_annotations(monkeypatch):
    from agent.flags.common import options_from_args
    from agent.flags.parser import build_parser

    monkeypatch.setenv("TOPOLOGY_FRAMEWORKS", "ray, torch,jax")
    monkeypatch.setenv("TOPOLOGY_JAX_PORT", "7100")
    args = build_parser().parse_args(["explain", "--pods", "x", "--tf-port", "2300"])
    options = options_from_args(args)
    assert options.frameworks == FrameworkOptions(names=("jax", "ray"), ports=(("jax", 7100), ("tf", 2300)))
    assert options.label("frameworks") == "TOPOLOGY_FRAMEWORKS" and options.label("jax_port") == "TOPOLOGY_JAX_PORT"
    rendition = part(render_pod(volcano(), "demo-worker-0", options), "jax")
    assert rendition.port is not None and rendition.port.source == "TOPOLOGY_JAX_PORT"
    assert rendition.selected_by == "TOPOLOGY_FRAMEWORKS"
    doc = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
           "metadata": {"name": "j", "annotations": {"topology-agent.io/frameworks": "jax,tf",
                                                     "topology-agent.io/tf-port": "2300"}},
           "spec": {"tasks": [{"name": "worker", "replicas": 2,
                               "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}}}]}}
    inject_document(doc, Settings(), version="0.0.0")
    for container in doc["spec"]["tasks"][0]["template"]["spec"]["initContainers"]:
        args_text = " ".join(container["args"])
        assert "--frameworks jax,tf" in args_text and "--tf-port 2300" in args_text, container["name"]


# --- golden bytes: each file of one small job -------------------------------------------------------------------

def _golden_job() -> list[dict[str, Any]]:
    return examples.volcano_job("golden", tasks=(("master", 1), ("worker", 2), ("ps", 1)), cpu="1")


GOLDEN_FILES = ["jax.env", "tf.env", "tf_config.json", "xgboost.env", "xgboost.json", "paddle.env", "mlx.env",
                "mlx_hostfile.json", "mpi.env", "hydra_hostfile", "ray.env"]


@pytest.mark.parametrize("name", GOLDEN_FILES)
def test_golden_bytes(name):
    """tests/core/golden/frameworks/<file>: the bytes of worker 1's file in a job of a master, 2 workers and a
    parameter server (--address ip, files in /shared). Regenerate after a deliberate change with
    ``python -m tests.core.test_framework_plumbing`` and read the diff."""
    rendered = rendered_with(_golden_job(), "golden-worker-1", address="ip", files_dir="/shared")
    assert rendered.files[name] == (GOLDEN / name).read_bytes()


def write_golden() -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    rendered = rendered_with(_golden_job(), "golden-worker-1", address="ip", files_dir="/shared")
    for name in GOLDEN_FILES:
        (GOLDEN / name).write_bytes(rendered.files[name])


# --- every pod of a job agrees -----------------------------------------------------------------------------------

JOB_SHAPES = {
    "volcano": lambda n: examples.volcano_job(tasks=(("master", 1), ("worker", n - 1), ("ps", 1))),
    "pytorchjob": lambda n: examples.pytorchjob(workers=n - 1),
    "indexed-job": lambda n: examples.indexed_job(completions=n),
    "jobset": lambda n: examples.jobset(rjobs=(("driver", 1, 1), ("workers", 1, n - 1))),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from(sorted(JOB_SHAPES)), n=st.integers(2, 6), nproc=st.integers(1, 3),
       address=st.sampled_from(["dns", "ip"]), v6=st.booleans())
def test_every_pod_of_a_job_computes_the_same_world(shape, n, nproc, address, v6):
    pods = JOB_SHAPES[shape](n)
    if v6:
        ipv6(pods)
    options = _options(*ALL, address=address, processes=Processes(per_node=nproc))
    renders = [render_pod(pods, p["metadata"]["name"], options) for p in pods]
    training = [r for r in renders if r.plan.topology.me.training]
    world = renders[0].plan.topology.processes
    envs = {key: [written(part(r, key)) for r in training] for key in ("jax", "xgboost", "paddle", "mlx")}
    assert len({e["JAX_COORDINATOR_ADDRESS"] for e in envs["jax"]}) == 1
    assert len({(e["DMLC_TRACKER_URI"], e["DMLC_TRACKER_PORT"]) for e in envs["xgboost"]}) == 1
    masters = {e["PADDLE_MASTER"] for e, r in zip(envs["paddle"], training, strict=True)
               if r.plan.topology.me.node_rank}
    first = next(r for r in training if r.plan.topology.me.node_rank == 0)
    rank0 = first.plan.topology.me
    assert masters == {f"{bracketed(rank0.address)}:36543"}  # rank 0 itself: its own IP, where the master starts
    assert written(part(first, "paddle"))["PADDLE_MASTER"] == f"{bracketed(rank0.ip or '')}:36543"
    heads = [written(part(r, "ray"))["RAY_ADDRESS"] for r in training]
    assert heads.count("127.0.0.1:6379") == 1 and len(set(heads)) == 2
    assert all(part(r, "ray").files == {} for r in renders if not r.plan.topology.me.training)
    for key, name in (("jax", "JAX_PROCESS_ID"), ("xgboost", "DMLC_TASK_ID"), ("mlx", "MLX_RANK")):
        ids = sorted(int(e[name]) + local for e in envs[key] for local in range(nproc))
        assert ids == list(range(world)), (key, ids)
    assert sorted(int(e["PADDLE_RANK"]) for e in envs["paddle"]) == list(range(len(training)))
    assert len({part(r, "mlx").files["mlx_hostfile.json"] for r in training}) == 1
    _check_tf(renders)


def _check_tf(renders: list[Any]) -> None:
    """One cluster on every TF task; each task's own entry is its own address."""
    tasks = [r for r in renders if part(r, "tf").files]
    expected = [r for r in renders if r.plan.topology.me.role in ("master", "worker", "ps")]  # jobset's: none
    assert tasks == expected
    configs = [json.loads(part(r, "tf").files["tf_config.json"]) for r in tasks]
    assert len({json.dumps(c["cluster"]) for c in configs}) == (1 if tasks else 0)
    seen = set()
    for rendered, config in zip(tasks, configs, strict=True):
        task = (config["task"]["type"], config["task"]["index"])
        assert task not in seen
        seen.add(task)
        entry = config["cluster"][task[0]][task[1]]
        address = rendered.plan.topology.me.address
        assert entry.rpartition(":")[0] in (address, f"[{address}]")


if __name__ == "__main__":
    write_golden()
    print(f"wrote {len(GOLDEN_FILES)} files to {GOLDEN}")
