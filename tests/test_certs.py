"""The webhook's certificates (runtime/certs.py): made, kept, renewed on time, and trusted across a CA change."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from agent.runtime import certs

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
