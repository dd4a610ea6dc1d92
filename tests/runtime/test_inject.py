"""`topology-agent inject`: every shipped example, reduced to the user's own job, comes back with the agent and
gives the same files; the controllers' own examples (tests/upstream/) validate, keep the user's containers and
render; the user's comments and order stay; a second run changes nothing; bad settings get one line."""

from __future__ import annotations

import copy
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent import __version__
from agent.cli import main
from agent.core import render_pod
from agent.core.adoption.injection import (
    INIT,
    PREFIX,
    SIDECAR,
    STATE,
    Settings,
    inject_document,
    names_registry,
    templates,
)
from agent.core.model import STATE_DIR
from agent.errors import InputError
from agent.flags.common import options_from_args
from agent.flags.parser import build_parser, check_command_line
from agent.runtime.commands.inject import inject_text
from tests.manifest_pods import pod_templates, pods_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
UPSTREAM = sorted((ROOT / "tests" / "upstream").glob("*.yaml"))
K8S_VERSION = "1.32"
OLD_AGENT = ("topology-agent", "topology-sidecar")
OLD_VOLUMES = ("shared", "topology-agent-token", "ssh-secret", "topology-agent-state")
VALUE_FLAGS = {"--timeout", "--elastic", "--address", "--ssh-port", "--debounce", "--signal", "--rank-order",
               "--roles", "--expect"}


def docs_of(path: Path) -> list[dict]:
    """The documents of a manifest, read with libyaml's parser where PyYAML has it (they are read at
    collection, in every worker) under the same safe constructor."""
    return [d for d in yaml.load_all(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if d]


def reduce_to_users_job(doc: dict) -> dict:
    """A shipped example as its user would write it before adopting the agent: the agent's containers and
    volumes out, their command-line options turned into topology-agent.io/ annotations on the job."""
    doc = copy.deepcopy(doc)
    annotations: dict[str, str] = {}
    for template in pod_templates(doc):
        spec = template["spec"]
        for container in spec.get("initContainers", []):
            if container["name"] not in OLD_AGENT:
                continue
            args = container["args"]
            for i, arg in enumerate(args):
                if arg in VALUE_FLAGS:
                    annotations[PREFIX + arg[2:]] = str(args[i + 1])
                elif arg == "--ssh-owner":
                    annotations[PREFIX + "ssh-owner"] = args[i + 1]
        secret = [v["secret"]["secretName"] for v in spec.get("volumes", []) if v["name"] == "ssh-secret"]
        if secret:
            annotations[PREFIX + "ssh-secret"] = secret[0]
        spec["initContainers"] = [c for c in spec.get("initContainers", []) if c["name"] not in OLD_AGENT]
        if not spec["initContainers"]:
            del spec["initContainers"]
        spec["volumes"] = [v for v in spec.get("volumes", []) if v["name"] not in OLD_VOLUMES]
        if not spec["volumes"]:
            del spec["volumes"]
        for container in spec["containers"]:
            container["volumeMounts"] = [m for m in container.get("volumeMounts", [])
                                         if m["name"] not in OLD_VOLUMES]
            if not container["volumeMounts"]:
                del container["volumeMounts"]
        for key in ("serviceAccountName", "automountServiceAccountToken", "shareProcessNamespace"):
            spec.pop(key, None)
    # The job's signal/debounce come from the elastic example's sidecar; the defaults are what inject writes.
    for key in ("signal", "debounce", "address", "elastic"):
        annotations.pop(PREFIX + key, None)
    if annotations:
        doc.setdefault("metadata", {}).setdefault("annotations", {}).update(annotations)
    return doc


def injected(doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    inject_document(doc, Settings(), version=__version__)
    return doc


def agent_args(template: dict, name: str = INIT) -> list[str] | None:
    for container in template["spec"].get("initContainers", []):
        if container["name"] == name:
            return [str(a) for a in container["args"]]
    return None


def options_of(args: list[str]):
    return options_from_args(build_parser().parse_args(args))


def user_containers(template: dict) -> list[dict]:
    spec = template["spec"]
    return ([c for c in spec.get("initContainers", []) if c["name"] not in (INIT, SIDECAR)]
            + spec["containers"])


def without_agent_mounts(container: dict) -> dict:
    container = copy.deepcopy(container)
    mounts = [m for m in container.get("volumeMounts", []) if not m["name"].startswith("topology-agent-")]
    container.pop("volumeMounts", None)
    if mounts:
        container["volumeMounts"] = mounts
    return container


SHIPPED = [(p.name, i, d) for p in EXAMPLES for i, d in enumerate(docs_of(p)) if pod_templates(d)]


@pytest.mark.parametrize(("name", "index", "doc"), SHIPPED, ids=[f"{n}:{i}" for n, i, _ in SHIPPED])
def test_a_shipped_example_reduced_to_the_users_job_injects_back_to_the_same_files(name, index, doc):
    users = reduce_to_users_job(doc)
    assert all(agent_args(t) is None for t in pod_templates(users))
    result = injected(users)
    shipped_pods, injected_pods = pods_for(doc), pods_for(result)
    assert [p["metadata"]["name"] for p in shipped_pods] == [p["metadata"]["name"] for p in injected_pods]
    shipped_options = options_of(agent_args(pod_templates(doc)[0]))
    injected_options = options_of(agent_args(pod_templates(result)[0]))
    for pod in shipped_pods:
        me = pod["metadata"]["name"]
        want = render_pod(shipped_pods, me, shipped_options).files
        got = render_pod(injected_pods, me, injected_options).files
        assert got.keys() == want.keys(), me
        for file in want:
            assert got[file] == want[file], f"{name} {me} {file}"
    # the elastic example's sidecar is back, with the same elastic range
    shipped_sidecar = agent_args(pod_templates(doc)[0], SIDECAR)
    injected_sidecar = agent_args(pod_templates(result)[0], SIDECAR)
    assert (shipped_sidecar is None) == (injected_sidecar is None)
    if shipped_sidecar:
        assert options_of(injected_sidecar).elastic == options_of(shipped_sidecar).elastic


UPSTREAM_DOCS = [(p.name, d) for p in UPSTREAM for d in docs_of(p)]


def _validate_template(template: dict) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="installed by the test extra")
    wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": template}
    kubernetes_validate.validate(json.loads(json.dumps(wrapped)), K8S_VERSION, strict=True)


def _annotated(name: str, doc: dict) -> dict:
    """Volcano's MPI example names its tasks as the mpi plugin does (mpimaster launches, mpiworker computes);
    the agent's Volcano default roles are the pytorch plugin's, so the user says which tasks train."""
    if name == "volcano-mpi.yaml":
        doc = copy.deepcopy(doc)
        doc["metadata"]["annotations"] = {PREFIX + "roles": "mpiworker"}
    return doc


RUNTIMES = sorted((ROOT / "manifests" / "trainer").glob("*.yaml"))


def uninjected(doc: dict) -> dict:
    """A runtime shipped with the agent in it, as it was before inject added the agent."""
    from agent.core.adoption.injection import INJECTED, remove

    doc = copy.deepcopy(doc)
    for template in templates(doc):
        spec = template.template["spec"]
        remove(spec)
        for key in ("initContainers", "volumes"):
            if not spec.get(key):
                spec.pop(key, None)
        for container in spec["containers"]:
            if not container.get("volumeMounts"):
                container.pop("volumeMounts", None)
        spec.pop("serviceAccountName")
        spec.pop("automountServiceAccountToken")
        template.template["metadata"]["annotations"].pop(INJECTED)
        if not template.template["metadata"]["annotations"]:
            del template.template["metadata"]
    return doc

ALL_JOBS = [(f"upstream/{n}", _annotated(n, d)) for n, d in UPSTREAM_DOCS] \
    + [(f"shipped/{n}:{i}", reduce_to_users_job(d)) for n, i, d in SHIPPED] \
    + [(f"shipped/{p.name}", uninjected(d)) for p in RUNTIMES for d in docs_of(p)]


@pytest.mark.parametrize(("name", "doc"), ALL_JOBS, ids=[n for n, _ in ALL_JOBS])
def test_injected_templates_validate_keep_the_users_containers_and_run_the_agent_restricted(name, doc):
    before = [copy.deepcopy(t.template) for t in templates(doc)]
    assert before, f"{name}: no pod template found"
    after = injected(doc)
    found = list(templates(after))
    assert len(found) == len(before)
    for old, new in zip(before, (t.template for t in found), strict=True):
        _validate_template(new)
        assert [without_agent_mounts(c) for c in user_containers(new)] == user_containers(old)
        for container in new["spec"]["containers"]:
            assert {"name": "topology-agent-shared", "mountPath": "/shared"} in container["volumeMounts"]
        assert new["spec"].get("securityContext") == old["spec"].get("securityContext")  # never imposed
        agents = [c for c in new["spec"]["initContainers"] if c["name"] in (INIT, SIDECAR)]
        assert agents[0]["name"] == INIT
        for container in agents:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False and context["capabilities"] == {"drop": ["ALL"]}
            assert context["readOnlyRootFilesystem"] is True
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}
            assert context["runAsNonRoot"] is True and context["runAsUser"] != 0
            assert container["resources"]["limits"]["memory"] == "128Mi"
            check_command_line([str(a) for a in container["args"]], name)
        token_holders = [c["name"] for c in new["spec"]["initContainers"] + new["spec"]["containers"]
                         if any(m["name"] == "topology-agent-token" for m in c.get("volumeMounts", []))]
        assert token_holders == [c["name"] for c in agents]
        # What init leaves for its sidecar decides membership: in a volume of the agent's containers alone.
        state_holders = [c["name"] for c in new["spec"]["initContainers"] + new["spec"]["containers"]
                         if any(m["name"] == STATE for m in c.get("volumeMounts", []))]
        with_sidecar = any(c["name"] == SIDECAR for c in agents)
        assert state_holders == ([c["name"] for c in agents] if with_sidecar else [])
        assert all({"name": STATE, "mountPath": STATE_DIR} in c["volumeMounts"] for c in agents if with_sidecar)
        assert [v for v in new["spec"]["volumes"] if v["name"] == STATE] == (
            [{"name": STATE, "emptyDir": {}}] if with_sidecar else [])
        assert new["metadata"]["annotations"]["topology-agent.io/injected"] == __version__


RENDERABLE = [(n, d) for n, d in ALL_JOBS if d["kind"] not in ("TrainingRuntime", "ClusterTrainingRuntime")]


@pytest.mark.parametrize(("name", "doc"), RENDERABLE, ids=[n for n, _ in RENDERABLE])
def test_the_pods_of_an_injected_job_render_with_the_injected_options(name, doc):
    after = injected(doc)
    pods = pods_for(after)
    assert pods, name
    options = options_of(agent_args(pod_templates(after)[0]))
    worlds: dict[str, set[str]] = {}
    ranks: dict[str, list[int]] = {}
    for pod in pods:
        rendered = render_pod(pods, pod["metadata"]["name"], options).variables
        variables = {v.name: v.value for v in rendered if not v.unset}  # a controller's WORLD_SIZE is unset
        if variables["TOPOLOGY_TRAINING"] == "1":  # a world per master (a LeaderWorkerSet has one per group)
            worlds.setdefault(variables["MASTER_ADDR"], set()).add(variables["WORLD_SIZE"])
            ranks.setdefault(variables["MASTER_ADDR"], []).append(int(variables["NODE_RANK"]))
        else:
            assert "WORLD_SIZE" not in variables and "RANK" not in variables
    assert worlds
    for master, sizes in worlds.items():
        assert len(sizes) == 1, (master, sizes)  # every training pod of a world agrees on its size
        assert sorted(ranks[master]) == list(range(len(ranks[master])))  # and each has its own node rank


def test_the_users_comments_quotes_and_order_stay_and_a_second_run_changes_nothing():
    text = (ROOT / "tests" / "upstream" / "jobset-depends-on.yaml").read_text()
    once, changed = inject_text(text, Settings(), version=__version__)
    assert len(changed) == 3
    kept = [line for line in text.splitlines() if line.strip()]
    out_lines = once.splitlines()
    position = 0
    for line in kept:  # every line of the user's, in the user's order (comments and quoting included)
        position = out_lines.index(line, position) + 1
    twice, _ = inject_text(once, Settings(), version=__version__)
    assert twice == once


def test_an_older_injection_is_upgraded_to_what_one_run_gives():
    text = (ROOT / "tests" / "upstream" / "training-operator-pytorch-simple.yaml").read_text()
    fresh, _ = inject_text(text, Settings(), version=__version__)
    old, _ = inject_text(text, Settings({"image": "topology-agent:0.0.9", "timeout": "900"}), version="0.0.9")
    assert "0.0.9" in old and "--timeout" in old
    upgraded, _ = inject_text(old, Settings(), version=__version__)
    assert upgraded == fresh


def test_elastic_pytorchjobs_get_the_sidecar_and_their_range_from_the_elastic_policy():
    doc = reduce_to_users_job(docs_of(ROOT / "manifests" / "examples" / "elastic-pytorchjob.yaml")[0])
    template = pod_templates(injected(doc))[0]
    assert options_of(agent_args(template)).elastic is not None
    sidecar = agent_args(template, SIDECAR)
    assert sidecar[:1] == ["sidecar"] and sidecar[sidecar.index("--elastic") + 1] == "2:4"
    sidecar_container = next(c for c in template["spec"]["initContainers"] if c["name"] == SIDECAR)
    assert sidecar_container["restartPolicy"] == "Always"  # a native sidecar: it does not block the trainer
    doc["metadata"]["annotations"] = {PREFIX + "elastic": "false"}
    assert agent_args(pod_templates(injected(doc))[0], SIDECAR) is None


def test_view_own_reaches_init_and_the_sidecar_alike():
    doc = reduce_to_users_job(docs_of(ROOT / "manifests" / "examples" / "elastic-pytorchjob.yaml")[0])
    doc["metadata"]["annotations"] = {PREFIX + "view": "own"}
    template = pod_templates(injected(doc))[0]
    assert options_of(agent_args(template)).view == "own"
    sidecar = agent_args(template, SIDECAR)
    assert sidecar[sidecar.index("--view") + 1] == "own"


def test_ssh_files_are_written_as_the_trainers_user_with_no_capability():
    doc = reduce_to_users_job(docs_of(ROOT / "manifests" / "examples" / "deepspeed-job.yaml")[1])
    assert doc["metadata"]["annotations"][PREFIX + "ssh-secret"]
    doc["metadata"]["annotations"].pop(PREFIX + "ssh-owner")
    template = pod_templates(injected(doc))[0]
    init = template["spec"]["initContainers"][0]
    assert "--ssh-secret-dir" in init["args"] and "--ssh-owner" not in init["args"]
    assert (init["securityContext"]["runAsUser"], init["securityContext"]["runAsGroup"]) == (10001, 10001)
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    secret = next(v for v in template["spec"]["volumes"] if v["name"] == "topology-agent-ssh")
    assert secret["secret"]["secretName"] == "ds-ssh"
    trainer = template["spec"]["containers"][0]
    assert not any(m["name"] == "topology-agent-ssh" for m in trainer["volumeMounts"])
    del template["spec"]["securityContext"]["runAsUser"]  # nobody says which user the trainer is
    with pytest.raises(InputError, match="runAsUser"):
        inject_document({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "annotations": {
            PREFIX + "ssh-secret": "ds-ssh"}}, "spec": {"containers": [{"name": "t", "image": "x"}]}},
            Settings(), version=__version__)


def test_a_user_service_account_is_kept_and_its_token_left_alone():
    doc = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": {"template": {"spec": {
        "serviceAccountName": "mine", "containers": [{"name": "t", "image": "x"}]}}}}
    spec = injected(doc)["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "mine" and "automountServiceAccountToken" not in spec


def test_a_kubectl_list_and_json_come_back_as_they_came():
    items = [d for n, d in UPSTREAM_DOCS if d["kind"] in ("PyTorchJob", "MPIJob")]
    text = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    out, changed = inject_text(text, Settings(), version=__version__)
    back = json.loads(out)
    assert back["kind"] == "List" and len(changed) == 5
    assert all(agent_args(t) for item in back["items"] for t in pod_templates(item))


@pytest.mark.parametrize(("annotations", "says"), [
    ({PREFIX + "rank-ordr": "topology"}, "'topology-agent.io/rank-ordr' is not a setting"),
    ({PREFIX + "elastic": "2-4"}, "--elastic"),
    ({PREFIX + "rank-order": "random"}, "--rank-order"),
    ({PREFIX + "view": "mine"}, "--view"),
    ({PREFIX + "ssh-secret": "s", PREFIX + "ssh-owner": "me"}, "ssh-owner"),
])
def test_a_bad_setting_is_one_line_exit_2_and_nothing_written(annotations, says, capsys, monkeypatch):
    doc = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "annotations": annotations},
           "spec": {"template": {"spec": {"containers": [{"name": "t", "image": "x"}]}}}}
    monkeypatch.setattr(sys, "stdin", io.StringIO(yaml.safe_dump(doc)))
    assert main(["inject"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Job j" in lines[0], lines


CONFIG_MAP = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c  # mine\ndata:\n  a: '1'\n"
DEPLOYMENT = ("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\nspec:\n  template:\n    spec:\n"
              "      containers:\n      - name: t\n        image: x\n")
BATCH_JOB = ("apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: j\nspec:\n  template:\n    spec:\n"
             "      containers:\n      - name: t\n        image: x\n")


def _inject_cli(text: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent.cli", "inject", *args], input=text, capture_output=True,
                          text=True, timeout=60)


def _image_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("topology-agent inject: warning: image ")]


def _without_image_warning(stderr: str) -> str:
    """inject's report lines: the default image names no registry, so the one warning line, last, is taken off."""
    lines = stderr.splitlines(keepends=True)
    assert _image_warnings(stderr) == [lines[-1].rstrip("\n")], stderr
    return "".join(lines[:-1])


def test_unknown_kinds_beside_a_job_pass_through_unchanged_and_are_named_as_left_alone():
    run = _inject_cli(CONFIG_MAP + "---\n" + BATCH_JOB + "---\n" + DEPLOYMENT)
    assert run.returncode == 0, run.stderr
    config_map, job, deployment = run.stdout.split("---\n")
    assert config_map == CONFIG_MAP and deployment == DEPLOYMENT
    assert "initContainers" in job
    assert _without_image_warning(run.stderr) == ("topology-agent inject: stdin: added the agent to 1 pod "
                                                  "template(s): Job j; left alone: "
                          "ConfigMap c, Deployment d (no pod template of a kind the agent knows)\n")


def test_input_with_no_pod_template_writes_nothing_and_names_what_it_holds():
    """Piped to kubectl apply, an empty stream fails the apply as well: passing the objects through would apply
    what the user meant to give the agent, without it."""
    for text, holds in [(CONFIG_MAP + "---\n" + DEPLOYMENT, "left alone: ConfigMap c, Deployment d"),
                        ("# nothing yet\n", "it holds no objects")]:
        run = _inject_cli(text)
        assert run.returncode == 2 and run.stdout == "", run
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1, run.stderr
        assert "stdin: no pod template to add the agent to, so nothing is written" in lines[0]
        assert holds in lines[0] and "pod templates of Pod, Job (batch.volcano.sh), PyTorchJob" in lines[0]


def test_a_second_run_says_the_templates_already_have_the_agent():
    once = _inject_cli(BATCH_JOB)
    twice = _inject_cli(once.stdout)
    assert twice.returncode == 0 and twice.stdout == once.stdout
    assert _without_image_warning(twice.stderr) == ("topology-agent inject: stdin: 1 pod template(s) already have "
                                                    "the agent, unchanged: Job j\n")
    upgraded = _inject_cli(once.stdout.replace("name: j\n", f"name: j\n  annotations:\n    {PREFIX}timeout: '60'\n", 1))
    assert _without_image_warning(upgraded.stderr) == ("topology-agent inject: stdin: added the agent to 1 pod "
                                                       "template(s): Job j\n")


@pytest.mark.parametrize(("image", "registry"), [
    ("topology-agent:0.1.0", False),  # docker.io/library/topology-agent:0.1.0
    ("team/topology-agent:1", False),  # a Docker Hub account's repository
    ("topology-agent@sha256:" + "a" * 64, False),
    ("registry.example.com/x:1", True),
    ("ghcr.io/acme/topology-agent:0.1.0", True),
    ("localhost:5000/x", True),
    ("localhost/x", True),
    ("127.0.0.1:5000/team/x:2", True),
    ("Registry/x", True),  # an upper-case first component is a host: a repository path is lower case
], ids=lambda v: str(v))
def test_an_image_names_a_registry_as_the_reference_grammar_reads_its_first_component(image, registry):
    assert names_registry(image) is registry


def test_inject_warns_once_on_stderr_when_the_agents_image_names_no_registry(tmp_path):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(BATCH_JOB + "---\n" + BATCH_JOB.replace("name: j\n", "name: k\n", 1))
    second.write_text(BATCH_JOB.replace("name: j\n", f"name: m\n  annotations:\n    {PREFIX}image: team/agent:1\n", 1))
    run = subprocess.run([sys.executable, "-m", "agent.cli", "inject", "-f", str(first), "-f", str(second)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    warnings = _image_warnings(run.stderr)
    assert len(warnings) == 1, run.stderr
    assert f"image team/agent:1, topology-agent:{__version__} names no registry" in warnings[0]
    assert "--set image=<registry>/topology-agent:<tag>" in warnings[0] and f"{PREFIX}image" in warnings[0]
    assert "warning" not in run.stdout and run.stdout.count("image: team/agent:1") == 2


@pytest.mark.parametrize("image", ["registry.example.com/x:1", "localhost:5000/x"])
def test_inject_says_nothing_of_an_image_that_names_its_registry(image):
    given = _inject_cli(BATCH_JOB, "--set", f"image={image}")
    annotated = _inject_cli(BATCH_JOB.replace("name: j\n", f"name: j\n  annotations:\n    {PREFIX}image: {image}\n", 1))
    for run in (given, annotated):
        assert run.returncode == 0 and f"image: {image}" in run.stdout, run.stderr
        assert run.stderr == "topology-agent inject: stdin: added the agent to 1 pod template(s): Job j\n"


@pytest.mark.parametrize("path", RUNTIMES, ids=[p.name for p in RUNTIMES])
def test_the_shipped_runtime_is_what_inject_gives_today(path):
    """manifests/trainer is written by inject: injecting it again must change no byte, so a change to the
    injection that is not carried into the shipped runtime fails here (re-run: topology-agent inject -f)."""
    text = path.read_text()
    again, changed = inject_text(text, Settings(), version=__version__)
    assert changed and again == text


PSS_CHECKS = ",".join(["CKV_K8S_16", "CKV_K8S_17", "CKV_K8S_18", "CKV_K8S_19", "CKV_K8S_20", "CKV_K8S_22",
                       "CKV_K8S_23", "CKV_K8S_25", "CKV_K8S_28", "CKV_K8S_37", "CKV_K8S_39", "CKV_K8S_30",
                       "CKV_K8S_31", "CKV_K8S_10", "CKV_K8S_11", "CKV_K8S_12", "CKV_K8S_13"])


@pytest.mark.slow
def test_checkov_finds_the_agents_injected_containers_restricted(tmp_path):
    """Each injected template's agent containers, as the containers of a Pod of their own (with the template's
    pod-level fields), through checkov's restricted-PSS and resource checks: the user's containers are theirs."""
    import os
    import shutil

    checkov = os.environ.get("TOPOLOGY_CHECKOV") or shutil.which("checkov")
    if checkov is None:
        pytest.skip("checkov is not installed (scripts/test puts it in .scan-venv: requirements-scan.lock)")
    pods = []
    for name, doc in ALL_JOBS:
        for i, template in enumerate(t.template for t in templates(injected(doc))):
            spec = copy.deepcopy(template["spec"])
            agents = [c for c in spec.pop("initContainers") if c["name"] in (INIT, SIDECAR)]
            for container in agents:
                container.pop("restartPolicy", None)
            spec["containers"] = agents
            pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": f"check-{len(pods)}", "namespace": "team-a",
                "annotations": {"source": f"{name} template {i}"}}, "spec": spec})
    (tmp_path / "pods.yaml").write_text(yaml.safe_dump_all(pods))
    run = subprocess.run([checkov, "-f", str(tmp_path / "pods.yaml"), "--framework", "kubernetes", "--compact",
                          "--skip-download", "--check", PSS_CHECKS], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    import re

    passed = re.search(r"Passed checks: (\d+), Failed checks: (\d+)", run.stdout)
    assert passed and int(passed.group(2)) == 0
    assert len(pods) > 20 and int(passed.group(1)) >= len(pods) * len(PSS_CHECKS.split(","))


def _sized(kind: str, pods: int) -> dict:
    """A minimal job of each kind whose replica counts make ``pods`` pods at once."""
    template = {"spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]}}
    if kind == "volcano":
        return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "j"},
                "spec": {"tasks": [{"name": "master", "replicas": 1, "template": template},
                                   {"name": "worker", "replicas": pods - 1, "template": template}]}}
    if kind in ("pytorchjob", "mpijob"):
        key, roles = ("pytorchReplicaSpecs", ("Master", "Worker")) if kind == "pytorchjob" else \
            ("mpiReplicaSpecs", ("Launcher", "Worker"))
        return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob" if kind == "pytorchjob" else "MPIJob",
                "metadata": {"name": "j"}, "spec": {key: {roles[0]: {"replicas": 1, "template": template},
                                                           roles[1]: {"replicas": pods - 1, "template": template}}}}
    if kind == "elastic":  # two pods now, up to ``pods`` later
        return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "j"},
                "spec": {"elasticPolicy": {"minReplicas": 2, "maxReplicas": pods},
                         "pytorchReplicaSpecs": {"Worker": {"replicas": 2, "template": template}}}}
    if kind == "jobset":  # 4 replicated jobs of pods/4 pods each
        job = {"parallelism": pods // 4, "completions": pods // 4, "template": template}
        return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "j"},
                "spec": {"replicatedJobs": [{"name": "w", "replicas": 4, "template": {"spec": job}}]}}
    if kind == "lws":  # groups of 8
        return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": {"name": "j"},
                "spec": {"replicas": pods // 8, "leaderWorkerTemplate": {"size": 8, "workerTemplate": template}}}
    assert kind == "indexed"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
            "spec": {"completionMode": "Indexed", "completions": pods, "parallelism": pods, "template": template}}


@pytest.mark.parametrize("kind", ["volcano", "pytorchjob", "mpijob", "elastic", "jobset", "lws", "indexed"])
@pytest.mark.parametrize(("pods", "request_", "limit"), [
    (1024, "64Mi", "128Mi"), (4096, "64Mi", "128Mi"), (4104, "128Mi", "256Mi"), (16384, "128Mi", "256Mi"),
    (16392, "256Mi", "512Mi"),
])
def test_the_agents_memory_follows_the_jobs_size(kind, pods, request_, limit):
    """At 16384 pods the leader's sidecar peaks near 150 MB (docs/benchmarks.md, "Memory"): a 128Mi limit for
    every job would OOM-kill it. The job's own replica counts (an elastic job's maxReplicas)
    size the agent's containers."""
    doc = injected(_sized(kind, pods))
    for template in templates(doc):
        agents = [c for c in template.template["spec"]["initContainers"] if c["name"] in (INIT, SIDECAR)]
        assert agents
        for container in agents:
            assert container["resources"]["requests"]["memory"] == request_
            assert container["resources"]["limits"]["memory"] == limit


def test_a_size_not_known_at_injection_gets_the_small_jobs_memory():
    """A lone Pod (the pods webhook) and a training runtime (each TrainJob sets its size) carry no job size."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]}}
    runtime = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
               "metadata": {"name": "r"}, "spec": {"template": {"spec": {"replicatedJobs": [
                   {"name": "node", "replicas": 1, "template": {"spec": {"parallelism": 20000, "template": {
                       "spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]}}}}}]}}}}
    for doc in (pod, runtime):
        for template in templates(injected(doc)):
            for container in template.template["spec"]["initContainers"]:
                assert container["resources"]["limits"]["memory"] == "128Mi"


def test_the_world_size_annotation_reaches_init_and_the_sidecar():
    """Hot spares are set like any other setting: the job's annotation passes --world-size to both containers."""
    doc = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "annotations": {
        PREFIX + "world-size": "4", PREFIX + "sidecar": "enabled"}},
        "spec": {"template": {"spec": {"containers": [{"name": "t", "image": "x"}]}}}}
    spec = injected(doc)["spec"]["template"]["spec"]
    agents = [c for c in [*spec["initContainers"], *spec.get("containers", [])] if c["name"].startswith("topology-")]
    assert len(agents) == 2
    for container in agents:
        args = container["args"]
        assert args[args.index("--world-size") + 1] == "4", container["name"]
