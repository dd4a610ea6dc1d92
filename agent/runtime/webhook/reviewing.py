"""Large AdmissionReviews are read in a process of their own, one at a time.

Parsing JSON holds the interpreter: 3 MiB of one real shape (a list of small objects) takes 60-170 ms, of
another (floats) up to 450 ms, and the parsed object is up to 24 times the size of its text. In the server's
process that stalled ``/healthz`` for 3.1 s and every other review behind it, and a few such objects at once
went past the memory limit. Here the server reads bodies up to ``SMALL`` itself (milliseconds at worst) and
hands larger ones to a reviewing process over a pipe: the server's event loop never parses one, at most one
large object is held at a time, and a review that outlives its deadline is ended by killing the process (it is
started again for the next one). The reviewing process trims its heap after each large object, so its memory
returns to its resting size.

The exchange per review, each message a frame of one type byte, a 4-byte length and the payload:
server -> ``R`` body; reviewer -> ``N`` {uid, namespace} (or ``E`` reason: not a review); server -> ``S``
{settings} or {error}; reviewer -> ``A`` answer (or ``X`` reason: a bug).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

from agent.core.adoption import admission
from agent.core.adoption.injection import Settings
from agent.errors import InputError
from agent.flags.parser import check_command_line
from agent.runtime.memory import release_memory

log = logging.getLogger("topology_agent.webhook")

SMALL = 64 * 1024  # bytes: a body up to here is reviewed in the server's process (a pod is 5-20 KB)
TRIM_AFTER = 1 << 20  # bytes: after a body this large the reviewing process gives its heap back
MAX_MESSAGE = 16 << 20  # bytes: no message of the exchange is larger (a body is at most webhook.MAX_BODY)
CHUNK = 256 * 1024  # bytes written to the pipe at a time
_HEADER = struct.Struct(">cI")


class Unavailable(Exception):
    """The reviewing process did not answer in time, or ended: the review gets no answer from it."""


@dataclass(frozen=True)
class Outcome:
    status: int  # 200: ``body`` is the AdmissionReview answer; 400: ``body`` says why the request is not one
    body: bytes
    uid: str = ""


def _frame(kind: bytes, payload: bytes) -> bytes:
    return _HEADER.pack(kind, len(payload)) + payload


def _read_frame(stream: BinaryIO) -> tuple[bytes, bytes] | None:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    kind, size = _HEADER.unpack(head)
    if size > MAX_MESSAGE:
        raise ValueError(f"a message of {size} bytes")
    payload = stream.read(size)
    return (kind, payload) if len(payload) == size else None


def serve(stdin: BinaryIO, stdout: BinaryIO, *, version: str) -> None:
    """The reviewing process's loop: until the server closes the pipe."""
    while (message := _read_frame(stdin)) is not None:
        _, body = message
        try:
            request = admission.read_review(body)
        except InputError as err:
            stdout.write(_frame(b"E", str(err).encode()))
            stdout.flush()
            continue
        stdout.write(_frame(b"N", json.dumps({"uid": request.uid, "namespace": request.namespace}).encode()))
        stdout.flush()
        reply = _read_frame(stdin)
        if reply is None:
            return
        try:
            given = json.loads(reply[1])
            if "error" in given:
                response = admission.deny(request.uid, given["error"])
                answer = {"apiVersion": admission.API_VERSION, "kind": "AdmissionReview", "response": response}
            else:
                answer = admission.answer(request, Settings(given["settings"]), version=version,
                                          check=check_command_line)
            stdout.write(_frame(b"A", json.dumps(answer).encode()))
        except Exception as err:  # a bug: the server logs it and answers 500; the next review goes on
            stdout.write(_frame(b"X", f"{type(err).__name__}: {err}"[:500].encode()))
        stdout.flush()
        del request
        if len(body) > TRIM_AFTER:
            del body
            release_memory()


class Reviewer:
    """The server's side: the reviewing process, started when first needed and again after it ends."""

    def __init__(self, command: Sequence[str]) -> None:
        self.command = list(command)
        self.started = 0  # processes started (a test and the benchmark read it)
        self._process: asyncio.subprocess.Process | None = None
        self._killed: list[asyncio.subprocess.Process] = []  # reaped at close
        self._lock = asyncio.Lock()

    async def _ready(self) -> asyncio.subprocess.Process:
        if self._process is None or self._process.returncode is not None:
            self._process = await asyncio.create_subprocess_exec(
                *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=MAX_MESSAGE)
            self.started += 1
        return self._process

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None and self._process.returncode is None else None

    async def review(self, body: bytes | bytearray, settings: Callable[[str], Awaitable[Settings]]) -> Outcome:
        """Review ``body`` there; ``settings`` gives a namespace's (InputError: the review is denied with it).
        The caller bounds the time: a cancelled review kills the process, which may be mid-way."""
        async with self._lock:
            process = await self._ready()
            try:
                return await self._exchange(process, body, settings)
            except asyncio.CancelledError:
                self._end(process)
                raise
            except (OSError, asyncio.IncompleteReadError, ValueError) as err:
                self._end(process)
                raise Unavailable(f"the reviewing process ended ({err or type(err).__name__})") from None

    async def _exchange(self, process: asyncio.subprocess.Process, body: bytes | bytearray,
                        settings: Callable[[str], Awaitable[Settings]]) -> Outcome:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(_HEADER.pack(b"R", len(body)))
        view = memoryview(body)
        for start in range(0, len(body), CHUNK):  # the pipe's buffer holds one chunk, never a copy of the body
            process.stdin.write(view[start:start + CHUNK])
            await process.stdin.drain()
        kind, payload = await self._receive(process.stdout)
        if kind == b"E":
            return Outcome(400, payload + b"\n")
        asked = json.loads(payload)
        reply: dict[str, Any]
        try:
            reply = {"settings": dict((await settings(asked["namespace"])).values)}
        except InputError as err:
            reply = {"error": str(err)}
        process.stdin.write(_frame(b"S", json.dumps(reply).encode()))
        await process.stdin.drain()
        kind, payload = await self._receive(process.stdout)
        if kind == b"X":
            log.error("internal error reviewing %s: %s", asked["uid"], payload.decode(errors="replace"))
            return Outcome(500, b"internal error in the webhook\n", asked["uid"])
        return Outcome(200, payload, asked["uid"])

    @staticmethod
    async def _receive(stream: asyncio.StreamReader) -> tuple[bytes, bytes]:
        kind, size = _HEADER.unpack(await stream.readexactly(_HEADER.size))
        if size > MAX_MESSAGE:
            raise ValueError(f"a message of {size} bytes")
        return kind, await stream.readexactly(size)

    def _end(self, process: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        self._killed = [p for p in self._killed if p.returncode is None] + [process]
        self._process = None

    async def close(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.returncode is None:
            if process.stdin is not None:
                process.stdin.close()
            try:
                await asyncio.wait_for(process.wait(), 5)
            except TimeoutError:
                self._end(process)
        for killed in self._killed:
            await killed.wait()
        self._killed.clear()


if __name__ == "__main__":  # the reviewing process, as webhook.REVIEWER starts it: only the decision's modules
    import sys

    from agent import __version__
    from agent.runtime.sealing import seal_process

    unsealed = seal_process()  # its /proc/<pid>/root is the webhook container's, key and token included
    if unsealed is not None:
        print(f"topology-agent webhook reviewer: warning: {unsealed}", file=sys.stderr)
    serve(sys.stdin.buffer, sys.stdout.buffer, version=__version__)
