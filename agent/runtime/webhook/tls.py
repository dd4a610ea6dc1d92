"""The webhook's TLS, kept: the pair it serves, checked before it is loaded, and repaired within seconds of a
breakage instead of at the next hourly check.

With its own CA (certs.py) it watches, through the agent's one reflector, its Secret and its
MutatingWebhookConfiguration by name (``fieldSelector=metadata.name=...``; RBAC ``list``/``watch`` with
``resourceNames`` authorizes exactly those requests). Any change to either, a deletion or a re-creation from the
manifest, runs the same check as start-up and as the hourly renewal: what does not verify is made again and
written, the caBundle is set again, and a replica serving another pair than the Secret's loads the Secret's. Two
replicas therefore converge on the one CA the Secret holds: a deleted Secret is created by one of them (409 for
the other, which then reads it) and both serve it.

With ``--tls-dir`` (cert-manager writes the files) it writes nothing: it reads the files every check, and serves
a pair only when the key is the certificate's. A mismatched pair at start is one line and exit 2; at a later
check it is refused with a warning and the pair served so far stays.

A pair is checked before the served context is touched: OpenSSL sets a new certificate before it checks the
key, so a half-written renewal (the new tls.crt, the old tls.key) left the served context with no usable key and
every handshake failing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from agent import __version__
from agent.errors import AgentError, ApiError, InputError
from agent.k8s.async_client import AsyncApi, AsyncClient
from agent.k8s.core import WatchEvent
from agent.k8s.reflector import AsyncOps, Reflector, reflect
from agent.runtime.webhook.certs import ManagedCerts, pair_problem

log = logging.getLogger("topology_agent.webhook")

RETRY = 60.0  # at most this many seconds between tries after a failed check, or a watch refused
GAP = 0.2  # seconds between two checks: the events of one repair (Secret, configuration) make one check
FIGHT = 20  # writes in FIGHT_WINDOW seconds: another writer undoes each of ours; checks slow to FIGHT_GAP apart
FIGHT_WINDOW = 60.0
FIGHT_GAP = 30.0


class KeptSettings(Protocol):
    """The webhook's settings that say where its pair comes from (webhook.py's ``WebhookSettings``)."""

    @property
    def tls_dir(self) -> Path | None: ...
    @property
    def check_every(self) -> float: ...
    @property
    def namespace(self) -> str: ...
    @property
    def secret(self) -> str: ...
    @property
    def config(self) -> str: ...
    @property
    def hosts(self) -> Sequence[str]: ...


class Served(Protocol):
    """What ``keep_tls`` keeps: the context the webhook's listener serves (None until a pair is loaded), and the
    settings it is kept by. webhook.py's ``Webhook`` is one; this module needs no more of it, so it imports
    nothing of webhook.py, which starts ``keep_tls``."""

    tls: ssl.SSLContext | None

    @property
    def settings(self) -> KeptSettings: ...


class BadPair(ValueError):
    """The key is not the certificate's, or either does not parse."""


def _load(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    # The ssl module loads a chain from files only: a private temporary directory, removed at once.
    with tempfile.TemporaryDirectory(prefix="topology-webhook-") as tmp:
        cert_path, key_path = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        for path, data in ((cert_path, cert), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
        context.load_cert_chain(cert_path, key_path)


def _server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def load_tls(context: ssl.SSLContext | None, cert: bytes, key: bytes) -> ssl.SSLContext:
    """A server context with this pair. The same context object is reloaded in place, so connections opened
    after a renewal get the new certificate without a restart. ``BadPair`` (or ``ssl.SSLError``) leaves
    ``context`` as it was: the pair is checked, then loaded into a scratch context, before the served one."""
    why = pair_problem(cert, key)
    if why is not None:
        raise BadPair(why)
    scratch = _server_context()
    _load(scratch, cert, key)
    if context is None:
        return scratch
    _load(context, cert, key)
    return context


def read_tls_dir(directory: Path) -> tuple[bytes, bytes]:
    try:
        return (directory / "tls.crt").read_bytes(), (directory / "tls.key").read_bytes()
    except OSError as err:
        raise InputError(f"--tls-dir {directory}: cannot read tls.crt and tls.key ({err.strerror or err}); mount "
                         "the certificate's Secret there (cert-manager writes both)") from None


async def keep_tls(api: AsyncApi, webhook: Served, *, stop: asyncio.Event) -> None:
    """Load the first certificate (its failure ends the webhook with one line), then keep it: the files of
    ``--tls-dir`` read every check, or the Secret and the configuration watched and checked on every change
    and every ``check_every`` seconds."""
    settings = webhook.settings
    if settings.tls_dir is not None:
        await _keep_files(webhook, settings.tls_dir, min(settings.check_every, RETRY), stop)
        return
    async with _own_client(api) as own:
        certs = ManagedCerts(own, namespace=settings.namespace, secret=settings.secret, config=settings.config,
                             hosts=settings.hosts)
        await _keep_managed(webhook, certs, stop)


@contextlib.asynccontextmanager
async def _own_client(api: AsyncApi) -> AsyncIterator[AsyncApi]:
    """A client of its own for the two watches and the checks, so that they never hold one of the connections
    the reviews' namespace reads use (the client keeps 4); another API (a test's) is used as it is."""
    if not isinstance(api, AsyncClient):
        yield api
        return
    own = AsyncClient(api.config, user_agent=f"topology-agent/{__version__} webhook-tls", timeout=api.timeout)
    try:
        yield own
    finally:
        await own.close()


async def _keep_files(webhook: Served, directory: Path, every: float, stop: asyncio.Event) -> None:
    served: tuple[bytes, bytes] | None = None
    refused: tuple[bytes, bytes] | None = None  # a bad pair is warned about once, not at every check
    while True:
        try:
            pair = read_tls_dir(directory)
            if pair != served and pair != refused:
                try:
                    webhook.tls = load_tls(webhook.tls, *pair)
                except (BadPair, ssl.SSLError) as err:
                    refused = pair
                    raise InputError(f"--tls-dir {directory}: {_why(err)}; give the Secret a matching tls.crt "
                                     "and tls.key (both from one cert-manager Certificate)") from None
                served, refused = pair, None
                log.info("serving the certificate from %s", directory)
        except InputError as err:
            if webhook.tls is None:
                raise
            log.warning("%s; serving the certificate loaded before, next check in %.0f s", err, every)
        if await _wait(stop, None, every):
            return


def _why(err: BaseException) -> str:
    if isinstance(err, ssl.SSLError):
        return f"OpenSSL refuses the pair ({err.reason or err})"
    return str(err)


async def _keep_managed(webhook: Served, certs: ManagedCerts, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    settings = webhook.settings
    served: bytes | None = None

    async def check() -> None:
        nonlocal served
        bundle = await certs.refresh()
        if bundle.cert != served:
            webhook.tls = load_tls(webhook.tls, bundle.cert, bundle.key)
            served = bundle.cert
            log.info("serving the certificate from Secret %s/%s", certs.namespace, certs.secret)

    await check()  # at start: a failure ends the webhook with its one line
    wake = asyncio.Event()
    watches = [asyncio.create_task(_watch(certs.api, certs.secrets_path, certs.secret, wake,
                                          f"Secret {certs.namespace}/{certs.secret}")),
               asyncio.create_task(_watch(certs.api, certs.configs_path, certs.config, wake,
                                          f"MutatingWebhookConfiguration {certs.config}"))]
    writes: collections.deque[float] = collections.deque()
    seen_writes, last, gap, retry = certs.writes, loop.time(), GAP, None
    try:
        while True:
            if await _wait(stop, wake, retry if retry is not None else settings.check_every):
                return
            if await _wait(stop, None, max(0.0, last + gap - loop.time())):  # one check for a burst of events
                return
            wake.clear()
            last = loop.time()
            try:
                await check()
                retry = None
            except (ApiError, InputError, BadPair, ssl.SSLError, ValueError) as err:
                retry = min(settings.check_every, RETRY)
                log.warning("could not check the webhook's certificate (%s); serving the current one, next try in "
                            "%.0f s", _why(err), retry)
            writes.extend([last] * (certs.writes - seen_writes))
            seen_writes = certs.writes
            while writes and writes[0] < last - FIGHT_WINDOW:
                writes.popleft()
            fighting = len(writes) >= FIGHT
            if fighting and gap != FIGHT_GAP:
                log.warning("Secret %s/%s or MutatingWebhookConfiguration %s was written %d times in %.0f s: "
                            "something undoes this replica's writes (another replica with other --cert-host names, "
                            "or another issuer); checking at most every %.0f s", certs.namespace, certs.secret,
                            certs.config, len(writes), FIGHT_WINDOW, FIGHT_GAP)
            gap = FIGHT_GAP if fighting else GAP
    finally:
        for task in watches:
            task.cancel()
        await asyncio.gather(*watches, return_exceptions=True)


async def _wait(stop: asyncio.Event, wake: asyncio.Event | None, seconds: float) -> bool:
    """Until ``stop`` (True), ``wake`` or ``seconds`` (False)."""
    events = [stop] if wake is None else [stop, wake]
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
    return stop.is_set()


class _Wake:
    """The reflector's store: it keeps nothing; any list or change of the object wakes the keeper (bookmarks
    do not)."""

    def __init__(self, wake: asyncio.Event) -> None:
        self.wake = wake

    def replace(self, items: list[Any]) -> None:
        self.wake.set()

    def apply(self, event: WatchEvent) -> None:
        if event.type != "BOOKMARK":
            self.wake.set()


async def _watch(api: AsyncApi, collection: str, name: str, wake: asyncio.Event, what: str) -> None:
    """List and watch one object by name for the webhook's life. The reflector retries what is transient; a
    refusal (403: an older ClusterRole without list/watch) is said once a minute, the hourly check still runs."""
    loop = asyncio.get_running_loop()
    selector = f"metadata.name={name}"
    ops = AsyncOps(lambda: api.list_objects(collection, field_selector=selector),
                   lambda rv, timeout, idle: api.watch_objects(collection, rv, timeout=timeout,
                                                               field_selector=selector, idle=idle),
                   clock=loop.time)
    while True:
        try:
            await reflect(Reflector(what, now=loop.time()), ops, _Wake(wake))
            return
        except AgentError as err:  # 403, an untrusted certificate, an answer that does not parse
            log.warning("cannot watch %s (%s): a change to it is repaired at the next check, not at once; grant "
                        "list and watch on it by name (manifests/webhook/rbac.yaml); trying again in %.0f s", what,
                        err, RETRY)
            await asyncio.sleep(RETRY)
