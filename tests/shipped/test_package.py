"""The installed package is whole: what the agent reads besides its code ships in the wheel, from one source, and
the image's build context holds all of it. (.ci/run also installs the wheel as a user does and runs the demo
outside the clone.)"""

from __future__ import annotations

import ast
import fnmatch
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import resources
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "agent"
WEBHOOK_CONFIG = "manifests/webhook/mutatingwebhookconfiguration.yaml"


def package_data() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]


def test_the_demos_webhook_configuration_is_a_link_to_the_shipped_manifest():
    data = AGENT / "runtime" / "mutatingwebhookconfiguration.yaml"
    assert data.is_symlink() and data.resolve() == (ROOT / WEBHOOK_CONFIG).resolve(), \
        "agent/runtime/mutatingwebhookconfiguration.yaml must stay a link to manifests/webhook's (one source)"
    read = resources.files("agent.runtime").joinpath("mutatingwebhookconfiguration.yaml").read_bytes()
    assert read == (ROOT / WEBHOOK_CONFIG).read_bytes()


def test_every_file_in_the_package_that_is_not_code_is_package_data():
    patterns = package_data()
    for path in sorted(AGENT.rglob("*")):
        if path.is_dir() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
            continue
        package = ".".join(path.parent.relative_to(ROOT).parts)
        assert any(fnmatch.fnmatch(path.name, p) for p in patterns.get(package, [])), \
            f"{path.relative_to(ROOT)} is not in pyproject.toml's [tool.setuptools.package-data] {package!r}: " \
            "an installed agent would not have it"


def test_the_agent_finds_its_files_with_importlib_resources_not_from_its_own_path():
    """``Path(__file__).parents[2] / "manifests"`` works in a clone and fails once installed (site-packages has no
    manifests/); package data read with importlib.resources works in both."""
    for path in sorted(AGENT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        uses = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id == "__file__"]
        assert not uses, f"{path.relative_to(ROOT)}:{uses[0]} finds files from __file__; ship them as package data " \
                         "and read them with importlib.resources"


def _image_build_context(into: Path) -> Path:
    """What the Dockerfile's build stage copies, copied the way COPY does (links inside a directory stay links)."""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if not words or words[0] != "COPY" or any(w.startswith("--from") for w in words):
            continue
        *sources, dest = words[1:]
        for source in sources:
            target = into / dest / Path(source).name if dest.endswith("/") or len(sources) > 1 else into / dest
            target.parent.mkdir(parents=True, exist_ok=True)
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, target, symlinks=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
            else:
                shutil.copy2(ROOT / source, target)
    return into


@pytest.mark.slow
def test_the_wheel_built_from_the_images_context_carries_the_package_data(tmp_path):
    context = _image_build_context(tmp_path / "context")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                             "--no-index", "--wheel-dir", str(tmp_path / "dist"), str(context)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (tmp_path / "dist").glob("topology_agent-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for package, patterns in package_data().items():
            folder = package.replace(".", "/")
            for pattern in patterns:
                assert any(fnmatch.fnmatch(n, f"{folder}/{pattern}") for n in names), \
                    f"the wheel has no {folder}/{pattern}"
        assert archive.read("agent/runtime/mutatingwebhookconfiguration.yaml") == (ROOT / WEBHOOK_CONFIG).read_bytes()


def test_the_image_starts_every_agent_process_non_dumpable_from_its_exec():
    """The image's interpreter may be run, not read, by the agent's user (Dockerfile), and Linux starts a program
    its user cannot read non-dumpable: its /proc/<pid>/environ is root's from the exec on, before the agent's
    own prctl (agent/runtime/sealing.py). The kernel's side is checked with a copy of sleep, read-only and not."""
    import os
    import re
    import tempfile

    dockerfile = (ROOT / "Dockerfile").read_text()
    final = dockerfile.rsplit("\nFROM ", 1)[1]
    # The interpreter's path below is the official image's (and scripts/image's base, laid out as it is).
    assert re.search(r"^ARG BASE=python:3\.11-slim$", dockerfile, re.M)
    assert final.startswith("${BASE}\n")
    assert re.search(r"^\s*(RUN|&&) .*\bchmod 0711 /usr/local/bin/python3\.11\b", final, re.M)
    assert re.search(r"^USER 65532:65532$", final, re.M)

    user = 65532 if os.geteuid() == 0 else os.geteuid()
    as_user = {"user": user, "group": user, "extra_groups": []} if os.geteuid() == 0 else {}
    sleep = shutil.which("sleep")
    assert sleep is not None
    owners = {}
    with tempfile.TemporaryDirectory() as where:
        os.chmod(where, 0o711)  # the user reaches the programs in it
        for mode in (0o755, 0o111):
            program = Path(where) / f"sleep-{mode:o}"
            shutil.copy(sleep, program)
            program.chmod(mode)
            proc = subprocess.Popen([str(program), "30"], **as_user)  # returns once the exec has happened
            try:
                owners[mode] = os.stat(f"/proc/{proc.pid}/environ").st_uid
            finally:
                proc.kill()
                proc.wait()
    assert owners == {0o755: user, 0o111: 0}
