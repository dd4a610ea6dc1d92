"""The agent in this process over the sandbox's API in memory: the fast lane's way to run init and the sidecar.

``FakeApi`` puts the in-memory sandbox (agent/sandbox/memory.py: the same store, objects, watches and faults as the
HTTPS sandbox) behind the agent's own mock transports (agent/k8s/mock.py), so init's blocking client and the
sidecar's async client, the reflector and the runtime all run for real; only the socket is gone. What a socket
would have raised is mapped by the agent's own transport helpers (k8s/transport.py), in the agent's words.

``init_pod`` runs init as its command line would (the same flags, the same settings), ``Sidecars`` runs sidecars on
the test's loop, and ``Logs`` keeps each one's log lines apart (a context variable names who logs). Waiting is for
events: a log line, a store change (``Memory.until``), a request made, a sidecar's evaluation (its
``evaluations`` condition); never a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import __version__
from agent.errors import AgentError
from agent.k8s.async_client import AsyncClient
from agent.k8s.client import Client
from agent.k8s.config import ApiConfig
from agent.k8s.core import Request, Response
from agent.k8s.mock import AsyncMockTransport, MockTransport
from agent.k8s.transport import silent, too_slow, unreachable
from agent.sandbox.calls import Answer
from agent.sandbox.memory import Memory

SERVER = "memory://sandbox"
CONFIG = ApiConfig(server=SERVER, token="sandbox-token")
WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="")


def agent_name(command: str, pod: str, namespace: str = "default") -> str:
    """The User-Agent the command gives its client (cli.py): the sandbox's stats count by it."""
    return f"topology-agent/{__version__} {command} ({namespace}/{pod})"


class Notice:
    """Something that changes, and whoever waits for a condition on it, in any thread or loop: a blocking
    ``wait_until`` or an async ``until``, each woken at every change (no polling)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    def changed(self) -> None:
        with self._lock:
            self._lock.notify_all()
            waiters = list(self._waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # that loop has closed
                loop.call_soon_threadsafe(event.set)

    def wait_until(self, test: Callable[[], Any], *, timeout: float = 30.0, what: str = "condition") -> Any:
        with self._lock:
            found = self._lock.wait_for(test, timeout)
        if not found:
            raise AssertionError(f"timed out waiting for {what}")
        return found

    async def until(self, test: Callable[[], Any], *, timeout: float = 30.0, what: str = "condition") -> Any:
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters.add(waiter)
        try:
            async with asyncio.timeout(timeout):
                while True:
                    waiter[1].clear()
                    found = test()
                    if found:
                        return found
                    await waiter[1].wait()
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {what}") from None
        finally:
            with self._lock:
                self._waiters.discard(waiter)


class Logs(logging.Handler):
    """The agent's log lines, kept apart by who logged them (``WHO``, set where each agent starts: tasks and
    threads started there inherit it)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: dict[str, list[str]] = defaultdict(list)
        self.notice = Notice()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines[WHO.get()].append(f"{record.levelname} {record.getMessage()}")
        self.notice.changed()

    def text(self, who: str) -> str:
        return "\n".join(self.lines.get(who, []))

    def wait_for(self, who: str, text: str, *, timeout: float = 30.0) -> None:
        self.notice.wait_until(lambda: text in self.text(who), timeout=timeout, what=f"{who}: {text!r}")

    async def until(self, who: str, text: str, *, timeout: float = 30.0) -> None:
        await self.notice.until(lambda: text in self.text(who), timeout=timeout, what=f"{who}: {text!r}")


@contextlib.contextmanager
def capturing() -> Iterator[Logs]:
    """Every ``topology_agent`` log line at INFO and up, for the test's length."""
    logs = Logs()
    logger = logging.getLogger("topology_agent")
    level = logger.level
    logger.addHandler(logs)
    logger.setLevel(logging.INFO)
    try:
        yield logs
    finally:
        logger.removeHandler(logs)
        logger.setLevel(level)


def _response(answer: Answer) -> Response:
    return Response(answer.status, answer.encoded, answer.headers.get("Retry-After"))


@dataclass
class FakeApi:
    """The in-memory sandbox behind the mock transports; ``cut`` names the agents whose connections are gone."""

    memory: Memory
    cut: set[str] = field(default_factory=set)
    requests: list[tuple[str, Request]] = field(default_factory=list)
    notice: Notice = field(default_factory=Notice)

    def _asked(self, agent: str, request: Request) -> None:
        if agent in self.cut:
            raise unreachable(ConnectionRefusedError("this pod's connections are gone"), SERVER, request)
        self.requests.append((agent, request))
        self.notice.changed()

    def client(self, agent: str, **kwargs: Any) -> Client:
        """init's client (http.client's place taken by the mock transport)."""
        return Client(CONFIG, user_agent=agent, transport=MockTransport(lambda request: self._sync(agent, request)),
                      **kwargs)

    def async_client(self, agent: str, **kwargs: Any) -> AsyncClient:
        """The sidecar's client (aiohttp's place taken by the async mock transport)."""
        return AsyncClient(CONFIG, user_agent=agent,
                           transport=AsyncMockTransport(lambda request: self._async(agent, request)), **kwargs)

    def __post_init__(self) -> None:
        self.memory.on_open = self.notice.changed

    def watching(self, agent: str, path: str) -> bool:
        """Whether the sandbox has opened a watch of ``path`` (a collection) for ``agent``."""
        return self.memory.watching(agent, path)

    # --- blocking ----------------------------------------------------------------------------------------

    def _sync(self, agent: str, request: Request) -> Callable[[float], Any]:
        def within(seconds: float) -> Any:
            self._asked(agent, request)
            watch = request.verb == "watch"
            try:
                if not watch:
                    return _response(self.memory.send(request, agent=agent, timeout=seconds))
                answered = self.memory.stream(request, agent=agent, wait=seconds)
            except TimeoutError as err:
                raise (silent(request, seconds) if watch else too_slow(request, seconds)) from err
            except ConnectionError as err:
                raise unreachable(err, SERVER, request) from err
            return _response(answered) if isinstance(answered, Answer) else self._lines(request, answered, seconds)

        return within

    def _lines(self, request: Request, lines: Iterator[bytes], wait: float) -> Iterator[bytes]:
        try:
            yield from lines
        except TimeoutError as err:
            raise silent(request, wait) from err
        except ConnectionError as err:
            raise unreachable(err, SERVER, request) from err
        finally:
            lines.close()  # type: ignore[attr-defined]

    # --- async -------------------------------------------------------------------------------------------

    def _async(self, agent: str, request: Request) -> Callable[[float], Any]:
        async def within(seconds: float) -> Any:
            self._asked(agent, request)
            watch = request.verb == "watch"
            try:
                if not watch:
                    return _response(await self.memory.send_async(request, agent=agent, timeout=seconds))
                answered = await self.memory.stream_async(request, agent=agent, wait=seconds)
            except TimeoutError as err:
                raise (silent(request, seconds) if watch else too_slow(request, seconds)) from err
            except ConnectionError as err:
                raise unreachable(err, SERVER, request) from err
            if isinstance(answered, Answer):
                return _response(answered)
            return self._lines_async(agent, request, answered, seconds)

        return within

    async def _lines_async(self, agent: str, request: Request, lines: AsyncIterator[bytes],
                           wait: float) -> AsyncIterator[bytes]:
        try:
            async for line in lines:
                if agent in self.cut:
                    raise ConnectionResetError("this pod's connections are gone")
                yield line
        except TimeoutError as err:
            raise silent(request, wait) from err
        except ConnectionError as err:
            raise unreachable(err, SERVER, request) from err
        finally:
            await lines.aclose()  # type: ignore[attr-defined]


# --- init ----------------------------------------------------------------------------------------------------

@dataclass
class Ran:
    """An init as its process would end: the exit code, and what it wrote to stderr (its log lines, then the
    command's error line)."""

    code: int
    err: str
    held: Any = None
    error: AgentError | None = None


def state_of(out: Path) -> Path:
    """The pod's state directory beside its output directory, as inject mounts one in the agent's containers."""
    return out.with_name(f"{out.name}.agent-state")


def with_state(out: Path, args: tuple[str, ...]) -> tuple[str, ...]:
    """``args`` with ``--state-dir`` (made, as the volume would be) unless they give one."""
    if "--state-dir" in args:
        return args
    state_of(out).mkdir(parents=True, exist_ok=True)
    return ("--state-dir", str(state_of(out)), *args)


def init_settings(pod: str, out: Path, *args: str, namespace: str = "default") -> tuple[Any, Any]:
    """init's settings and SSH settings from its command line, as ``flags/pod.pod_start`` makes them (the
    output directory made and proven writable), with the pod's identity given."""
    from agent.flags.common import options_from_args, out_dir, ssh_settings, state_dir
    from agent.flags.init import InitSettings, check
    from agent.flags.parser import parse_command_line
    from agent.flags.pod import PodFields

    parsed = parse_command_line(["init", "--out", str(out), *with_state(out, args)])
    options, own, ssh = options_from_args(parsed), check(parsed), ssh_settings(parsed)
    settings = InitSettings.of(PodFields(namespace=namespace, pod_name=pod, options=options,
                                         out_dir=out_dir(parsed, check=True), state_dir=state_dir(parsed, out)), own)
    return settings, ssh


def init_pod(api: FakeApi, logs: Logs, pod: str, out: Path, *args: str, who: str | None = None,
             namespace: str = "default", **run: Any) -> Ran:
    """``topology-agent init --out OUT ARGS`` for ``pod``, in this thread: its settings from the same flags, the
    real ``run_init`` over the in-memory API. ``run``: run_init's seams (sleep, clock, resolver)."""
    from agent.runtime.init import run_init

    who = who or f"init {pod}"
    token = WHO.set(who)
    start = len(logs.lines.get(who, []))
    client = api.client(agent_name("init", pod, namespace), clock=run.get("clock", time.monotonic))  # as run_init's
    events = api.client(agent_name("events", pod, namespace))  # the pod's Events: a client of their own, as cli's
    try:
        settings, ssh = init_settings(pod, out, *args, namespace=namespace)
        held = run_init(client, settings, ssh=ssh, events=events, **run)
    except AgentError as err:
        said = "\n".join(logs.lines.get(who, [])[start:])
        return Ran(err.exit_code, f"{said}\ntopology-agent init: error: {err}", error=err)
    finally:
        client.close()
        events.close()
        WHO.reset(token)
    return Ran(0, "\n".join(logs.lines.get(who, [])[start:]), held)


class Inits:
    """inits running side by side, each in a thread of its own (as the processes of a job's pods)."""

    def __init__(self, api: FakeApi, logs: Logs) -> None:
        self.api, self.logs = api, logs
        self.threads: dict[str, tuple[threading.Thread, list[Ran]]] = {}

    def start(self, pod: str, out: Path, *args: str, who: str | None = None, **run: Any) -> str:
        who = who or f"init {pod}"
        result: list[Ran] = []
        thread = threading.Thread(target=lambda: result.append(init_pod(self.api, self.logs, pod, out, *args,
                                                                        who=who, **run)), name=who, daemon=True)
        thread.start()
        self.threads[who] = (thread, result)
        return who

    def finish(self, who: str, timeout: float = 90.0) -> Ran:
        thread, result = self.threads.pop(who)
        thread.join(timeout)
        assert not thread.is_alive(), f"{who} did not end in {timeout} s"
        return result[0]

    def running(self, who: str) -> bool:
        return self.threads[who][0].is_alive()

    async def finish_async(self, who: str, timeout: float = 90.0) -> Ran:
        return await asyncio.to_thread(self.finish, who, timeout)


# --- the sidecar ---------------------------------------------------------------------------------------------

@dataclass
class Running:
    """One sidecar on the test's loop."""

    who: str
    pod: str
    out: Path
    agent: str
    task: asyncio.Task[Any]
    stop: asyncio.Event
    sidecar: Any = None  # the runtime's Sidecar, once started
    port: int | None = None  # its health server's, when started with one

    def env(self) -> dict[str, str]:
        import json

        return json.loads((self.out / "topology.json").read_text())["env"]

    async def until(self, test: Callable[[], Any], *, timeout: float = 30.0, what: str = "condition") -> Any:
        """Until ``test()`` holds, looked at after each of the sidecar's evaluations (its ``evaluations``)."""
        evaluations = self.sidecar.evaluations
        try:
            async with asyncio.timeout(timeout), evaluations:
                return await evaluations.wait_for(test)
        except TimeoutError:
            raise AssertionError(f"{self.who}: timed out waiting for {what}") from None


class Sidecars:
    """Sidecars in this process, each the real ``run_sidecar`` over its own async client."""

    def __init__(self, api: FakeApi, logs: Logs) -> None:
        self.api, self.logs = api, logs
        self.running: dict[str, Running] = {}

    async def start(self, pod: str, out: Path, *args: str, who: str | None = None,
                    namespace: str = "default", topology: bool = False) -> Running:
        """``topology-agent sidecar --out OUT ARGS`` for ``pod``: its settings from the same flags. ``topology``:
        its health server on a loopback port (``Running.port``), serving /topology."""
        from agent.flags.common import options_from_args, out_dir, ssh_settings, state_dir
        from agent.flags.parser import parse_command_line
        from agent.flags.pod import PodFields
        from agent.flags.sidecar import SidecarSettings, check
        from agent.runtime.sidecar import run_sidecar
        from agent.runtime.signalling import TrainerFinder

        who = who or pod
        self.logs.lines.pop(who, None)  # a restarted sidecar's log starts empty, as its file did
        parsed = parse_command_line(["sidecar", "--out", str(out), "--health-port", "0", *with_state(out, args)])
        own = check(parsed)
        pod_fields = PodFields(namespace=namespace, pod_name=pod, options=options_from_args(parsed),
                               out_dir=out_dir(parsed, check=True), state_dir=state_dir(parsed, out))
        settings = SidecarSettings.of(pod_fields, own.settings, ssh=ssh_settings(parsed),
                                      finder=TrainerFinder(**own.trainer))
        health = {"health_port": 0, "health_host": "127.0.0.1", "health_topology": True} if topology else {}
        bound: list[int | None] = []
        agent = agent_name("sidecar", pod, namespace)
        started: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()

        async def run() -> Any:
            WHO.set(who)
            async with self.api.async_client(agent) as api, \
                    self.api.async_client(agent_name("events", pod, namespace)) as events:
                try:
                    return await run_sidecar(api, settings, stop=stop, events=events, **health,
                                             on_ready=lambda sidecar, port: bound.append(port)
                                             or started.set_result(sidecar))
                finally:
                    if not started.done():
                        started.cancel()

        running = Running(who, pod, out, agent, asyncio.create_task(run(), name=who), stop)
        self.running[who] = running
        await asyncio.wait([started, running.task], return_when=asyncio.FIRST_COMPLETED)
        if started.done() and not started.cancelled():
            running.sidecar, running.port = started.result(), bound[0]
        else:  # it ended before its tasks ran: its error, or the sidecar stopped before the first list
            self.running.pop(who)
            running.sidecar = await running.task
        return running

    async def stop(self, who: str) -> None:
        """SIGTERM: the sidecar stops cleanly (releasing the Lease if it held it)."""
        running = self.running.pop(who)
        running.stop.set()
        await running.task

    async def kill(self, who: str) -> None:
        """SIGKILL: its connections are gone and it does nothing more (no Lease released)."""
        running = self.running.pop(who)
        self.api.cut.add(running.agent)
        running.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, AgentError):
            await running.task

    async def stop_all(self) -> None:
        for who in list(self.running):
            await self.stop(who)
