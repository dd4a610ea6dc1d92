"""SSH key material: the job's Secret (``keygen``) and each pod's host key and host certificate.

The Secret holds a user key pair (for passwordless login between pods) and a host certificate authority.
Every pod's init container generates a fresh host key and signs it with the CA for the pod's own names, so a
pod that lacks the Secret cannot pose as a member. Keys are ed25519. ``keygen`` makes the Secret with asyncssh;
init, in every pod, reads the keys and signs its host certificate with ``cryptography`` alone (its
SSHCertificateBuilder; asyncssh is built on it): importing asyncssh would cost each SSH pod's init ~17 MB more.
Private keys are never logged; only ``keygen`` prints one (into the Secret manifest it outputs).
"""

from __future__ import annotations

import base64
import logging
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import SSHCertificateBuilder, SSHCertificateType

from agent.core import Rendered
from agent.core.files.ssh_config import SshPaths, host_principals, render_sshd_config
from agent.core.report.events import JOB_LABEL
from agent.errors import InputError
from agent.ssh.files import PRIVATE, PUBLIC, SshSettings, membership_files

__all__ = ["PRIVATE", "PUBLIC", "SshSettings", "membership_files"]  # the files' side, for the callers of both

log = logging.getLogger("topology_agent.ssh")
SECRET_KEYS = ("id_ed25519", "id_ed25519.pub", "host_ca", "host_ca.pub")
CERT_VALIDITY = 365 * 24 * 3600
_CA_TYPES = (ed25519.Ed25519PrivateKey, ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)  # what signs a certificate


@dataclass(frozen=True)
class JobKeys:
    user_private: str
    user_public: str
    ca_private: serialization.SSHCertPrivateKeyTypes
    ca_public: str


def generate_secret_manifest(job: str, namespace: str) -> str:
    """A Secret with a fresh user key pair and host CA; printed by ``keygen``. Labelled with the job as the
    agent's Events are (``topology-agent.io/job``), so ``kubectl get secrets,events -l`` finds both; nothing reads
    the label back: pods mount the Secret by its name."""
    import asyncssh  # keygen's alone

    user = asyncssh.generate_private_key("ssh-ed25519", comment=f"{job} user")
    ca = asyncssh.generate_private_key("ssh-ed25519", comment=f"{job} host CA")
    data = {
        "id_ed25519": user.export_private_key("openssh").decode(),
        "id_ed25519.pub": user.export_public_key().decode(),
        "host_ca": ca.export_private_key("openssh").decode(),
        "host_ca.pub": ca.export_public_key().decode(),
    }
    manifest = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": secret_name(job), "namespace": namespace,
                     "labels": {"app.kubernetes.io/managed-by": "topology-agent", JOB_LABEL: job}},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }
    return yaml.safe_dump(manifest, sort_keys=False)


def secret_name(job: str) -> str:
    return f"{job}-ssh"


def load_job_keys(secret_dir: Path) -> JobKeys:
    """Read the mounted Secret; warn when its private keys are readable by group or others."""
    missing = [k for k in SECRET_KEYS if not (secret_dir / k).is_file()]
    if missing:
        raise InputError(f"--ssh-secret-dir {secret_dir}: missing {', '.join(missing)}; mount the Secret made by "
                         "topology-agent keygen")
    for name in ("id_ed25519", "host_ca"):
        mode = (secret_dir / name).stat().st_mode
        if mode & (stat.S_IRGRP | stat.S_IROTH):
            log.warning("%s is readable by group or others (mode %o); mount the Secret with defaultMode: 0400",
                        secret_dir / name, stat.S_IMODE(mode))
    try:
        user_private = (secret_dir / "id_ed25519").read_text()
        serialization.load_ssh_private_key(user_private.encode(), password=None)
        ca = serialization.load_ssh_private_key((secret_dir / "host_ca").read_bytes(), password=None)
        if not isinstance(ca, _CA_TYPES):
            raise TypeError("a host CA key must be ed25519, ECDSA or RSA")
    except (ValueError, TypeError, UnsupportedAlgorithm) as err:
        why = " ".join(str(err).split())[:120]  # cryptography's own words (a key type, a passphrase), never the key
        raise InputError(f"--ssh-secret-dir {secret_dir}: a private key does not parse ({type(err).__name__}: "
                         f"{why}); recreate the Secret with topology-agent keygen") from None
    return JobKeys(user_private=user_private, user_public=(secret_dir / "id_ed25519.pub").read_text().strip(),
                   ca_private=ca, ca_public=(secret_dir / "host_ca.pub").read_text().strip())


def ssh_files(rendered: Rendered, keys: JobKeys, *, paths: SshPaths, port: int, cluster_domain: str | None,
              now: float | None = None) -> tuple[dict[str, bytes], dict[str, int]]:
    """Files (relative names under ``ssh/``) and their modes for this pod."""
    topo = rendered.plan.topology
    me = topo.me
    principals = host_principals(me, topo, cluster_domain)
    host_key = ed25519.Ed25519PrivateKey.generate()
    issued = int(now if now is not None else time.time())
    cert = (SSHCertificateBuilder().public_key(host_key.public_key()).type(SSHCertificateType.HOST)
            .key_id(me.name.encode()).valid_principals([p.encode() for p in principals])
            .valid_after(issued - 300).valid_before(issued + CERT_VALIDITY).sign(keys.ca_private))
    log.info("host certificate for %s signed by the job CA, principals: %s", me.name, ", ".join(principals))
    files = {
        "ssh/id_ed25519": keys.user_private.encode(),
        "ssh/id_ed25519.pub": (keys.user_public + "\n").encode(),
        "ssh/authorized_keys": (keys.user_public + "\n").encode(),
        "ssh/ssh_host_ed25519_key": host_key.private_bytes(serialization.Encoding.PEM,
                                                           serialization.PrivateFormat.OpenSSH,
                                                           serialization.NoEncryption()),
        "ssh/ssh_host_ed25519_key.pub": _line(host_key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH), f"{me.name} host key"),
        "ssh/ssh_host_ed25519_key-cert.pub": _line(cert.public_bytes(), f"{me.name} host certificate"),
        **membership_files(rendered, keys.ca_public, paths=paths, port=port),
        "ssh/sshd_config": render_sshd_config(paths, port, pod_name=me.name).encode(),
    }
    modes = {name: PRIVATE if name.endswith(("id_ed25519", "_key")) else PUBLIC for name in files}
    return files, modes


def _line(key: bytes, comment: str) -> bytes:
    """An OpenSSH public key or certificate line, with its comment, as ssh-keygen writes it."""
    return key + b" " + comment.encode() + b"\n"
