"""Where the API server is and how to authenticate: in-cluster service account first, then kubeconfig.

In a pod the service account mount is read directly (three files and two environment variables; re-read on
every request, because bound tokens rotate). Outside a cluster the ``kubernetes`` package's kubeconfig
loader is used, imported only then: it understands every kubeconfig form (exec plugins, client
certificates, contexts) and costs ~0.6 s of imports that an init container in a pod should not pay.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from agent.errors import InputError

SERVICEACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class ApiConfig:
    server: str
    token: str | None = None
    token_file: Path | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    namespace: str | None = None
    source: str = ""

    def bearer(self) -> str | None:
        if self.token_file is not None:
            try:
                return self.token_file.read_text().strip()
            except OSError:
                return self.token
        return self.token


def serviceaccount_dir() -> Path:
    return Path(os.environ.get("TOPOLOGY_SERVICEACCOUNT_DIR") or SERVICEACCOUNT_DIR)


def in_cluster_config() -> ApiConfig | None:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    sa = serviceaccount_dir()
    if not host or not port or not (sa / "token").is_file():
        return None
    host = f"[{host}]" if ":" in host else host
    namespace_file = sa / "namespace"
    return ApiConfig(
        server=f"https://{host}:{port}",
        token_file=sa / "token",
        ca_file=str(sa / "ca.crt") if (sa / "ca.crt").is_file() else None,
        namespace=namespace_file.read_text().strip() if namespace_file.is_file() else None,
        source=f"in-cluster service account ({sa})",
    )


def kubeconfig_config(path: str | None = None, context: str | None = None) -> ApiConfig:
    try:
        from kubernetes import client as k8s_client
        from kubernetes import config as k8s_config
        from kubernetes.config.config_exception import ConfigException
    except ImportError as err:  # pragma: no cover - a dependency
        raise InputError("the 'kubernetes' package is missing; pip install topology-agent") from err
    configuration = k8s_client.Configuration()
    where = path or os.environ.get("KUBECONFIG") or "~/.kube/config"
    files = [Path(p).expanduser() for p in where.split(os.pathsep) if p]
    if not any(f.is_file() for f in files):
        raise InputError(f"no API server configuration: not in a pod (no service account) and kubeconfig {where}: "
                         "file not found; run in a pod, or point KUBECONFIG (or --kubeconfig) at a kubeconfig file")
    for file in files:
        why = kubeconfig_problem(file)
        if why is not None:
            raise InputError(f"kubeconfig {file} is not a kubeconfig ({why}); point KUBECONFIG (or --kubeconfig) at "
                             "the file kubectl uses, or run in a pod")
    try:
        contexts, active = k8s_config.list_kube_config_contexts(config_file=path)
        if context is not None:
            active = next((c for c in contexts if c.get("name") == context), None)
            if active is None:
                raise InputError(f"--context '{context}' is not a context of kubeconfig {where} (its contexts: "
                                 f"{', '.join(str(c.get('name')) for c in contexts) or 'none'}); give one of them")
        k8s_config.load_kube_config(config_file=path, context=context, client_configuration=configuration)
    except (ConfigException, OSError, TypeError, ValueError, KeyError, AttributeError) as err:
        reason = str(err) if isinstance(err, ConfigException) else f"{type(err).__name__} while reading it"
        raise InputError(
            f"no API server configuration: not in a pod (no service account) and kubeconfig {where} is unusable "
            f"({reason}); run in a pod, or point KUBECONFIG at a valid file"
        ) from err
    auth = configuration.api_key.get("authorization") or configuration.api_key.get("BearerToken")
    token = auth.split(" ", 1)[1] if auth and " " in auth else auth
    return ApiConfig(
        server=configuration.host,
        token=token,
        ca_file=configuration.ssl_ca_cert,
        cert_file=configuration.cert_file,
        key_file=configuration.key_file,
        verify=bool(configuration.verify_ssl),
        namespace=(active or {}).get("context", {}).get("namespace"),
        source=f"kubeconfig {where}",
    )


def kubeconfig_problem(file: Path) -> str | None:
    """Why ``file`` cannot be a kubeconfig, read as kubectl reads it (YAML: a map whose clusters, users and
    contexts are lists of named entries), or None. The kubernetes package assumes that shape and fails with
    Python errors ('str' object does not support item assignment) on anything else."""
    import yaml

    if not file.is_file():
        return None  # KUBECONFIG may list files that do not exist; kubectl skips them too
    try:
        data = yaml.safe_load(file.read_bytes())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        return f"not YAML{where}: {getattr(err, 'problem', None) or type(err).__name__}"
    except OSError as err:
        return err.strerror or str(err)
    if data is None:
        return "it is empty"
    if not isinstance(data, dict):
        return f"its top level is a {type(data).__name__}, not a map with clusters, users and contexts"
    for key in ("clusters", "users", "contexts"):
        entries = data.get(key)
        if entries is not None and (not isinstance(entries, list) or not all(
                isinstance(e, dict) and isinstance(e.get("name"), str) for e in entries)):
            return f"'{key}' is not a list of entries with a name"
    if not data.get("clusters"):
        return "it names no cluster"
    return None


def load_config(kubeconfig: str | None = None, context: str | None = None) -> ApiConfig:
    """In-cluster when the service account is mounted (and no kubeconfig or context is named), else kubeconfig
    (``context``: one of its contexts, as kubectl's --context)."""
    if not kubeconfig and not context:
        found = in_cluster_config()
        if found is not None:
            return found
    return kubeconfig_config(kubeconfig, context)

