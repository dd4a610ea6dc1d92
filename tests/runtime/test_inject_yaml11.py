"""`topology-agent inject` writes YAML that YAML 1.1 readers read back as the strings the agent meant: PyYAML
(kubernetes-validate) reads a plain `1:2` as 62 and `on` as a bool, kubectl's go-yaml v2 a plain `y` or `0o17` as a
bool or an int (tests/integration/test_inject_kubectl.py reads the same output with kubectl). Each setting that
reaches an argument, an image, serviceAccountName or secretName is tried with values of its own grammar; the
user's own plain scalars stay as written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent import __version__
from agent.core.adoption import injection
from agent.core.adoption.injection import INIT, PREFIX, SIDECAR, SSH, Settings
from agent.errors import InputError
from agent.runtime.commands.inject import inject_text
from agent.runtime.quoting import is_misread_plain

ROOT = Path(__file__).resolve().parents[2]
# The training-operator's own elastic example: its elasticPolicy (1 to 2 workers) becomes `--elastic 1:2`.
ECHO = (ROOT / "tests" / "upstream" / "training-operator-pytorch-elastic-echo.yaml").read_text()
K8S_VERSION = "1.32"

# Each setting whose value the agent writes into the pod, with values of the setting's own grammar (a container or
# Secret name is a DNS name: no ':' or upper case; a label key has no ':') that YAML 1.2 reads as strings, so
# ruamel writes them plain, and that a YAML 1.1 reader misreads written plain: bools (`y` and `n` to go-yaml v2
# only), base-60 ints (PyYAML only) and ints with an upper-case base prefix (go-yaml v2 only).
TRIED: dict[str, tuple[str, ...]] = {
    "roles": ("on", "y", "1:2", "0X1F"),
    "container": ("off", "y", "n"),
    "cluster-domain": ("on", "n", "yes"),
    "topology-levels": ("yes", "Y", "0X1F", "0B1"),
    "trainer-match": ("on", "y", "1:2", "0O17"),
    "image": ("on", "y", "1:2"),
    "service-account": ("on", "y", "no"),
    "ssh-secret": ("no", "y", "off"),
}
CASES = [(setting, value) for setting, values in TRIED.items() for value in values]
ELASTIC = "1:2"


def annotated(settings: dict[str, str], *, name: str = "elastic-example-echo") -> str:
    """The example, named ``name``, with the job's settings as annotations (double-quoted, as kubectl needs a
    string), and what the SSH files and the trainer's signals need: the trainer's user and a shared process
    namespace; peers named by DNS where a cluster domain is given (an elastic job's are otherwise named by IP)."""
    needs = {"ssh-owner": "1000:1000", **({"address": "dns"} if "cluster-domain" in settings else {})}
    lines = "".join(f'    {PREFIX}{key}: "{value}"\n' for key, value in {**settings, **needs}.items())
    text = ECHO.replace("  name: elastic-example-echo\n", f"  name: {name}\n  annotations:\n{lines}", 1)
    return text.replace("        spec:\n", "        spec:\n          shareProcessNamespace: true\n", 1)


def template_of(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]


def agents(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in template["spec"]["initContainers"] if c["name"] in (INIT, SIDECAR)}


def written(template: dict[str, Any], setting: str) -> list[Any]:
    """Every place the agent wrote the setting's value, as the reader read it back."""
    spec, containers = template["spec"], agents(template)
    if setting == "image":
        return [c["image"] for c in containers.values()]
    if setting == "service-account":
        return [spec.get("serviceAccountName")]
    if setting == "ssh-secret":
        return [v["secret"]["secretName"] for v in spec["volumes"] if v["name"] == SSH]
    flag = f"--{setting}"
    return [c["args"][c["args"].index(flag) + 1] for c in containers.values() if flag in c["args"]]


def validate(template: dict[str, Any]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="installed by the test extra")
    wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": template}
    kubernetes_validate.validate(json.loads(json.dumps(wrapped)), K8S_VERSION, strict=True)


@pytest.mark.parametrize("value", sorted({v for values in TRIED.values() for v in values} | {ELASTIC}))
def test_every_value_tried_is_one_a_yaml_1_1_reader_misreads_written_plain(value):
    assert is_misread_plain(value)


@pytest.mark.parametrize(("setting", "value"), CASES, ids=[f"{s}={v}" for s, v in CASES])
def test_pyyaml_reads_every_value_inject_adds_as_the_string_it_is(setting, value):
    out, changed = inject_text(annotated({setting: value}), Settings(), version=__version__)
    assert changed == ["PyTorchJob elastic-example-echo Worker"]
    template = template_of(yaml.safe_load(out))
    expected = {"trainer-match": 1, "service-account": 1, "ssh-secret": 1}.get(setting, 2)  # init and sidecar
    assert written(template, setting) == [value] * expected
    assert written(template, "elastic") == [ELASTIC] * 2
    for container in agents(template).values():
        assert all(type(arg) is str for arg in container["args"]), container["args"]
    validate(template)


def test_a_second_run_over_quoted_values_changes_nothing():
    settings = {"roles": "on", "container": "y", "image": "1:2", "service-account": "y", "ssh-secret": "no"}
    once, _ = inject_text(annotated(settings), Settings(), version=__version__)
    again, _ = inject_text(once, Settings(), version=__version__)
    assert again == once


def test_the_training_operators_elastic_example_validates_as_inject_writes_it():
    """`--elastic 1:2` from its elasticPolicy: written plain, PyYAML (and so kubernetes-validate) read 62."""
    out, _ = inject_text(ECHO, Settings(), version=__version__)
    template = template_of(yaml.safe_load(out))
    assert written(template, "elastic") == [ELASTIC] * 2
    validate(template)


UPSTREAM = sorted((ROOT / "tests" / "upstream").glob("*.yaml"))


@pytest.mark.parametrize("path", UPSTREAM, ids=[p.name for p in UPSTREAM])
def test_the_controllers_own_examples_read_back_with_pyyaml_as_strings_that_validate(path):
    """Settings given on the command line (inject --set) are written as those from annotations are. A Volcano
    Job's roles must name its tasks (inject refuses a job that would train nothing), so there the roles
    name its training task, after the refusal of `--roles on` is checked."""
    settings = {"roles": "on", "image": "1:2"}
    if "batch.volcano.sh/" in path.read_text():
        with pytest.raises(InputError, match=r"none of its tasks .* is a training role given \(on\)"):
            inject_text(path.read_text(), Settings(settings), version=__version__)
        settings["roles"] = "mpiworker"  # Volcano's MPI example: mpimaster launches, mpiworker computes
    out, changed = inject_text(path.read_text(), Settings(settings), version=__version__)
    assert changed
    templates = [t.template for doc in yaml.safe_load_all(out) if doc for t in injection.templates(doc)]
    assert len(templates) == len(changed)
    for template in templates:
        for container in agents(template).values():
            assert container["image"] == "1:2"
            assert all(type(arg) is str for arg in container["args"]), container["args"]
        validate(template)


USERS = """\
apiVersion: v1
kind: Pod
metadata:
  name: worker-0
  annotations:
    topology-agent.io/roles: "y"
spec:
  containers:
  - name: trainer
    image: trainer
    tty: yes
    stdin: on
    env:
    - name: PET_NNODES
      value: 1:2
    - name: LEVEL
      value: "off"
    args: ['no', "0o17"]
"""


def test_the_users_own_scalars_stay_as_written_where_the_agents_copies_are_quoted():
    """A Pod of an elastic job (its PET_NNODES, written plain by the user) passes the range to the agent: the
    user's lines stay as they are, bools included, and the agent's copy reads back as a string."""
    out, _ = inject_text(USERS, Settings(), version=__version__)
    for line in USERS.splitlines():
        assert line in out.splitlines(), line
    pod = yaml.safe_load(out)
    assert pod["spec"]["containers"][0]["tty"] is True and pod["spec"]["containers"][0]["stdin"] is True
    init = agents(pod)[INIT]
    assert init["args"][init["args"].index("--elastic") + 1] == "1:2"
    assert init["args"][init["args"].index("--roles") + 1] == "y"


@pytest.mark.parametrize(("text", "misread"), [
    ("on", True), ("ON", True), ("y", True), ("N", True), ("off", True), ("~", True), ("", True), ("null", True),
    ("1:2", True), ("0o17", True), ("0x1F", True), ("0b101", True), ("-0b1", True), ("1_000", True), ("09", True),
    ("1e3", True), (".5", True), ("+.inf", True), (".NaN", True), ("2001-01-01", True), ("2001-1-2T03:04:05Z", True),
    ("<<", True), ("=", True),
    ("ono", False), ("yes-no", False), ("0o18", False), ("0x", False), ("1:2:a", False), ("1.2.3", False),
    ("_1", False), ("topology-agent", False), ("ip", False), ("/shared", False), ("v1.2", False), ("2001", True),
])
def test_what_a_yaml_1_1_reader_misreads_written_plain(text, misread):
    assert is_misread_plain(text) is misread
