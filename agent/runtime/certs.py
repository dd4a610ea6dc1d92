"""The webhook's TLS: a CA and a serving certificate it makes itself, kept in one Secret that every replica
shares, rotated before they expire, and the CA bundle written into its own MutatingWebhookConfiguration.

Lifetimes: the CA 5 years, the serving certificate 90 days. The serving certificate is renewed when less than a
third of its life is left (or when it does not cover a name it must serve); the CA when less than one year is
left. A renewed CA is added to the bundle beside the old one, which stays until it expires, so API servers that
still hold the old bundle keep trusting the old certificate during the change-over.

Replicas race through the API server, not through each other: the Secret is created once (409: another
replica made it, read theirs) and replaced with its resourceVersion (409: read again, decide again).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from agent.errors import ApiConflict, ApiNotFound, InputError
from agent.k8s.async_client import AsyncApi

log = logging.getLogger("topology-agent.webhook")

CA_LIFE = datetime.timedelta(days=5 * 365)
CA_RENEW = datetime.timedelta(days=365)
SERVING_LIFE = datetime.timedelta(days=90)
SERVING_RENEW = SERVING_LIFE / 3
ISSUER = "topology-agent webhook CA"


@dataclass(frozen=True)
class Bundle:
    """What the Secret holds: the serving pair, the CA that signed it, and the CAs to trust."""

    cert: bytes  # PEM, the serving certificate
    key: bytes  # PEM, its key
    ca_cert: bytes  # PEM, the current CA
    ca_key: bytes  # PEM, the CA's key (so that any replica can renew the serving certificate)
    trust: bytes  # PEM, every CA still valid (the caBundle)


def service_hosts(service: str, namespace: str, domain: str = "cluster.local") -> list[str]:
    """The names the API server may use for a Service (it asks for <service>.<namespace>.svc)."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.{domain}"]


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def new_ca(now: datetime.datetime) -> tuple[bytes, bytes]:
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + CA_LIFE)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def issue(ca_cert: bytes, ca_key: bytes, hosts: Sequence[str], now: datetime.datetime) -> tuple[bytes, bytes]:
    """A serving certificate for ``hosts`` (DNS names or IP addresses), signed by the CA."""
    ca = x509.load_pem_x509_certificate(ca_cert)
    signer = serialization.load_pem_private_key(ca_key, password=None)
    key = _key()
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(min(now + SERVING_LIFE, ca.not_valid_after_utc))
            .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.public_key()),  # type: ignore[arg-type]
                           critical=False)
            .sign(signer, hashes.SHA256()))  # type: ignore[arg-type]
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def _certs(pem: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem) if pem.strip() else []


def _names(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(n) for n in san.get_values_for_type(x509.DNSName)} | {
        str(n) for n in san.get_values_for_type(x509.IPAddress)}


def renew(current: Bundle | None, hosts: Sequence[str], now: datetime.datetime) -> tuple[Bundle, list[str]]:
    """The bundle to keep from ``current`` at ``now``, and why it changed (empty: ``current`` as it is). Any
    change issues a new serving certificate; a CA near its end is replaced and joins the trusted ones."""
    why: list[str] = []
    ca_cert, ca_key = (current.ca_cert, current.ca_key) if current else (b"", b"")
    ca = _certs(ca_cert)[0] if ca_cert.strip() else None
    if ca is None or ca.not_valid_after_utc - now < CA_RENEW:
        why.append("no CA yet" if ca is None else f"the CA expires on {ca.not_valid_after_utc:%Y-%m-%d}")
        ca_cert, ca_key = new_ca(now)
    serving = _certs(current.cert)[0] if current and current.cert.strip() else None
    if serving is None:
        why.append("no serving certificate yet")
    elif serving.not_valid_after_utc - now < SERVING_RENEW:
        why.append(f"the serving certificate expires on {serving.not_valid_after_utc:%Y-%m-%d}")
    elif not set(hosts) <= _names(serving):
        why.append(f"the serving certificate does not cover {', '.join(sorted(set(hosts) - _names(serving)))}")
    if not why:
        assert current is not None
        return current, []
    cert, key = issue(ca_cert, ca_key, hosts, now)
    fresh = x509.load_pem_x509_certificate(ca_cert)
    keep = [c for c in (_certs(current.trust) if current else []) if c.not_valid_after_utc > now and c != fresh]
    trust = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in [*keep, fresh])
    return Bundle(cert, key, ca_cert, ca_key, trust), why


def to_secret(bundle: Bundle, name: str, namespace: str, resource_version: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace,
                            "labels": {"app.kubernetes.io/name": "topology-agent-webhook"}}
    if resource_version:
        meta["resourceVersion"] = resource_version
    data = {"tls.crt": bundle.cert, "tls.key": bundle.key, "ca.crt": bundle.trust, "ca-current.crt": bundle.ca_cert,
            "ca.key": bundle.ca_key}
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls", "metadata": meta,
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}


def from_secret(secret: dict[str, Any]) -> Bundle | None:
    """The bundle in a Secret, or None when it holds none this webhook can use (it is then replaced)."""
    data = secret.get("data") or {}
    try:
        raw = {k: base64.b64decode(data.get(k) or "", validate=True) for k in
               ("tls.crt", "tls.key", "ca.crt", "ca-current.crt", "ca.key")}
        bundle = Bundle(raw["tls.crt"], raw["tls.key"], raw["ca-current.crt"], raw["ca.key"], raw["ca.crt"])
        if bundle.ca_cert.strip():
            x509.load_pem_x509_certificate(bundle.ca_cert)
            serialization.load_pem_private_key(bundle.ca_key, password=None)
        _certs(bundle.trust)
        _certs(bundle.cert)
    except (ValueError, TypeError) as err:
        log.warning("Secret %s: its certificates do not parse (%s); making new ones",
                    secret.get("metadata", {}).get("name"), str(err)[:120])
        return None
    return bundle


class ManagedCerts:
    """Keeps the Secret's bundle current and the webhook configuration's caBundle equal to its trust."""

    def __init__(self, api: AsyncApi, *, namespace: str, secret: str, config: str, hosts: Sequence[str],
                 clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC)) -> None:
        self.api, self.namespace, self.secret, self.config, self.hosts = api, namespace, secret, config, list(hosts)
        self.clock = clock
        self.bundle: Bundle | None = None

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/secrets/{self.secret}"

    async def refresh(self) -> Bundle:
        """Read, renew if needed, write; then make the caBundle match. Returns the bundle to serve."""
        for _ in range(5):
            try:
                secret: dict[str, Any] | None = await self.api.get_object(self.path)
            except ApiNotFound:
                secret = None
            current = from_secret(secret) if secret else None
            bundle, why = renew(current, self.hosts, self.clock())
            try:
                if secret is None:
                    await self.api.create(f"/api/v1/namespaces/{self.namespace}/secrets",
                                          to_secret(bundle, self.secret, self.namespace))
                elif why:
                    await self.api.replace(self.path, to_secret(bundle, self.secret, self.namespace,
                                                                secret["metadata"].get("resourceVersion")))
            except ApiConflict:
                continue  # another replica wrote first: take theirs
            if why:
                log.info("webhook certificates: %s; Secret %s/%s written", "; ".join(why), self.namespace,
                         self.secret)
            self.bundle = bundle
            await self.patch_ca_bundle(bundle.trust)
            return bundle
        raise InputError(f"Secret {self.namespace}/{self.secret} kept changing under this replica (5 conflicts "
                         "in a row); is another program writing it?")

    async def patch_ca_bundle(self, trust: bytes) -> None:
        """Set every webhook's clientConfig.caBundle in the named MutatingWebhookConfiguration (and nothing
        else of it). A configuration that does not exist yet is not an error: it gets its bundle next time."""
        path = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{self.config}"
        wanted = base64.b64encode(trust).decode()
        for _ in range(5):
            try:
                config = await self.api.get_object(path)
            except ApiNotFound:
                log.warning("MutatingWebhookConfiguration %s does not exist yet; its caBundle will be set when it "
                            "does (apply manifests/webhook)", self.config)
                return
            hooks = [h for h in config.get("webhooks") or [] if isinstance(h, dict)]
            if all((h.get("clientConfig") or {}).get("caBundle") == wanted for h in hooks):
                return
            for hook in hooks:
                hook.setdefault("clientConfig", {})["caBundle"] = wanted
            try:
                await self.api.replace(path, config)
            except ApiConflict:
                continue
            log.info("MutatingWebhookConfiguration %s: caBundle set (%d webhooks)", self.config, len(hooks))
            return
