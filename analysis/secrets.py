"""Mask secret-looking values in text that came from a node before it is stored. Pure functions.

Checks mask what they know to be secret (``checks.nccl_env`` on the node and in its parser); this is the
second line of defence, applied where node output enters stored rows: in any ``NAME=value``,
``NAME = value``, ``export NAME=value`` or ``NAME: value``, a value whose name contains TOKEN, KEY, SECRET
or PASSWORD (any case) becomes ``***`` up to the end of its line; the name stays, so the operator sees
that a value was there. ``NCCL_IB_PKEY`` (an InfiniBand partition key index) is not a secret, nor the
nccl_env check's ``nccl_keys`` (the names of a node's NCCL variables, compared across nodes). Empty values,
values already masked (asterisks only, like the check's own ``****``) and placeholders (``<unset>``,
``<set> (majority)``) are left as they are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

MASK = "***"
_SECRET_WORD = re.compile(r"TOKEN|KEY|SECRET|PASSWORD", re.IGNORECASE)
# NCCL_IB_PKEY: an InfiniBand partition key index; nccl_keys: the nccl_env check's set of variable names.
_NOT_SECRET = frozenset({"NCCL_IB_PKEY", "nccl_keys"})
# A name (not the tail of a longer word), an optional closing quote (JSON, repr) and the separator.
_ASSIGNMENT = re.compile(r"(?<![\w.])(?P<name>[A-Za-z_][\w.-]*)[\"']?[ \t]*[=:][ \t]*")
_LINE_END = re.compile(r"[\r\n]")
# Not a value: already masked (the check's own ``****``) or a placeholder (``<unset> (majority)``, ``<value>``).
_NOT_A_VALUE = re.compile(r"(?:\*+|<[a-z]+>)(?: \([a-z]+\))?")
_QUOTED = re.compile(r"'[^'\r\n]*'|\"[^\"\r\n]*\"")  # how checks quote a value in a detail: repr()


def is_secret_name(name: str) -> bool:
    return name not in _NOT_SECRET and bool(_SECRET_WORD.search(name))


def _maskable(value: str) -> bool:
    value = value.strip()
    return bool(value) and not _NOT_A_VALUE.fullmatch(value)


def mask_secrets(text: str) -> str:
    """``text`` with the value of every secret-looking ``NAME=value`` / ``NAME: value`` replaced by ``***``."""
    parts: list[str] = []
    pos = 0
    while (match := _ASSIGNMENT.search(text, pos)) is not None:
        value_start = match.end()
        parts.append(text[pos:value_start])
        pos = value_start  # not masked: the value may hold further assignments (``A=1 B_TOKEN=2``)
        if is_secret_name(match.group("name")):
            line_end = _LINE_END.search(text, value_start)
            value_end = line_end.start() if line_end is not None else len(text)
            if _maskable(text[value_start:value_end]):
                parts.append(MASK)
                pos = value_end
    parts.append(text[pos:])
    return "".join(parts)


def mask_value(name: str, value: str) -> str:
    """A value stored beside its name (``key``/``value`` columns): ``***`` when the name is secret-looking
    (a ``NAME=value`` line of that very name keeps its name)."""
    if not is_secret_name(name):
        return mask_secrets(value)
    assignment = _ASSIGNMENT.match(value)
    if assignment is not None and assignment.group("name") == name:
        return mask_secrets(value)
    return MASK if _maskable(value) else value


def mask_row(item: str, texts: Mapping[str, str | None]) -> dict[str, str | None]:
    """A check row's node text (``observed``, ``expected``, ``detail``, ``raw_output``), masked.

    When the row's item is itself a secret-looking name (an NCCL variable), ``observed`` and ``expected`` are
    its values, masked whole, and so is every quoted value in ``detail`` (``overrides /etc/nccl.conf: 'x'``)."""
    masked: dict[str, str | None] = {}
    for field, text in texts.items():
        if text is None:
            masked[field] = None
        elif field in ("observed", "expected"):
            masked[field] = mask_value(item, text)
        elif field == "detail" and is_secret_name(item):
            masked[field] = _QUOTED.sub(_mask_quoted, mask_secrets(text))
        else:
            masked[field] = mask_secrets(text)
    return masked


def _mask_quoted(match: re.Match[str]) -> str:
    quoted = match.group(0)
    return f"{quoted[0]}{MASK}{quoted[-1]}" if _maskable(quoted[1:-1]) else quoted
