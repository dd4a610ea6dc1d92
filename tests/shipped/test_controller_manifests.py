"""The shipped webhook rules and RBAC name every job object the controllers' registry says the agent injects or
reads, and nothing more: a controller added without its manifests (or a manifest left behind by a removed one)
fails here."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from agent.core.adoption.admission import JOB_RESOURCES
from agent.core.controllers import CONTROLLERS, job_resources

ROOT = Path(__file__).resolve().parents[2]
WEBHOOK = ROOT / "manifests" / "webhook"
RBAC = ROOT / "manifests" / "rbac"
# API groups of the agent's own objects and its pods' (pods, Services, its ConfigMaps, Lease and Events, the pods'
# DRA ResourceClaims), not of any controller's jobs.
OWN_GROUPS = ("", "coordination.k8s.io", "events.k8s.io", "resource.k8s.io")

INJECTED = {(r.group, r.plural) for r in job_resources() if r.templates}
READ = {(r.group, r.plural) for r in job_resources() if r.read and r.namespaced}
READ_CLUSTER_WIDE = {(r.group, r.plural) for r in job_resources() if r.read and not r.namespaced}


def _documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _pairs(rules: list[dict], verb: str | None = None) -> set[tuple[str, str]]:
    """(group, resource) of every rule (that grants ``verb``, for RBAC rules)."""
    return {(group, resource) for rule in rules if verb is None or verb in rule["verbs"]
            for group in rule["apiGroups"] for resource in rule["resources"]}


def _webhooks() -> dict[str, dict]:
    config = next(doc for doc in _documents(WEBHOOK / "mutatingwebhookconfiguration.yaml")
                  if doc["kind"] == "MutatingWebhookConfiguration")
    return {webhook["name"]: webhook for webhook in config["webhooks"]}


def test_the_registry_derives_something_to_check():
    assert {"pytorchjobs", "mpijobs", "jobsets", "leaderworkersets", "trainingruntimes"} <= {p for _, p in INJECTED}
    assert ("trainer.kubeflow.org", "clustertrainingruntimes") in READ_CLUSTER_WIDE


def test_each_kind_of_job_object_belongs_to_one_controller():
    kinds = Counter((r.group, r.kind) for c in CONTROLLERS.values() for r in c.resources)
    resources = Counter((r.group, r.plural) for c in CONTROLLERS.values() for r in c.resources)
    assert [k for k, n in kinds.items() if n > 1] == []
    assert [k for k, n in resources.items() if n > 1] == []
    assert all(r.read or r.templates for r in job_resources())


@pytest.mark.parametrize("name", ["jobs.topology-agent.io", "namespace-jobs.topology-agent.io"])
def test_the_job_webhooks_take_every_controllers_job_objects_that_hold_pod_templates(name):
    rules = _webhooks()[name]["rules"]
    assert all(rule["operations"] == ["CREATE"] for rule in rules)
    assert _pairs(rules) == INJECTED
    assert {(g, p) for g, plurals in JOB_RESOURCES.items() for p in plurals} == INJECTED


@pytest.mark.parametrize("name", ["pods.topology-agent.io", "namespace-pods.topology-agent.io"])
def test_the_pod_webhooks_take_pods_alone(name):
    assert _pairs(_webhooks()[name]["rules"]) == {("", "pods")}


def test_the_agents_role_grants_get_on_every_job_object_it_reads_and_no_other():
    role = next(doc for doc in _documents(RBAC / "role.yaml") if doc["kind"] == "Role")
    assert _pairs(role["rules"], "get") >= READ
    assert {p for p in _pairs(role["rules"]) if p[0] not in OWN_GROUPS} == READ


def test_a_cluster_wide_job_object_is_read_through_an_optional_cluster_role():
    granted = set()
    for path in sorted(RBAC.glob("*/clusterrole.yaml")):
        for doc in _documents(path):
            if doc["kind"] == "ClusterRole":
                granted |= _pairs(doc["rules"], "get")
    assert granted >= READ_CLUSTER_WIDE


def test_the_webhook_reads_no_job_object():
    """The API server sends the webhook each object: its account may read none of them."""
    rules = [rule for doc in _documents(WEBHOOK / "rbac.yaml") if doc["kind"] in ("Role", "ClusterRole")
             for rule in doc["rules"]]
    assert _pairs(rules) & (INJECTED | READ | READ_CLUSTER_WIDE) == set()


def test_the_import_contract_names_every_controller_module():
    """pyproject.toml keeps each controller's module on the base alone; a module it does not name is unchecked."""
    import pkgutil
    import tomllib

    from agent.core import controllers

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c.get("containers") == ["agent.core.controllers"])
    named = {name.strip() for layer in layers for name in layer.split("|")}
    assert named == {m.name for m in pkgutil.iter_modules(controllers.__path__)}
