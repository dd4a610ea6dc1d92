"""What both transports share: TLS, credentials, time budgets, and how a failed connection is named. No HTTP
library is imported here.

Time is bounded at two levels. A request never takes longer than its own limit (30 s for a GET or a LIST page,
the inactivity deadline between two events of a watch), however the bytes arrive: a server that sends 1 byte a
second is cut like a silent one. And a client can carry a deadline (init's ``--timeout``) that every request
ends by, connect included.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass

from agent.errors import ApiStalled, ApiUnavailable, ApiUntrusted
from agent.k8s.config import ApiConfig
from agent.k8s.core import Request
from agent.k8s.retrying import DeadlinePassed

CONNECT = 5.0  # seconds to open a connection
READ = 64 * 1024  # bytes a read asks for; a read returns what has arrived
IDLE = 60.0  # seconds without an event or bookmark before a watch counts as dead (reflector.py)


def ssl_context(config: ApiConfig) -> ssl.SSLContext | None:
    if not config.server.startswith("https"):
        return None
    if config.verify:
        context = ssl.create_default_context(cafile=config.ca_file)
    else:  # the kubeconfig said insecure-skip-tls-verify
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if config.cert_file:
        context.load_cert_chain(config.cert_file, config.key_file)
    return context


def headers(config: ApiConfig, user_agent: str, request: Request) -> dict[str, str]:
    out = {"Accept": request.accept, "User-Agent": user_agent}
    token = config.bearer()  # re-read each time: in-cluster tokens rotate
    if token:
        out["Authorization"] = f"Bearer {token}"
    if request.body is not None:
        out["Content-Type"] = request.content_type
    return out


def tls_failure(err: BaseException, server: str) -> ApiUntrusted | None:
    """The ``ApiUntrusted`` for a failed certificate verification anywhere in ``err``'s chain (http.client raises
    it as it is, aiohttp wraps it in ClientConnectorCertificateError), or None: every other connection error is
    retried."""
    seen: set[int] = set()
    todo: list[object] = [err]
    while todo:
        item = todo.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        why = getattr(item, "verify_message", None)  # aiohttp's wrapper is an SSLCertVerificationError too, without it
        if isinstance(item, ssl.SSLCertVerificationError) and why:
            return ApiUntrusted(f"API server {server}: its TLS certificate failed verification ({why}); check the "
                                "CA (the kubeconfig's certificate-authority, or the service account's ca.crt) and "
                                "the server address")
        todo += [item.__cause__, item.__context__, getattr(item, "reason", None),
                 getattr(item, "certificate_error", None), *item.args]
    return None


def unreachable(err: BaseException, server: str, request: Request) -> Exception:
    """The agent's error for a transport failure: untrusted certificates are named, the rest is transient."""
    untrusted = tls_failure(err, server)
    if untrusted is not None:
        return untrusted
    return ApiUnavailable(f"API server {server} unreachable during {request.verb} {request.what}: "
                          f"{type(err).__name__}")


@dataclass
class Budget:
    """Seconds left for a request: its own limit, cut by the client's deadline when it has one."""

    clock: Callable[[], float]
    deadline: float | None = None

    def left(self, limit: float) -> float:
        if self.deadline is None:
            return limit
        left = self.deadline - self.clock()
        if left <= 0:
            raise DeadlinePassed("the deadline has passed", status=0)
        return min(limit, left)



def too_slow(request: Request, seconds: float) -> ApiUnavailable:
    return ApiUnavailable(f"{request.verb} {request.what}: no whole answer within {seconds:.0f} s (a stalled or "
                          "trickling connection)")


def silent(request: Request, seconds: float) -> ApiStalled:
    return ApiStalled(f"watch {request.what}: no event or bookmark for {seconds:.0f} s (a silently stalled "
                      "watch)")
