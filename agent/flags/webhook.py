"""`topology-agent webhook`: its flags and ``WebhookOwn``, the settings they give (``runtime.webhook.WebhookSettings``
adds what no flag sets): a flag is its argument, its field (with its one default) and its check, here."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from agent.core.adoption.injection import Settings
from agent.core.pods.validation import is_dns1123_label, is_dns1123_subdomain
from agent.errors import InputError
from agent.flags.common import (
    Knob,
    add_set_argument,
    at_least_one_second,
    defaults_from,
    ip_address,
    is_ip,
    kubeconfig,
    log_format,
    whole,
)

if TYPE_CHECKING:
    from agent.k8s.config import ApiConfig


@dataclass(frozen=True, kw_only=True)
class WebhookOwn:
    """The settings the webhook's flags give."""

    host: str = "0.0.0.0"
    port: int = 8443
    namespace: str = "topology-agent-system"  # where the webhook runs: its Secret
    service: str = "topology-agent-webhook"
    secret: str = "topology-agent-webhook-tls"
    config: str = "topology-agent"  # the MutatingWebhookConfiguration whose caBundle it keeps
    tls_dir: Path | None = None  # tls.crt + tls.key written by someone else (cert-manager): no Secret, no caBundle
    check_every: float = 3600.0  # how often the certificates are checked for renewal
    defaults: Settings = field(default_factory=Settings)  # --set: every job's settings, under its namespace's


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", default=str(WebhookOwn.port), help="HTTPS port (default 8443)")
    parser.add_argument("--host", default=WebhookOwn.host, help="address to bind (default 0.0.0.0)")
    parser.add_argument("--namespace", help="the webhook's namespace, where its TLS Secret is (default: "
                                            "$POD_NAMESPACE, else topology-agent-system)")
    parser.add_argument("--service", default=WebhookOwn.service, help="its Service: the certificate "
                                                                           "covers <service>.<namespace>.svc")
    parser.add_argument("--cert-host", action="append", default=[], metavar="NAME_OR_IP",
                        help="another name or IP address the certificate covers (repeatable)")
    parser.add_argument("--secret", default=WebhookOwn.secret,
                        help="the Secret holding its CA and serving certificate (default topology-agent-webhook-tls)")
    parser.add_argument("--config", default=WebhookOwn.config, help="the MutatingWebhookConfiguration whose caBundle "
                                                                   "it keeps (default topology-agent)")
    parser.add_argument("--tls-dir", help="serve tls.crt and tls.key from this directory (cert-manager) instead "
                                          "of managing a Secret and the caBundle")
    parser.add_argument("--check-every", default=f"{WebhookOwn.check_every:g}",
                        help="seconds between certificate checks (default 3600)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    parser.add_argument("--log-format", help="text or json (default text)")
    add_set_argument(parser)


class WebhookStart(NamedTuple):
    """What the webhook knows before it serves."""

    settings: WebhookOwn
    cert_hosts: tuple[str, ...]  # --cert-host: names and addresses the certificate covers beside the Service's
    log_format: str
    config: ApiConfig


def settings_from(args: argparse.Namespace) -> WebhookStart:
    """Every flag checked, then the API's configuration read."""
    from agent.k8s.config import load_config

    fmt = log_format(args)
    port = whole("--port", args.port, low=1) or WebhookOwn.port
    host = ip_address(Knob(args.host, "--host"))
    check_every = at_least_one_second(Knob(args.check_every, "--check-every"), WebhookOwn.check_every,
                                      high=86_400 * 30)
    namespace = args.namespace or os.environ.get("POD_NAMESPACE") or WebhookOwn.namespace
    _check_names(args, namespace)
    defaults = defaults_from(args)
    tls_dir = Path(args.tls_dir) if args.tls_dir else None
    if tls_dir is not None and not tls_dir.is_dir():
        raise InputError(f"--tls-dir {tls_dir}: not a directory; mount the certificate's Secret there")
    config = load_config(kubeconfig(args))
    fields = WebhookOwn(host=host, port=port, namespace=namespace, service=args.service, secret=args.secret,
                        config=args.config, tls_dir=tls_dir, check_every=check_every or WebhookOwn.check_every,
                        defaults=defaults)
    return WebhookStart(settings=fields, cert_hosts=tuple(args.cert_host), log_format=fmt, config=config)


def _check_names(args: argparse.Namespace, namespace: str) -> None:
    for option, value in (("--namespace", namespace), ("--service", args.service)):
        if not is_dns1123_label(value):
            raise InputError(f"{option} '{value}' is not a valid Kubernetes name (a DNS-1123 label)")
    for option, value in (("--secret", args.secret), ("--config", args.config)):
        if not is_dns1123_subdomain(value):
            raise InputError(f"{option} '{value}' is not a valid Kubernetes object name")
    for value in args.cert_host:
        if not (is_dns1123_subdomain(value) or is_ip(value)):
            raise InputError(f"--cert-host '{value}' is neither a DNS name nor an IP address")
