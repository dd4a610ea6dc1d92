"""The admission webhook's decision (core/adoption/admission.py): the same transform as `inject`, as a JSONPatch.

A job object gets exactly what `inject` gives it. A controller's Pods, injected one by one from what they carry
(the job's settings as namespace defaults), validate, keep the user's containers, run the agent restricted and
render the same files as the pods of the injected job. Reinvocation only completes what another webhook added.
"""

from __future__ import annotations

import base64
import copy
import json
import re

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import __version__
from agent.core import render_pod
from agent.core.adoption import admission
from agent.core.adoption.injection import INIT, INJECT_LABEL, PREFIX, SIDECAR, Settings
from agent.errors import InputError
from agent.flags.parser import check_command_line
from agent.runtime.commands.inject import inject_text
from tests.manifest_pods import pods_for
from tests.runtime.test_inject import (
    ALL_JOBS,
    RENDERABLE,
    _validate_template,
    agent_args,
    injected,
    options_of,
    user_containers,
    without_agent_mounts,
)


def review(obj: dict, *, namespace: str = "team-a", operation: str = "CREATE", plural: str | None = None) -> dict:
    group, _, version = obj["apiVersion"].rpartition("/")
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": group, "version": version, "kind": obj["kind"]},
        "resource": {"group": group, "version": version, "resource": plural or obj["kind"].lower() + "s"},
        "name": obj["metadata"].get("name", ""), "namespace": namespace, "operation": operation,
        "object": obj, "oldObject": None}}


NO_SETTINGS = Settings()


def admitted(obj: dict, settings: Settings = NO_SETTINGS, **kwargs) -> tuple[dict, dict]:
    """(the object after the patch, the response). The review gets its own copy, as the webhook parses its own
    from the body: the decision changes what it is given."""
    answer = admission.answer(admission.parse_review(review(copy.deepcopy(obj), **kwargs)), settings,
                              version=__version__, check=check_command_line)
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == "u-1"
    if "patch" not in response:
        return obj, response
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    return jsonpatch.apply_patch(obj, ops), response


JOBS = [(n, d) for n, d in ALL_JOBS]


@pytest.mark.parametrize(("name", "doc"), JOBS, ids=[n for n, _ in JOBS])
def test_a_job_object_gets_exactly_what_inject_gives_it(name, doc):
    after, response = admitted(copy.deepcopy(doc), namespace=doc["metadata"].get("namespace", "team-a"))
    assert response["allowed"] is True
    assert after == injected(doc)
    again, response = admitted(after)  # the pods it creates, or a second webhook call: nothing more
    assert again == after and "patch" not in response


def pod_level(doc: dict) -> tuple[list[dict], Settings]:
    """The job's pods as its controller creates them (no agent), and the job's own settings as the
    namespace's: a Pod does not carry its job's annotations."""
    annotations = doc["metadata"].get("annotations") or {}
    settings = Settings().over(annotations, "job")
    users = copy.deepcopy(doc)
    pods = pods_for(users)
    for pod in pods:
        pod["spec"].pop("initContainers", None) if not pod["spec"].get("initContainers") else None
        pod["metadata"].setdefault("labels", {})[INJECT_LABEL] = "enabled"
        pod["metadata"].pop("resourceVersion", None)
    return pods, settings


def with_elastic_env(doc: dict, pods: list[dict]) -> None:
    """training-operator writes an elasticPolicy's MIN:MAX into PET_NNODES of every container."""
    policy = (doc.get("spec") or {}).get("elasticPolicy") if doc["kind"] == "PyTorchJob" else None
    if policy:
        value = f"{policy['minReplicas']}:{policy['maxReplicas']}"
        for pod in pods:
            for container in pod["spec"]["containers"]:
                container.setdefault("env", []).append({"name": "PET_NNODES", "value": value})


CONTROLLERS_ENV = re.compile(r"JOB_COMPLETION_INDEX|VK_TASK_INDEX|VC_TASK_INDEX|MPI_HOST|VC_[A-Z0-9_]+_(HOSTS|NUM)")


def without_controllers_writes(container: dict) -> dict:
    """The container without what a controller writes into every container of its pods, init containers too: the
    agent's where inject put it in the job's template, not where the webhook adds it to the Pod (the Job
    controller's JOB_COMPLETION_INDEX; Volcano's env, svc and mpi plugins' variables and the svc plugin's
    /etc/volcano mount)."""
    env = [e for e in container.get("env") or [] if not CONTROLLERS_ENV.fullmatch(e.get("name", ""))]
    mounts = [m for m in container.get("volumeMounts") or [] if m.get("mountPath") != "/etc/volcano"]
    return {**container, "env": env, "volumeMounts": mounts}


@pytest.mark.parametrize(("name", "doc"), RENDERABLE, ids=[n for n, _ in RENDERABLE])
def test_a_controllers_pods_injected_one_by_one_render_what_the_injected_job_renders(name, doc):
    pods, settings = pod_level(doc)
    with_elastic_env(doc, pods)
    webhook_pods = []
    for pod in pods:
        running = pod.pop("status")  # what the pod has once it runs; nothing at CREATE
        before = copy.deepcopy(pod)
        after, response = admitted(pod, settings, plural="pods")
        assert response["allowed"] is True, response
        _validate_template({"metadata": after["metadata"], "spec": after["spec"]})
        assert [without_agent_mounts(c) for c in user_containers(after)] == user_containers(before)
        assert after["spec"].get("securityContext") == before["spec"].get("securityContext")
        for container in after["spec"]["initContainers"]:
            if container["name"] in (INIT, SIDECAR):
                context = container["securityContext"]
                assert context["allowPrivilegeEscalation"] is False and context["capabilities"] == {"drop": ["ALL"]}
                assert context["runAsNonRoot"] is True and context["readOnlyRootFilesystem"] is True
        webhook_pods.append({**after, "status": running})
    job_pods = pods_for(injected(doc))
    with_elastic_env(doc, job_pods)
    job_options = options_of(agent_args(job_pods[0]))
    pod_options = options_of(agent_args(webhook_pods[0]))
    assert pod_options.elastic == job_options.elastic
    assert (agent_args(webhook_pods[0], SIDECAR) is None) == (agent_args(job_pods[0], SIDECAR) is None)
    for webhook_pod, job_pod in zip(webhook_pods, job_pods, strict=True):  # the same decisions, pod by pod
        assert agent_args(webhook_pod) == agent_args(job_pod), webhook_pod["metadata"]["name"]
        assert agent_args(webhook_pod, SIDECAR) == agent_args(job_pod, SIDECAR)
        agents = [[without_controllers_writes(c) for c in p["spec"]["initContainers"] if c["name"] in (INIT, SIDECAR)]
                  for p in (webhook_pod, job_pod)]
        assert agents[0] == agents[1]  # the very containers inject writes (checkov checks those: test_inject)
    for pod in job_pods:
        me = pod["metadata"]["name"]
        want = render_pod(job_pods, me, job_options).files
        got = render_pod(webhook_pods, me, pod_options).files
        assert got == want, f"{name} {me}"


def bare_pod(**annotations: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "train-", "labels": {INJECT_LABEL: "enabled"},
                         "annotations": {PREFIX + k: v for k, v in annotations.items()}},
            "spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]}}


def test_a_pod_with_a_subdomain_waits_for_dns_and_an_elastic_one_gets_the_sidecar():
    pod = bare_pod()
    pod["spec"]["subdomain"] = "train"
    after, _ = admitted(pod)
    assert "--wait-dns" not in agent_args(after)  # whose pod? its controller may not name it by DNS
    pod["metadata"]["labels"]["batch.kubernetes.io/job-name"] = "train"  # an Indexed Job's, as its template
    after, _ = admitted(pod)
    assert "--wait-dns" in agent_args(after) and agent_args(after, SIDECAR) is None
    pod["spec"]["containers"][0]["env"] = [{"name": "PET_NNODES", "value": "2:8"}]
    after, _ = admitted(pod)
    assert "--wait-dns" not in agent_args(after)  # elastic pods are found by IP
    assert agent_args(after, SIDECAR)[-4:] == ["--elastic", "2:8", "--address", "ip"]
    pod["spec"]["containers"][0]["env"] = [{"name": "PET_NNODES", "value": "4"}]  # a fixed size: not elastic
    after, _ = admitted(pod)
    assert agent_args(after, SIDECAR) is None


def test_namespace_settings_are_defaults_and_the_pods_own_annotations_win():
    namespace = {"metadata": {"name": "team-a", "annotations": {PREFIX + "timeout": "900",
                                                                 PREFIX + "image": "registry/agent:1"}}}
    settings = admission.namespace_settings(namespace)
    after, _ = admitted(bare_pod(timeout="60"), settings)
    init = after["spec"]["initContainers"][0]
    assert init["image"] == "registry/agent:1" and init["args"][init["args"].index("--timeout") + 1] == "60"


def test_an_injected_pod_only_gets_the_mount_in_a_container_another_webhook_added():
    after, _ = admitted(bare_pod(timeout="60"))
    later = copy.deepcopy(after)
    later["spec"]["containers"].append({"name": "istio-proxy", "image": "proxy:1"})  # a later webhook's work
    later["metadata"]["annotations"].pop(PREFIX + "timeout")  # the settings are not read again
    again, response = admitted(later)
    assert response["allowed"] is True
    assert again["spec"]["containers"][1]["volumeMounts"] == [{"name": "topology-agent-shared", "mountPath": "/shared"}]
    assert again["spec"]["initContainers"] == after["spec"]["initContainers"]
    ops = json.loads(base64.b64decode(response["patch"]))
    assert [op["path"] for op in ops] == ["/spec/containers/1/volumeMounts"]


def test_a_pod_of_an_injected_template_is_left_as_it_is():
    from tests.manifest_pods import pod_templates

    doc = injected(ALL_JOBS[0][1])
    pod = pods_for(doc)[0]
    pod["metadata"]["labels"][INJECT_LABEL] = "enabled"
    pod["metadata"]["annotations"] = dict(pod_templates(doc)[0]["metadata"]["annotations"])  # as controllers copy
    after, response = admitted(pod, Settings({"timeout": "5"}))
    assert after == pod and "patch" not in response


@pytest.mark.parametrize(("annotations", "says"), [
    ({"rank-ordr": "topology"}, "annotation 'topology-agent.io/rank-ordr' is not a setting of the agent"),
    ({"timeout": "soon"}, "--timeout 'soon'"),
    ({"ssh-secret": "s"}, "the SSH files must belong to the user the trainer runs as"),
])
def test_bad_settings_deny_the_pod_with_the_one_line_inject_prints(annotations, says):
    pod = bare_pod(**annotations)
    after, response = admitted(pod)
    assert response["allowed"] is False and after == pod
    assert response["status"]["code"] == 400 and says in response["status"]["message"]
    assert response["status"]["message"].startswith("topology-agent: Pod train-*")
    with pytest.raises(InputError) as err:  # and inject refuses the same pod with the same words
        inject_text(json.dumps(pod), Settings(), version=__version__)
    assert response["status"]["message"] == f"topology-agent: {err.value}"


def test_a_volcano_job_whose_tasks_none_trains_is_admitted_with_the_line_inject_prints_as_a_warning():
    """A namespace that adopts every job holds jobs that are no training jobs: the webhook injects them and says,
    as kubectl prints a webhook's warning, what inject refuses them with."""
    def job(plugins: dict) -> dict:
        return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "lm-mpi-job"},
                "spec": {"plugins": plugins, "tasks": [
                    {"name": t, "replicas": n, "template": {"spec": {"containers": [{"name": t, "image": "mpi"}]}}}
                    for t, n in (("mpimaster", 1), ("mpiworker", 2))]}}

    unnamed = job({"mpi": [], "ssh": [], "svc": []})
    after, response = admitted(unnamed)
    assert response["allowed"] is True and "patch" in response
    assert all(agent_args(task["template"]) for task in after["spec"]["tasks"])
    with pytest.raises(InputError) as err:
        inject_text(json.dumps(unnamed), Settings(), version=__version__)
    assert response["warnings"] == [f"topology-agent: {err.value}"]
    assert "none of its tasks (mpimaster, mpiworker) trains" in response["warnings"][0]
    _, named = admitted(job({"mpi": ["--master=mpimaster", "--worker=mpiworker"], "ssh": [], "svc": []}))
    assert named["allowed"] is True and "patch" in named and "warnings" not in named


def test_a_namespace_with_a_misspelt_setting_is_named():
    with pytest.raises(InputError, match=re.escape("Namespace team-a: annotation 'topology-agent.io/imgae'")):
        admission.namespace_settings({"metadata": {"name": "team-a", "annotations": {PREFIX + "imgae": "x"}}})


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_only_create_is_changed(operation):
    pod = bare_pod()
    after, response = admitted(pod, operation=operation)
    assert response == {"uid": "u-1", "allowed": True} and after == pod


@pytest.mark.parametrize(("body", "says"), [
    ({"kind": "Pod"}, "not an AdmissionReview"),
    ({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1beta1", "request": {"uid": "x"}},
     "only admission.k8s.io/v1 is served"),
    ({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {}}, "no request.uid"),
    ([], "not an AdmissionReview"),
])
def test_what_is_not_an_admission_review_is_refused_with_a_reason(body, says):
    with pytest.raises(InputError, match=says):
        admission.parse_review(body)


def test_the_patch_escapes_annotation_keys_and_applies_to_the_object_as_sent():
    pod = bare_pod()
    _, response = admitted(pod)
    ops = json.loads(base64.b64decode(response["patch"]))
    assert any(op["path"].endswith("topology-agent.io~1injected") for op in ops)
    assert pod == bare_pod()  # the request's object itself is not changed


def test_the_patch_comes_from_what_the_agent_adds_not_a_copy_of_the_object():
    """A 2.85 MiB Pod's review allocates a small fraction of the object's size: the patch is built from the
    agent's pieces, never from a deep copy and a whole-object diff (which take a review to 80-110 times the object)."""
    import tracemalloc

    pod = bare_pod()
    pod["metadata"]["annotations"]["note"] = "x" * (2 << 20)
    pod["spec"]["containers"][0]["env"] = [{"name": f"V{i}", "value": str(i)} for i in range(20000)]
    request = admission.parse_review(json.loads(json.dumps(review(pod))))
    tracemalloc.start()
    try:
        answer = admission.answer(request, NO_SETTINGS, version=__version__, check=check_command_line)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024, peak  # the object parsed is ~6 MB
    patch = base64.b64decode(answer["response"]["patch"])
    assert len(patch) < 8192 and b"xxxx" not in patch and b"V19999" not in patch


@pytest.mark.slow
def test_a_review_with_more_json_values_than_the_webhook_reads_is_refused_before_it_is_parsed(monkeypatch):
    """A 3 MiB object of the costliest shape (distinct map keys, ~70 bytes a value parsed) would take a webhook
    past its memory limit if parsed. Values are counted before anything is made: past MAX_VALUES the review is
    refused in one line, under it (a 3 MiB object of real shape has ~350000) it is read."""
    pod = bare_pod()
    pod["spec"]["nodeSelector"] = {f"k{i:06d}": "" for i in range(admission.MAX_VALUES // 2 + 1)}  # ':' and ','
    body = json.dumps(review(pod)).encode()
    parsed: list[int] = []
    real = json.loads
    monkeypatch.setattr(json, "loads", lambda *args, **kwargs: parsed.append(1) or real(*args, **kwargs))
    with pytest.raises(InputError) as refused:
        admission.read_review(body)
    assert parsed == []
    assert str(refused.value).startswith(f"the review holds about {admission.json_values(body)} JSON values, more "
                                         f"than the webhook reads ({admission.MAX_VALUES})")
    assert "\n" not in str(refused.value)
    pod["spec"]["nodeSelector"] = {f"k{i:06d}": "" for i in range(admission.MAX_VALUES // 2 - 64)}
    assert admission.read_review(json.dumps(review(pod)).encode()).uid == "u-1" and parsed == [1]


def test_a_users_pvc_named_like_the_agent_is_kept_by_the_webhooks_patch():
    """A user's PVC named `topology-agent-data` mounted at /data stays: the patch removes only the agent's own
    pieces, in a template the agent injected (a name match alone would put the job's data on an emptyDir)."""
    pod = bare_pod()
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "topology-agent-data", "mountPath": "/data"}]
    pod["spec"]["volumes"] = [{"name": "topology-agent-data", "persistentVolumeClaim": {"claimName": "data"}},
                              {"name": "topology-agent-config", "configMap": {"name": "settings"}}]
    after, response = admitted(pod)
    assert response["allowed"] is True
    spec = after["spec"]
    assert spec["volumes"][:2] == pod["spec"]["volumes"]
    assert [v["name"] for v in spec["volumes"][2:]] == ["topology-agent-shared", "topology-agent-token"]
    assert spec["containers"][0]["volumeMounts"] == [{"name": "topology-agent-data", "mountPath": "/data"},
                                                     {"name": "topology-agent-shared", "mountPath": "/shared"}]
    pod["spec"]["volumes"][0]["name"] = "topology-agent-shared"  # one of the agent's own names: refused, never replaced
    _, response = admitted(pod)
    assert response["allowed"] is False
    assert "volume 'topology-agent-shared' is in a template the agent did not inject" in response["status"]["message"]


AGENT_PIECES = {"initContainers": [{"name": INIT, "image": "old"}, {"name": SIDECAR, "image": "old"}],
                "volumes": [{"name": "topology-agent-shared", "emptyDir": {}},
                            {"name": "topology-agent-token", "projected": {"sources": []}}]}


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_the_patch_applied_to_the_object_as_sent_is_the_transform_whatever_the_template_holds(data):
    """Lists the transform extends (the user's init containers, volumes and mounts, present or not), fields absent
    or present, and a template injected before whose containers another webhook added to (only the shared mount
    is added): patch(object) == transform(copy of object)."""
    from agent.core.adoption.injection import INJECTED, complete, inject, is_injected, templates

    injected = data.draw(st.booleans())
    spec: dict = {"containers": []}
    for i in range(data.draw(st.integers(1, 3))):
        container: dict = {"name": f"c{i}", "image": "x"}
        if data.draw(st.booleans()):
            container["volumeMounts"] = [{"name": f"m{j}", "mountPath": f"/m{j}"}
                                         for j in range(data.draw(st.integers(0, 2)))]
            if injected and data.draw(st.booleans()):
                container["volumeMounts"].insert(0, {"name": "topology-agent-shared", "mountPath": "/shared"})
        spec["containers"].append(container)
    for key, agents in AGENT_PIECES.items():
        if injected or data.draw(st.booleans()):
            users = [{"name": f"user-{key}-{j}", "emptyDir": {}} if key == "volumes" else
                     {"name": f"user-{j}", "image": "u"} for j in range(data.draw(st.integers(0, 3)))]
            for agent in agents if injected else ():
                piece = copy.deepcopy(agent)
                if piece["name"] == INIT:
                    piece["volumeMounts"] = [{"name": "topology-agent-shared", "mountPath": "/shared"}]
                users.insert(data.draw(st.integers(0, len(users))), piece)
            spec[key] = users
    if data.draw(st.booleans()):
        spec["serviceAccountName"] = data.draw(st.sampled_from(["mine", "topology-agent"]))
    template: dict = {"spec": spec}
    if injected or data.draw(st.booleans()):
        template["metadata"] = {"labels": {"a": "b"}}
        if injected or data.draw(st.booleans()):
            template["metadata"]["annotations"] = {"a": "b"}
    if injected:
        template["metadata"]["annotations"][INJECTED] = "0.0.1"
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": {"template": template}}
    wanted = copy.deepcopy(job)
    for each in templates(wanted):
        if is_injected(each):
            complete(each)
        else:
            inject(each, version=__version__)
    after, response = admitted(job)
    assert response["allowed"] is True
    assert after == wanted
