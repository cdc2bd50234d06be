"""Localizing faults in a running multi-node job from outside: which node is behind a dead rank, a hang, a
compute straggler or a communication straggler, from each rank's Flight Recorder records and process state.

Public: :func:`localize` (rows of a window in, one :class:`WatchFinding` per node and kind out), :func:`judge`
(the same, with the arrival lags judged: :class:`Judgement`), :func:`owner_line`, :class:`WatchRules` and
:data:`REASONS` (the reason codes, typed: each with the status its row carries, its meaning and its action)."""

from cluster_accept.watch.judge.localize import Judgement, judge, localize, owner_line
from cluster_accept.watch.judge.rules import REASONS, WatchRules

__all__ = ["REASONS", "Judgement", "WatchRules", "judge", "localize", "owner_line"]
