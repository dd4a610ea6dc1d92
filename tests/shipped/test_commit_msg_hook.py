"""The commit-msg hook (scripts/hooks/commit-msg, installed with ``git config core.hooksPath scripts/hooks``) keeps
commit subjects at 72 characters at most, with a blank line before the body."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "scripts" / "hooks" / "commit-msg"
SUBJECT_72 = "flags: ".ljust(72, "x")
UNICODE_72 = "docs: µs and → in a subject ".ljust(72, "z")  # more than 72 bytes in UTF-8

GOOD = {
    "a subject alone": "sidecar: say what changed\n",
    "a subject of 72 characters and a body": f"{SUBJECT_72}\n\nThe story, and the figures: 12.4 -> 12.2 ms.\n",
    "comment lines and what follows the scissors are not counted": (
        "views: renew_all\n\nWhy.\n# Please enter the commit message for your changes.\n"
        "# ------------------------ >8 ------------------------\n" + "y" * 100 + "\n"),
    "leading blank lines, as git strips them": "\n\nviews: renew_all\n",
    "characters, not bytes": f"{UNICODE_72}\n",
}
BAD = {
    "a subject of 73 characters": (SUBJECT_72 + "y\n\nBody.\n", "the subject is 73 characters, over 72"),
    "a body right under the subject": ("views: renew_all\nThe story.\n", "the second line is not blank"),
}


def run_hook(tmp_path: Path, message: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message, encoding="utf-8")
    return subprocess.run([str(HOOK), str(path)], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("message", GOOD.values(), ids=GOOD.keys())
def test_the_hook_accepts_a_good_message(tmp_path, message):
    done = run_hook(tmp_path, message)
    assert done.returncode == 0 and not done.stderr, done.stderr


@pytest.mark.parametrize(("message", "said"), BAD.values(), ids=BAD.keys())
def test_the_hook_refuses_a_bad_message_in_one_line(tmp_path, message, said):
    done = run_hook(tmp_path, message)
    assert done.returncode == 1
    assert said in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_git_runs_the_hook_from_core_hooks_path(tmp_path):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True, env=env,
                              timeout=30)

    assert git("init", "-q").returncode == 0
    assert git("config", "core.hooksPath", str(HOOK.parent)).returncode == 0
    refused = git("commit", "-q", "--allow-empty", "-m", "x" * 73)
    assert refused.returncode != 0 and "over 72" in refused.stderr, refused.stderr
    assert git("commit", "-q", "--allow-empty", "-m", "tests: a subject of a good length").returncode == 0
    assert git("log", "--format=%s").stdout == "tests: a subject of a good length\n"
