"""The webhook's certificates (runtime/webhook/certs.py): made, kept, renewed on time, and trusted across a CA
change."""

from __future__ import annotations

import base64
import datetime

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from agent.runtime.webhook import certs

NOW = datetime.datetime(2026, 11, 24, tzinfo=datetime.UTC)
HOSTS = certs.service_hosts("topology-agent-webhook", "topology-agent-system")
DAY = datetime.timedelta(days=1)


def chain(bundle: certs.Bundle) -> tuple[x509.Certificate, list[x509.Certificate]]:
    return x509.load_pem_x509_certificate(bundle.cert), x509.load_pem_x509_certificates(bundle.trust)


def trusted(bundle: certs.Bundle) -> bool:
    serving, cas = chain(bundle)
    for ca in cas:
        try:
            serving.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):  # not this CA
            continue
        return True
    return False


def names(bundle: certs.Bundle) -> set[str]:
    serving, _ = chain(bundle)
    san = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(n) for n in san.get_values_for_type(x509.DNSName)} | {
        str(n) for n in san.get_values_for_type(x509.IPAddress)}


def test_a_first_bundle_covers_the_service_names_and_is_signed_by_its_ca():
    bundle, why = certs.renew(None, [*HOSTS, "127.0.0.1"], NOW)
    assert why == ["no CA yet", "no serving certificate yet"]
    assert trusted(bundle) and names(bundle) == {*HOSTS, "127.0.0.1"}
    serving, cas = chain(bundle)
    assert len(cas) == 1 and serving.not_valid_after_utc - NOW <= certs.SERVING_LIFE
    assert "topology-agent-webhook.topology-agent-system.svc" in HOSTS


@pytest.mark.parametrize(("days_later", "renewed"), [(1, False), (59, False), (61, True), (89, True)])
def test_the_serving_certificate_is_renewed_with_a_third_of_its_life_left(days_later, renewed):
    first, _ = certs.renew(None, HOSTS, NOW)
    later, why = certs.renew(first, HOSTS, NOW + days_later * DAY)
    assert (later is not first) == renewed and bool(why) == renewed
    assert later.ca_cert == first.ca_cert and later.trust == first.trust  # the caBundle does not change
    assert trusted(later)
    if renewed:
        assert why[0].startswith("the serving certificate expires on")


def test_a_name_the_certificate_lacks_gets_a_new_certificate():
    first, _ = certs.renew(None, HOSTS, NOW)
    later, why = certs.renew(first, [*HOSTS, "127.0.0.1"], NOW + DAY)
    assert why == ["the serving certificate does not cover 127.0.0.1"] and "127.0.0.1" in names(later)


def test_a_new_ca_is_trusted_beside_the_old_one_until_the_old_one_ends():
    first, _ = certs.renew(None, HOSTS, NOW)
    near_end = NOW + certs.CA_LIFE - 300 * DAY
    second, why = certs.renew(first, HOSTS, near_end)
    assert why[0].startswith("the CA expires on") and second.ca_cert != first.ca_cert
    _, cas = chain(second)
    assert len(cas) == 2 and trusted(second)  # old and new CA in the bundle; served by the new
    after_old, _ = certs.renew(second, HOSTS, NOW + certs.CA_LIFE + DAY)
    _, cas = chain(after_old)
    assert x509.load_pem_x509_certificate(first.ca_cert) not in cas


def test_the_secret_round_trips_and_garbage_is_replaced_not_trusted():
    bundle, _ = certs.renew(None, HOSTS, NOW)
    secret = certs.to_secret(bundle, "tls", "ns", "42")
    assert secret["type"] == "kubernetes.io/tls" and secret["metadata"]["resourceVersion"] == "42"
    assert certs.from_secret(secret) == bundle
    secret["data"]["ca.key"] = "bm90IGEga2V5"  # "not a key"
    assert certs.from_secret(secret) is None
    assert certs.from_secret({"metadata": {"name": "x"}, "data": {"tls.crt": "%%%"}}) is None


# What the Secret holds is checked as cert-controller's validServerCert checks it, and what does not
# verify is made again; the rest is kept.

SERVICE = "topology-agent-webhook.topology-agent-system.svc"


def verifies(bundle: certs.Bundle, at: datetime.datetime = NOW) -> bool:
    """The serving certificate chains, for the Service's name, to a CA of the trust (the caBundle), and the
    key is the certificate's: what the API server's TLS handshake needs."""
    from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

    serving, cas = chain(bundle)
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    key = serialization.load_pem_private_key(bundle.key, password=None)
    if key.public_key().public_bytes(*spki) != serving.public_key().public_bytes(*spki):
        return False
    verifier = PolicyBuilder().store(Store(cas)).time(at).build_server_verifier(x509.DNSName(SERVICE))
    try:
        verifier.verify(serving, [])
    except VerificationError:
        return False
    return True


def test_certificates_start_an_hour_back_as_cert_controllers_do():
    """A node whose clock lags the webhook's by minutes still accepts a fresh certificate (5 minutes before)."""
    bundle, _ = certs.renew(None, HOSTS, NOW)
    serving, (ca,) = chain(bundle)
    assert ca.not_valid_before_utc == serving.not_valid_before_utc == NOW - datetime.timedelta(hours=1)
    assert verifies(bundle, NOW - datetime.timedelta(minutes=59))


def test_a_serving_key_that_is_not_the_certificates_is_issued_again_by_the_same_ca():
    first, _ = certs.renew(None, HOSTS, NOW)
    other, _ = certs.renew(None, HOSTS, NOW)
    broken = certs.Bundle(first.cert, other.key, first.ca_cert, first.ca_key, first.trust)
    assert not verifies(broken)
    fixed, why = certs.renew(broken, HOSTS, NOW + DAY)
    assert why == ["the serving pair does not match: tls.key is not the private key of tls.crt"]
    assert verifies(fixed, NOW + DAY) and fixed.ca_cert == first.ca_cert and fixed.trust == first.trust


def test_a_serving_certificate_from_another_ca_is_issued_again_by_the_secrets_ca():
    first, _ = certs.renew(None, HOSTS, NOW)
    stranger, _ = certs.renew(None, HOSTS, NOW)  # a valid pair, signed by another CA of the same name
    broken = certs.Bundle(stranger.cert, stranger.key, first.ca_cert, first.ca_key, first.trust)
    assert not verifies(broken)
    fixed, why = certs.renew(broken, HOSTS, NOW + DAY)
    assert len(why) == 1 and why[0].startswith(f"the serving certificate does not verify against the CA for {HOSTS[0]}")
    assert verifies(fixed, NOW + DAY) and fixed.ca_cert == first.ca_cert and fixed.trust == first.trust


def test_a_ca_key_that_is_not_the_cas_gives_a_new_ca_and_the_broken_one_is_no_longer_trusted():
    """At renewal, a ca.key that is not the CA's signed a certificate that failed the caBundle; now the CA is
    replaced, the serving pair issued by the new one, and the CA nothing can be issued by leaves the bundle."""
    due, _ = certs.renew(None, HOSTS, NOW - 75 * DAY)  # 15 days left: due for renewal
    other, _ = certs.renew(None, HOSTS, NOW)
    broken = certs.Bundle(due.cert, due.key, due.ca_cert, other.ca_key, due.trust)
    fixed, why = certs.renew(broken, HOSTS, NOW)
    assert why == ["the CA's key (ca.key) is not the private key of the CA certificate (ca-current.crt)"]
    assert fixed.ca_cert != due.ca_cert and verifies(fixed)
    _, cas = chain(fixed)
    assert cas == [x509.load_pem_x509_certificate(fixed.ca_cert)]


@pytest.mark.parametrize("case", ["not yet valid", "expired", "not a CA"])
def test_a_ca_that_cannot_sign_now_is_replaced(case):
    made = {"not yet valid": NOW + 2 * DAY, "expired": NOW - certs.CA_LIFE - DAY, "not a CA": NOW}[case]
    ca, key = certs.new_ca(made)
    serving, serving_key = certs.issue(ca, key, HOSTS, made)
    if case == "not a CA":
        ca, key = serving, serving_key  # the serving certificate given as the CA
    broken = certs.Bundle(serving, serving_key, ca, key, ca)
    fixed, why = certs.renew(broken, HOSTS, NOW)
    assert why and fixed.ca_cert != ca and verifies(fixed)
    assert {"not yet valid": "the CA is not valid now", "expired": "the CA is not valid now",
            "not a CA": "the CA certificate (ca-current.crt) is not a CA"}[case] in why[0]


def test_a_serving_certificate_not_valid_yet_is_issued_again():
    first, _ = certs.renew(None, HOSTS, NOW)
    cert, key = certs.issue(first.ca_cert, first.ca_key, HOSTS, NOW + 2 * DAY)  # from a clock two days ahead
    fixed, why = certs.renew(certs.Bundle(cert, key, first.ca_cert, first.ca_key, first.trust), HOSTS, NOW)
    assert len(why) == 1 and "not valid at validation time" in why[0] and verifies(fixed)


def test_a_bundle_that_lost_the_current_ca_gets_it_back_and_keeps_the_pair():
    first, _ = certs.renew(None, HOSTS, NOW)
    other, _ = certs.renew(None, HOSTS, NOW)
    fixed, why = certs.renew(certs.Bundle(first.cert, first.key, first.ca_cert, first.ca_key, other.ca_cert),
                             HOSTS, NOW)
    assert why == ["the trusted CAs (ca.crt) lack the current CA"]
    assert fixed.cert == first.cert and verifies(fixed)


def test_a_garbage_serving_pair_in_the_secret_costs_the_pair_not_the_ca():
    first, _ = certs.renew(None, HOSTS, NOW)
    secret = certs.to_secret(first, "tls", "ns", "42")
    secret["data"]["tls.crt"] = "%%%"  # not base64
    secret["data"]["tls.key"] = "bm90IGEga2V5"  # "not a key"
    fixed, why = certs.renew(certs.read_secret(secret), HOSTS, NOW)
    assert why == ["no serving certificate yet"] and fixed.ca_cert == first.ca_cert and verifies(fixed)


def test_a_pairs_problem_never_quotes_the_key():
    first, _ = certs.renew(None, HOSTS, NOW)
    for key in (first.key, first.key[:-40], b"-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n"):
        why = certs.pair_problem(first.ca_cert, key) or ""
        assert why and "PRIVATE" not in why and "c2VjcmV0" not in why and len(why) < 120


def test_a_pair_that_does_not_match_leaves_the_served_context_serving():
    """A renewal half written (the new tls.crt, the old tls.key): OpenSSL sets the certificate before it checks
    the key, so loading it left the served context with no usable key and every handshake failed. The pair is
    now refused before the served context is touched."""
    import socket
    import ssl
    import threading

    from agent.runtime.webhook import tls

    now = datetime.datetime.now(datetime.UTC)
    first, _ = certs.renew(None, ["127.0.0.1"], now - 70 * DAY)
    later, _ = certs.renew(first, ["127.0.0.1"], now)
    context = tls.load_tls(None, first.cert, first.key)
    with pytest.raises(tls.BadPair, match=r"tls\.key is not the private key of tls\.crt"):
        tls.load_tls(context, later.cert, first.key)
    with socket.create_server(("127.0.0.1", 0)) as server:
        def serve_one() -> None:
            conn, _ = server.accept()
            with context.wrap_socket(conn, server_side=True) as tls_conn:
                tls_conn.recv(1)

        thread = threading.Thread(target=serve_one, daemon=True)
        thread.start()
        client = ssl.create_default_context(cadata=first.trust.decode())
        with socket.create_connection(server.getsockname(), timeout=5) as raw, \
                client.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
            served = conn.getpeercert(binary_form=True)
            conn.sendall(b"x")
        thread.join(5)
    assert served == x509.load_pem_x509_certificate(first.cert).public_bytes(serialization.Encoding.DER)


def test_a_secret_an_earlier_version_wrote_verifies_as_it_is(monkeypatch):
    """An upgrade keeps the CA and the pair: only what fails a check is made again."""
    monkeypatch.setattr(certs, "BACKDATE", datetime.timedelta(minutes=5))  # e10201c's certificates
    earlier, _ = certs.renew(None, HOSTS, NOW - 10 * DAY)
    monkeypatch.undo()
    kept, why = certs.renew(certs.read_secret(certs.to_secret(earlier, "tls", "ns")), HOSTS, NOW)
    assert why == [] and kept == earlier


class RefusedWatches:
    """An API whose RBAC is an older release's: the Secret and the configuration may be read and written, not
    listed or watched."""

    def __init__(self) -> None:
        self.objects: dict[str, dict] = {
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/topology-agent": {
                "metadata": {"name": "topology-agent"}, "webhooks": [{"name": "a", "clientConfig": {}}]}}
        self.lists = 0

    async def get_object(self, path: str, *, metadata_only: bool = False) -> dict:
        from agent.errors import ApiNotFound

        if path not in self.objects:
            raise ApiNotFound("not found", status=404)
        return self.objects[path]

    async def create(self, path: str, body: dict) -> dict:
        self.objects[f"{path}/{body['metadata']['name']}"] = body
        return body

    async def replace(self, path: str, body: dict) -> dict:
        self.objects[path] = body
        return body

    async def list_objects(self, path: str, **_: object) -> tuple[list, str]:
        from agent.errors import ApiForbidden

        self.lists += 1
        raise ApiForbidden(f'{path.rsplit("/", 1)[1]} is forbidden: cannot list', status=403)

    def watch_objects(self, *_: object, **__: object):
        raise AssertionError("no watch without a list")


async def test_a_refused_watch_is_said_and_the_webhook_still_serves_and_checks(caplog):
    """An older ClusterRole without list/watch: one warning per object, no crash; the check at start ran."""
    import asyncio
    import types

    from agent.runtime.webhook import tls
    from agent.runtime.webhook.webhook import WebhookSettings

    api = RefusedWatches()
    webhook = types.SimpleNamespace(settings=WebhookSettings(hosts=tuple(HOSTS)), tls=None)
    stop = asyncio.Event()
    keeper = asyncio.create_task(tls.keep_tls(api, webhook, stop=stop))  # type: ignore[arg-type]
    deadline = asyncio.get_running_loop().time() + 10
    while api.lists < 2 or webhook.tls is None:
        assert not keeper.done() and asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(keeper, 5)
    warned = [r.getMessage() for r in caplog.records if "cannot watch" in r.getMessage()]
    assert len(warned) == 2 and "grant list and watch on it by name (manifests/webhook/rbac.yaml)" in warned[0]
    secret = api.objects["/api/v1/namespaces/topology-agent-system/secrets/topology-agent-webhook-tls"]
    bundle = certs.from_secret(secret)
    config = api.objects["/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/topology-agent"]
    assert bundle is not None and config["webhooks"][0]["clientConfig"]["caBundle"] == base64.b64encode(
        bundle.trust).decode()
