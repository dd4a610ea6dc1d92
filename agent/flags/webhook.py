"""`topology-agent webhook`: its flags, and the fields of ``runtime.webhook.WebhookSettings`` they give."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, TypedDict

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
    from agent.core.adoption.injection import Settings
    from agent.k8s.config import ApiConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", default="8443", help="HTTPS port (default 8443)")
    parser.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    parser.add_argument("--namespace", help="the webhook's namespace, where its TLS Secret is (default: "
                                            "$POD_NAMESPACE, else topology-agent-system)")
    parser.add_argument("--service", default="topology-agent-webhook", help="its Service: the certificate "
                                                                           "covers <service>.<namespace>.svc")
    parser.add_argument("--cert-host", action="append", default=[], metavar="NAME_OR_IP",
                        help="another name or IP address the certificate covers (repeatable)")
    parser.add_argument("--secret", default="topology-agent-webhook-tls",
                        help="the Secret holding its CA and serving certificate (default topology-agent-webhook-tls)")
    parser.add_argument("--config", default="topology-agent", help="the MutatingWebhookConfiguration whose caBundle "
                                                                   "it keeps (default topology-agent)")
    parser.add_argument("--tls-dir", help="serve tls.crt and tls.key from this directory (cert-manager) instead "
                                          "of managing a Secret and the caBundle")
    parser.add_argument("--check-every", default="3600", help="seconds between certificate checks (default 3600)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    parser.add_argument("--log-format", help="text or json (default text)")
    add_set_argument(parser)


class WebhookFields(TypedDict):
    """``WebhookSettings``' fields that the webhook's flags give, by their names there."""

    host: str
    port: int
    namespace: str
    service: str
    secret: str
    config: str
    tls_dir: Path | None
    check_every: float
    defaults: Settings  # --set: every job's settings, under its namespace's annotations


class WebhookStart(NamedTuple):
    """What the webhook knows before it serves."""

    settings: WebhookFields
    cert_hosts: tuple[str, ...]  # --cert-host: names and addresses the certificate covers beside the Service's
    log_format: str
    config: ApiConfig


def settings_from(args: argparse.Namespace) -> WebhookStart:
    """Every flag checked, then the API's configuration read."""
    from agent.k8s.config import load_config

    fmt = log_format(args)
    port = whole("--port", args.port, low=1) or 8443
    host = ip_address(Knob(args.host, "--host"))
    check_every = at_least_one_second(Knob(args.check_every, "--check-every"), 3600.0, high=86_400 * 30)
    namespace = args.namespace or os.environ.get("POD_NAMESPACE") or "topology-agent-system"
    _check_names(args, namespace)
    defaults = defaults_from(args)
    tls_dir = Path(args.tls_dir) if args.tls_dir else None
    if tls_dir is not None and not tls_dir.is_dir():
        raise InputError(f"--tls-dir {tls_dir}: not a directory; mount the certificate's Secret there")
    config = load_config(kubeconfig(args))
    fields = WebhookFields(host=host, port=port, namespace=namespace, service=args.service, secret=args.secret,
                           config=args.config, tls_dir=tls_dir, check_every=check_every or 3600.0,
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
