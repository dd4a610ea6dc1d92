"""The agent's one exception tree.

Every failure a user can meet is an ``AgentError`` whose message is one line: what is wrong, which pod or
field, and what to do. The CLI prints that line and exits with ``exit_code``; nothing else is shown, so a
message must stand on its own. Third-party exceptions are mapped to this tree at the layer that calls the
library (``raise ... from err``) and never cross into the core or the CLI.

    AgentError                 exit 1
    ├── InputError             exit 2   bad pods, labels, options or files given to the agent
    └── OutputError            exit 1   the output directory cannot be written
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
