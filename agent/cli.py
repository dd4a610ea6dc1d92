"""The ``topology-agent`` command: dispatch, exit codes and the process's life. Each command's flags, their
``TOPOLOGY_<NAME>`` fallbacks and their checks are its module in agent/flags/. An ``AgentError`` becomes one line
on stderr and its exit code; anything else is a bug, one line too (its traceback with TOPOLOGY_DEBUG=1). The
line is escaped (core/escaping.py): an error quotes what an object or the API server said."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from agent import __version__
from agent.core.escaping import printable
from agent.errors import AgentError
from agent.runtime.logs import setup_logging

if TYPE_CHECKING:
    import asyncio
    from pathlib import Path

    from agent.flags.init import InitOwn
    from agent.flags.inject import InjectSettings
    from agent.flags.keygen import KeygenSettings
    from agent.flags.plan import PlanSettings
    from agent.flags.pod import PodStart
    from agent.flags.render import RenderSettings
    from agent.flags.sandbox import SandboxSettings
    from agent.flags.sidecar import SidecarFlags
    from agent.flags.status import StatusSettings
    from agent.flags.webhook import WebhookStart
    from agent.runtime.init import Held


EVENTS_TIMEOUT = 10.0  # seconds an Event write may take (it is dropped after, never retried in place)


def _render(given: RenderSettings) -> int:
    from agent.core import render_pod
    from agent.runtime.output import write_generation

    rendered = render_pod(given.pods, given.me, given.options, files_dir=str(given.out.absolute()), nodes=given.nodes)
    names = write_generation(given.out, rendered, given.options, given.ssh)
    me = rendered.plan.topology.me
    print(f"wrote {', '.join(names)} to {given.out} for pod '{me.name}' (role {me.role})"
          + (f" with the options of its init container: {' '.join(given.from_pod)}" if given.from_pod else ""))
    return 0


def _explain(given: RenderSettings) -> int:
    from agent.core import render_pod
    from agent.core.files.explaining import explain_with_options

    print(explain_with_options(render_pod(given.pods, given.me, given.options, nodes=given.nodes), given.from_pod))
    return 0


def _status(given: StatusSettings) -> int:
    from agent.runtime.commands.status import run_status

    run_status(given, user_agent=f"topology-agent/{__version__} status")
    return 0


def _init(start: PodStart[InitOwn]) -> Held:
    from agent.flags.init import InitSettings
    from agent.k8s.client import Client
    from agent.runtime.init import run_init

    setup_logging(start.log_format)
    settings = InitSettings.of(start.pod, start.own)
    where = f"{settings.namespace}/{settings.pod_name}"
    api = Client(start.config, user_agent=f"topology-agent/{__version__} init ({where})")
    # The pod's Events go on a client of their own (runtime/events.py): a slow one never holds init's calls up.
    events = Client(start.config, user_agent=f"topology-agent/{__version__} events ({where})", timeout=EVENTS_TIMEOUT)
    try:
        return run_init(api, settings, ssh=start.ssh, events=events)
    finally:
        api.close()  # its connections; the rest of what it held is kept (console)
        events.close()


def _sidecar(start: PodStart[SidecarFlags]) -> int:
    from agent.flags.sidecar import SidecarSettings
    from agent.k8s.async_client import AsyncClient
    from agent.runtime.sidecar import run_sidecar
    from agent.runtime.signalling import TrainerFinder

    setup_logging(start.log_format)
    own = start.own
    settings = SidecarSettings.of(start.pod, own.settings, ssh=start.ssh, finder=TrainerFinder(**own.trainer))
    where = f"{settings.namespace}/{settings.pod_name}"

    async def serve(stop: asyncio.Event) -> None:
        async with AsyncClient(start.config, user_agent=f"topology-agent/{__version__} sidecar ({where})") as api, \
                AsyncClient(start.config, user_agent=f"topology-agent/{__version__} events ({where})",
                            timeout=EVENTS_TIMEOUT, connections=1) as events:
            await run_sidecar(api, settings, stop=stop, events=events, **own.health)

    _until_stopped(serve)
    return 0


def _webhook(start: WebhookStart) -> int:
    from agent.k8s.async_client import AsyncClient
    from agent.runtime.webhook.certs import service_hosts
    from agent.runtime.webhook.webhook import WebhookSettings, run_webhook

    setup_logging(start.log_format)
    own = start.settings
    settings = WebhookSettings.of(own, hosts=(*service_hosts(own.service, own.namespace), *start.cert_hosts))

    async def serve(stop: asyncio.Event) -> None:
        # Namespace GETs: as many connections as reviews can be open, each answered or given up in 5 s, so a hung
        # read never holds a slot a healthy namespace's review needs.
        async with AsyncClient(start.config, user_agent=f"topology-agent/{__version__} webhook", timeout=5.0,
                               connections=settings.limits.connections) as api:
            await run_webhook(api, settings, version=__version__, stop=stop)

    _until_stopped(serve)
    return 0


def _until_stopped(serve: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run a server until it returns; SIGTERM and SIGINT set its ``stop``."""
    import asyncio
    import signal

    async def main() -> None:
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
        await serve(stop)

    asyncio.run(main())


def _inject(given: InjectSettings) -> int:
    from agent.runtime.commands.inject import run_inject

    return run_inject(given.filenames, given.defaults, version=__version__)


def _plan(given: PlanSettings) -> int:
    from agent.runtime.planning import run_plan

    return run_plan(given.filename, given.runtimes, out=given.out, me=given.me, output=given.output,
                    version=__version__)


def _keygen(given: KeygenSettings) -> int:
    from agent.runtime.commands.keygen import run_keygen

    return run_keygen(given.job, given.namespace, given.config)


def _sandbox(given: SandboxSettings) -> int:
    from agent.sandbox.server import run_sandbox

    run_sandbox(given.state, port=given.port, bookmark_interval=given.bookmark_interval, services=given.services,
                controllers=given.controllers, nodes=given.nodes)
    return 0


def _demo(out: Path) -> int:
    from agent.runtime.demo import run_demo

    return run_demo(out)


# Each command, run with the settings its module in agent/flags/ gives.
COMMANDS: dict[str, Callable[[Any], int | Held]] = {
    "render": _render, "explain": _explain, "status": _status, "init": _init, "sidecar": _sidecar,
    "sandbox": _sandbox, "demo": _demo, "keygen": _keygen, "inject": _inject, "webhook": _webhook, "plan": _plan}
BUG_EXIT = 70  # EX_SOFTWARE
SIGPIPE_EXIT = 128 + 13  # what a shell reports for a process ended by SIGPIPE
ONE_SHOT = ("render", "explain", "init")
# The commands whose process holds a token or a key, or whose /proc/<pid>/root leads to one (sealing.py).
SEALED = ("init", "sidecar", "webhook")


class Ran(NamedTuple):
    command: str | None  # None: the command line did not parse
    code: int
    held: object = None  # what a one-shot command held: console() ends the process without freeing it


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the cyclic collector is running again on return, and what the command held is freed."""
    return run(argv).code


def run(argv: Sequence[str] | None = None, *, ending: bool = False) -> Ran:
    """Run one command. ``ending``: the process ends right after (console), so a one-shot command's heap is never
    collected."""
    from agent.flags.parser import UsageError, parse_command_line, settings_from

    try:
        args = parse_command_line(argv)
    except UsageError as err:
        print(str(err), file=sys.stderr)
        return Ran(None, 2)
    collecting = gc.isenabled()
    if args.command in ONE_SHOT:
        # One-shot processes that parse up to millions of small objects and create no garbage cycles worth
        # collecting: the cyclic collector's passes over them would make parsing super-linear (about half of a
        # 16384-pod parse). Memory is returned when the process ends.
        gc.disable()
    try:
        result = COMMANDS[args.command](settings_from(args))
        return Ran(args.command, result) if isinstance(result, int) else Ran(args.command, 0, held=result)
    except AgentError as err:
        print(f"topology-agent {args.command}: error: {printable(str(err))}", file=sys.stderr)
        return Ran(args.command, err.exit_code)
    except KeyboardInterrupt:
        return Ran(args.command, 130)
    except BrokenPipeError:
        # The reader left (``explain ... | head``): nothing is wrong with the command. Quiet, as a tool killed by
        # SIGPIPE is, with the shell's code for it; stdout goes to /dev/null so the exit's flush cannot fail too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return Ran(args.command, SIGPIPE_EXIT)
    except Exception as err:
        # A bug, not bad input: still one line, so a log shows what broke; the traceback on request.
        if os.environ.get("TOPOLOGY_DEBUG"):
            raise
        first = printable((str(err).splitlines() or [""])[0][:200])
        print(f"topology-agent {args.command}: internal error: {type(err).__name__}: {first} (a bug in the agent; "
              "run again with TOPOLOGY_DEBUG=1 for the traceback and report it)", file=sys.stderr)
        return Ran(args.command, BUG_EXIT)
    finally:
        if collecting and not ending:
            gc.enable()


def _seal(argv: Sequence[str]) -> None:
    """Make the process of a command in ``SEALED`` non-dumpable before the rest of the agent is imported and
    anything is read: until then a process of the same user may open its /proc/<pid>/root, and that is the
    interpreter's start only (importing the flags and the core takes 0.2 s more)."""
    if argv and argv[0] in SEALED:  # the command is the first word: the only option before it is --version
        from agent.runtime.sealing import seal_process

        unsealed = seal_process()
        if unsealed is not None:
            print(f"topology-agent {argv[0]}: warning: {unsealed}", file=sys.stderr)


def console() -> NoReturn:
    """The ``topology-agent`` command. A one-shot command ends without tearing down its heap: freeing a
    large job's objects one by one would come after the files are in place, on every pod's start-up path (the
    files are renamed into place and the logs flushed first; nothing is left to clean up)."""
    _seal(sys.argv[1:])
    ran = run(ending=True)  # held until os._exit: what the command held is never freed
    if ran.command in ONE_SHOT:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(ran.code)
    sys.exit(ran.code)


if __name__ == "__main__":  # pragma: no cover
    console()
