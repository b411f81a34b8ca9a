"""Text from runs made inert before it reaches a terminal.

Log lines, host names, failure details and stack traces come from files that whoever writes the run
directory (or a log handed to ``classify``) controls. Printed as they are, escape sequences in them act
on the reader's terminal: OSC 52 writes the clipboard, OSC 8 hides a link under harmless text, OSC 0
retitles the window, CSI clears the screen or moves the cursor to forge lines. `for_terminal` is the one
place every verb's human-readable output goes through (``--json`` output is already escaped by JSON).
"""

from __future__ import annotations

import re

_STRINGS = re.compile(
    r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])"  # OSC, DCS, SOS, PM, APC (7-bit ESC x, or the 8-bit C1 byte)
    r"[^\x07\x1b\x9c\n]*"  # their payload: a title, a clipboard, a link target
    r"(?:\x07|\x1b\\|\x9c)?"  # BEL or ST; missing at the end of a line (a cut log line): removed all the same
)
"""Control strings, removed with their payload. The payload stops at a line end: nothing legitimate spans one,
and an unterminated string must not swallow the lines after it."""
_CSI = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?")
"""Control sequences (colours, cursor moves, screen clears): removed, the text around them kept."""
_ESCAPE = re.compile(r"\x1b[ -/]*[0-~]?")
"""Any other escape sequence (``ESC c`` resets the terminal, ``ESC ( 0`` switches character sets)."""
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""What remains that a terminal acts on: C0 but tab and newline (a carriage return overwrites the line), DEL,
C1, and the bidirectional controls that reorder what is shown ("Trojan Source")."""


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def for_terminal(text: str) -> str:
    """``text`` without escape sequences, other control characters shown as ``\\xNN`` (``\\uNNNN``); tab and
    newline kept. Idempotent, and a no-op for ordinary text."""
    if text.isprintable():
        return text  # the common case: nothing to look for (isprintable is False for \\n, \\t and every control)
    text = _STRINGS.sub("", text)
    text = _CSI.sub("", text)
    text = _ESCAPE.sub("", text)
    return _CONTROL.sub(_visible, text)
