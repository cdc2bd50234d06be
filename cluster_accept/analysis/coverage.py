"""No silent pass: every expectation a profile states yields a row for every node a stage tested.

A check that finds nothing to look at (no transport in a log, no figure for a threshold) must say so — pass,
fail, or skip/error with the reason — never leave the expectation unjudged while the node is accepted.
Each check and probe declares the expectations of the profile model its rows answer
(:class:`~cluster_accept.checks.declarations.Expectation`: the check and item whose row judges it, and the stage
that writes that row); :func:`missing` lists what a stage left without a row, and the stage adds an ``error``
row ``coverage:no_row`` for each, so a gap rejects the node instead of passing it.

The other side: a figure measured with nothing to judge it against — no minimum set or derived from the node's
hardware, no peer to compare it with — is a ``not_judged`` row, never a pass; :func:`not_judged` gathers them
with the key the profile would need, for the report's "Not judged" list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cluster_accept.checks.base import CheckRow, NodeRow, Status
from cluster_accept.checks.declarations import Expectation
from cluster_accept.checks.reasons import TOOL_CHECK, Action, Reason, declare
from cluster_accept.inventory.model import Profile

NAME = "coverage"
REASONS = declare(
    Reason(
        "no_row",
        Status.ERROR,
        "the profile states this expectation but the stage judged nothing for it on this node: a gap in the "
        "tool, not the node; rerun and report it",
        Action.RERUN,
    ),
)


# The probe's run itself failed (its own row says why): nothing it would have measured can be judged.
RUN_FAILED = frozenset({"probe_failed", "probe_error", "probe_timeout"})


def stated(profile: Profile, declared: Iterable[Expectation]) -> list[Expectation]:
    """What ``profile`` states of the ``declared`` expectations (a stage's), each listed item its own."""
    return [each for expectation in declared for each in expectation.of(profile)]


def _judged(rows: Iterable[NodeRow], expectation: Expectation) -> bool:
    return any(
        (r.check == expectation.check and (expectation.item is None or r.item.startswith(expectation.item)))
        or (
            r.check in expectation.settled_by
            and r.status != Status.PASS
            and (not expectation.settling_reasons or r.reason in expectation.settling_reasons)
        )
        for r in rows
    )


def missing(
    stage: str, tested: Mapping[str, Profile], rows: Iterable[NodeRow], declared: Iterable[Expectation]
) -> list[tuple[str, Expectation]]:
    """(node, expectation) pairs of the ``declared`` ones (what ``stage``'s plug-ins answer) that ``stage`` left
    without a row. A node the stage could not reach (or the tool failed on) was judged by that row."""
    declared = [e for e in declared if e.stage == stage]
    by_node: dict[str, list[NodeRow]] = {}
    for row in rows:
        if row.stage == stage:
            by_node.setdefault(row.node, []).append(row)
    gaps = []
    for node, profile in tested.items():
        own = by_node.get(node, [])
        if any(r.status == Status.UNREACHABLE or r.check == TOOL_CHECK for r in own):
            continue
        gaps += [(node, e) for e in stated(profile, declared) if not _judged(own, e)]
    return gaps


def gap_row(expectation: Expectation) -> CheckRow:
    what = f"{expectation.check} row" + (f" for {expectation.item}" if expectation.item else "")
    return CheckRow(NAME, expectation.name, Status.ERROR, "no_row", None, what, "the stage judged nothing for it")


@dataclass(frozen=True)
class NotJudged:
    """A figure (``check item``) left without an expectation on ``nodes``, and what to write to judge it."""

    figure: str
    write: str  # ``set thresholds.<key>``, as the rows name it
    nodes: frozenset[str]


def not_judged(rows: Iterable[NodeRow]) -> list[NotJudged]:
    """Every figure written ``not_judged``, once per figure and key to write, with the nodes it was on."""
    found: dict[tuple[str, str], set[str]] = {}
    for row in rows:
        if row.status == Status.NOT_JUDGED:
            write = (row.expected or "").removeprefix("none: ")
            found.setdefault((f"{row.check} {row.item}", write), set()).add(row.node)
    return [NotJudged(figure, write, frozenset(nodes)) for (figure, write), nodes in sorted(found.items())]
