"""A full disk or a read-only volume: one clear line, exit 1, the previous files intact, no temp file left."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "volcano-pods.json"


@pytest.fixture
def small_tmpfs(tmp_path):
    mount = tmp_path / "vol"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); CI runs as root with mount rights")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def render(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent.cli", "render", "--pods", str(EXAMPLE), "--self",
                           "demo-worker-0", "--out", str(out), *extra], capture_output=True, text=True, cwd=ROOT)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


def test_a_full_disk_keeps_the_previous_generation(small_tmpfs):
    out = small_tmpfs / "shared"
    assert render(out).returncode == 0
    before = snapshot(out)
    filler = small_tmpfs / "filler"
    with filler.open("wb", buffering=0) as handle:  # fill the volume to the last block
        try:
            while True:
                handle.write(b"x" * 4096)
        except OSError:
            pass
    result = render(out, "--master-port", "4242")  # would change torch.env
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "No space left on device" in lines[0] and "not full" in lines[0]
    assert snapshot(out) == before
    assert not [p for p in out.iterdir() if p.name.startswith(".topology-agent-")]


def test_a_read_only_volume_keeps_the_previous_generation(small_tmpfs):
    out = small_tmpfs / "shared"
    assert render(out).returncode == 0
    before = snapshot(out)
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    result = render(out, "--master-port", "4242")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Read-only file system" in lines[0]
    assert snapshot(out) == before
