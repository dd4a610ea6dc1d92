"""A short run of bench/fuzz.py in the suite (the 10,000 + 10,000 run is in docs/reliability.md). Seed 1's first
1,000 pod lists include the two findings of the first full run: a configMapKeyRef that is not an object
(AttributeError) and a quantity with a line break echoed into a two-line message."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("fuzz", Path(__file__).resolve().parents[2] / "bench" / "fuzz.py")
fuzz = importlib.util.module_from_spec(SPEC)  # type: ignore[arg-type]
SPEC.loader.exec_module(fuzz)  # type: ignore[union-attr]


@pytest.fixture(autouse=True)
def alarm():
    import signal

    previous = signal.signal(signal.SIGALRM, fuzz._alarm)
    yield
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.slow
def test_a_thousand_mutated_pod_lists_find_nothing():
    outcomes, findings, _ = fuzz.fuzz_pod_lists(1000, random.Random(1))
    assert findings == []
    assert outcomes["rendered"] > 100 and outcomes["refused"] > 100  # both sides of the boundary were reached


@pytest.mark.slow
def test_a_thousand_mutated_watch_streams_find_nothing():
    outcomes, findings, _ = fuzz.fuzz_streams(1000, random.Random(2))
    assert findings == []
    assert outcomes["broken line"] > 100 and outcomes["stream rendered"] > 100


@pytest.mark.slow
def test_a_thousand_mutated_published_topologies_find_nothing():
    """The snapshot's document, the journal's entries, the ConfigMaps' fields and their compressed bytes,
    mutated, through a follower's reading, its check of the writer, and the core: none ends in a traceback (a
    ConfigMap whose metadata is not an object among them)."""
    outcomes, findings, _ = fuzz.fuzz_published(1000, random.Random(3))
    assert findings == []
    assert outcomes["published rendered"] > 100 and outcomes["published refused"] > 100
