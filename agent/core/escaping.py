"""Text from an object, made safe to print on a terminal or to write as one log line.

Anyone who can write an object the agent reads (a Lease's holderIdentity, a published ConfigMap's leader, a pod's
labels) chooses the characters the agent later prints or logs. A terminal acts on some of them: ESC starts
sequences that clear the screen, move the cursor, set the window title or make an OSC 8 link; CR and LF start a
new line, which can forge a log line or a table row; BEL rings; C1 controls are 8-bit escapes; bidi controls
reorder what is shown. kubectl's printers escape the same class (k8s.io/cli-runtime pkg/printers/terminal.go,
``EscapeTerminal``: ESC and CR, after CVE-2021-25743); here every control, format and line-separator character is
replaced by a visible Python-style escape, so a value always prints as one line of inert characters. The result
is for people, not for parsing back: a backslash is kept as it is.
"""

from __future__ import annotations

import unicodedata

from agent.core.pods.validation import is_dns1123_subdomain

# Unicode categories a terminal or a reader acts on: controls (C0, DEL, C1), format characters (bidi overrides,
# zero-width), lone surrogates (which no UTF-8 stream can carry) and the line and paragraph separators.
_ACTED_ON = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
SHOWN = 80  # characters of an invalid name that are shown


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` with every character a terminal acts on replaced by a visible escape (``\\x1b``, ``\\n``,
    ``\\u202e``); printable text is returned as it is."""
    if text.isprintable():
        return text
    return "".join(_escape(c) if unicodedata.category(c) in _ACTED_ON else c for c in text)


def shown(value: str, limit: int = SHOWN) -> str:
    """A value read from an object, as a message quotes it: its first ``limit`` characters, escaped."""
    return printable(value[:limit]) + ("..." if len(value) > limit else "")


def pod_name_shown(value: str) -> str:
    """A pod name read from an object (a Lease's holder, a journal's leader or standby) as it is printed: itself
    when it is one (a DNS-1123 subdomain), else ``<invalid: ...>`` with its first characters escaped."""
    return value if is_dns1123_subdomain(value) else f"<invalid: {shown(value)}>"
