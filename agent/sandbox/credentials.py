"""What a client needs to trust and reach the sandbox, written into its state directory: a CA and a server
certificate for 127.0.0.1, a kubeconfig for kubectl, and an in-cluster service account mount (token, ca.crt,
namespace), the agent's production path."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import ssl
from pathlib import Path
from typing import Any

KUBECONFIG = "kubeconfig"
SERVICEACCOUNT = "serviceaccount"


def make_tls(state_dir: Path) -> ssl.SSLContext:
    """A new CA (``ca.crt``, for clients) and the server's certificate and key, as the server's TLS context."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "topology-agent sandbox CA")])
    # The extensions a strict verifier asks for (Python 3.13 sets VERIFY_X509_STRICT by default, RFC 5280):
    # key identifiers on both, key usages, a critical basicConstraints on the CA.
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=7))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(ca_ski, critical=False)
          .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandbox-apiserver")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (state_dir / "ca.crt").write_bytes(ca.public_bytes(pem))
    (state_dir / "server.crt").write_bytes(cert.public_bytes(pem))
    (state_dir / "server.key").write_bytes(key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (state_dir / "server.key").chmod(0o600)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(state_dir / "server.crt", state_dir / "server.key")
    return context


def write_client_files(state_dir: Path, *, url: str, token: str, tls: bool) -> None:
    """The kubeconfig and the service account mount, both with the token and (over TLS) the CA."""
    cluster: dict[str, Any] = {"server": url}
    if tls:
        cluster["certificate-authority-data"] = base64.b64encode((state_dir / "ca.crt").read_bytes()).decode()
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "sandbox",
        "clusters": [{"name": "sandbox", "cluster": cluster}],
        "users": [{"name": "sandbox", "user": {"token": token}}],
        "contexts": [{"name": "sandbox", "context": {"cluster": "sandbox", "user": "sandbox",
                                                      "namespace": "default"}}],
    }
    kubeconfig = state_dir / KUBECONFIG
    kubeconfig.write_text(json.dumps(config, indent=2))
    kubeconfig.chmod(0o600)
    sa = state_dir / SERVICEACCOUNT
    sa.mkdir(exist_ok=True)
    (sa / "token").write_text(token)
    (sa / "namespace").write_text("default")
    if tls:
        (sa / "ca.crt").write_bytes((state_dir / "ca.crt").read_bytes())
