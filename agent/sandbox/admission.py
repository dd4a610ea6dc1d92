"""Mutating admission webhooks, called at CREATE as kube-apiserver calls them: the configurations in name order
and their webhooks in list order; rules, namespaceSelector and objectSelector; an AdmissionReview v1 over HTTPS
trusting the caBundle, with ``?timeout=Ns``; the JSONPatch applied; failurePolicy on a call that fails; one
reinvocation of ``IfNeeded`` webhooks when a later one changed the object. The admission configuration kinds
themselves (webhook configurations, admission policies and their bindings) are never sent to a webhook, as
kube-apiserver exempts them, so that no webhook can keep itself or another from being configured.

A webhook reached through a Service needs the Service's address: the sandbox has no cluster network, so
``services`` maps ``namespace/name`` to ``host:port`` (``topology-agent sandbox --service``). The TLS name
checked is ``<name>.<namespace>.svc``, as the API server checks it. Not done: matchConditions (CEL), UPDATE,
DELETE and CONNECT, validating webhooks.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import ssl
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import jsonpatch

Obj = dict[str, Any]
log = logging.getLogger("topology_agent.sandbox")


@dataclass(frozen=True)
class Target:
    """What is being created, as the rules and the AdmissionReview name it."""

    group: str
    version: str
    plural: str
    kind: str
    namespace: str  # "" for a cluster-scoped object
    dry_run: bool = False


# apiserver's rules.IsExemptAdmissionConfigurationResource: kinds of this group no webhook is ever called for
EXEMPT_GROUP = "admissionregistration.k8s.io"
EXEMPT_KINDS = frozenset({"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration",
                          "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                          "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"})


def exempt(target: Target) -> bool:
    """True for the admission configuration kinds, which kube-apiserver never sends to a webhook."""
    return target.group == EXEMPT_GROUP and target.kind in EXEMPT_KINDS


class Denied(Exception):
    """The request is refused: ``code`` and the message the API server would answer."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def selector_matches(selector: Any, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector: matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist), all ANDed;
    empty or absent matches everything."""
    if not isinstance(selector, Mapping):
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), set(expr.get("values") or [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _listed(values: Any, value: str) -> bool:
    return isinstance(values, list) and ("*" in values or value in values)


def rule_matches(rule: Mapping[str, Any], target: Target) -> bool:
    scope = rule.get("scope") or "*"
    if (scope == "Namespaced" and not target.namespace) or (scope == "Cluster" and target.namespace):
        return False
    resources = rule.get("resources") or []
    return (_listed(rule.get("operations"), "CREATE") and _listed(rule.get("apiGroups"), target.group)
            and _listed(rule.get("apiVersions"), target.version)
            and (target.plural in resources or "*" in resources or "*/*" in resources))


def _labels(obj: Any) -> Mapping[str, str]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def applies(hook: Mapping[str, Any], target: Target, obj: Obj, namespace: Obj | None) -> bool:
    if not any(isinstance(r, Mapping) and rule_matches(r, target) for r in hook.get("rules") or []):
        return False
    if target.namespace:  # a cluster-scoped object is not filtered by namespace
        ns_labels = dict(_labels(namespace)) if namespace else {}
        ns_labels.setdefault("kubernetes.io/metadata.name", target.namespace)
        if not selector_matches(hook.get("namespaceSelector"), ns_labels):
            return False
    return selector_matches(hook.get("objectSelector"), _labels(obj))


def _reason(err: BaseException) -> str:
    """Why a call failed, in the API server's words where it has them (Go's net/http)."""
    if isinstance(err, TimeoutError):
        return "context deadline exceeded"
    if isinstance(err, aiohttp.ClientConnectorCertificateError):
        return f"tls: failed to verify certificate: {err.certificate_error}"
    if isinstance(err, aiohttp.ClientConnectorError):
        code = err.os_error.errno
        why = os.strerror(code) if code else err.os_error.strerror or str(err.os_error)
        return f"dial tcp {err.host}:{err.port}: connect: {why.lower()}"
    return str(err)


class Caller:
    """Calls the webhooks of the stored MutatingWebhookConfigurations for one create."""

    def __init__(self, services: Mapping[str, str] | None = None) -> None:
        self.services = dict(services or {})
        self._session: aiohttp.ClientSession | None = None
        self._contexts: dict[str, ssl.SSLContext] = {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _context(self, ca_bundle: str | None) -> ssl.SSLContext:
        key = ca_bundle or ""
        if key not in self._contexts:
            if ca_bundle:
                self._contexts[key] = ssl.create_default_context(cadata=base64.b64decode(ca_bundle).decode())
            else:
                self._contexts[key] = ssl.create_default_context()
        return self._contexts[key]

    def _address(self, config: Mapping[str, Any]) -> tuple[str, str | None]:
        """(URL to post to, TLS name to check, None: the URL's host)."""
        if isinstance(config.get("url"), str):
            return config["url"], None
        service = config.get("service") or {}
        name, namespace = service.get("name", ""), service.get("namespace", "")
        path = service.get("path") or "/"
        address = self.services.get(f"{namespace}/{name}")
        if address is None:
            raise OSError(f"service \"{name}\" not found (the sandbox has no cluster network: map it with "
                          f"topology-agent sandbox --service {namespace}/{name}=127.0.0.1:PORT)")
        return f"https://{address}{path}", f"{name}.{namespace}.svc"

    async def call(self, hook: Mapping[str, Any], target: Target, obj: Obj) -> Obj | None:
        """The object after this webhook (None: unchanged); Denied when it refuses or cannot be called and its
        failurePolicy is Fail."""
        name = hook.get("name", "?")
        timeout = float(hook.get("timeoutSeconds") or 10)
        uid = str(uuid.uuid4())
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": uid, "kind": {"group": target.group, "version": target.version, "kind": target.kind},
            "resource": {"group": target.group, "version": target.version, "resource": target.plural},
            "requestKind": {"group": target.group, "version": target.version, "kind": target.kind},
            "requestResource": {"group": target.group, "version": target.version, "resource": target.plural},
            "name": (obj.get("metadata") or {}).get("name", ""), "namespace": target.namespace,
            "operation": "CREATE", "userInfo": {"username": "sandbox-admin", "groups": ["system:masters"]},
            "object": obj, "oldObject": None, "dryRun": target.dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}}
        config = hook.get("clientConfig") or {}
        url = "?"
        try:
            url, tls_name = self._address(config)
            url = f"{url}{'&' if '?' in url else '?'}timeout={int(timeout)}s"
            if self._session is None or self._session.closed:
                self._session = aiohttp.ClientSession()
            async with self._session.post(url, json=review, ssl=self._context(config.get("caBundle")),
                                          server_hostname=tls_name,
                                          timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                if response.status != 200:
                    raise OSError(f"the server answered {response.status}: {(await response.text())[:200]}")
                answer = await response.json(content_type=None)
            result = answer.get("response") if isinstance(answer, Mapping) else None
            if not isinstance(result, Mapping) or result.get("uid") != uid:
                raise OSError(f"expected response.uid={uid!r}, got {(result or {}).get('uid')!r}")
        except (TimeoutError, OSError, aiohttp.ClientError, ValueError, ssl.SSLError) as err:
            reason = _reason(err)
            if hook.get("failurePolicy", "Fail") == "Ignore":
                log.warning("failed calling webhook %r, ignored (failurePolicy Ignore): %s", name, reason)
                return None
            raise Denied(500, "InternalError", f"Internal error occurred: failed calling webhook \"{name}\": "
                                               f"failed to call webhook: Post \"{url}\": {reason}") from None
        if not result.get("allowed"):
            why = result.get("status") or {}
            message = why.get("message") or "without explanation"
            raise Denied(int(why.get("code") or 400), why.get("reason") or "BadRequest",
                         f"admission webhook \"{name}\" denied the request: {message}")
        if result.get("patch") is None:
            return None
        if result.get("patchType") != "JSONPatch":
            raise Denied(500, "InternalError", f"Internal error occurred: webhook \"{name}\": patchType "
                                               f"{result.get('patchType')!r} is not JSONPatch")
        try:
            ops = json.loads(base64.b64decode(result["patch"]))
            return jsonpatch.apply_patch(obj, ops)
        except (ValueError, TypeError, jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as err:
            raise Denied(500, "InternalError", f"Internal error occurred: webhook \"{name}\": its JSONPatch "
                                               f"does not apply: {err}") from None

    async def admit(self, configs: list[Obj], target: Target, obj: Obj, namespace: Obj | None) -> Obj:
        """The object after every matching webhook, or Denied."""
        if exempt(target):
            return obj
        hooks = [h for c in sorted(configs, key=lambda c: c["metadata"]["name"])
                 for h in c.get("webhooks") or [] if isinstance(h, Mapping)]
        called: list[tuple[int, Mapping[str, Any]]] = []
        last_change = -1
        for i, hook in enumerate(hooks):
            if not applies(hook, target, obj, namespace):
                continue
            called.append((i, hook))
            changed = await self.call(hook, target, obj)
            if changed is not None and changed != obj:
                obj, last_change = changed, i
        for i, hook in called:  # once more, for a webhook that ran before an object change it did not see
            if hook.get("reinvocationPolicy") == "IfNeeded" and last_change > i and applies(hook, target, obj,
                                                                                         namespace):
                changed = await self.call(hook, target, obj)
                if changed is not None:
                    obj = changed
        return obj
