"""``topology-agent keygen``: a job's SSH Secret (a user key pair and a host CA), printed as a manifest or created
through the API (``--apply``). An existing Secret is never replaced: its pods' known_hosts trust its CA, so a clash
says how to rotate instead."""

from __future__ import annotations

from typing import TYPE_CHECKING

import yaml

from agent.errors import ApiConflict
from agent.ssh.material import generate_secret_manifest

if TYPE_CHECKING:
    from agent.k8s.config import ApiConfig


def run_keygen(job: str, namespace: str, config: ApiConfig | None) -> int:
    manifest = generate_secret_manifest(job, namespace)
    if config is None:
        print(manifest, end="")
        return 0
    from agent.k8s.client import Client

    api = Client(config)
    try:
        created = api.create(f"/api/v1/namespaces/{namespace}/secrets", yaml.safe_load(manifest))
    except ApiConflict as err:
        raise ApiConflict(f"secrets '{job}-ssh' already exists in namespace '{namespace}'; delete it first to rotate "
                          "keys", status=409) from err
    finally:
        api.close()
    print(f"secret/{created['metadata']['name']} created in namespace {namespace}")
    return 0
