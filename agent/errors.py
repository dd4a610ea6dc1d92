"""The agent's one exception tree.

Every failure a user can meet is an ``AgentError`` whose message is one line: what is wrong, which pod or
field, and what to do. The CLI prints that line and exits with ``exit_code``; nothing else is shown, so a
message must stand on its own. Third-party exceptions are mapped to this tree at the layer that calls the
library (``raise ... from err``) and never cross into the core or the CLI.

    AgentError                 exit 1
    ├── InputError             exit 2   bad pods, labels, options or files given to the agent
    ├── OutputError            exit 1   the output directory cannot be written
    ├── GangTimeout            exit 4   the job's pods did not all appear (or get addresses) in time
    └── ApiError               exit 3   the API server said no, or could not be reached
        ├── ApiUnavailable              connection refused/reset, 5xx, 429: retried with backoff first
        │   └── ApiStalled              a watch that showed no progress for its inactivity deadline
        ├── ApiForbidden                401/403: RBAC is missing; never retried
        ├── ApiNotFound                 404
        ├── ApiConflict                 409: exists already, or changed since it was read
        ├── ApiGone                     410: a watch's resourceVersion is too old; the caller relists
        └── ApiUntrusted                the server's TLS certificate failed verification; never retried
"""

from __future__ import annotations


class AgentError(Exception):
    """A failure the user must act on; ``str(err)`` is the one line the CLI prints."""

    exit_code: int = 1


class InputError(AgentError):
    """The pods, labels or options describe no valid topology; the user must fix the input."""

    exit_code = 2


class OutputError(AgentError):
    """The files could not be written; the previous files, if any, are left in place."""

    exit_code = 1


class GangTimeout(AgentError):
    """The gang did not form before --timeout; the message names the pods still missing."""

    exit_code = 4


class ApiError(AgentError):
    """The API server refused or failed a request. ``status`` is the HTTP status (0: no answer)."""

    exit_code = 3

    def __init__(self, message: str, *, status: int = 0, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class ApiUnavailable(ApiError):
    """Transient: no connection, a 5xx, or 429. The retry loop backs off and tries again."""


class ApiStalled(ApiUnavailable):
    """A watch with no event or bookmark for its inactivity deadline (hung silently, or trickling): the reflector
    lists again, since a watch that hangs may hang again."""


class ApiForbidden(ApiError):
    """401/403. Retrying cannot help; the message names the verb, resource and namespace refused."""


class ApiNotFound(ApiError):
    """404: the object (own pod, owner) does not exist."""


class ApiGone(ApiError):
    """410: the watch's resourceVersion was compacted away; list again."""


class ApiConflict(ApiError):
    """409: a create found the object, or a compare-and-swap update lost to another writer."""


class ApiUntrusted(ApiError):
    """The API server's certificate failed verification: a wrong CA or server name, or a certificate a strict
    verifier refuses. Retrying cannot help, so the message says why at once."""
