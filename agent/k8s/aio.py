"""aiohttp as the sidecar loads it: the client and the low-level server, without the system's CA bundle.

aiohttp's connector module makes its two default TLS contexts as it is imported (for a connector given no context
of its own), and each reads the system's CA bundle: ~1 MB of certificates apiece held by every sidecar of a job.
The agent never uses them: each connector it makes gets the context its kubeconfig or service account names
(``transport.ssl_context``), which reads the system's bundle itself when the kubeconfig names no CA. So aiohttp is
imported here with OpenSSL's bundle variables naming an empty file, and restored after; the sidecar's modules
import aiohttp from here (an import-linter contract).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

BUNDLE = ("SSL_CERT_FILE", "SSL_CERT_DIR")  # OpenSSL's default verify paths, read when a context is made


@contextmanager
def system_bundle_unread() -> Iterator[None]:
    """OpenSSL's default verify paths name an empty file while inside; the environment as it was after."""
    saved = {name: os.environ.get(name) for name in BUNDLE}
    os.environ.update(dict.fromkeys(BUNDLE, os.devnull))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


with system_bundle_unread():
    import aiohttp
    from aiohttp.web_request import BaseRequest
    from aiohttp.web_response import Response, StreamResponse
    from aiohttp.web_server import Server

__all__ = ["BaseRequest", "Response", "Server", "StreamResponse", "aiohttp", "system_bundle_unread"]
