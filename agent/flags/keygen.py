"""`topology-agent keygen`: its flags, and the job's SSH Secret they name."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, NamedTuple

from agent.core.pods.validation import is_dns1123_label, is_dns1123_subdomain, is_label_value
from agent.errors import InputError
from agent.flags.common import kubeconfig

if TYPE_CHECKING:
    from agent.k8s.config import ApiConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job", required=True, help="job name; the Secret is <job>-ssh")
    parser.add_argument("--namespace", default="default", help="namespace of the Secret (default: default)")
    parser.add_argument("--apply", action="store_true", help="create the Secret through the API instead of printing")
    parser.add_argument("--kubeconfig", help="kubeconfig file for --apply")


class KeygenSettings(NamedTuple):
    job: str
    namespace: str
    config: ApiConfig | None  # --apply: create the Secret through this API instead of printing it


def settings_from(args: argparse.Namespace) -> KeygenSettings:
    # The Secret is named <job>-ssh (an object name) and labelled with the job (a label value), in a namespace.
    for option, value, ok in (("--job", args.job, is_dns1123_subdomain(f"{args.job}-ssh") and is_label_value(args.job)),
                              ("--namespace", args.namespace, is_dns1123_label(args.namespace))):
        if not ok:
            raise InputError(f"{option} '{value}' is not a valid Kubernetes name: lower-case letters, digits and "
                             "'-' (and '.' in a job name), starting and ending with a letter or digit, at most 63 "
                             "characters")
    if not args.apply:
        return KeygenSettings(job=args.job, namespace=args.namespace, config=None)
    from agent.k8s.config import load_config

    return KeygenSettings(job=args.job, namespace=args.namespace, config=load_config(kubeconfig(args)))
