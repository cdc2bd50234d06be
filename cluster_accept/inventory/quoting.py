"""Inventory text as it is printed: what a problem quotes of the value it refuses, and names kept to one line.

A problem line says which key is wrong and shows what it holds; a hostlist of megabytes, a key written by a
generator gone wrong, or a YAML alias that expands to millions of items would otherwise be echoed whole to
the operator's terminal and into every log that keeps the message. Each quoted value is cut to its first
:data:`QUOTE_CHARS` characters and says how long it was.
"""

from __future__ import annotations

import re
import reprlib

QUOTE_CHARS = 200
# Containers are shown shallow: a YAML alias can make a list of 9**9 items out of a few lines.
_SHALLOW = reprlib.Repr()
_SHALLOW.maxlevel, _SHALLOW.maxstring, _SHALLOW.maxother = 3, QUOTE_CHARS, QUOTE_CHARS


def _length_note(total: int) -> str:
    return f"… ({total:,} characters)"


def quoted(value: object) -> str:
    """``value`` as Python writes it (``'node[1-'``), a string cut to its first :data:`QUOTE_CHARS` characters
    with its length after it (``'aaa…'… (7,340,032 characters)``); escapes keep control characters visible."""
    if isinstance(value, str):
        if len(value) <= QUOTE_CHARS:
            return repr(value)
        return f"{value[:QUOTE_CHARS]!r}{_length_note(len(value))}"
    return cut(_SHALLOW.repr(value))


def cut(text: str) -> str:
    """``text`` cut to its first :data:`QUOTE_CHARS` characters, with its length: for a message written by
    another library (ClusterShell, PyYAML, ``re``), which may hold the refused value whole."""
    if len(text) <= QUOTE_CHARS:
        return text
    return f"{text[:QUOTE_CHARS]}{_length_note(len(text))}"


# A value another library quoted as Python does ('…' or "…", backslash escapes inside), longer than a quote here.
_LONG_QUOTE = re.compile("|".join(rf"{q}(?:[^{q}\\\n]|\\.){{{QUOTE_CHARS + 1},}}{q}" for q in "'\""))


def _cut_quote(found: re.Match[str]) -> str:
    text = found.group()
    return f"{text[: QUOTE_CHARS + 1]}{text[0]}{_length_note(len(text) - 2)}"


def cut_quotes(text: str) -> str:
    """``text`` with every value quoted in it cut to its first :data:`QUOTE_CHARS` characters: for PyYAML's
    messages, several lines (what, where, a snippet) each worth keeping, which quote a tag, an alias or a key
    as it was written."""
    return _LONG_QUOTE.sub(_cut_quote, text)


# What breaks or shifts the line a name is printed on: newline and tab, which every output keeps as layout
# (analysis.text.visible leaves them raw), and the other line boundaries str.splitlines and some Markdown or chat
# renderers honour (CR, VT, FF, the file/group/record separators, NEL, U+2028, U+2029). A name is printed on one
# line (at the head of report.md, in table rows, on terminals), and Markdown starts a heading or a table row
# wherever a line starts. Other control characters (ESC, BEL, bidi overrides) are shown as escapes wherever a
# name is printed, so a name holding one still loads.
_LAYOUT = re.compile("[\t\n\x0b\x0c\r\x1c-\x1e\x85\u2028\u2029]")


def one_line(name: str) -> str:
    """``name`` when nothing in it breaks the line it is printed on; ValueError naming the first such character
    and where it is."""
    found = _LAYOUT.search(name)
    if found is not None:
        raise ValueError(
            f"holds {quoted(found.group())} at position {found.start()}, which breaks the line a name is printed "
            "on (the heading of report.md, table rows, terminals): write it on one line"
        )
    return name
