"""Node text made safe to show, and honest about what was cut. Pure functions, standard library only.

Whatever a node prints ends up on an operator's terminal, in report.html and in report.md. Raw control
characters there are not inert: ESC starts terminal sequences (colours, window titles, cursor moves that
overwrite earlier lines), CR lets ``progress 10%`` hide behind ``progress 100%``, BEL and NUL upset viewers,
and bidi overrides (U+202E) make text read differently from what it is. :func:`visible` shows each one as an
escape (``\\x1b``, ``\\r``, ``\\u202e``), so the operator still sees that something was there. Newline and tab
are layout and stay. A backslash is left as it is: node text stays readable, at the price that a literal
``\\x1b`` typed by a node looks like an escaped ESC.

Evidence is cut to fit rows and pages; :func:`keep_head` and :func:`keep_tail` say so where they cut, with how
much was kept of how much, so a short excerpt is never mistaken for the whole output. The note sits on its own
line so that masking a secret up to the end of a cut line cannot hide it. Node text reaches these functions
masked already (where it entered the controller, ``remote/``), so a cut leaves no piece of a secret to find.
"""

from __future__ import annotations

import os
import re

# C0 controls but tab and newline, DEL, C1 controls, bidi marks/embeddings/overrides/isolates, the Unicode line
# and paragraph separators, and lone surrogates (which cannot even be written as UTF-8).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def visible(text: str) -> str:
    """``text`` with every control character shown as a Python-style escape (ESC as ``\\x1b``, CR as ``\\r``,
    U+202E as ``\\u202e``); newline and tab kept. Idempotent: the result has nothing left to escape."""
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def truncation_note(kept: int, total: int, end: str) -> str:
    """``[truncated: kept the last 4,000 of 123,456 characters]``; ``end`` is ``first`` or ``last``."""
    return f"[truncated: kept the {end} {kept:,} of {total:,} characters]"


def keep_head(text: str, limit: int, total: int | None = None) -> str:
    """The first ``limit`` characters of ``text``, followed by a line saying what was cut; ``text`` itself when
    it fits. ``total``: the length of the whole, when ``text`` stands for its start (masked: shorter than what
    it stands for); the note then counts the whole, and says the cut even where ``text`` fits."""
    whole = len(text) if total is None else total
    if whole <= limit and len(text) <= limit:
        return text
    return f"{text[:limit]}\n… {truncation_note(limit, whole, 'first')}"


# The line a reader that bounds node output as it arrives (remote.channel) ends a stream's cut part with: how many
# characters it read there without keeping them. Its tag is drawn afresh by each controller process, so no node
# can print it and miscount what was cut.
_CUT_TAG = f"@@cut:{os.urandom(8).hex()}:"
_CUT = re.compile("\n" + re.escape(_CUT_TAG) + r"(\d{1,18})(\n?)")


def cut_mark(dropped: int) -> str:
    """The line (without its newline) saying that ``dropped`` more characters were read and not kept."""
    return f"{_CUT_TAG}{dropped}"


def uncut(text: str) -> tuple[str, int]:
    """``text`` less the line :func:`cut_mark` ended it with, and the length of the whole it stands for (its own
    length where nothing was cut). Only the very end is looked at: a cut line is never anywhere else."""
    tail_at = max(0, len(text) - 64)
    at = text.rfind("\n" + _CUT_TAG, tail_at)
    found = _CUT.fullmatch(text, at) if at >= 0 else None
    if found is None:
        return text, len(text)
    head = text[:at] + found.group(2)
    return head, len(head) + int(found.group(1))


def keep_tail(text: str, limit: int) -> str:
    """The last ``limit`` characters of ``text``, after a line saying what was cut; ``text`` itself when it
    fits. For output whose end says most (a failed run's traceback, the last lines of stderr)."""
    if len(text) <= limit:
        return text
    return f"{truncation_note(limit, len(text), 'last')} …\n{text[-limit:] if limit else ''}"


def quote(text: str, limit: int = 200) -> str:
    """A piece of node text quoted in a message (``unexpected line '…'``) as Python writes it: cut to its first
    ``limit`` characters, the cut said on a line of its own (as :func:`keep_head` says it). Node text is masked
    where it entered the controller (``vocabulary.secrets.MaskedText``), so a cut here leaves no piece of a
    secret."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}\n… {truncation_note(limit, len(text), 'first')}"


# The line a probe's run prints first, on its stderr, with the settings it runs with (probes/node/job_settings.py):
# what is read for suspects, never a run's last words.
SETTINGS_LINE_START = '{"info": "settings"'


def run_output(stdout: str, stderr: str) -> str:
    """A run's output as its end is read (why it failed, its last lines): stdout, then stderr, less the settings
    lines it printed before it started."""

    def kept(text: str) -> str:
        return "\n".join(line for line in text.splitlines() if not line.startswith(SETTINGS_LINE_START))

    return kept(stdout) + "\n" + kept(stderr)
