"""k8s/aio: the sidecar's modules load aiohttp without its default TLS contexts reading the system's CA bundle,
the environment is as it was after, and a kubeconfig that names no CA still trusts the system's bundle
(transport.ssl_context reads it itself). The "system" bundle here is a CA of the test's own, named by
SSL_CERT_FILE, so the counts do not depend on the machine's certificates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from agent.sandbox.credentials import make_tls

PROBE = """
import json, os
before = {name: os.environ.get(name) for name in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
import agent.k8s.async_client, agent.runtime.health, agent.runtime.sidecar  # what the sidecar command loads
import aiohttp.connector
from agent.k8s.config import ApiConfig
from agent.k8s.transport import ssl_context
after = {name: os.environ.get(name) for name in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
system = ssl_context(ApiConfig(server="https://127.0.0.1:6443"))
print(json.dumps({"aiohttp_default": aiohttp.connector._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509"],
                  "no_ca_named": system.cert_store_stats()["x509"], "same_env": before == after}))
"""


def test_the_sidecar_s_aiohttp_holds_no_system_certificates_and_a_kubeconfig_without_a_ca_still_has_them(
        tmp_path: Path) -> None:
    make_tls(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "SSL_CERT_FILE": str(tmp_path / "ca.crt"),
           "SSL_CERT_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=env)
    assert json.loads(run.stdout) == {"aiohttp_default": 0, "no_ca_named": 1, "same_env": True}
