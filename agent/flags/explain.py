"""`topology-agent explain`: render's flags but ``--out``, and render's settings (it prints instead of writing)."""

from __future__ import annotations

import argparse

from agent.flags import render
from agent.flags.render import settings_from as settings_from


def add_arguments(parser: argparse.ArgumentParser) -> None:
    render.add_arguments(parser, out=False)
