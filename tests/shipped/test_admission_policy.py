"""The published topology's ValidatingAdmissionPolicy (manifests/policy), run by a real CEL engine
(tests/vap.py: cel-expr-python, the binding of the reference C++ implementation, in the API server's order).

Each case ends in what followers do with the write: "denied" (the API server refuses it), or, once admitted,
"used" or "refused" by the readers' own check of the writer pod (agent/core/publication/provenance.py). The policy
cannot look up pods, so on CREATE it admits any agent pod that names itself; the readers refuse the ones that are not
the job's. Every case that the review found open ends in "denied" or "refused"."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from agent import examples
from agent.core import Options
from agent.core.controllers import VOLCANO
from agent.core.plan.gang import JobView, roster_of
from agent.core.publication.provenance import Writer, WriterCheck
from agent.runtime.demo import volcano_owner
from tests.vap import WEBHOOK_POLICY_FILE, Deny, Policy, agent_request, policy_spec

NS = "team-a"
AGENT = f"system:serviceaccount:{NS}:topology-agent"
GC = "system:serviceaccount:kube-system:generic-garbage-collector"

POLICY = Policy()
OWNER = volcano_owner()
OWNER["spec"]["tasks"] = [{"name": "master", "replicas": 1}, {"name": "worker", "replicas": 3}]
PODS = {p["metadata"]["name"]: p for p in examples.volcano_job("demo", (("master", 1), ("worker", 3)))}
OTHER = {p["metadata"]["name"]: p for p in examples.volcano_job("other", (("master", 1),))}
LEADER, STANDBY, MEMBER, STRANGER = "demo-master-0", "demo-worker-0", "demo-worker-2", "other-master-0"


def uid(name: str) -> str:
    return str({**PODS, **OTHER}[name]["metadata"]["uid"])


def request(operation: str, *, username: str = AGENT, pod: str | None = None, pod_uid: str | None = None,
            name: str = "demo-topology") -> dict[str, Any]:
    """An AdmissionRequest as the API server gives it to CEL: a bound token's pod in userInfo.extra."""
    return agent_request(operation, namespace=NS, pod=pod or "", pod_uid=pod_uid or (uid(pod) if pod else ""),
                         name=name, username=username, bound=pod is not None)


def published(leader: str, leader_uid: str | None = None, *, standby: str = f"{STANDBY},demo-worker-1",
              name: str = "demo-topology") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS},
            "data": {"generation": "3", "leader": leader, "standby": standby,
                     "leaderUid": uid(leader) if leader_uid is None else leader_uid}}


def readers_verdict(obj: dict[str, Any], pods: dict[str, Any]) -> str:
    """What a follower of job demo does with an admitted write: the writer pod read as it is now."""
    check = WriterCheck(VOLCANO, Options(), "demo", NS, roster_of(JobView(VOLCANO, Options(), (OWNER,))))
    writer = Writer(obj["data"].get("leader", ""), obj["data"].get("leaderUid", ""))
    why = check.judge(writer, pods.get(writer.name), obj["metadata"]["name"])
    return "used" if why is None else "refused"


def outcome(req: dict[str, Any], obj: Any, old: Any, pods: dict[str, Any] | None = None) -> str:
    try:
        applies = POLICY.admit(req, obj, old)
    except Deny as err:
        return f"denied: {err}"
    written = obj if obj is not None else old
    if not applies or req["operation"] == "DELETE":
        return "admitted" if applies else "not matched"
    return readers_verdict(written, {**PODS, **OTHER} if pods is None else pods)


ONLY_AGENT = "denied: only the topology-agent ServiceAccount writes a published topology (docs/security.md)"
ONLY_WRITER = ("denied: only the pod named in data.leader and data.leaderUid (the job's publisher), with its own "
               "bound token, writes it")
ONLY_STANDBY = "denied: an update may change the leader only to a standby the previous leader named in data.standby"
OLD = published(LEADER)

CASES = {
    # CREATE
    "the leader creates, naming itself": (request("CREATE", pod=LEADER), published(LEADER), None, "used"),
    "the leader's name with another pod's uid": (request("CREATE", pod=LEADER),
                                                 published(LEADER, uid(MEMBER)), None, ONLY_WRITER),
    "a member creates, naming the leader": (request("CREATE", pod=MEMBER), published(LEADER), None, ONLY_WRITER),
    "a member creates, naming itself": (request("CREATE", pod=MEMBER), published(MEMBER), None, "used"),
    "a standby creates, naming itself": (request("CREATE", pod=STANDBY), published(STANDBY), None, "used"),
    "a non-member (another job's agent) creates, naming itself": (request("CREATE", pod=STRANGER),
                                                                   published(STRANGER), None, "refused"),
    "a non-member creates, naming the leader": (request("CREATE", pod=STRANGER), published(LEADER), None,
                                                ONLY_WRITER),
    "a non-member creates with no writer named": (request("CREATE", pod=STRANGER), published(STRANGER, ""), None,
                                                  ONLY_WRITER),
    "a user creates": (request("CREATE", username="alice"), published(LEADER), None, ONLY_AGENT),
    "the agent's account without a bound pod": (request("CREATE"), published(LEADER), None, ONLY_WRITER),
    "a trainer's token (another account)": (request("CREATE", username=f"system:serviceaccount:{NS}:default",
                                                    pod=MEMBER), published(MEMBER), None, ONLY_AGENT),
    "the journal, created by the leader": (request("CREATE", pod=LEADER, name="demo-topology-journal"),
                                           published(LEADER, name="demo-topology-journal"), None, "used"),
    "the journal, created by a non-member": (request("CREATE", pod=STRANGER, name="demo-topology-journal"),
                                             published(STRANGER, name="demo-topology-journal"), None, "refused"),
    "the summary, created by the leader": (request("CREATE", pod=LEADER, name="demo-topology-summary"),
                                           published(LEADER, name="demo-topology-summary"), None, "used"),
    "the summary, created by a non-member": (request("CREATE", pod=STRANGER, name="demo-topology-summary"),
                                             published(STRANGER, name="demo-topology-summary"), None, "refused"),
    "the summary, created by a user": (request("CREATE", username="alice", name="demo-topology-summary"),
                                       published(LEADER, name="demo-topology-summary"), None, ONLY_AGENT),
    # UPDATE
    "the leader updates": (request("UPDATE", pod=LEADER), published(LEADER), OLD, "used"),
    "a named standby takes over": (request("UPDATE", pod=STANDBY), published(STANDBY), OLD, "used"),
    "a member that is not a standby takes over": (request("UPDATE", pod=MEMBER), published(MEMBER), OLD,
                                                  ONLY_STANDBY),
    "a non-member takes over": (request("UPDATE", pod=STRANGER), published(STRANGER), OLD, ONLY_STANDBY),
    "a non-member rewrites, keeping the leader's name": (request("UPDATE", pod=STRANGER), published(LEADER), OLD,
                                                         ONLY_WRITER),
    "a standby rewrites, keeping the leader's name": (request("UPDATE", pod=STANDBY), published(LEADER), OLD,
                                                      ONLY_WRITER),
    "a user updates": (request("UPDATE", username="alice"), published(LEADER), OLD, ONLY_AGENT),
    # DELETE
    "the leader deletes": (request("DELETE", pod=LEADER), None, OLD, "admitted"),
    "a member deletes": (request("DELETE", pod=MEMBER), None, OLD, ONLY_WRITER),
    "the garbage collector deletes": (request("DELETE", username=GC), None, OLD, "not matched"),
    # not ours
    "another ConfigMap": (request("CREATE", username="alice", name="settings"),
                          published(LEADER, name="settings"), None, "not matched"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_policy_and_the_readers_together(case):
    req, obj, old, expected = CASES[case]
    assert outcome(req, obj, old) == expected


def test_a_re_created_leader_pod_may_update_under_its_new_uid_but_readers_refuse_the_old_uid():
    """Volcano re-creates a failed pod under the same name: its new token carries the new uid. It may update the
    objects its earlier incarnation wrote (the name is the leader's); until it has, readers refuse the old uid."""
    reborn = copy.deepcopy(PODS)
    reborn[LEADER]["metadata"]["uid"] = "4d1f7a52-0000-4000-8000-000000000001"
    assert readers_verdict(OLD, reborn) == "refused"
    assert outcome(request("UPDATE", pod=LEADER, pod_uid=reborn[LEADER]["metadata"]["uid"]),
                   published(LEADER, reborn[LEADER]["metadata"]["uid"]), OLD, reborn) == "used"


def test_the_engine_is_real_an_expression_error_denies():
    """Under failurePolicy Fail an evaluation error denies: here a typed request without userInfo.extra is not
    what the API server sends, and the engine says so instead of admitting."""
    req = request("CREATE", pod=LEADER)
    del req["userInfo"]["extra"]
    with pytest.raises(Deny, match="expression error"):
        POLICY.admit(req, published(LEADER), None)


# The webhook's account may update its own MutatingWebhookConfiguration (it writes the caBundle), and
# RBAC cannot narrow that to one field. manifests/webhook's policy admits from that account only a change of
# webhooks[*].clientConfig.caBundle; anyone else is not matched.

WEBHOOK_POLICY = Policy(spec=policy_spec(WEBHOOK_POLICY_FILE))
WEBHOOK_SA = "system:serviceaccount:topology-agent-system:topology-agent-webhook"
CONFIG_FILE = WEBHOOK_POLICY_FILE.parent / "mutatingwebhookconfiguration.yaml"


def stored_config() -> dict[str, Any]:
    """The configuration as the API server holds it once the webhook has set its caBundle."""
    config = yaml.safe_load(CONFIG_FILE.read_text())
    config["metadata"].update(resourceVersion="7", uid="c0ffee00-0000-4000-8000-000000000001",
                              labels={"app.kubernetes.io/name": "topology-agent-webhook"})
    for hook in config["webhooks"]:
        hook["clientConfig"]["caBundle"] = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCm9sZAo="
    return config


def config_update(username: str, name: str = "topology-agent") -> dict[str, Any]:
    return {"uid": "9c1b8a3e-0000-4000-8000-000000000002", "operation": "UPDATE", "name": name, "namespace": "",
            "kind": {"group": "admissionregistration.k8s.io", "version": "v1", "kind": "MutatingWebhookConfiguration"},
            "resource": {"group": "admissionregistration.k8s.io", "version": "v1",
                         "resource": "mutatingwebhookconfigurations"},
            "userInfo": {"username": username, "uid": "u", "groups": ["system:serviceaccounts"], "extra": {}},
            "dryRun": False, "options": {}}


def changed(change) -> dict[str, Any]:
    config = stored_config()
    change(config)
    return config


def each_hook(change):
    def apply(config: dict[str, Any]) -> None:
        for hook in config["webhooks"]:
            change(hook)

    return apply


def set_(path: str, value: Any):
    """Set one field of the first webhook (``a.b`` nests)."""
    def apply(config: dict[str, Any]) -> None:
        target = config["webhooks"][0]
        *parents, last = path.split(".")
        for step in parents:
            target = target[step]
        target[last] = value

    return apply


NEW_BUNDLE = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCm5ldwo="
ONLY = ("denied: the webhook's ServiceAccount may change only webhooks[*].clientConfig.caBundle of this "
        "configuration: it ")
WHICH = {"webhooks": "added, removed, renamed or reordered webhooks",
         "where": "changed where a webhook is called (clientConfig.url or clientConfig.service)",
         "what": "changed what a webhook is sent (rules, matchPolicy, namespaceSelector, objectSelector or "
                 "matchConditions)",
         "how": "changed how a webhook is called (failurePolicy, timeoutSeconds, sideEffects, admissionReviewVersions "
                "or reinvocationPolicy)",
         "metadata": "changed its labels, annotations, finalizers or ownerReferences"}
ADMITTED = "admitted"


def denied(which: str) -> str:
    return f"{ONLY}{WHICH[which]}; a cluster admin applies manifests/webhook for that"


CONFIG_CASES = {
    # what the webhook does: allowed
    "the webhook sets every caBundle": (WEBHOOK_SA, each_hook(lambda h: h["clientConfig"].update(caBundle=NEW_BUNDLE)),
                                        ADMITTED),
    "the webhook sets one caBundle": (WEBHOOK_SA, set_("clientConfig.caBundle", NEW_BUNDLE), ADMITTED),
    "the webhook writes it back unchanged": (WEBHOOK_SA, lambda c: None, ADMITTED),
    # what a stolen token would do: denied
    "rules: every pod UPDATE too": (WEBHOOK_SA, set_("rules", [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""],
                                                                "apiVersions": ["v1"], "resources": ["pods"]}]),
                                    denied("what")),
    "rules: every resource": (WEBHOOK_SA, set_("rules", [{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"],
                                                          "resources": ["*"]}]), denied("what")),
    "rules removed": (WEBHOOK_SA, lambda c: c["webhooks"][0].pop("rules"), denied("what")),
    "a url instead of the Service": (WEBHOOK_SA, set_("clientConfig", {"url": "https://evil.example/mutate",
                                                                       "caBundle": NEW_BUNDLE}), denied("where")),
    "another Service": (WEBHOOK_SA, set_("clientConfig.service.name", "elsewhere"), denied("where")),
    "another port": (WEBHOOK_SA, set_("clientConfig.service.port", 8443), denied("where")),
    "another path": (WEBHOOK_SA, set_("clientConfig.service.path", "/other"), denied("where")),
    "the namespaceSelector emptied": (WEBHOOK_SA, set_("namespaceSelector", {}), denied("what")),
    "the objectSelector emptied": (WEBHOOK_SA, set_("objectSelector", {}), denied("what")),
    "matchConditions added": (WEBHOOK_SA, set_("matchConditions", [{"name": "all", "expression": "true"}]),
                              denied("what")),
    "matchPolicy set": (WEBHOOK_SA, set_("matchPolicy", "Exact"), denied("what")),
    "failurePolicy Ignore": (WEBHOOK_SA, set_("failurePolicy", "Ignore"), denied("how")),
    "timeoutSeconds 30": (WEBHOOK_SA, set_("timeoutSeconds", 30), denied("how")),
    "sideEffects changed": (WEBHOOK_SA, set_("sideEffects", "NoneOnDryRun"), denied("how")),
    "reinvocationPolicy changed": (WEBHOOK_SA, set_("reinvocationPolicy", "Never"), denied("how")),
    "admissionReviewVersions changed": (WEBHOOK_SA, set_("admissionReviewVersions", ["v1beta1", "v1"]), denied("how")),
    "a webhook added": (WEBHOOK_SA, lambda c: c["webhooks"].append({**c["webhooks"][0], "name": "all.evil.io"}),
                        denied("webhooks")),
    "a webhook removed": (WEBHOOK_SA, lambda c: c["webhooks"].pop(), denied("webhooks")),
    "every webhook removed": (WEBHOOK_SA, lambda c: c.pop("webhooks"), denied("webhooks")),
    "webhooks reordered": (WEBHOOK_SA, lambda c: c["webhooks"].reverse(), denied("webhooks")),
    "cert-manager's annotation added": (WEBHOOK_SA, lambda c: c["metadata"].update(
        annotations={"cert-manager.io/inject-ca-from": "team-a/their-cert"}), denied("metadata")),
    "a finalizer added": (WEBHOOK_SA, lambda c: c["metadata"].update(finalizers=["keep.evil.io"]), denied("metadata")),
    "a label changed": (WEBHOOK_SA, lambda c: c["metadata"]["labels"].update(x="y"), denied("metadata")),
    # not the webhook's account, or not its configuration: not matched
    "an admin changes the rules": ("kubernetes-admin", set_("rules", []), "not matched"),
    "cert-manager's CA injector sets the caBundle": (
        "system:serviceaccount:cert-manager:cert-manager-cainjector", set_("clientConfig.caBundle", NEW_BUNDLE),
        "not matched"),
    "the same account name in another namespace": ("system:serviceaccount:team-a:topology-agent-webhook",
                                                   set_("failurePolicy", "Ignore"), "not matched"),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_the_webhooks_account_may_change_only_the_cabundle_of_its_configuration(case):
    username, change, expected = CONFIG_CASES[case]
    try:
        applies = WEBHOOK_POLICY.admit(config_update(username), changed(change), stored_config())
    except Deny as err:
        assert f"denied: {err}" == expected
        return
    assert (ADMITTED if applies else "not matched") == expected


def test_the_policy_matches_only_the_webhooks_own_configuration_and_only_updates():
    for request in (config_update(WEBHOOK_SA, name="someone-elses"), {**config_update(WEBHOOK_SA),
                                                                      "operation": "DELETE"}):
        assert WEBHOOK_POLICY.admit(request, changed(set_("failurePolicy", "Ignore")), stored_config()) is False
    binding = [d for d in yaml.safe_load_all(WEBHOOK_POLICY_FILE.read_text()) if d["kind"].endswith("Binding")]
    assert [(b["spec"]["policyName"], b["spec"]["validationActions"]) for b in binding] == [
        ("topology-agent-webhook-cabundle-only", ["Deny"])]
    assert WEBHOOK_POLICY.spec["failurePolicy"] == "Fail"
