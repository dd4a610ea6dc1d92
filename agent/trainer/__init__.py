"""For training scripts: learn about a new world when the sidecar signals one.

The signal handler only sets a flag (nothing else is safe inside a handler); the script asks between steps::

    from agent.trainer import TopologyWatcher

    world = TopologyWatcher("/shared")          # installs a SIGUSR1 handler
    for step in range(steps):
        if world.changed():
            new = world.reload()                 # re-reads topology.json and torch.env
            print("world is now", new.world_size, "ranks; I am node", new.node_rank)
            # checkpoint, tear down the process group, re-initialise with new.env ...
        train_step()

``reload(apply_env=True)`` also copies the new variables into ``os.environ`` so that a fresh
``init_process_group(init_method="env://")`` sees them. Importing this module imports nothing heavy.

A command that cannot take a new world in its process (JAX, TensorFlow, Paddle, MLX, LightGBM, mpirun) runs
under the launcher instead, which starts it again with the new files: ``python -m agent.trainer run -- CMD``
(``agent.trainer.launcher``). XGBoost forms its group again between rounds in the same process:
``agent.trainer.xgboost.Group``. docs/frameworks.md, "What a membership change does".

Process groups by where the pods landed (topology.json carries every member's domains), e.g. tensor parallel
inside an NVLink clique and data parallel (HSDP replicas) across::

    from torch.distributed.device_mesh import DeviceMesh
    mesh = DeviceMesh("cuda", read_world("/shared").mesh("gpu_clique"), mesh_dim_names=("replicate", "shard"))

``mesh(level)`` is a rectangle of global ranks, one row per domain at ``level``; the rows are the groups that
share a domain, the columns the groups across domains. Every process computes the same rectangle from the same
file, as DeviceMesh requires.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import string
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any


@dataclass(frozen=True)
class World:
    """One generation of the files, as the script needs it."""

    generation: int
    env: dict[str, str]
    document: dict[str, Any]

    @property
    def world_size(self) -> int:
        """torch.env's WORLD_SIZE: the training pods, one process each (a script started without a launcher)."""
        return int(self.env.get("WORLD_SIZE", "0"))

    @property
    def rank(self) -> int:
        """torch.env's RANK: this pod's rank among them (= NODE_RANK)."""
        return int(self.env.get("RANK", "-1"))

    @property
    def processes(self) -> int:
        """Every training pod's processes added up (topology.json's ``processes``): the world a launcher forms
        from NNODES x NPROC_PER_NODE, which ``groups`` and ``mesh`` number."""
        return int(self.document.get("processes", 0))

    @property
    def node_rank(self) -> int:
        return int(self.env.get("NODE_RANK", "-1"))

    @property
    def nnodes(self) -> int:
        return int(self.env.get("NNODES", "0"))

    def groups(self, level: str) -> list[list[int]]:
        """Global ranks of the training processes grouped by their domain at ``level`` (a level name from
        topology.json's ``topology.levels``, or ``node``); groups in the order of their first rank. The ranks are
        a launcher's (a pod's first rank is the processes of the pods before it): with one process per pod they
        are the pods' RANKs."""
        return domain_groups(self.document, level)

    def mesh(self, level: str) -> list[list[int]]:
        """``groups(level)`` as the 2-D rank list DeviceMesh takes (``mesh=``); every group must be as large."""
        groups = self.groups(level)
        if len({len(g) for g in groups}) > 1:
            sizes = ", ".join(str(len(g)) for g in groups)
            raise ValueError(f"domains at level '{level}' hold different numbers of ranks ({sizes}); a DeviceMesh "
                             "needs equal groups: use groups() for uneven process groups")
        return groups


def domain_groups(document: dict[str, Any], level: str) -> list[list[int]]:
    """See ``World.groups``. A domain is named by its path from the outermost level down to ``level``, so two
    racks with the same name in different zones stay two groups."""
    names = [lv["name"] for lv in document.get("topology", {}).get("levels", [])]
    if level != "node" and level not in names:
        known = ", ".join([*names, "node"])
        raise ValueError(f"level '{level}' is not in topology.json (levels: {known}); the agent writes them "
                         "with --topology-levels or --rank-order topology")
    by_domain: dict[tuple[str, ...], list[int]] = {}
    for member in document.get("members", []):
        if not member.get("training"):
            continue
        domains = member.get("domains")
        if level == "node":
            key: tuple[str, ...] = (member.get("node", ""),)
        elif domains is None:
            raise ValueError(f"pod '{member.get('name')}' has no known domains (its node's labels could not be "
                             "read); see the agent's log")
        else:
            key = tuple(domains[name] for name in names[:names.index(level) + 1])
        first = member["rank"]
        by_domain.setdefault(key, []).extend(range(first, first + member["slots"]))
    return sorted((sorted(g) for g in by_domain.values()), key=lambda g: g[0])


def _read_word(text: str, i: int, expand: Callable[[str], str]) -> tuple[str, int]:
    """One sh word of the forms torch.env uses: '...' (literal, across line breaks) and "${NAME}" pieces."""
    out = []
    while i < len(text) and text[i] not in " \t\n":
        quote = text[i]
        if quote in "'\"":
            end = text.find(quote, i + 1)
            if end < 0:
                raise ValueError("torch.env: a quote is not closed")
            piece = text[i + 1:end]
            out.append(piece if quote == "'" else expand(piece))
            i = end + 1
        else:
            out.append(quote)
            i += 1
    return "".join(out), i


def apply_env_file(text: str, env: dict[str, str]) -> dict[str, str]:
    """Apply the ``export KEY='value'`` and ``unset KEY`` statements of an agent's env file (torch.env, jax.env,
    ...) to ``env`` in place, as sh would: a value may hold any character, line breaks and U+2028 included
    (``str.splitlines`` would cut it there; sh does not), a ``"${NAME}"`` piece takes NAME from ``env`` as it
    stands, and ``unset`` removes a name ``env`` had before. Nothing goes through a shell."""

    def expand(piece: str) -> str:
        return string.Template(piece).safe_substitute(env)

    i, n = 0, len(text)
    while i < n:
        if text[i] in " \t\n":
            i += 1
        elif text.startswith("export ", i) and "=" in text[i:text.find("\n", i) if "\n" in text[i:] else n]:
            eq = text.index("=", i)
            key = text[i + len("export "):eq]
            env[key], i = _read_word(text, eq + 1, expand)
        else:  # a comment, or unset KEY...: one physical line
            end = text.find("\n", i)
            end = n if end < 0 else end
            words = text[i:end].split()
            if words[:1] == ["unset"]:
                for key in words[1:]:
                    env.pop(key, None)
            i = end + 1
    return env


def parse_env_file(text: str) -> dict[str, str]:
    """The variables an env file exports, references expanded from this process's environment."""
    exported = _Overlay()
    apply_env_file(text, exported)
    return dict(exported)


class _Overlay(dict[str, str]):
    """The file's own values, with this process's environment behind them for ``"${NAME}"`` pieces only."""

    def __missing__(self, key: str) -> str:
        return os.environ[key]


def read_world(directory: Path | str) -> World:
    directory = Path(directory)
    document = json.loads((directory / "topology.json").read_text())
    env = parse_env_file((directory / "torch.env").read_text())
    return World(generation=int(document.get("generation", 0)), env=env, document=document)


class TopologyWatcher:
    """Tracks the generation of the files in ``directory``; ``changed()`` is true after a signal or a newer file."""

    def __init__(self, directory: Path | str = "/shared", *, signum: int = signal.SIGUSR1,
                 callback: Callable[[World], None] | None = None, install: bool = True,
                 pid_file: Path | str | None = None) -> None:
        self.directory = Path(directory)
        self.signum = signum
        self.callback = callback
        self.signalled = threading.Event()
        self.current = read_world(self.directory)
        if install:
            signal.signal(signum, self._handler)
            # A system call the signal lands in goes on (SA_RESTART): the handler only notes it, and a C library
            # blocked in a read (XGBoost's collective bootstrap, a socket of the trainer's own) fails on EINTR
            # instead of retrying. Python's own waits and sleeps still wake (they are never restarted).
            signal.siginterrupt(signum, False)
        if pid_file is not None:  # for the sidecar's --trainer-pid-file: exact, unlike a command-line match
            Path(pid_file).write_text(f"{os.getpid()}\n")

    def _handler(self, _signum: int, _frame: FrameType | None) -> None:
        self.signalled.set()

    def _on_disk_generation(self) -> int:
        try:
            return int((self.directory / "generation").read_text().strip())
        except (OSError, ValueError):
            return self.current.generation

    def changed(self) -> bool:
        """A signal arrived, or the files moved on (a signal can be lost if it came before the handler)."""
        return self.signalled.is_set() or self._on_disk_generation() > self.current.generation

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The signal held back from this thread, and from the threads started meanwhile (they inherit the mask),
        while a C library's blocking calls run: a socket read with a timeout, or a poll, fails on EINTR whatever
        SA_RESTART says (signal(7)), and XGBoost's collective bootstrap failed so when the sidecar signalled during
        it. A signal sent meanwhile is delivered when the block ends, and noted then."""
        before = signal.pthread_sigmask(signal.SIG_BLOCK, {self.signum})
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)

    def close(self) -> None:
        """Ignore further signals: a script that ends right after a change may see the files before the signal
        lands, and a signal that arrives during interpreter shutdown would otherwise kill it (default action)."""
        signal.signal(self.signum, signal.SIG_IGN)

    def reload(self, *, apply_env: bool = False) -> World:
        self.signalled.clear()
        world = read_world(self.directory)
        self.current = world
        if apply_env:
            os.environ.update(world.env)
        if self.callback is not None:
            self.callback(world)
        return world
