"""What happens once a run's verdicts are known: ``summary.json``, the optional Prometheus text file, and
the optional Slurm step (drain the bad nodes, resume the ones we drained that pass again).

The choices travel as one typed :class:`Operations` value, so a served deployment carries them as a flow
parameter like any other.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from cluster_accept.analysis.probe_verdicts import MetricRule, measurement_frame
from cluster_accept.analysis.verdicts import VerdictRow
from cluster_accept.checks.base import NodeRow, Status
from cluster_accept.ops.breaker import DEFAULT_MAX_DRAIN_FRACTION, BreakerTrip, DrainLimits
from cluster_accept.ops.slurm import SlurmPlan, slurm_step
from cluster_accept.probes.base import discover
from cluster_accept.reports.summary import prometheus_text, summary
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

    def drain_limits(self, run_dir: Path | None = None) -> DrainLimits:
        """The breaker's limits; under ``serve`` with the drains the other runs beside ``run_dir`` applied in
        the window."""
        recent = 0
        if self.drain_window_h is not None and run_dir is not None:
            recent = drains_applied_since(run_dir.parent, time.time() - 3600 * self.drain_window_h, run_dir)
        return DrainLimits(self.max_drain_fraction, self.max_drain, self.force, self.drain_window_h, recent)


def drains_applied_since(out_dir: Path, since: float, this_run: Path) -> int:
    """Drains the runs under ``out_dir`` (their ``slurm.json``, written at their end) applied since ``since``."""
    count = 0
    for path in out_dir.glob("*/slurm.json"):
        try:
            if path.parent == this_run or path.stat().st_mtime < since:
                continue
            actions = json.loads(path.read_text()).get("actions") or []
        except (OSError, ValueError, AttributeError):
            continue
        count += sum(1 for a in actions if isinstance(a, dict) and a.get("action") == "drain" and a.get("applied"))
    return count


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


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
    """node -> the checks this run judged on it (a row of any status)."""
    judged: dict[str, set[str]] = {}
    for row in rows:
        judged.setdefault(row.node, set()).add(row.check)
    return judged


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
) -> SlurmPlan:
    """Write ``summary.json`` (and the Prometheus file), then the Slurm step, recorded in ``slurm.json``.

    ``rules``: the judged figures (the probes' ``METRICS``) the Prometheus file's key figures come from;
    every discovered probe's when not given. ``slurm_names``: inventory name -> Slurm name, where they differ."""
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
    plan = slurm_step(
        verdicts,
        str(run_info["run_id"]),
        operations.drain,
        operations.resume_passing,
        operations.apply,
        operations.scontrol,
        slurm_names,
        judged_checks(rows),
        operations.drain_limits(run_dir),
    )
    if operations.drain or operations.resume_passing:
        record = {
            "apply": operations.apply,
            "error": plan.error,
            "actions": [asdict(a) for a in plan.actions],
            "unknown_to_slurm": plan.unknown,
            "kept_drained": [{"node": node, "why": why} for node, why in plan.kept],
            "breaker": None if plan.breaker is None else _breaker_record(plan.breaker),
        }
        _write_atomic(run_dir / "slurm.json", json.dumps(record, indent=2) + "\n")
    return plan


def _breaker_record(tripped: BreakerTrip) -> dict[str, Any]:
    return {"why": tripped.why, "held": [{"node": node, "reason": reason} for node, reason in tripped.held]}
