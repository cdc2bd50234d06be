"""A relative finding drains a node only once it repeats; a hard one drains it at once.

A straggler, a figure below its floor or its own history, a slow pair or rail can show once on a healthy node: a
co-tenant, a throttle event, a reference that moved. Drained on that one run, a schedule that checks every few
hours takes healthy nodes out and puts them back again. So ``--drain`` drains a node whose every reason is relative
only when the node was not accepted in each of its last ``fail_streak`` runs (default 3), or in
``ceil(fail_share × fail_window)`` of its last ``fail_window`` runs (default half of 6: 3), this run counted in
both; until then the drain is *held*, and listed with its count so far. A node with any hard reason (a GPU
missing, an ECC error, an XID, a port down, the node out of reach, a probe or collective that failed) drains at
once, as does one whose rejection names no reason.

Which findings are relative, the module that declares each reason says, beside the code
(``Reason(..., kind=FindingKind.RELATIVE)``, :mod:`checks.reasons`): this module reads the run's
:class:`~checks.reasons.ReasonCatalog`, handed to it by the flow that gathered the stages' declarations, and a
reason nobody declares is hard.

A node's runs are the runs under the same output directory (``OUT/<run_id>/verdicts.parquet``, the same runs
the drain breaker counts under ``serve``), of the same cluster, before this one by run id (which starts with
the UTC start time), in which the node was judged (neither skipped nor failed by the tool). A one-shot ``run
--drain`` counts them as a served run does: a run's history is on disk. A past run whose verdicts cannot be
read is left out of the count and named; a run without verdicts (interrupted) is no run of the node's.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster_accept.analysis.verdicts import NOT_ACCEPTED, Verdict, VerdictRow
from cluster_accept.checks.reasons import FindingKind, ReasonCatalog

UNJUDGED = frozenset({Verdict.SKIPPED.value, Verdict.TOOL_ERROR.value})  # runs that said nothing of the node
MAX_RUNS_READ = 200  # the most earlier run directories one run reads back for its held drains
SHOWN_REASONS = 3  # reasons a held drain's sentence names (the record lists them all)


@dataclass(frozen=True)
class RepeatRule:
    """When a relative finding drains: ``streak`` consecutive runs not accepted, or ``share`` of the node's last
    ``window`` runs (this run included in both)."""

    streak: int = 3
    share: float = 0.5
    window: int = 6

    @property
    def failures_in_window(self) -> int:
        """Runs not accepted among the last ``window`` that drain the node: ``ceil(share × window)``."""
        return max(1, math.ceil(self.share * self.window - 1e-9))


DEFAULT_RULE = RepeatRule()


@dataclass(frozen=True)
class Repeats:
    """A node's count so far: consecutive runs not accepted up to this one, and runs not accepted among its last
    ``window`` runs (``seen`` of them known)."""

    streak: int
    failed: int
    seen: int

    def due(self, rule: RepeatRule) -> bool:
        return self.streak >= rule.streak or self.failed >= rule.failures_in_window


def count_repeats(outcomes: Sequence[bool], window: int) -> Repeats:
    """``outcomes``: the node's judged runs, oldest first, this run last, True where it was not accepted."""
    streak = 0
    for failed in reversed(outcomes):
        if not failed:
            break
        streak += 1
    recent = list(outcomes)[-window:] if window > 0 else []
    return Repeats(streak, sum(recent), len(recent))


@dataclass(frozen=True)
class HeldDrain:
    """A drain held back until its relative finding repeats: the node, this run's reasons, the count so far."""

    node: str
    reasons: tuple[str, ...]
    repeats: Repeats
    rule: RepeatRule

    @property
    def said(self) -> str:
        """``node003 held: gemm:straggler 2 of 3 consecutive runs (2 of 3 in its last 6 runs)``."""
        named = ", ".join(self.reasons[:SHOWN_REASONS])
        if len(self.reasons) > SHOWN_REASONS:
            named += f" and {len(self.reasons) - SHOWN_REASONS} more"
        count, rule = self.repeats, self.rule
        return (
            f"{self.node} held: {named} {count.streak} of {rule.streak} consecutive runs "
            f"({count.failed} of {rule.failures_in_window} in its last {rule.window} runs)"
        )

    def record(self) -> dict[str, Any]:
        """As ``slurm.json`` lists it."""
        return {
            "node": self.node,
            "reasons": list(self.reasons),
            "streak": self.repeats.streak,
            "streak_to_drain": self.rule.streak,
            "failed_in_window": self.repeats.failed,
            "failed_to_drain": self.rule.failures_in_window,
            "window": self.rule.window,
            "said": self.said,
        }


def relative_only(verdict: VerdictRow, reasons: ReasonCatalog) -> bool:
    """Whether a node not accepted was sent back for relative findings only (and named at least one), as
    ``reasons``, the run's declarations, classify them."""
    return (
        verdict.verdict in NOT_ACCEPTED
        and bool(verdict.reasons)
        and all(reasons.kind(reason) == FindingKind.RELATIVE for reason in verdict.reasons)
    )


def held_drains(
    verdicts: Sequence[VerdictRow], past: Mapping[str, Sequence[bool]], rule: RepeatRule, reasons: ReasonCatalog
) -> dict[str, HeldDrain]:
    """node -> its held drain, for each node not accepted for relative findings only (as ``reasons`` declare them)
    whose count is not yet due; ``past``: node -> its earlier judged runs, oldest first, True where it was not
    accepted. Pure."""
    held: dict[str, HeldDrain] = {}
    for verdict in verdicts:
        if not relative_only(verdict, reasons):
            continue
        count = count_repeats([*past.get(verdict.node, ()), True], rule.window)
        if not count.due(rule):
            held[verdict.node] = HeldDrain(verdict.node, tuple(verdict.reasons), count, rule)
    return held


def outcomes_by_node(records: Iterable[tuple[str, str, str]]) -> dict[str, list[bool]]:
    """node -> its judged runs oldest first (True: not accepted), from ``(run_id, node, verdict)`` records; a run
    that skipped the node or failed on the controller for it says nothing of it."""
    bad = {v.value for v in NOT_ACCEPTED}
    found: dict[str, list[bool]] = {}
    for _, node, verdict in sorted(records):
        if verdict not in UNJUDGED:
            found.setdefault(node, []).append(verdict in bad)
    return found


def read_past_verdicts(
    out_dir: Path, this_run: Path, cluster: str, nodes: Collection[str], runs_wanted: int
) -> tuple[list[tuple[str, str, str]], tuple[str, ...]]:
    """``(run_id, node, verdict)`` of ``nodes`` in the runs under ``out_dir`` before ``this_run`` (by name, newest
    first, at most :data:`MAX_RUNS_READ`), until each node has ``runs_wanted`` judged runs; and each verdicts file
    that could not be read, with why (left out of the count: its verdicts are unknown)."""
    from cluster_accept.analysis.table_files import UnfitTable, read_table_file, row_limit  # pyarrow: only here
    from cluster_accept.inventory.hostlist import MAX_NODES

    wanted = set(nodes)
    counted = dict.fromkeys(wanted, 0)
    found: list[tuple[str, str, str]] = []
    unread: list[str] = []
    earlier = sorted((p for p in out_dir.glob("*/verdicts.parquet") if p.parent.name < this_run.name), reverse=True)
    for path in earlier[:MAX_RUNS_READ]:
        if all(n >= runs_wanted for n in counted.values()):
            break
        try:
            table = read_table_file(path, "verdicts", ["cluster", "node", "verdict"], row_limit("verdicts", MAX_NODES))
        except UnfitTable as exc:
            unread.append(f"{path.parent.name}/{path.name} ({exc.problem})")
            continue
        for row in table.to_pylist():
            node, verdict = str(row["node"]), str(row["verdict"])
            if row["cluster"] == cluster and node in wanted and verdict not in UNJUDGED:
                found.append((path.parent.name, node, verdict))
                counted[node] += 1
    return found, tuple(unread)


def holds_for_run(
    run_dir: Path, cluster: str, verdicts: Sequence[VerdictRow], rule: RepeatRule, reasons: ReasonCatalog
) -> tuple[dict[str, HeldDrain], tuple[str, ...]]:
    """This run's held drains (:func:`held_drains` over the runs beside ``run_dir``), and the earlier runs'
    verdicts that could not be read. Nothing is read where no node is a candidate or one run drains
    (``streak`` 1)."""
    candidates = [v.node for v in verdicts if relative_only(v, reasons)]
    if not candidates or rule.streak <= 1 or rule.failures_in_window <= 1:
        return {}, ()
    records, unread = read_past_verdicts(run_dir.parent, run_dir, cluster, candidates, rule.window - 1)
    return held_drains(verdicts, outcomes_by_node(records), rule, reasons), unread
