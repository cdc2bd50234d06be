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

A run is the run its ``run.json`` names (``run_id``, with the ``cluster`` and ``started`` every run writes
there), not its directory: a copy of a run's directory (``cp -a RUN RUN.bak``) is the same run and counts once,
and a directory without such a ``run.json`` (a bare ``verdicts.parquet`` put there by hand) is no run the tool
made: it neither counts nor breaks a streak, and is named with the files not read. Its verdicts must be that
run's (their ``run_id``); a file holding another run's is not read.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from cluster_accept.analysis.verdicts import NOT_ACCEPTED, Verdict, VerdictRow
from cluster_accept.checks.reasons import FindingKind, ReasonCatalog
from cluster_accept.ops.defaults import FAIL_SHARE, FAIL_STREAK, FAIL_WINDOW

UNJUDGED = frozenset({Verdict.SKIPPED.value, Verdict.TOOL_ERROR.value})  # runs that said nothing of the node
MAX_RUNS_READ = 200  # the most earlier run directories one run reads back for its held drains
RUN_DIRS_NAMED = 4 * MAX_RUNS_READ  # the most directories (the latest by name) whose run.json says which run
SHOWN_REASONS = 3  # reasons a held drain's sentence names (the record lists them all)
RUN_RECORD = "run.json"  # what names a run directory's run (rundir.run_record.RunRecord)
RUN_RECORD_BYTES = 64 * 2**20  # a run.json larger than this (its node lists at MAX_NODES long names) is none


@dataclass(frozen=True)
class RepeatRule:
    """When a relative finding drains: ``streak`` consecutive runs not accepted, or ``share`` of the node's last
    ``window`` runs (this run included in both)."""

    streak: int = FAIL_STREAK
    share: float = FAIL_SHARE
    window: int = FAIL_WINDOW

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


class RunIdentity(BaseModel):
    """What names a run in its ``run.json``: the keys every run writes there at its start, of the types
    :class:`~rundir.run_record.RunRecord` holds them to (that module sits above this one); the rest is not read."""

    model_config = ConfigDict(extra="ignore")

    run_id: StrictStr = Field(min_length=1)
    cluster: StrictStr
    started: StrictStr
    stages: list[StrictStr]


@dataclass(frozen=True)
class PastRun:
    """A run directory under the output directory, named by the run its ``run.json`` names."""

    run_id: str
    cluster: str
    path: Path


def run_identity(run_dir: Path) -> RunIdentity:
    """The run ``run_dir``'s ``run.json`` names; ValueError saying what is wrong where it names none (missing,
    not a plain file, too large, not JSON, a key missing or of another type)."""
    path = run_dir / RUN_RECORD
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ValueError(f"no {RUN_RECORD} to read ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{RUN_RECORD} is not a plain file")
        data = handle.read(RUN_RECORD_BYTES + 1)
    if len(data) > RUN_RECORD_BYTES:
        raise ValueError(f"{RUN_RECORD} is larger than a run writes ({RUN_RECORD_BYTES:,} bytes)")
    try:
        return RunIdentity.model_validate(json.loads(data))
    except (ValueError, RecursionError) as exc:  # ValidationError is a ValueError
        said = "; ".join(_problem(e) for e in exc.errors()) if isinstance(exc, ValidationError) else "not JSON"
        raise ValueError(f"{RUN_RECORD} names no run: {said}") from None


def _problem(error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "(the whole file)"
    return f"{where}: {error['msg']}"


def past_runs(out_dir: Path, before: str) -> tuple[list[PastRun], tuple[str, ...]]:
    """The runs under ``out_dir`` with verdicts (of its latest :data:`RUN_DIRS_NAMED` directories by name), started
    before the run ``before`` (by run id), each once, newest first: a run whose directory was copied is taken from
    the directory named by its id, else the first by name. And each directory with verdicts that names no run,
    with why (none counts)."""
    found: dict[str, PastRun] = {}
    unread: list[str] = []
    listed = sorted((p.parent for p in out_dir.glob("*/verdicts.parquet")), reverse=True)[:RUN_DIRS_NAMED]
    for path in reversed(listed):
        try:
            identity = run_identity(path)
        except ValueError as exc:
            unread.append(f"{path.name}/verdicts.parquet (not a run's: {exc}; not counted)")
            continue
        run = PastRun(identity.run_id, identity.cluster, path)
        if run.run_id < before and (run.run_id not in found or path.name == run.run_id):
            found[run.run_id] = run
    return sorted(found.values(), key=lambda run: run.run_id, reverse=True), tuple(unread)


def read_past_verdicts(
    out_dir: Path, this_run: Path, cluster: str, nodes: Collection[str], runs_wanted: int
) -> tuple[list[tuple[str, str, str]], tuple[str, ...]]:
    """``(run_id, node, verdict)`` of ``nodes`` in the runs under ``out_dir`` before ``this_run`` (:func:`past_runs`,
    newest first, at most :data:`MAX_RUNS_READ`), until each node has ``runs_wanted`` judged runs; and each
    verdicts file that could not be read or is no run's, with why (left out of the count: its verdicts are
    unknown)."""
    from cluster_accept.analysis.table_files import UnfitTable, read_table_file, row_limit  # pyarrow: only here
    from cluster_accept.inventory.hostlist import MAX_NODES

    wanted = set(nodes)
    counted = dict.fromkeys(wanted, 0)
    found: list[tuple[str, str, str]] = []
    runs, unread = past_runs(out_dir, _this_run_id(this_run))
    columns = ["run_id", "cluster", "node", "verdict"]
    for run in [run for run in runs if run.cluster == cluster][:MAX_RUNS_READ]:
        if all(n >= runs_wanted for n in counted.values()):
            break
        path = run.path / "verdicts.parquet"
        try:
            table = read_table_file(path, "verdicts", columns, row_limit("verdicts", MAX_NODES))
        except UnfitTable as exc:
            unread = (*unread, f"{run.path.name}/{path.name} ({exc.problem})")
            continue
        rows = table.to_pylist()
        others = sorted({str(row["run_id"]) for row in rows} - {run.run_id})
        if others:
            unread = (*unread, f"{run.path.name}/{path.name} (rows of run {others[0]!r}, not of {run.run_id!r})")
            continue
        for row in rows:
            node, verdict = str(row["node"]), str(row["verdict"])
            if row["cluster"] == cluster and node in wanted and verdict not in UNJUDGED:
                found.append((run.run_id, node, verdict))
                counted[node] += 1
    return found, unread


def _this_run_id(run_dir: Path) -> str:
    """The run ``run_dir`` holds: as its ``run.json`` names it, else as the directory is named."""
    return run_id_of(run_dir) or run_dir.name


def run_id_of(run_dir: Path) -> str | None:
    """The run ``run_dir``'s ``run.json`` names, or None where it names none (:func:`run_identity`)."""
    try:
        return run_identity(run_dir).run_id
    except ValueError:
        return None


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
