"""The shipped ValidatingAdmissionPolicies (manifests/policy's published topology, manifests/webhook's caBundle-only
guard), evaluated as the API server does, by a real CEL engine: cel-expr-python, the Python binding of cel-cpp
(the reference C++ implementation), with the strings extension Kubernetes loads. The evaluation order is the API
server's (apiserver's validating admission policy): the resource rules (group, resource, operation, name), then
every matchCondition (a false one: the policy does not apply; an error, under failurePolicy Fail, denies), the
variables, then each validation (false or an error denies, with its message)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

cel = pytest.importorskip("cel_expr_python.cel", reason="cel-expr-python is a test dependency (pyproject [test])")
from cel_expr_python.ext import ext_strings  # noqa: E402  (after the skip: the binding may be missing)

POLICY_FILE = Path(__file__).resolve().parents[1] / "manifests" / "policy" / "published-topology-policy.yaml"
WEBHOOK_POLICY_FILE = (Path(__file__).resolve().parents[1] / "manifests" / "webhook"
                       / "webhook-configuration-policy.yaml")


def policy_spec(path: Path = POLICY_FILE) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    (policy,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    return policy["spec"]


class Deny(Exception):
    pass


@dataclass
class Policy:
    """One ValidatingAdmissionPolicy, compiled once: Kubernetes' CEL environment for admission has the strings
    extension (split) and the variables object, request, object, oldObject, params, namespaceObject."""

    spec: dict[str, Any] = field(default_factory=policy_spec)

    def __post_init__(self) -> None:
        names = ("object", "oldObject", "request", "params", "namespaceObject", "variables")
        self.env = cel.NewEnv(variables={n: cel.Type.DYN for n in names}, extensions=[ext_strings.ExtStrings()])
        self.conditions = [(c["name"], self.env.compile(c["expression"])) for c in self.spec.get("matchConditions", [])]
        self.variables = [(v["name"], self.env.compile(v["expression"])) for v in self.spec.get("variables", [])]
        self.validations = [(self.env.compile(v["expression"]), " ".join(v["message"].split()))
                            for v in self.spec["validations"]]
        assert self.spec["failurePolicy"] == "Fail"

    def _eval(self, expr: Any, data: dict[str, Any]) -> Any:
        value = expr.eval(data=data)
        if value.type() == cel.Type.ERROR:
            raise Deny(f"expression error: {value.value()}")  # failurePolicy: Fail
        return value.plain_value()

    def admit(self, request: dict[str, Any], obj: Any, old: Any) -> bool:
        """True when admitted, False when the policy does not apply; Deny with the message otherwise."""
        rules = self.spec["matchConstraints"]["resourceRules"]
        resource = request["resource"]
        if not any(request["operation"] in r["operations"] and resource["resource"] in r["resources"]
                   and (resource["group"] in r["apiGroups"] or "*" in r["apiGroups"])
                   and (not r.get("resourceNames") or request["name"] in r["resourceNames"]) for r in rules):
            return False
        data = {"object": obj, "oldObject": old, "request": request, "params": None, "namespaceObject": None,
                "variables": {}}
        for _, condition in self.conditions:
            if self._eval(condition, data) is not True:
                return False
        variables: dict[str, Any] = {}
        for name, expr in self.variables:
            variables[name] = self._eval(expr, {**data, "variables": variables})
        data["variables"] = variables
        for expr, message in self.validations:
            if self._eval(expr, data) is not True:
                raise Deny(message)
        return True


def agent_request(operation: str, *, namespace: str, pod: str, pod_uid: str, name: str,
                  username: str | None = None, bound: bool = True) -> dict[str, Any]:
    """An AdmissionRequest as the API server gives it to CEL, from a token bound to ``pod`` (its name and uid in
    userInfo.extra) of the agent's ServiceAccount unless ``username`` says otherwise."""
    extra = {"authentication.kubernetes.io/pod-name": [pod],
             "authentication.kubernetes.io/pod-uid": [pod_uid]} if bound else {}
    return {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "operation": operation, "name": name,
            "namespace": namespace, "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "userInfo": {"username": username or f"system:serviceaccount:{namespace}:topology-agent",
                         "uid": "sa-uid", "groups": ["system:serviceaccounts"], "extra": extra},
            "dryRun": False, "options": {}}
