"""The locks agree with pyproject.toml and with each other, so the image runs what the tests ran."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.M)


def pins(name: str) -> dict[str, str]:
    return {re.sub(r"[-_.]+", "-", m.group(1).lower()): m.group(2) for m in PIN.finditer((ROOT / name).read_text())}


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.sub(r"[-_.]+", "-", re.split(r"[\s<>=!~;\[(]", r, maxsplit=1)[0].lower())  # PEP 503 names
            for r in requirements}


def test_every_declared_dependency_is_pinned_in_the_locks():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime, test = pins("requirements.lock"), pins("requirements-test.lock")
    assert requirement_names(project["dependencies"]) <= set(runtime)
    assert requirement_names(project["dependencies"] + project["optional-dependencies"]["test"]) <= set(test)
    assert {"torch", "deepspeed"} <= set(pins("requirements-consumers.lock"))


def test_the_scanner_is_locked_at_the_version_its_input_names():
    wanted = [line for line in (ROOT / "requirements-scan.in").read_text().splitlines() if line and line[0] != "#"]
    assert wanted == ["checkov==3.3.30"] and pins("requirements-scan.lock")["checkov"] == "3.3.30"


def test_a_package_in_two_locks_has_one_version():  # the scanner's lock is for its own venv and may differ
    locks = {name: pins(name) for name in ("requirements.lock", "requirements-test.lock",
                                           "requirements-consumers.lock")}
    seen: dict[str, tuple[str, str]] = {}
    clashes = []
    for lock, versions in locks.items():
        for package, version in versions.items():
            first = seen.setdefault(package, (lock, version))
            if first[1] != version:
                clashes.append(f"{package}: {first[1]} in {first[0]}, {version} in {lock}")
    assert not clashes, clashes


def test_the_hashed_locks_carry_a_hash_for_every_pin():
    for name in ("requirements.lock", "requirements-test.lock", "requirements-scan.lock"):
        text = (ROOT / name).read_text()
        entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n\n", 1)[-1])
        unhashed = [e.split()[0] for e in entries if PIN.match(e) and "--hash=sha256:" not in e]
        assert not unhashed, f"{name}: {unhashed}"


def test_every_framework_lock_pins_what_its_input_asks_for_with_a_hash_for_every_pin():
    """consumers/<name>.lock: what the frameworks' end-to-end tests install, each into a venv of its own."""
    inputs = sorted((ROOT / "consumers").glob("*.in"))
    assert {p.stem for p in inputs} == {"jax", "xgboost", "tensorflow", "paddle", "mlx", "ray"}
    for wanted in inputs:
        lock = wanted.with_suffix(".lock")
        locked = pins(str(lock.relative_to(ROOT)))
        asked = dict(re.sub(r"\[.*\]", "", line).lower().split("==")  # mlx[cpu]==0.32.4: mlx at 0.32.4
                     for line in wanted.read_text().split() if not line.startswith("#"))
        assert asked and all(locked.get(name) == version for name, version in asked.items()), (wanted.name, asked)
        entries = re.split(r"\n(?=[A-Za-z0-9])", lock.read_text().split("\n\n", 1)[-1])
        unhashed = [e.split()[0] for e in entries if PIN.match(e) and "--hash=sha256:" not in e]
        assert not unhashed, f"{lock.name}: {unhashed}"
