"""Init's SSH material: the host key and the certificate the job's CA signs, as OpenSSH reads them."""

from __future__ import annotations

import base64
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent import examples
from agent.core import Options, render_pod
from agent.core.files.ssh_config import SshPaths
from agent.errors import InputError
from agent.ssh.material import generate_secret_manifest, load_job_keys, ssh_files


def _secret(directory: Path) -> Path:
    manifest = yaml.safe_load(generate_secret_manifest("demo", "default"))
    directory.mkdir(mode=0o700)
    for key, value in manifest["data"].items():
        (directory / key).write_bytes(base64.b64decode(value))
        (directory / key).chmod(0o400)
    return directory


def test_the_secret_is_labelled_with_the_job_under_the_agent_s_own_prefix():
    labels = yaml.safe_load(generate_secret_manifest("demo", "team-a"))["metadata"]["labels"]
    assert labels == {"app.kubernetes.io/managed-by": "topology-agent", "topology-agent.io/job": "demo"}


NEEDS_KEYGEN = pytest.mark.skipif(shutil.which("ssh-keygen") is None,
                                  reason="ssh-keygen is not installed (.ci/run installs openssh-client)")


def _own_ca(tmp_path: Path, kind: str, passphrase: str = "") -> Path:
    """A Secret whose host CA the user made with ssh-keygen, in place of keygen's."""
    secret = _secret(tmp_path / "secret")
    for name in ("host_ca", "host_ca.pub"):
        (secret / name).chmod(0o600)
        (secret / name).unlink()
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", passphrase, "-C", "own CA", "-f", str(secret / "host_ca")],
                   check=True)
    return secret


@NEEDS_KEYGEN
def test_init_signs_a_host_certificate_openssh_reads_with_the_pods_names(tmp_path):
    keys = load_job_keys(_secret(tmp_path / "secret"))
    rendered = render_pod(examples.volcano_job(), "demo-worker-1", Options(address="ip"))
    files, modes = ssh_files(rendered, keys, paths=SshPaths(str(tmp_path / "ssh")), port=2222, cluster_domain=None,
                             now=1_800_000_000)
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(data)
    (tmp_path / "ssh/ssh_host_ed25519_key").chmod(0o600)
    shown = subprocess.run(["ssh-keygen", "-L", "-f", str(tmp_path / "ssh/ssh_host_ed25519_key-cert.pub")],
                           capture_output=True, text=True, check=True).stdout
    assert "host certificate" in shown and 'Key ID: "demo-worker-1"' in shown
    for principal in ("demo-worker-1", "demo-worker-1.demo", "demo-worker-1.demo.default.svc",
                      examples.loopback_ip(2)):
        assert f"\n                {principal}\n" in shown
    fingerprint = subprocess.run(["ssh-keygen", "-l", "-f", str(tmp_path / "secret/host_ca.pub")],
                                 capture_output=True, text=True, check=True).stdout.split()[1]
    assert f"Signing CA: ED25519 {fingerprint}" in shown
    # the host key's public half is what the certificate certifies, and ssh-keygen reads the private key
    public = subprocess.run(["ssh-keygen", "-y", "-f", str(tmp_path / "ssh/ssh_host_ed25519_key")],
                            capture_output=True, text=True, check=True).stdout.split()[1]
    assert files["ssh/ssh_host_ed25519_key.pub"].split()[1].decode() == public
    assert modes["ssh/ssh_host_ed25519_key"] == 0o600 and modes["ssh/ssh_host_ed25519_key-cert.pub"] == 0o644


@pytest.mark.parametrize("membership_only,written", [(False, "ssh/ssh_host_ed25519_key-cert.pub"),
                                                     (True, "ssh/known_hosts")])
def test_the_ssh_files_are_written_without_asyncssh(tmp_path, membership_only, written):
    # asyncssh is keygen's: importing it cost each SSH pod's init ~17 MB more than cryptography's SSH support, and
    # the sidecar, which rewrites known_hosts and ssh_config at each change, loads no key library at all
    secret = _secret(tmp_path / "secret")
    code = ("import sys; from pathlib import Path; from agent import examples; from agent.core import Options, "
            "render_pod; from agent.runtime.output import write_generation; from agent.ssh.files import SshSettings; "
            "o = Options(address='ip'); r = render_pod(examples.volcano_job(), 'demo-worker-1', o); "
            f"names = write_generation(Path({str(tmp_path / 'out')!r}), r, o, SshSettings(Path({str(secret)!r})), "
            f"ssh_membership_only={membership_only}); "
            f"print({written!r} in names, 'asyncssh' in sys.modules, 'cryptography' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["True", "False", str(not membership_only)]
    if membership_only:
        assert "@cert-authority" in (tmp_path / "out/ssh/known_hosts").read_text()
    else:
        assert (tmp_path / "out" / written).read_bytes().startswith(b"ssh-ed25519-cert-v01@openssh.com ")


@pytest.mark.parametrize("key", ["host_ca", "id_ed25519"])
def test_a_private_key_that_does_not_parse_is_one_line(tmp_path, key):
    secret = _secret(tmp_path / "secret")
    (secret / key).chmod(0o600)
    (secret / key).write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nbm90IGEga2V5\n-----END OPENSSH PRIVATE KEY-----\n")
    with pytest.raises(InputError) as err:
        load_job_keys(secret)
    assert "a private key does not parse" in str(err.value) and "keygen" in str(err.value)
    assert "\n" not in str(err.value) and "bm90IGEga2V5" not in str(err.value)


@pytest.mark.parametrize("kind,shown", [("ecdsa", "ECDSA"), ("rsa", "RSA")])
@NEEDS_KEYGEN
def test_a_users_own_ecdsa_or_rsa_ca_signs_too(tmp_path, kind, shown):
    secret = _own_ca(tmp_path, kind)
    keys = load_job_keys(secret)
    rendered = render_pod(examples.volcano_job(), "demo-worker-1", Options(address="ip"))
    files, _ = ssh_files(rendered, keys, paths=SshPaths(str(tmp_path / "ssh")), port=2222, cluster_domain=None)
    (tmp_path / "cert.pub").write_bytes(files["ssh/ssh_host_ed25519_key-cert.pub"])
    shown_cert = subprocess.run(["ssh-keygen", "-L", "-f", str(tmp_path / "cert.pub")], capture_output=True,
                                text=True, check=True).stdout
    assert f"Signing CA: {shown} " in shown_cert and "demo-worker-1.demo" in shown_cert
    assert (secret / "host_ca.pub").read_text().split()[1] in files["ssh/known_hosts"].decode()


@NEEDS_KEYGEN
def test_a_passphrase_protected_ca_is_refused_saying_so(tmp_path):
    secret = _own_ca(tmp_path, "ed25519", "a passphrase")
    with pytest.raises(InputError) as err:
        load_job_keys(secret)
    assert "does not parse" in str(err.value) and "password" in str(err.value).lower()
    assert "\n" not in str(err.value) and "BEGIN" not in str(err.value)
