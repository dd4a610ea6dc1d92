"""The webhook's TLS: a CA and a serving certificate it makes itself, kept in one Secret that every replica
shares, rotated before they expire, and the CA bundle written into its own MutatingWebhookConfiguration.

Lifetimes: the CA 5 years, the serving certificate 90 days. The serving certificate is renewed when less than a
third of its life is left (or when it does not cover a name it must serve); the CA when less than one year is
left. A renewed CA is added to the bundle beside the old one, which stays until it expires, so API servers that
still hold the old bundle keep trusting the old certificate during the change-over.

Every check validates what the Secret holds as open-policy-agent/cert-controller does (``validServerCert``):
the CA's key is its certificate's key, the CA is a CA and valid; the serving key is the serving certificate's
key, the certificate chains to the CA for every name it must serve, and it is within its validity with the
renewal margin left. What fails is made again: a broken CA (not a near end) is replaced and dropped from the
bundle, since nothing it signs can be renewed. Certificates start one hour back (cert-controller's backdate),
so a node whose clock is behind still accepts them.

Replicas race through the API server, not through each other: the Secret is created once (409: another
replica made it, read theirs) and replaced with its resourceVersion (409: read again, decide again).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import ipaddress
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from agent.errors import ApiConflict, ApiNotFound, InputError
from agent.k8s.async_client import AsyncApi

log = logging.getLogger("topology_agent.webhook")

CA_LIFE = datetime.timedelta(days=5 * 365)
CA_RENEW = datetime.timedelta(days=365)
SERVING_LIFE = datetime.timedelta(days=90)
SERVING_RENEW = SERVING_LIFE / 3
BACKDATE = datetime.timedelta(hours=1)  # cert-controller's: a node whose clock lags still accepts a new certificate
ISSUER = "topology-agent webhook CA"
KEYS = ("tls.crt", "tls.key", "ca.crt", "ca-current.crt", "ca.key")  # the Secret's data


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


def _san(host: str) -> x509.DNSName | x509.IPAddress:
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
            .not_valid_before(now - BACKDATE).not_valid_after(now + CA_LIFE)
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
            .not_valid_before(now - BACKDATE)
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


def _spki(key: Any) -> bytes:
    return key.public_bytes(serialization.Encoding.DER,
                            serialization.PublicFormat.SubjectPublicKeyInfo)


def _cert(pem: bytes, what: str) -> x509.Certificate:
    """The first certificate of ``pem``; ValueError naming ``what`` when there is none."""
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError:
        raise ValueError(f"{what} is not a PEM certificate") from None


def _private_key(pem: bytes, what: str) -> Any:
    """The key of ``pem``; ValueError naming ``what`` (never quoting it: it is a private key)."""
    try:
        return serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise ValueError(f"{what} is not an unencrypted PEM private key") from None


def pair_problem(cert_pem: bytes, key_pem: bytes, *, cert_name: str = "tls.crt",
                 key_name: str = "tls.key") -> str | None:
    """Why ``key_pem`` cannot serve ``cert_pem`` (None: it can): either does not parse, or the key is another
    certificate's. OpenSSL refuses such a pair only as it loads it, after it has dropped the pair it served."""
    if not cert_pem.strip():
        return f"{cert_name} is empty"
    if not key_pem.strip():
        return f"{key_name} is empty"
    try:
        cert, key = _cert(cert_pem, cert_name), _private_key(key_pem, key_name)
    except ValueError as err:
        return str(err)
    if _spki(key.public_key()) != _spki(cert.public_key()):
        return f"{key_name} is not the private key of {cert_name}"
    return None


def ca_problem(ca_cert: bytes, ca_key: bytes, now: datetime.datetime) -> str | None:
    """Why the CA cannot sign (None: it can): absent, unparsable, its key is not its certificate's, not a CA, not
    self-signed, or not valid ``now``."""
    if not ca_cert.strip():
        return "no CA yet"
    why = pair_problem(ca_cert, ca_key, cert_name="the CA certificate (ca-current.crt)",
                       key_name="the CA's key (ca.key)")
    if why is not None:
        return why
    ca = _cert(ca_cert, "ca-current.crt")
    try:
        is_ca = ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        return "the CA certificate (ca-current.crt) is not a CA (basicConstraints)"
    try:
        ca.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "the CA certificate (ca-current.crt) is not self-signed"
    if not ca.not_valid_before_utc <= now <= ca.not_valid_after_utc:
        return (f"the CA is not valid now (from {ca.not_valid_before_utc:%Y-%m-%d %H:%M} to "
                f"{ca.not_valid_after_utc:%Y-%m-%d %H:%M} UTC)")
    return None


def serving_problem(ca_cert: bytes, cert: bytes, key: bytes, hosts: Sequence[str],
                    now: datetime.datetime) -> str | None:
    """Why the serving pair must be issued again (None: it serves): absent, unparsable, a key that is not the
    certificate's, less than ``SERVING_RENEW`` left, a name missing, or a chain that does not verify against
    the CA (``ca_cert``, assumed sound) for each of ``hosts`` at ``now``."""
    if not cert.strip():
        return "no serving certificate yet"
    why = pair_problem(cert, key)
    if why is not None:
        return f"the serving pair does not match: {why}"
    serving = _cert(cert, "tls.crt")
    if serving.not_valid_after_utc - now < SERVING_RENEW:
        return f"the serving certificate expires on {serving.not_valid_after_utc:%Y-%m-%d}"
    missing = set(hosts) - _names(serving)
    if missing:
        return f"the serving certificate does not cover {', '.join(sorted(missing))}"
    store = Store([_cert(ca_cert, "ca-current.crt")])
    for host in hosts:
        try:
            PolicyBuilder().store(store).time(now).build_server_verifier(_san(host)).verify(serving, [])
        except (VerificationError, ValueError) as err:
            reason = str(err).split(" (encountered", 1)[0].removeprefix("validation failed: ")
            return f"the serving certificate does not verify against the CA for {host} ({reason})"
    return None


def renew(current: Bundle | None, hosts: Sequence[str], now: datetime.datetime) -> tuple[Bundle, list[str]]:
    """The bundle to keep from ``current`` at ``now``, and why it changed (empty: ``current`` as it is).

    A CA near its end is replaced and stays trusted until it ends; a CA that cannot sign (its key is not its
    certificate's, ...) is replaced and no longer trusted. A serving pair that does not verify against the CA
    kept is issued again by it; a new CA issues a new pair."""
    why: list[str] = []
    ca_cert, ca_key = (current.ca_cert, current.ca_key) if current else (b"", b"")
    cert, key = (current.cert, current.key) if current else (b"", b"")
    trusted = _trusted(current.trust) if current else []
    broken = ca_problem(ca_cert, ca_key, now)
    if broken is not None:
        why.append(broken)
        with contextlib.suppress(ValueError):
            unusable = x509.load_pem_x509_certificate(ca_cert)
            trusted = [c for c in trusted if c != unusable]
    elif (end := x509.load_pem_x509_certificate(ca_cert).not_valid_after_utc) - now < CA_RENEW:
        why.append(f"the CA expires on {end:%Y-%m-%d}")
    if why:
        ca_cert, ca_key = new_ca(now)
        if not cert.strip():
            why.append("no serving certificate yet")
        cert = b""
    elif (problem := serving_problem(ca_cert, cert, key, hosts, now)) is not None:
        why.append(problem)
        cert = b""
    ca = x509.load_pem_x509_certificate(ca_cert)
    if not why and ca not in trusted:
        why.append("the trusted CAs (ca.crt) lack the current CA")
    if not why:
        assert current is not None
        return current, []
    if not cert:
        cert, key = issue(ca_cert, ca_key, hosts, now)
    keep = [c for c in trusted if c.not_valid_after_utc > now and c != ca]
    trust = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in [*keep, ca])
    return Bundle(cert, key, ca_cert, ca_key, trust), why


def _trusted(pem: bytes) -> list[x509.Certificate]:
    """The CAs of a bundle; one that does not parse is no CA (the current one is added back)."""
    try:
        return _certs(pem)
    except ValueError:
        return []


def to_secret(bundle: Bundle, name: str, namespace: str, resource_version: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace,
                            "labels": {"app.kubernetes.io/name": "topology-agent-webhook"}}
    if resource_version:
        meta["resourceVersion"] = resource_version
    data = {"tls.crt": bundle.cert, "tls.key": bundle.key, "ca.crt": bundle.trust, "ca-current.crt": bundle.ca_cert,
            "ca.key": bundle.ca_key}
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls", "metadata": meta,
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}


def read_secret(secret: dict[str, Any]) -> Bundle:
    """What a Secret holds, as bytes, unchecked (``renew`` judges each part): a value that is not base64 reads as
    empty, so a broken serving pair does not cost the CA and the CA a broken bundle does not cost the pair."""
    data = secret.get("data")
    data = data if isinstance(data, dict) else {}
    raw: dict[str, bytes] = {}
    for k in KEYS:
        try:
            raw[k] = base64.b64decode(data.get(k) or "", validate=True)
        except (ValueError, TypeError):
            raw[k] = b""
    return Bundle(raw["tls.crt"], raw["tls.key"], raw["ca-current.crt"], raw["ca.key"], raw["ca.crt"])


def from_secret(secret: dict[str, Any]) -> Bundle | None:
    """The bundle in a Secret, or None when any part of it does not parse (it is then replaced whole)."""
    bundle = read_secret(secret)
    data = secret.get("data") if isinstance(secret.get("data"), dict) else {}
    try:
        for k in KEYS:
            base64.b64decode((data or {}).get(k) or "", validate=True)
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
    """Keeps the Secret's bundle valid and current, and the webhook configuration's caBundle equal to its trust.
    ``refresh`` is idempotent: called on every change to either object (tls.py watches them), it writes only
    what does not verify."""

    def __init__(self, api: AsyncApi, *, namespace: str, secret: str, config: str, hosts: Sequence[str],
                 clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC)) -> None:
        self.api, self.namespace, self.secret, self.config, self.hosts = api, namespace, secret, config, list(hosts)
        self.clock = clock
        self.bundle: Bundle | None = None
        self.writes = 0  # Secrets and configurations written: the keeper slows down when they never settle

    @property
    def secrets_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/secrets"

    @property
    def path(self) -> str:
        return f"{self.secrets_path}/{self.secret}"

    configs_path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"

    @property
    def config_path(self) -> str:
        return f"{self.configs_path}/{self.config}"

    async def refresh(self) -> Bundle:
        """Read, check, make again what does not verify, write; then make the caBundle match. Returns the bundle
        to serve."""
        for _ in range(5):
            try:
                secret: dict[str, Any] | None = await self.api.get_object(self.path)
            except ApiNotFound:
                secret = None
            current = read_secret(secret) if secret else None
            bundle, why = renew(current, self.hosts, self.clock())
            try:
                if secret is None:
                    await self.api.create(self.secrets_path, to_secret(bundle, self.secret, self.namespace))
                elif why:
                    await self.api.replace(self.path, to_secret(bundle, self.secret, self.namespace,
                                                                secret["metadata"].get("resourceVersion")))
            except ApiConflict:
                continue  # another replica wrote first: take theirs
            if why:
                self.writes += 1
                log.info("webhook certificates: %s; Secret %s/%s %s", "; ".join(why), self.namespace, self.secret,
                         "created" if secret is None else "written")
            self.bundle = bundle
            await self.patch_ca_bundle(bundle.trust)
            return bundle
        raise InputError(f"Secret {self.namespace}/{self.secret} kept changing under this replica (5 conflicts "
                         "in a row); is another program writing it?")

    async def patch_ca_bundle(self, trust: bytes) -> None:
        """Set every webhook's clientConfig.caBundle in the named MutatingWebhookConfiguration (and nothing
        else of it: the ValidatingAdmissionPolicy in manifests/webhook admits nothing else from this account).
        A configuration that does not exist yet is not an error: it gets its bundle as it is created."""
        wanted = base64.b64encode(trust).decode()
        for _ in range(5):
            try:
                config = await self.api.get_object(self.config_path)
            except ApiNotFound:
                log.warning("MutatingWebhookConfiguration %s does not exist; its caBundle is set as soon as it is "
                            "created (apply manifests/webhook)", self.config)
                return
            hooks = [h for h in config.get("webhooks") or [] if isinstance(h, dict)]
            if all((h.get("clientConfig") or {}).get("caBundle") == wanted for h in hooks):
                return
            for hook in hooks:
                hook.setdefault("clientConfig", {})["caBundle"] = wanted
            try:
                await self.api.replace(self.config_path, config)
            except ApiConflict:
                continue
            self.writes += 1
            log.info("MutatingWebhookConfiguration %s: caBundle set (%d webhooks)", self.config, len(hooks))
            return
