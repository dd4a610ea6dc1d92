"""Logging: human-readable lines by default, one JSON object per line with ``--log-format json``.

Every message is escaped (core/escaping.py) whatever the format: its values come from objects anyone in the
namespace can write, and an LF in one must not start a forged line nor an ESC drive the terminal of whoever reads
the log (``kubectl logs``, ``jq -r .msg``)."""

from __future__ import annotations

import json
import logging
import sys
import time

from agent.core.escaping import printable


class TextFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": printable(record.getMessage()),
        }
        return json.dumps(entry)


def setup_logging(fmt: str = "text", *, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    root = logging.getLogger("topology_agent")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
