"""What happens once a run's verdicts are known: ``summary.json``, the optional Prometheus text file, and
the optional Slurm step (drain the bad nodes, resume the ones we drained that pass again).

The choices travel as one typed :class:`Operations` value, so a served deployment carries them as a flow
parameter like any other.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cluster_accept.analysis.probe_verdicts import MetricRule, measurement_frame
from cluster_accept.analysis.verdicts import VerdictRow
from cluster_accept.checks.base import NodeRow, Status, retested
from cluster_accept.checks.reasons import ReasonCatalog
from cluster_accept.ops.breaker import DEFAULT_MAX_DRAIN_FRACTION, BreakerTrip, DrainLimits
from cluster_accept.ops.repeats import DEFAULT_RULE, HeldDrain, RepeatRule, holds_for_run, run_id_of
from cluster_accept.ops.slurm import SSH_CHECK, SlurmPlan, slurm_step
from cluster_accept.probes.base import discover
from cluster_accept.reports.summary import prometheus_text, summary
from cluster_accept.vocabulary.own_files import replace_whole
from cluster_accept.vocabulary.rows import Measurement

if TYPE_CHECKING:  # the history's frames: a node's own check (check --local) loads no pyarrow
    from cluster_accept.analysis.fleet import FleetView


class Operations(BaseModel):
    model_config = ConfigDict(extra="forbid")

    drain: bool = False  # drain rejected and unreachable nodes in Slurm
    resume_passing: bool = False  # resume nodes drained by cluster-accept that pass now
    apply: bool = False  # without it the Slurm commands are only listed (a dry run)
    scontrol: str = "scontrol"
    prometheus: str | None = None  # a node_exporter textfile-collector file to (re)write
    # the drain breaker (ops.breaker): at most max(1, fraction x tested nodes) drained, or max_drain; force: no limit
    max_drain_fraction: float = Field(default=DEFAULT_MAX_DRAIN_FRACTION, gt=0, le=1)
    max_drain: int | None = Field(default=None, ge=0)
    force: bool = False
    drain_window_h: float | None = Field(default=None, gt=0)  # serve: the breaker's limit holds over this window
    # a node rejected for relative findings only (ops.repeats) drains once not accepted in fail_streak consecutive
    # runs, or in ceil(fail_share x fail_window) of its last fail_window runs; fail_streak 1: at once
    fail_streak: int = Field(default=DEFAULT_RULE.streak, ge=1)
    fail_share: float = Field(default=DEFAULT_RULE.share, gt=0, le=1)
    fail_window: int = Field(default=DEFAULT_RULE.window, ge=1)

    @model_validator(mode="after")
    def _window_holds_the_streak(self) -> Operations:
        """A window shorter than the streak could never see the streak it waits for."""
        if self.fail_window < self.fail_streak:
            raise ValueError(f"fail_window ({self.fail_window}) must be at least fail_streak ({self.fail_streak})")
        return self

    def repeat_rule(self) -> RepeatRule:
        return RepeatRule(self.fail_streak, self.fail_share, self.fail_window)

    def drain_limits(self, run_dir: Path | None = None) -> DrainLimits:
        """The breaker's limits; under ``serve`` with the drains the other runs beside ``run_dir`` applied in
        the window, and the records of the window that could not be read (their drains are unknown)."""
        recent: int = 0
        unknown: tuple[str, ...] = ()
        if self.drain_window_h is not None and run_dir is not None:
            since = time.time() - 3600 * self.drain_window_h
            recent, unknown = drains_applied_since(run_dir.parent, since, run_dir)
        return DrainLimits(self.max_drain_fraction, self.max_drain, self.force, self.drain_window_h, recent, unknown)


# ``slurm.json``'s state while its drains are being applied: written before the first command runs, so a run
# that dies meanwhile leaves its drains counted (each as applied: whether it was is not known), never none.
APPLYING = "applying"


def drains_applied_since(out_dir: Path, since: float, this_run: Path) -> tuple[int, tuple[str, ...]]:
    """Drains the runs under ``out_dir`` (their ``slurm.json``) applied since ``since``, and each record of the
    window that cannot be read, with why: a record cut short or unreadable is no record of zero drains. A run's
    drains count once: a copy of its directory (``cp -a RUN RUN.bak``, its ``run.json`` naming the same run) is
    not another run's record, nor is a copy of this run."""
    count, unknown = 0, []
    seen = {run_id_of(this_run) or this_run.name}
    for path in sorted(out_dir.glob("*/slurm.json")):
        named = run_id_of(path.parent)
        if path.parent == this_run or named in seen:
            continue
        seen.add(named or path.parent.name)
        try:
            if path.stat().st_mtime < since:
                continue
            count += _drains_recorded(path)
        except FileNotFoundError:
            continue  # gone since it was listed: set aside by an operator, not a record of this window
        except (OSError, ValueError, RecursionError) as exc:
            unknown.append(f"{path.parent.name}/{path.name} ({_why(exc)})")
    return count, tuple(unknown)


def _drains_recorded(path: Path) -> int:
    """The drains one ``slurm.json`` applied (every drain of one left :data:`APPLYING`); ValueError naming what
    is wrong where it is no such record."""
    data = json.loads(path.read_text(encoding="utf-8"))
    actions = data.get("actions") if isinstance(data, dict) else None
    if not isinstance(actions, list) or not all(
        isinstance(a, dict) and isinstance(a.get("action"), str) and isinstance(a.get("applied"), bool) for a in actions
    ):
        raise ValueError("not a record of actions, each with what it was and whether it was applied")
    pending = data.get("state") == APPLYING
    return sum(1 for a in actions if a["action"] == "drain" and (a["applied"] or pending))


def _why(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON, cut short or corrupt: {exc.msg} at character {exc.pos}"
    if isinstance(exc, OSError):
        return f"cannot be read: {exc.strerror or exc}"
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_whole(path, text)  # the Prometheus directory may be writable by others: never a fixed temporary name


def _probe_rules() -> dict[str, MetricRule]:
    return {metric: rule for probe in discover() for metric, rule in probe.metrics.items()}


def warnings_by_node(rows: Sequence[NodeRow]) -> dict[str, list[str]]:
    """``check:reason`` of each node's warnings, each once: what ``summary.json`` lists for accepted nodes."""
    found: dict[str, list[str]] = {}
    for row in rows:
        if row.status == Status.WARN and row.code not in found.setdefault(row.node, []):
            found[row.node].append(row.code)
    return found


def judged_checks(rows: Sequence[NodeRow]) -> dict[str, set[str]]:
    """node -> the checks this run judged on it (a row of any status), but those that passed an event only as
    seen before (:func:`checks.base.retested`): a drain for their findings is not lifted on their word."""
    by_node: dict[str, list[NodeRow]] = {}
    for row in rows:
        by_node.setdefault(row.node, []).append(row)
    return {node: retested(found) for node, found in by_node.items()}


def after_run(
    run_dir: Path,
    run_info: Mapping[str, Any],
    verdicts: Sequence[VerdictRow],
    rows: Sequence[NodeRow],
    measurements: Sequence[Measurement],
    operations: Operations,
    rules: Mapping[str, MetricRule] | None = None,
    slurm_names: Mapping[str, str] | None = None,
    fleet: FleetView | None = None,
    over_ssh: Collection[str] = (),
    reasons: ReasonCatalog | None = None,
) -> SlurmPlan:
    """Write ``summary.json`` (and the Prometheus file), then the Slurm step, recorded in ``slurm.json`` (first
    as :data:`APPLYING`, before any command runs).

    ``rules``: the judged figures (the probes' ``METRICS``) the Prometheus file's key figures come from;
    every discovered probe's when not given. ``slurm_names``: inventory name -> Slurm name, where they differ.
    ``over_ssh``: the nodes the run reached over SSH, which tested SSH again (a drain for ``ssh:refused`` may
    be lifted); no other node's. A node rejected for relative findings only is drained once they repeat over the
    runs beside ``run_dir`` (:mod:`ops.repeats`); until then its drain is held, with its count so far.
    ``reasons``: the run's declarations (every stage's checks and probes), which say which findings are relative;
    without them only the common reasons are known, and a check's or probe's own finding drains at once."""
    _write_atomic(
        run_dir / "summary.json",
        json.dumps(summary(run_info, verdicts, warnings_by_node(rows)), indent=2, default=str) + "\n",
    )
    if operations.prometheus:
        from cluster_accept.analysis.history import key_figures  # pyarrow: only a run that writes the file loads it

        figures = key_figures(measurement_frame(measurements), _probe_rules() if rules is None else rules)
        values = {
            (str(n), str(m)): float(v)
            for n, m, v in zip(figures["node"], figures["metric"], figures["value"], strict=True)
        }
        _write_atomic(Path(operations.prometheus), prometheus_text(run_info, verdicts, values, fleet))
    held: tuple[Mapping[str, HeldDrain], tuple[str, ...]] = ({}, ())
    if operations.drain:
        declared = ReasonCatalog() if reasons is None else reasons
        held = holds_for_run(run_dir, str(run_info["cluster"]), verdicts, operations.repeat_rule(), declared)
    plan = slurm_step(
        verdicts,
        str(run_info["run_id"]),
        operations.drain,
        operations.resume_passing,
        operations.apply,
        operations.scontrol,
        slurm_names,
        _with_ssh(judged_checks(rows), over_ssh),
        operations.drain_limits(run_dir),
        lambda planned: _write_atomic(run_dir / "slurm.json", _slurm_record(planned, operations, APPLYING)),
        *held,
    )
    if operations.drain or operations.resume_passing:
        _write_atomic(run_dir / "slurm.json", _slurm_record(plan, operations, "done"))
    return plan


def _with_ssh(judged: Mapping[str, set[str]], over_ssh: Collection[str]) -> dict[str, set[str]]:
    """``judged`` with SSH tested again on the nodes the run reached over it (an unreachable node's reasons)."""
    return {node: checks | {SSH_CHECK} if node in over_ssh else set(checks) for node, checks in judged.items()}


def _slurm_record(plan: SlurmPlan, operations: Operations, state: str) -> str:
    record = {
        "apply": operations.apply,
        "state": state,
        "error": plan.error,
        "actions": [asdict(a) for a in plan.actions],
        "unknown_to_slurm": plan.unknown,
        "kept_drained": [{"node": node, "why": why} for node, why in plan.kept],
        "breaker": None if plan.breaker is None else _breaker_record(plan.breaker),
        "repeat_rule": {k: getattr(operations, k) for k in ("fail_streak", "fail_share", "fail_window")},
        "held_until_repeated": [held.record() for held in plan.held],
        "repeats_unread": list(plan.repeats_unread),
    }
    return json.dumps(record, indent=2) + "\n"


def _breaker_record(tripped: BreakerTrip) -> dict[str, Any]:
    return {"why": tripped.why, "held": [{"node": node, "reason": reason} for node, reason in tripped.held]}
