"""Any other controller: the pods a label selector (``--selector``) matches, each placed by the label named by
``--index-label``."""

from __future__ import annotations

from agent.core.controllers.base import Controller, meta, number
from agent.core.model import Identity, Options, RawPod
from agent.errors import InputError


def parse_selector(selector: str, *, label: str = "--selector") -> dict[str, str]:
    """``a=b,c=d`` (equality only: the agent needs a set it can also match offline)."""
    pairs: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in selector.split(","))):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip().lstrip("=")
        if not sep or not key or key.endswith("!"):
            raise InputError(f"{label} '{selector}': '{part}' is not key=value; use e.g. app=x,job=y")
        pairs[key] = value
    if not pairs:
        raise InputError(f"{label} is empty; use e.g. app=x,job=y")
    return pairs


def selector_matches(pod: RawPod, pairs: dict[str, str]) -> bool:
    labels = meta(pod).labels
    return all(labels.get(k) == v for k, v in pairs.items())


class Generic(Controller):
    key, title, marker = "selector", "label selector", ""

    def claims(self, pod: RawPod) -> bool:
        return False  # chosen by --selector only

    def job_of(self, pod: RawPod) -> str | None:
        return None

    def identify(self, pod: RawPod, options: Options) -> Identity:
        if not options.choice.index_label:
            raise InputError("--selector needs --index-label KEY (the label holding each pod's index)")
        index = number(pod, options.choice.index_label, fix="every pod the selector matches needs it")
        return Identity(job=options.choice.selector or "", role="worker", index=(index,), ordinal=index)

    def selector(self, pod: RawPod, options: Options) -> str:
        return options.choice.selector or ""


GENERIC = Generic()
