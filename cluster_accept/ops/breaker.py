"""The drain breaker: one run never takes more than a few nodes out of Slurm, and never drains for a fault that is
likelier the controller's than the nodes'.

A controller that lost its route, a bad profile or an outage of a shared service (DNS, LDAP, a file system every
node mounts) makes every node fail the same way; drained on that word, the cluster empties. So a run drains at
most ``max(1, max_drain_fraction × tested nodes)`` (or ``--max-drain N``): past that, no drain is applied at all,
every node that would have been drained is listed with its reasons, and the run exits 3 for an operator to look.
Under ``serve`` the limit holds over a window of runs, counted from their ``slurm.json``, each run once (the run its
``run.json`` names: a copy of a run's directory is no second run); a record of the window that cannot be read holds
every drain back, naming it (its drains are unknown, never counted as none).
When every tested node is unreachable the same way, the controller is named as the likely fault and nothing is
drained. ``--force`` lifts both, and the run records it (the operations in ``run.json``). Pure: the plan in,
the plan out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from cluster_accept.analysis.verdicts import Verdict, VerdictRow
from cluster_accept.inventory.hostlist import fold
from cluster_accept.ops.defaults import DEFAULT_MAX_DRAIN_FRACTION


@dataclass(frozen=True)
class DrainLimits:
    """How many nodes one run may drain: a fraction of the tested nodes (at least one), a count that overrides
    it, or no limit (``force``)."""

    max_fraction: float = DEFAULT_MAX_DRAIN_FRACTION
    max_nodes: int | None = None
    force: bool = False
    # under ``serve``: the runs of the last ``window_h`` hours drained ``drained_in_window`` nodes together, and
    # together they may drain no more than one run may (a schedule never empties the cluster run by run)
    window_h: float | None = None
    drained_in_window: int = 0
    # the window's drain records that could not be read, each with why: their drains are unknown, not zero
    unknown_in_window: tuple[str, ...] = ()


@dataclass(frozen=True)
class BreakerTrip:
    """Why the run drained nothing, and the drains it held back: (node, the reason it would have been drained)."""

    why: str
    held: tuple[tuple[str, str], ...]


def tested_count(verdicts: Sequence[VerdictRow]) -> int:
    return sum(1 for v in verdicts if v.verdict != Verdict.SKIPPED)


def allowed_drains(tested: int, limits: DrainLimits) -> int | None:
    """The most nodes this run may drain; None: no limit."""
    if limits.force:
        return None
    if limits.max_nodes is not None:
        return limits.max_nodes
    return max(1, math.floor(limits.max_fraction * tested + 1e-9))


def controller_fault(verdicts: Sequence[VerdictRow]) -> str | None:
    """A sentence naming the controller as the likely fault when every tested node (two or more) is unreachable
    with the same reasons: one cause everywhere is the controller's route, key or a shared service, rarely every
    node at once. None otherwise."""
    tested = [v for v in verdicts if v.verdict != Verdict.SKIPPED]
    if len(tested) < 2 or any(v.verdict != Verdict.UNREACHABLE for v in tested):
        return None
    causes = {tuple(v.reasons) for v in tested}
    if len(causes) != 1:
        return None
    said = ", ".join(causes.pop()) or "no reason given"
    return (
        f"every tested node ({len(tested)}, {fold([v.node for v in tested])}) is unreachable the same way ({said}): "
        "the controller is the likely fault (its network route, SSH key or a shared service), not the nodes"
    )


def trip(verdicts: Sequence[VerdictRow], drains: Sequence[tuple[str, str]], limits: DrainLimits) -> BreakerTrip | None:
    """Whether the planned ``drains`` ((node, reason) each) must be held back as a whole; None: they may go."""
    if limits.force or not drains:
        return None
    held = tuple(drains)
    fault = controller_fault(verdicts)
    if fault is not None:
        return BreakerTrip(f"{fault}; nothing drained", held)
    tested = tested_count(verdicts)
    allowed = allowed_drains(tested, limits)
    if allowed is not None and limits.window_h is not None and limits.unknown_in_window:
        return BreakerTrip(_unknown_window(len(drains), limits.window_h, limits.unknown_in_window), held)
    if allowed is not None and limits.window_h is not None and limits.drained_in_window + len(drains) > allowed:
        why = (
            f"{len(drains)} nodes would be drained, and the runs of the last {limits.window_h:g} h drained "
            f"{limits.drained_in_window}: more than the breaker allows in that window ({allowed}); nothing drained"
        )
        return BreakerTrip(why, held)
    if allowed is None or len(drains) <= allowed:
        return None
    limit = (
        f"--max-drain {limits.max_nodes}"
        if limits.max_nodes is not None
        else f"max(1, {limits.max_fraction:g} x {tested} tested nodes) = {allowed}"
    )
    why = (
        f"{len(drains)} of {tested} tested nodes would be drained, more than the breaker allows ({limit}): "
        "nothing drained; look at the nodes' reasons (a fault shared by many nodes is rarely theirs), then drain "
        "with --max-drain N or --force"
    )
    return BreakerTrip(why, held)


def _unknown_window(drains: int, window_h: float, unknown: tuple[str, ...]) -> str:
    """Why drains are held when records of the window cannot be read: what they drained is not known, so
    the breaker cannot tell that this run's drains stay within its limit (it never counts them as none)."""
    named = "; ".join(unknown[:3]) + (f"; and {len(unknown) - 3} more" if len(unknown) > 3 else "")
    return (
        f"{drains} nodes would be drained, and {len(unknown)} drain record(s) of the runs of the last {window_h:g} h "
        f"cannot be read ({named}): how many nodes those runs drained is unknown, so the breaker holds every drain; "
        "nothing drained; repair the record or set it aside out of the runs' directory, or drain with --force"
    )
