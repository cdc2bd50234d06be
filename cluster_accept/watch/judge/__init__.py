"""Localizing faults in a running multi-node job from outside: which node is behind a dead rank, a hang, a
compute straggler or a communication straggler, from each rank's Flight Recorder records and process state.

Public: :func:`localize` (rows of a window in, one :class:`WatchFinding` per node and kind out),
:func:`owner_line`, :class:`WatchRules` and :data:`REASONS` (the reason codes, each with its meaning and action)."""

from cluster_accept.watch.judge.localize import localize, owner_line
from cluster_accept.watch.judge.rules import REASONS, WatchRules

__all__ = ["REASONS", "WatchRules", "localize", "owner_line"]
