"""One closed set of outcomes for every row of every stage; the reason code beside it says why."""

from __future__ import annotations

import enum


class Status(str, enum.Enum):
    """One closed set of outcomes; the reason code says why."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    ERROR = "error"
    TIMEOUT = "timeout"
    UNREACHABLE = "unreachable"


BAD_STATUSES = frozenset({Status.FAIL, Status.ERROR, Status.TIMEOUT, Status.UNREACHABLE})
