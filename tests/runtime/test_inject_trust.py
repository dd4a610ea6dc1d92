"""Trust, inject's side: hostile or odd manifests given to `topology-agent inject` and the
shared transform. A user's own pieces are never removed, bad input is one line and exit 2, YAML is bounded as
kubectl bounds it, and what inject writes reads back the same."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from agent import __version__
from agent.cli import main
from agent.core.adoption.injection import INJECTED, SHARED, Settings, inject_document
from agent.errors import InputError
from agent.flags.parser import check_command_line
from agent.runtime.commands.inject import inject_text

ROOT = Path(__file__).resolve().parents[2]


def inject(text: str, settings: Settings | None = None) -> str:
    return inject_text(text, settings or Settings(), version=__version__)[0]


def load(text: str) -> dict:
    return YAML(typ="safe").load(text)


def run_inject(text: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    code = main(["inject"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_exit_2(text: str, capsys, monkeypatch) -> str:
    code, out, err = run_inject(text, capsys, monkeypatch)
    assert code == 2, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def pod(volumes: str, mounts: str = "", annotations: str = "") -> str:
    return (f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n{annotations}spec:\n  containers:\n"
            f"  - name: trainer\n    image: trainer:1\n{mounts}  volumes:\n{volumes}")


# -- 1. a user's volume is never removed ---------------------------------------------------------------------


def test_a_users_pvc_named_like_the_agent_is_kept_with_its_mount():
    """A user's PVC `topology-agent-data` at /data stays: a name-prefix match would remove it and admit the pod
    with the shared emptyDir instead, and the job would write its data nowhere."""
    text = pod("  - name: topology-agent-data\n    persistentVolumeClaim:\n      claimName: data\n",
               "    volumeMounts:\n    - name: topology-agent-data\n      mountPath: /data\n")
    spec = load(inject(text))["spec"]
    assert {"name": "topology-agent-data", "persistentVolumeClaim": {"claimName": "data"}} in spec["volumes"]
    assert {"name": "topology-agent-data", "mountPath": "/data"} in spec["containers"][0]["volumeMounts"]
    assert {"name": SHARED, "mountPath": "/shared"} in spec["containers"][0]["volumeMounts"]


def test_a_users_volume_stays_through_a_second_run_and_an_upgrade():
    """The same volume in a template the agent injected before (an upgrade takes the agent's pieces out first)."""
    text = pod("  - name: topology-agent-config\n    configMap:\n      name: settings\n",
               "    volumeMounts:\n    - name: topology-agent-config\n      mountPath: /etc/settings\n")
    once = inject(text)
    old = inject(text, Settings({"image": "topology-agent:0.0.9"}))
    for again in (inject(once), inject(old)):
        spec = load(again)["spec"]
        assert {"name": "topology-agent-config", "configMap": {"name": "settings"}} in spec["volumes"]
        assert {"name": "topology-agent-config", "mountPath": "/etc/settings"} in spec["containers"][0]["volumeMounts"]
    assert inject(once) == once


def test_inject_keeps_a_configmap_volume_of_a_job():
    doc = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": {"template": {"spec": {
        "containers": [{"name": "t", "image": "x", "volumeMounts": [{"name": "topology-agent-cfg",
                                                                      "mountPath": "/cfg"}]}],
        "volumes": [{"name": "topology-agent-cfg", "configMap": {"name": "cfg"}}]}}}}
    inject_document(doc, Settings(), version=__version__)
    spec = doc["spec"]["template"]["spec"]
    assert {"name": "topology-agent-cfg", "configMap": {"name": "cfg"}} in spec["volumes"]
    assert [v["name"] for v in spec["volumes"]] == ["topology-agent-cfg", "topology-agent-shared",
                                                    "topology-agent-token"]


@pytest.mark.parametrize(("volume", "annotations", "says"), [
    ("  - name: topology-agent-shared\n    persistentVolumeClaim:\n      claimName: data\n", "",
     "volume 'topology-agent-shared' is in a template the agent did not inject"),
    ("  - name: topology-agent-token\n    secret:\n      secretName: mine\n", "",
     "volume 'topology-agent-token' is in a template the agent did not inject"),
    # a template that says it was injected still keeps a volume the agent would not have made
    ("  - name: topology-agent-shared\n    persistentVolumeClaim:\n      claimName: data\n",
     f"  annotations:\n    {INJECTED}: 0.0.9\n",
     "volume 'topology-agent-shared' is a persistentVolumeClaim volume, not the agent's emptyDir"),
    # the state volume holds what decides membership: a PVC of that name in an injected template is the user's
    ("  - name: topology-agent-state\n    persistentVolumeClaim:\n      claimName: data\n",
     f"  annotations:\n    {INJECTED}: 0.0.9\n",
     "volume 'topology-agent-state' is a persistentVolumeClaim volume, not the agent's emptyDir"),
], ids=["pvc-not-injected", "secret-not-injected", "pvc-in-injected-template", "state-pvc-in-injected-template"])
def test_a_users_volume_with_one_of_the_agents_own_names_is_refused_in_one_line(volume, annotations, says, capsys,
                                                                                 monkeypatch):
    line = one_line_exit_2(pod(volume, annotations=annotations), capsys, monkeypatch)
    assert "Pod p: " in line and says in line and "rename the volume and its volumeMounts" in line, line


def test_a_users_container_with_the_agents_name_is_refused(capsys, monkeypatch):
    text = ("apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: j\nspec:\n  template:\n    spec:\n"
            "      initContainers:\n      - name: topology-agent\n        image: mine:1\n"
            "      containers:\n      - name: t\n        image: x\n")
    line = one_line_exit_2(text, capsys, monkeypatch)
    assert "Job j: init container 'topology-agent' is in a template the agent did not inject" in line
    assert "rename it" in line


def test_a_shipped_hand_written_example_is_refused_with_what_to_do(capsys, monkeypatch):
    """manifests/examples have the agent written in by hand (no injected annotation): inject does not guess
    which pieces are the agent's; it says to apply such a job as it is."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "manifests" / "examples" / "pytorchjob.yaml").read_text()
    line = one_line_exit_2(text, capsys, monkeypatch)
    assert "init container 'topology-agent'" in line and "apply the job without inject" in line, line


def test_a_users_own_mount_of_the_shared_volume_elsewhere_stays_and_a_second_run_changes_nothing():
    """A user's init container (or a container) that reads the agent's files where it likes keeps its mount."""
    text = ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  initContainers:\n  - name: prepare\n"
            "    image: x\n    volumeMounts:\n    - name: topology-agent-shared\n      mountPath: /topology\n"
            "  containers:\n  - name: trainer\n    image: trainer:1\n    volumeMounts:\n"
            "    - name: topology-agent-shared\n      mountPath: /etc/topology-files\n")
    once = inject(text)
    spec = load(once)["spec"]
    assert spec["initContainers"][-1]["volumeMounts"] == [{"name": SHARED, "mountPath": "/topology"}]
    assert spec["containers"][0]["volumeMounts"] == [{"name": SHARED, "mountPath": "/etc/topology-files"}]
    assert inject(once) == once


# -- 2. YAML aliases bounded as kubectl bounds them ----------------------------------------------------------


def alias_bomb(levels: int = 10, fan: int = 10) -> str:
    """A kubectl List whose items alias nested Lists: fan**levels Pods from under 1 KB."""
    lines = ["apiVersion: v1", "kind: List", "items:",
             "- &l0 {kind: List, items: [&p {apiVersion: v1, kind: Pod, metadata: {name: p}, spec: {containers: "
             "[{name: t, image: x}]}}" + ", *p" * (fan - 1) + "]}"]
    for level in range(1, levels):
        lines.append(f"- &l{level} {{kind: List, items: [" + ", ".join([f"*l{level - 1}"] * fan) + "]}")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_in_one_line_before_any_template_is_walked(capsys, monkeypatch):
    """895 bytes of YAML aliases make 10^10 templates; inject refuses them at once. The count is kept as the YAML
    is composed, so nothing is expanded: the agent's transform is never reached (a counter stands in for a clock)."""
    import agent.core.adoption.injection as injection

    text = alias_bomb()
    assert len(text) < 1024
    calls = []
    real = injection.inject

    def counted(*args, **kwargs):
        calls.append(1)
        assert len(calls) < 1000, "inject walked the alias bomb's templates"
        return real(*args, **kwargs)

    monkeypatch.setattr(injection, "inject", counted)
    line = one_line_exit_2(text, capsys, monkeypatch)
    assert "excessive aliasing" in line and "come from aliases" in line, line
    assert calls == []


def configmap_aliasing(times: int, width: int = 200) -> str:
    """A ConfigMap whose list of ``width`` numbers is aliased ``times`` times: the shape go-yaml's rule was
    written for (few real nodes, many alias-driven ones)."""
    values = ", ".join(str(i) for i in range(width))
    return (f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  a: &a [{values}]\n"
            f"  b: [{', '.join(['*a'] * times)}]\n")


def test_aliasing_is_refused_exactly_where_kubectl_refuses_it():
    """go-yaml's rule counted here as kubectl's decoder counts: 209 aliases of a 200-item list pass (42,230 of
    42,636 nodes from aliases, 98.9%), 210 do not (99.0%). kubectl v1.32 gives the same answer (the next test)."""
    out = inject(configmap_aliasing(209))
    assert load(out)["data"]["b"][208] == list(range(200))
    with pytest.raises(InputError, match="excessive aliasing"):
        inject(configmap_aliasing(210))


def test_the_allowed_share_of_aliases_falls_from_99_to_10_percent():
    from agent.runtime.commands.inject import allowed_alias_ratio, excessive_aliasing

    assert allowed_alias_ratio(1000) == allowed_alias_ratio(400_000) == 0.99
    assert allowed_alias_ratio(2_200_000) == pytest.approx(0.545)
    assert allowed_alias_ratio(4_000_000) == allowed_alias_ratio(10**12) == 0.10
    assert not excessive_aliasing(1000, 999) and not excessive_aliasing(100_000, 100)  # the two floors
    assert excessive_aliasing(1001, 992) and not excessive_aliasing(1001, 990)
    assert excessive_aliasing(4_000_000, 400_001) and not excessive_aliasing(4_000_000, 400_000)


SHAPES = {  # each alias brings one node of its own and ~200 alias-driven ones, so the share can pass 99%
    "list": lambda n: configmap_aliasing(n),
    "mapping": lambda n: ("kind: ConfigMap\napiVersion: v1\nmetadata: {name: c}\ndata:\n  a: &a {"
                          + ", ".join(f"k{i}: v{i}" for i in range(100)) + "}\n  b: [" + ", ".join(["*a"] * n)
                          + "]\n"),
    "nested": lambda n: ("kind: ConfigMap\napiVersion: v1\nmetadata: {name: c}\ndata:\n  a: &a ["
                         + ", ".join(str(i) for i in range(50)) + "]\n  b: &b [*a, *a, *a, *a]\n  c: ["
                         + ", ".join(["*b"] * n) + "]\n"),
    "second-document": lambda n: "kind: ConfigMap\napiVersion: v1\nmetadata: {name: first}\n---\n"
                                 + configmap_aliasing(n, 300),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_kubectl_refuses_the_same_aliasing(shape, tmp_path):
    """The boundary found with the agent, checked against kubectl's own decoder on both sides (kubectl only
    decodes here: its server is a closed loopback port, so every call ends with an error after decoding)."""
    import shutil
    import subprocess

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (https://kubernetes.io/docs/tasks/tools/)")
    make = SHAPES[shape]

    def refused(n: int) -> bool:
        try:
            inject(make(n))
        except InputError as err:
            assert "excessive aliasing" in str(err)
            return True
        return False

    low, high = 1, 4000  # refused(high), not refused(low): bisect to the first refused count
    assert not refused(low) and refused(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if refused(middle) else (middle, high)
    for n, expected in ((low, False), (high, True)):
        path = tmp_path / f"{shape}-{n}.yaml"
        path.write_text(make(n))
        run = subprocess.run([kubectl, "create", "--dry-run=client", "-o", "name", "--validate=false",
                              "--server=http://127.0.0.1:1", "-f", str(path)], capture_output=True, text=True,
                             timeout=60)
        assert ("excessive aliasing" in run.stderr) is expected, (shape, n, run.stderr)


def test_an_anchor_that_contains_itself_is_refused():
    """go-yaml refuses it ("anchor 'a' value contains itself"); ruamel would build a cycle for the dump to chase."""
    with pytest.raises(InputError, match="anchor 'a' contains an alias of itself at line 6"):
        inject("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata: &a\n  x: *a\n")


def test_templates_visits_an_object_aliased_many_times_once():
    """The same object reached through Lists in Lists (10^5 paths here) is one object: one template, once."""
    from agent.core.adoption.injection import templates

    pod_ = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "t", "image": "x"}]}}
    level: dict = {"kind": "List", "items": [pod_] * 10}
    for _ in range(4):
        level = {"kind": "List", "items": [level] * 10}
    assert [t.where for t in templates(level)] == ["Pod p"]


def test_a_template_shared_by_an_anchor_is_injected_once_and_stays_shared():
    """Volcano jobs often share one template between tasks with an anchor; the output keeps the anchor."""
    text = ("apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata:\n  name: v\nspec:\n  tasks:\n"
            "  - name: master\n    replicas: 1\n    template: &t\n      spec:\n        containers:\n"
            "        - name: t\n          image: x\n  - name: worker\n    replicas: 2\n    template: *t\n")
    once, changed = inject_text(text, Settings(), version=__version__)
    assert changed == ["Job v tasks[0] (master)", "Job v tasks[1] (worker)"]
    assert "template: *t" in once and once.count("name: topology-agent\n") == 1
    tasks = load(once)["spec"]["tasks"]
    assert tasks[0]["template"] == tasks[1]["template"]
    assert tasks[1]["template"]["spec"]["initContainers"][0]["name"] == "topology-agent"
    assert inject(once) == once


# -- nesting: bounded in YAML and JSON alike -----------------------------------------------------------------


def nested_configmap(depth: int) -> str:
    """A ConfigMap whose data nests ``depth`` mappings in all (the document itself counts one)."""
    lines = ["apiVersion: v1", "kind: ConfigMap", "metadata:", "  name: c", "data:"]
    lines += [f"{'  ' * (level + 1)}k{level}:" for level in range(depth - 2)]
    lines.append(f"{'  ' * (depth - 1)}leaf: x")
    return "\n".join(lines) + "\n"


def test_a_configmap_nested_300_deep_is_one_line_exit_2(capsys, monkeypatch):
    """Deep nesting is refused in one line (exit 2), not a RecursionError from the YAML dump (exit 70)."""
    line = one_line_exit_2(nested_configmap(300), capsys, monkeypatch)
    assert "nests objects and lists more than 100 deep" in line and "(line 105)" in line, line


def test_nesting_up_to_the_bound_passes_through_unchanged_in_yaml_and_json():
    text = nested_configmap(100)
    assert inject(text) == text
    assert inject(json.dumps(load(text))) == json.dumps(load(text), indent=2) + "\n"
    with pytest.raises(InputError, match="more than 100 deep"):
        inject(nested_configmap(101))
    with pytest.raises(InputError, match="more than 100 deep"):
        inject(json.dumps(load(nested_configmap(101))))


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, "- " * 5000 + "x\n",
                                  "x: " + "{a: " * 5000 + "}" * 5000], ids=["json", "block", "flow"])
def test_deeper_input_than_any_parser_stack_is_one_line(text, capsys, monkeypatch):
    line = one_line_exit_2(text, capsys, monkeypatch)
    assert "more than 100 deep" in line, line


# -- 3. every bad manifest is one line and exit 2 ------------------------------------------------------------

SSH_POD = ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations:\n    topology-agent.io/ssh-secret: s\n"
           "spec:\n{pod}  containers:\n  - name: t\n    image: x\n{container}")


@pytest.mark.parametrize(("text", "says"), [
    ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations: [1, 2]\nspec:\n  containers:\n"
     "  - name: t\n    image: x\n", "Pod p: metadata.annotations is [1, 2], not a map of strings"),
    ("apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: j\nspec:\n  template:\n    metadata:\n"
     "      annotations: x\n    spec:\n      containers:\n      - name: t\n        image: x\n",
     "Job j: metadata.annotations is 'x', not a map of strings"),
    ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations:\n    topology-agent.io/timeout: [1]\n"
     "spec:\n  containers:\n  - name: t\n    image: x\n",
     "Pod p: annotation 'topology-agent.io/timeout' is [1], not a string; quote the value"),
    (SSH_POD.format(pod="  securityContext: x\n", container=""), "Pod p: spec.securityContext is 'x', not an object"),
    (SSH_POD.format(pod="", container="    securityContext: [1]\n"),
     "Pod p: securityContext of container 't' is [1], not an object"),
    (SSH_POD.format(pod="  securityContext:\n    runAsUser: 1.5e400\n", container=""),
     "Pod p: spec.securityContext.runAsUser is inf, not a user or group ID (a whole number from 0 to 2147483647)"),
    (SSH_POD.format(pod="", container="    securityContext:\n      runAsUser: true\n"),
     "Pod p: securityContext of container 't': runAsUser is True, not a user or group ID"),
    (SSH_POD.format(pod="  securityContext:\n    runAsUser: -1\n", container=""),
     "spec.securityContext.runAsUser is -1, not a user or group ID"),
    (SSH_POD.format(pod="  securityContext:\n    runAsUser: 2147483648\n", container=""),
     "spec.securityContext.runAsUser is 2147483648, not a user or group ID"),
    (SSH_POD.format(pod="  securityContext:\n    runAsUser: 1000\n    runAsGroup: '1000'\n", container=""),
     "spec.securityContext.runAsGroup is '1000', not a user or group ID"),
    (SSH_POD.format(pod="  securityContext:\n    runAsUser: 1000\n", container="    volumeMounts: /data\n"),
     "Pod p: spec.containers[0].volumeMounts is '/data', not a list"),
    (SSH_POD.format(pod="  volumes: {data: {emptyDir: {}}}\n", container=""),
     "Pod p: spec.volumes is {'data': {'emptyDir': {}}}, not a list"),
    (SSH_POD.format(pod="  initContainers: [x]\n", container=""),
     "Pod p: spec.initContainers[0] is 'x', not a container"),
    ("apiVersion: v1\nkind: Pod\nmetadata: x\nspec:\n  containers:\n  - name: t\n    image: x\n",
     "Pod ?: metadata is 'x', not an object"),
    ("a: 1\n? b:\n    c: [1]\n: 2\n", "the input is YAML that inject cannot read (TypeError: unhashable type"),
    ("a: \x00\n", "the input is not YAML: unacceptable character #x0000: special characters are not allowed in"),
], ids=["annotations-list", "template-annotations-string", "annotation-value-list", "pod-context", "container-context",
        "uid-inf", "uid-bool", "uid-negative", "uid-too-big", "gid-string", "mounts-string", "volumes-map",
        "init-container-string", "metadata-string", "mapping-key", "nul"])
def test_a_bad_manifest_is_one_line_and_exit_2(text, says, capsys, monkeypatch):
    """Each of these is one line and exit 2: never exit 70 ("internal error") with a traceback, nor (volumes,
    mounts, init containers of another type) silently replaced by the agent's own list."""
    line = one_line_exit_2(text, capsys, monkeypatch)
    assert says in line, line


def test_a_null_setting_is_empty_not_the_word_none():
    """A setting written `key:` with no value (YAML null) is empty, as the API server stores it."""
    text = ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations:\n    topology-agent.io/image:\n"
            "spec:\n  containers:\n  - name: t\n    image: x\n")
    assert load(inject(text))["spec"]["initContainers"][0]["image"] == f"topology-agent:{__version__}"


def test_a_reused_anchor_gives_no_warning_on_stderr(capfd):
    """YAML lets an anchor be defined again (the last one counts); ruamel warned in several lines on stderr."""
    text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  a: &x '1'\n  b: &x '2'\n  c: *x\n"
    assert inject(text) == text
    assert capfd.readouterr().err == ""


# -- 4. settings that shape the pod are validated; every setting is bounded ----------------------------------


def job_with(annotations: dict[str, str]) -> str:
    lines = "".join(f"    {key}: {json.dumps(value)}\n" for key, value in annotations.items())  # YAML reads JSON
    return ("apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: j\n  annotations:\n" + lines
            + "spec:\n  template:\n    spec:\n      securityContext:\n        runAsUser: 1000\n"
              "      containers:\n      - name: t\n        image: x\n")


@pytest.mark.parametrize(("key", "value", "says"), [
    ("service-account", "Bad_Name!", "'topology-agent.io/service-account' 'Bad_Name!' is not a ServiceAccount name"),
    ("ssh-secret", "no/such secret", "'topology-agent.io/ssh-secret' 'no/such secret' is not a Secret name"),
    ("image", " spaced ", "'topology-agent.io/image' ' spaced ' is not an image reference"),
    ("image", "topology-agent:", "is not an image reference"),
    ("image", "a\tb", "is not an image reference"),
    ("image", "x@sha256:12", "is not an image reference"),
    ("image", "a" * 256 + ":1", "is not an image reference"),
    ("out", "shared", "'topology-agent.io/out' 'shared' is not a directory the agent can share"),
    ("out", "/", "is not a directory the agent can share"),
    ("out", "/data/../etc", "is not a directory the agent can share"),
    ("out", "/shared/", "is not a directory the agent can share"),
    ("out", "/a//b", "is not a directory the agent can share"),
    ("out", "/a\nb", "is not a directory the agent can share"),
    ("out", "//shared", "is not a directory the agent can share"),
    ("image", "topology-agent:vé", "is not an image reference"),
    ("ssh-owner", "3000000000:1000", "ssh-owner: its UID is 3000000000, not a user or group ID"),
    ("trainer-match", "x" * 1025, "'topology-agent.io/trainer-match' is 1025 characters long; a setting is at "
                                   "most 1024"),
    ("timeout", "9" * 2000, "'topology-agent.io/timeout' is 2000 characters long"),
], ids=["account", "secret", "image-spaces", "image-empty-tag", "image-tab", "image-short-digest", "image-long",
        "out-relative", "out-root", "out-dotdot", "out-trailing-slash", "out-double-slash", "out-newline",
        "out-leading-double-slash", "image-non-ascii-tag",
        "owner-uid", "match-long", "timeout-long"])
def test_a_setting_that_would_make_pods_the_api_server_refuses_is_one_line_exit_2(key, value, says, capsys,
                                                                                  monkeypatch):
    """Each of these is refused at once: let through (exit 0), the job would be applied, or admitted by the
    webhook, and every pod of it refused later (an invalid ServiceAccount or Secret name, an image no runtime
    pulls, a mount at a relative path or at /)."""
    annotations = {f"topology-agent.io/{key}": value}
    if key == "ssh-owner":
        annotations["topology-agent.io/ssh-secret"] = "s"
    if key == "trainer-match":
        annotations["topology-agent.io/sidecar"] = "true"
    line = one_line_exit_2(job_with(annotations), capsys, monkeypatch)
    assert line.startswith("topology-agent inject: error: Job j: annotation ") and says in line, line


@pytest.mark.parametrize(("key", "value"), [
    ("service-account", "trainer.team-a"), ("ssh-secret", "ds-ssh"), ("image", "topology-agent:0.1.0"),
    ("image", "ghcr.io/acme/topology-agent:0.1.0"), ("image", "localhost:5000/tools/topology_agent__x:v1.0-rc.1"),
    ("image", "[fd00::1]:5000/agent@sha256:" + "0" * 64), ("out", "/data/topology"), ("out", "/shared"),
])
def test_good_settings_that_shape_the_pod_pass(key, value):
    spec = load(inject(job_with({f"topology-agent.io/{key}": value})))["spec"]["template"]["spec"]
    init = spec["initContainers"][0]
    if key == "image":
        assert init["image"] == value
    elif key == "out":
        assert {"name": SHARED, "mountPath": value} in spec["containers"][0]["volumeMounts"]
    elif key == "service-account":
        assert spec["serviceAccountName"] == value
    else:
        assert {"name": "topology-agent-ssh", "secret": {"secretName": value, "defaultMode": 0o444}} in spec["volumes"]


def test_a_long_trainer_match_is_refused_before_any_regex_is_compiled(monkeypatch):
    """A 200 KB trainer-match value is never compiled (re's cache would keep 512 of them): the length bound
    comes first, in Settings.over, for inject, the webhook and --set alike."""
    compiled: list[int] = []
    real = re.compile

    def counting(pattern, flags=0):
        compiled.append(len(pattern))
        return real(pattern, flags)

    monkeypatch.setattr(re, "compile", counting)
    text = job_with({"topology-agent.io/sidecar": "true", "topology-agent.io/trainer-match": "(a|b)*" * 40_000})
    with pytest.raises(InputError, match="is 240000 characters long; a setting is at most 1024"):
        inject(text)
    assert not [n for n in compiled if n > 1024]
    with pytest.raises(InputError, match=re.escape("--set: annotation 'topology-agent.io/image' is 2000 characters")):
        Settings().over({"topology-agent.io/image": "x" * 2000}, "--set")


def test_the_webhook_refuses_the_same_settings_with_the_same_line():
    """The webhook runs the same transform: a Volcano Job whose image setting has spaces is denied at CREATE
    (it was admitted, and every pod of it refused later), and so is a Pod over the namespace's own bad setting."""
    from agent.core.adoption import admission

    job = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {
        "name": "v", "annotations": {"topology-agent.io/image": " spaced "}}, "spec": {"tasks": [
            {"name": "worker", "replicas": 2, "template": {"spec": {"containers": [{"name": "t", "image": "x"}]}}}]}}
    request = admission.parse_review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u", "operation": "CREATE", "namespace": "team-a", "name": "v",
        "kind": {"group": "batch.volcano.sh", "version": "v1alpha1", "kind": "Job"}, "object": job}})
    response = admission.answer(request, Settings(), version=__version__, check=check_command_line)["response"]
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        "topology-agent: Job v: annotation 'topology-agent.io/image' ' spaced ' is not an image reference "
        "([registry/]path[:tag][@digest], the path in lower case, no spaces); e.g. ghcr.io/acme/topology-agent:0.1.0")
    with pytest.raises(InputError, match=re.escape("Namespace team-a: annotation 'topology-agent.io/out' '/' is not")):
        admission.namespace_settings({"metadata": {"name": "team-a", "annotations": {"topology-agent.io/out": "/"}}})


# -- 5. JSON is read as strictly as YAML ---------------------------------------------------------------------


def test_json_with_a_duplicate_key_is_refused_as_the_same_yaml_is(capsys, monkeypatch):
    """A duplicate key is refused: the first `spec` (with the user's volume) is never dropped without a word."""
    first = '{"containers": [{"name": "t", "image": "x"}], "volumes": [{"name": "data", "emptyDir": {}}]}'
    second = '{"containers": [{"name": "t", "image": "x"}]}'
    text = f'{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "p"}}, "spec": {first}, "spec": {second}}}'
    line = one_line_exit_2(text, capsys, monkeypatch)
    assert line.endswith("the input's JSON has the key 'spec' twice in one object; keep one (the same YAML is "
                         "refused too)"), line
    as_yaml = one_line_exit_2(f"apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec: {first}\nspec: {second}\n",
                              capsys, monkeypatch)
    assert "duplicate key" in as_yaml and '"spec"' in as_yaml, as_yaml
    nested = '[{"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": "c", "name": "d"}}]'
    assert "the key 'name' twice" in one_line_exit_2(nested, capsys, monkeypatch)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_json_constants_no_kubernetes_client_reads_are_refused(constant, capsys, monkeypatch):
    text = f'{{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {{"name": "c"}}, "data": {{"a": {constant}}}}}'
    line = one_line_exit_2(text, capsys, monkeypatch)
    assert f"has {constant}, which is not a JSON number" in line, line


# -- 6. flow style, comments and line endings round-trip -----------------------------------------------------

WEBSITE = ROOT / "tests" / "upstream" / "website"


@pytest.mark.parametrize("name", ["init-containers.yaml", "indexed-job.yaml"])
def test_kubernetes_websites_flow_style_examples_keep_their_layout_and_read_back_the_same(name):
    """kubernetes/website's examples are flow style over many lines (KYAML). inject keeps their lines and
    comments, and inject of its output reads it (it "starts like JSON" without being JSON)."""
    text = (WEBSITE / name).read_text()
    once = inject(text)
    assert inject(once) == once
    lines = once.splitlines()
    assert lines[:4] == text.splitlines()[:4]  # the header comment and the ---
    assert max(len(line) for line in lines[4:]) < 100  # block style, not one line
    for key in ("apiVersion:", "kind:", "metadata:", "spec:", "initContainers:", "volumes:", "containers:"):
        assert sum(line.strip().startswith(key) for line in lines) >= 1, key
    document = load(once)
    assert document == load(inject(yaml_dumped(load(text))))  # the same objects as from plain YAML
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="installed by the test extra")
    kubernetes_validate.validate(json.loads(json.dumps(document)), "1.32", strict=True)


def yaml_dumped(doc: dict) -> str:
    out = io.StringIO()
    YAML(typ="safe").dump(doc, out)
    return out.getvalue()


def test_the_comment_inside_flow_style_stays_over_the_key_it_was_written_over():
    once = inject((WEBSITE / "init-containers.yaml").read_text()).splitlines()
    at = once.index("  # These containers are run during pod initialization")
    assert once[at + 1] == "  initContainers:"
    assert once[at - 2:at] == ["    - name: topology-agent-shared", "      mountPath: /shared"]


def test_flow_style_that_starts_like_json_is_read_as_yaml():
    """KYAML without a leading --- starts with '{', as JSON does; JSON is tried first, then YAML."""
    text = (WEBSITE / "indexed-job.yaml").read_text().split("---\n", 1)[1]
    assert text.startswith("{")
    once = inject(text)
    assert once.startswith('apiVersion: "batch/v1"\nkind: "Job"\n') and inject(once) == once
    with pytest.raises(InputError, match=re.escape("the input starts like JSON but is not JSON (Expecting property "
                                                   "name enclosed in double quotes: line 1 column 2 (char 1)), nor "
                                                   "YAML (expected the node content, but found ']' at line 1)")):
        inject("{]")


def test_comments_by_a_list_the_agent_adds_to_stay_with_what_they_were_written_over():
    """ruamel kept a comment over `volumes:` as the one after the last volume mount: the agent's mount went in
    between, and injecting again dropped it with the agent's mount."""
    text = ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  initContainers:\n  # fetch the data first\n"
            "  - name: fetch  # mine\n    image: x\n  # then warm the cache\n  - name: warm\n    image: x\n"
            "  containers:\n  - name: t\n    image: x\n    volumeMounts:\n    - name: data\n      mountPath: /data\n"
            "  # the data volume\n  volumes:\n  - name: data\n    emptyDir: {}\n  # the agent's go after this\n")
    once = inject(text)
    lines = once.splitlines()
    assert lines[lines.index("  # the data volume") + 1] == "  volumes:"
    assert lines[lines.index("  # then warm the cache") + 1] == "  - name: warm"
    assert "  - name: fetch  # mine" in lines or "  - name: fetch # mine" in lines
    assert inject(once) == once


def test_crlf_comes_back_as_crlf_from_a_file_and_from_stdin(tmp_path, capsys, monkeypatch):
    """CRLF input comes back CRLF (Python's text reading would turn every CRLF into LF before inject saw it)."""
    lf = (ROOT / "tests" / "upstream" / "jobset-depends-on.yaml").read_text()
    crlf = lf.replace("\n", "\r\n")
    path = tmp_path / "job.yaml"
    path.write_bytes(crlf.encode())
    assert main(["inject", "-f", str(path)]) == 0
    out = capsys.readouterr().out
    assert out == inject(lf).replace("\n", "\r\n")
    assert out.count("\r\n") == out.count("\n")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(crlf.encode()), encoding="utf-8"))
    assert main(["inject"]) == 0
    assert capsys.readouterr().out == out
    assert inject(out) == out  # and it reads back the same


def test_json_with_a_byte_order_mark_is_still_json():
    text = '\ufeff{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}'
    assert inject(text) == '\ufeff' + json.dumps(json.loads(text[1:]), indent=2) + "\n"
