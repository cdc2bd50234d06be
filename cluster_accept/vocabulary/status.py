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
    # A figure measured with nothing to hold it against: no minimum (none set, none derivable from the node's
    # hardware) and no peer to compare it with. Never a pass, never a reason to reject: the report lists it with
    # the key to write.
    NOT_JUDGED = "not_judged"


BAD_STATUSES = frozenset({Status.FAIL, Status.ERROR, Status.TIMEOUT, Status.UNREACHABLE})
