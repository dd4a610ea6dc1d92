"""Benchmark: what ``topology-agent init`` costs before it does anything, and what a follower's whole init costs.

Most of a follower's init (every pod of a large job but the leader and the two standbys) is the interpreter
starting and importing the agent, so this measures, in fresh processes:

1. ``python -c pass``: the interpreter alone;
2. the imports of the init entry point (agent.cli, the init command's flags, agent.runtime.init, the API client),
   nothing run;
3. a real ``topology-agent init`` of a follower (a worker of a --pods Volcano job in the sandbox over HTTPS, the
   default settings: it reads the leader's publication, which the leader's init wrote once before the runs);
4. one ``python -X importtime`` of (2) per run: the modules' own import times (medians over the runs).

Each checkout's ``agent/`` is copied to a temporary directory and run from there (``PYTHONPATH``, the current
directory elsewhere, no bytecode written into any checkout), with its bytecode compiled first as ``pip install``
and the image do (``--no-bytecode``: from source, as a checkout run with PYTHONDONTWRITEBYTECODE=1 is). With
``--against`` another checkout's agent (another commit: ``git worktree add /tmp/before <commit>``) runs
interleaved with this one, each run one process of each, in the same sandbox setup: compare the two medians of
one series, never a number measured at another time (the machine is shared). Wall and CPU (user + system, the
child's rusage) per process; medians (min-max).

    python bench/import_bench.py --runs 9 --against /tmp/before
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from init_bench import build_job

from agent.sandbox.threaded import SandboxThread

HERE = Path(__file__).resolve().parent.parent
# What the init entry point imports before it reads its settings: the console script's module, the init command's
# flags (agent/flags/parser.py imports the command's module by name), init and its client.
INIT_IMPORTS = "import agent.cli, agent.flags.init, agent.flags.pod, agent.runtime.init, agent.k8s.client"
# The console script (pip's entry-point wrapper does the same), after checking which copy of the agent it runs.
CONSOLE = "import sys, agent; assert agent.__file__.startswith(sys.argv.pop(1)); from agent.cli import console; " \
          "console()"


class Copy:
    """One checkout's agent package, copied (links followed: the package data) and run from its own directory."""

    def __init__(self, label: str, checkout: Path, tmp: Path, *, bytecode: bool) -> None:
        self.label = label
        self.root = tmp / label
        shutil.copytree(checkout / "agent", self.root / "agent",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        if bytecode and not compileall.compile_dir(str(self.root / "agent"), quiet=1):
            raise SystemExit(f"{checkout}: the agent package does not compile")
        self.env = {**os.environ, "PYTHONPATH": str(self.root), "PYTHONDONTWRITEBYTECODE": "1"}
        self.env.pop("PYTHONSTARTUP", None)

    def check(self) -> None:
        root = str(self.root)
        code = f"import agent; {INIT_IMPORTS}; assert agent.__file__.startswith({root!r}), agent.__file__"
        subprocess.run([sys.executable, "-c", code], env=self.env, cwd=self.root.parent, check=True)


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, str]:
    """Wall and CPU seconds of one child process, and its stderr."""
    with tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        err.seek(0)
        text = err.read().decode()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd[:3])}... failed: {text[-800:]}")
    return wall, usage.ru_utime + usage.ru_stime, text


def own_times(importtime: str) -> dict[str, int]:
    """Each module's own import time in microseconds, from ``-X importtime``'s lines."""
    found = {}
    for line in importtime.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", line)
        if m:
            found[m[2]] = int(m[1])
    return found


class Job:
    """A sandbox job of ``pods`` pods whose leader published once, for one copy's followers to read."""

    def __init__(self, copy: Copy, pods: int, tmp: Path) -> None:
        self.copy, self.tmp = copy, tmp
        self.sandbox = SandboxThread(tmp / f"sandbox-{copy.label}")
        self.sandbox.__enter__()
        build_job(self.sandbox, pods, 0)
        self.follower = f"demo-worker-{pods // 2}"
        self.run("demo-master-0", "leader")

    def run(self, pod: str, out: str) -> tuple[float, float]:
        env = {**self.copy.env, **self.sandbox.client_env(), "POD_NAME": pod, "POD_NAMESPACE": "default"}
        env.pop("KUBECONFIG", None)
        target = self.tmp / f"out-{self.copy.label}-{out}"
        shutil.rmtree(target, ignore_errors=True)
        wall, cpu, _ = timed([sys.executable, "-c", CONSOLE, str(self.copy.root), "init", "--out", str(target),
                              "--address", "ip"], env, self.copy.root.parent)
        if not (target / "torch.env").is_file():
            raise SystemExit(f"{self.copy.label}: init of {pod} wrote no torch.env")
        return wall, cpu

    def close(self) -> None:
        self.sandbox.stop()


def med(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def one_round(copies: list[Copy], jobs: dict[str, Job], runs: dict[str, dict[str, list[float]]],
              modules: dict[str, dict[str, list[int]]]) -> None:
    """One process of each kind for each copy, the copies alternating (one series, interleaved)."""
    wall, cpu, _ = timed([sys.executable, "-c", "pass"], copies[0].env, copies[0].root.parent)
    runs["python -c pass"]["wall"].append(wall)
    runs["python -c pass"]["cpu"].append(cpu)
    for copy in copies:
        wall, cpu, _ = timed([sys.executable, "-c", INIT_IMPORTS], copy.env, copy.root.parent)
        runs[f"imports, {copy.label}"]["wall"].append(wall)
        runs[f"imports, {copy.label}"]["cpu"].append(cpu)
    for copy in copies:
        if copy.label in jobs:
            job = jobs[copy.label]
            wall, cpu = job.run(job.follower, "follower")
            runs[f"follower init, {copy.label}"]["wall"].append(wall)
            runs[f"follower init, {copy.label}"]["cpu"].append(cpu)
    for copy in copies:
        _, _, text = timed([sys.executable, "-X", "importtime", "-c", INIT_IMPORTS], copy.env, copy.root.parent)
        for name, us in own_times(text).items():
            modules[copy.label][name].append(us)


def report(args: argparse.Namespace, copies: list[Copy], runs: dict[str, dict[str, list[float]]],
           modules: dict[str, dict[str, list[int]]], load: list[float]) -> None:
    n = args.runs
    print(f"{n} runs each, interleaved; bytecode {'compiled' if args.bytecode else 'none (from source)'}; "
          f"follower: a worker of a {args.pods}-pod job, default settings; load average "
          f"{min(load):.1f}-{max(load):.1f}. Seconds, median (min-max):\n")
    print("| process | wall | CPU |")
    print("|---|---|---|")
    for what, times in runs.items():
        print(f"| {what} | {med(times['wall'])} | {med(times['cpu'])} |")
    owns = {c.label: {name: statistics.median(us) for name, us in modules[c.label].items() if len(us) == n}
            for c in copies}
    for copy in copies:
        own = owns[copy.label]
        agent = sum(us for name, us in own.items() if name == "agent" or name.startswith("agent."))
        print(f"\n{copy.label}: {len(own)} modules imported, {sum(own.values()) / 1e3:.1f} ms of import time "
              f"by -X importtime (the agent's own modules {agent / 1e3:.1f} ms); "
              "the largest own times, ms:\n")
        top = sorted(own.items(), key=lambda kv: -kv[1])[:args.top]
        print(", ".join(f"{name} {us / 1e3:.1f}" for name, us in top))
        for other in copies:
            only = {name: us for name, us in own.items() if name not in owns[other.label]}
            if other is not copy and only:
                print(f"\nonly in {copy.label}: {len(only)} modules, {sum(only.values()) / 1e3:.1f} ms: "
                      + ", ".join(f"{name} {us / 1e3:.1f}" for name, us in sorted(only.items(), key=lambda kv: -kv[1])))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--pods", type=int, default=512, help="the job's size (from 256 pods a follower reads the "
                        "leader's publication); 0: no init processes, the imports alone")
    parser.add_argument("--against", type=Path, help="another checkout, run interleaved with this one")
    parser.add_argument("--no-bytecode", dest="bytecode", action="store_false",
                        help="run from source, no bytecode compiled (as a checkout with PYTHONDONTWRITEBYTECODE=1)")
    parser.add_argument("--top", type=int, default=15, help="how many modules to name by own import time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        copies = [Copy("this", HERE, tmp, bytecode=args.bytecode)]
        if args.against:
            copies.insert(0, Copy("against", args.against.resolve(), tmp, bytecode=args.bytecode))
        for copy in copies:
            copy.check()
        jobs = {c.label: Job(c, args.pods, tmp) for c in copies} if args.pods else {}
        runs: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        modules: dict[str, dict[str, list[int]]] = {c.label: defaultdict(list) for c in copies}
        load = []
        try:
            for k in range(args.runs):
                load.append(os.getloadavg()[0])
                one_round(copies if k % 2 == 0 else copies[::-1], jobs, runs, modules)
        finally:
            for job in jobs.values():
                job.close()
    report(args, copies, runs, modules, load)


if __name__ == "__main__":
    main()
