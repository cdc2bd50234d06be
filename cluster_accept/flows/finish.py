"""The end of a run, once its stages are done: verdicts, the run's row, the history, the report, Prefect's
artifacts and the operations (summary, Prometheus file, Slurm), each a short step of its own.

``run.json``'s ``ended`` is the mark of a finished run: written last, then the checkpoints can go. A run's exit
code is its outcome's; a run with no node to test is refused before it starts
(:func:`rundir.run.refuse_nothing_to_test`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster_accept.analysis.fleet import FleetView, read_fleet
from cluster_accept.analysis.history import append_run
from cluster_accept.analysis.history_files import HistoryFiles
from cluster_accept.analysis.probe_verdicts import measurement_frame
from cluster_accept.analysis.schemas import RUNS, THRESHOLDS, VERDICTS, write_table
from cluster_accept.analysis.thresholds_said import JUDGED_STAGES, ThresholdSaid, run_thresholds
from cluster_accept.analysis.verdicts import NOT_ACCEPTED, Verdict, VerdictRow, node_verdict
from cluster_accept.checks.base import NodeRow
from cluster_accept.checks.declarations import Link
from cluster_accept.checks.reasons import ReasonCatalog
from cluster_accept.flows.artifacts import publish
from cluster_accept.ops.after_run import Operations, after_run
from cluster_accept.ops.slurm import SlurmPlan
from cluster_accept.probes.base import Probe
from cluster_accept.reports.figures import ReportSection, ReportView
from cluster_accept.reports.render import ReportData, build_context, render
from cluster_accept.reports.thresholds import thresholds_section
from cluster_accept.rundir.checkpoints import Checkpoints
from cluster_accept.rundir.outputs import now_iso
from cluster_accept.rundir.run_record import RunRecord
from cluster_accept.tasks.probe_stage import judged_rules
from cluster_accept.tasks.stage import RunState

TOOL_FAILURE = 3  # the exit code of a run the tool itself failed in (cli: one line, the traceback in a log)
NOTHING_TESTED = 2  # exits.USAGE_ERROR: a run that tested no node was asked for nothing to test


@dataclass
class RunOutcome:
    run_id: str
    run_dir: Path
    verdicts: list[VerdictRow] = field(default_factory=list)
    slurm: SlurmPlan = field(default_factory=SlurmPlan)

    @property
    def tested(self) -> bool:
        """Whether any node was tested (every verdict ``skipped``: the selection was all excluded nodes)."""
        return any(v.verdict != Verdict.SKIPPED for v in self.verdicts)

    @property
    def exit_code(self) -> int:
        """3 when the tool failed on any node (the run's word is incomplete: that outranks a rejection), 2 when no
        node was tested (0 says "accepted", and nothing was), 1 when a node is not accepted, 0 when every tested
        node is. Runs are refused before they start when nothing is to be tested; a run resumed from an older
        ``run.json`` can still get here."""
        if any(v.verdict == Verdict.TOOL_ERROR for v in self.verdicts) or self.slurm.breaker is not None:
            return TOOL_FAILURE  # the tool failed, or its drain was held back for an operator to look
        if not self.tested:
            return NOTHING_TESTED
        return 1 if any(v.verdict in NOT_ACCEPTED for v in self.verdicts) else 0

    def count(self, verdict: Verdict) -> int:
        return sum(1 for v in self.verdicts if v.verdict == verdict)


def verdict_rows(state: RunState, links: tuple[Link, ...]) -> list[VerdictRow]:
    """One verdict per inventory node (excluded ones skipped), reasons naming the cause first."""
    by_node: dict[str, list[NodeRow]] = {}
    for row in state.rows:
        by_node.setdefault(row.node, []).append(row)
    found = []
    for node in state.inventory.nodes:
        verdict = node_verdict(node.name, by_node.get(node.name, []), links, excluded=node.excluded)
        found.append(verdict.row(state.run_id, state.cluster, node.profile_name))
    return found


def probe_sections(state: RunState, probes: list[Probe], thresholds: dict[str, dict[str, Any]]) -> list[ReportSection]:
    """Each probe's part of the report's measurements, in probe order."""
    view = ReportView(state.measurements, state.rows, thresholds, state.tables.records())
    sections = [probe.report(view) for probe in probes if probe.report is not None]
    return [s for s in sections if s is not None]


def relative_thresholds(state: RunState, probes: list[Probe]) -> list[ThresholdSaid]:
    """The run's relative thresholds, each with the noise it rests on (the cluster's calibration where the history
    holds one) and the false rejections to expect from it per run. A run that judged no figure against its peers
    (a bisection) reads no calibration."""
    if not any(m.stage in JUDGED_STAGES for m in state.measurements):
        return []
    profiles = {n.name: n.profile for n in state.inventory.nodes}
    frame = measurement_frame(state.measurements)
    return run_thresholds(frame, judged_rules(probes), profiles, state.calibration)


def _thresholds(state: RunState) -> dict[str, dict[str, Any]]:
    return {n.profile_name: n.profile.thresholds.model_dump() for n in state.inventory.nodes}


@dataclass(frozen=True)
class ReportContext:
    """What the report and the verdicts need beyond the run's data: the reasons' declarations, the probes'
    sections and the cause links the stages declare."""

    reasons: ReasonCatalog
    probes: list[Probe]
    links: tuple[Link, ...]


def finish(
    state: RunState,
    record: RunRecord,
    history: Path | None,
    operations: Operations,
    context: ReportContext,
) -> RunOutcome:
    verdicts = verdict_rows(state, context.links)
    write_table(state.run_dir.path / "verdicts.parquet", verdicts, VERDICTS)
    said = relative_thresholds(state, context.probes)
    tagged = [{"run_id": state.run_id, "cluster": state.cluster, **row.record()} for row in said]
    write_table(state.run_dir.path / "thresholds.parquet", tagged, THRESHOLDS)
    record.ended = now_iso()
    write_table(state.run_dir.path / "runs.parquet", [record.row(verdicts)], RUNS)
    fleet = None
    if history is not None:
        append_run(history, state.run_dir.path, state.run_id, record.started[:10])
        fleet = read_history_fleet(state, record, history, context)
    run_info = record.saved()  # as run.json holds it, for the report and the operations
    html_path, _ = render_report(state, run_info, verdicts, context, fleet, said)
    publish(run_info, verdicts, html_path)
    names = {n.name: n.slurm_node for n in state.inventory.nodes if n.slurm_name}
    over_ssh = {n.name for n in state.inventory.nodes if n.reached_over_ssh}
    slurm = after_run(
        state.run_dir.path,
        run_info,
        verdicts,
        state.rows,
        state.measurements,
        operations,
        None,
        names,
        fleet,
        over_ssh,
        reasons=context.reasons,
    )
    state.run_dir.write_json("run.json", record.saved())
    Checkpoints(state.run_dir.path).clear()
    state.run_dir.release()
    return RunOutcome(state.run_id, state.run_dir.path, verdicts, slurm)


def read_history_fleet(state: RunState, record: RunRecord, history: Path, context: ReportContext) -> FleetView:
    """The fleet over the history, this run's included; every history file the run skipped (read earlier by the
    stages, or now) is named in ``run.json`` (``history_set_aside``) beside the warning it got."""
    files = HistoryFiles(history)  # read afresh: this run's own files were appended just now
    fleet = read_fleet(files, state.cluster, judged_rules(context.probes))
    skipped = [*(state.history.files.set_aside if state.history is not None else []), *files.set_aside]
    if skipped:
        record.history_set_aside = list({str(s.file): s.record() for s in skipped}.values())
    return fleet


def render_report(
    state: RunState,
    run_info: dict[str, Any],
    verdicts: list[VerdictRow],
    context: ReportContext,
    fleet: FleetView | None = None,
    said: list[ThresholdSaid] | None = None,
) -> tuple[Path, Path]:
    """Write report.html and report.md (with the fleet read from the history, when one is kept, and the relative
    thresholds ``said``, after the probes' sections)."""
    thresholds = _thresholds(state)
    shown = thresholds_section(said or [])
    data = ReportData(
        rows=state.rows,
        values=state.values,
        scaling=[r.record() for r in state.tables.scaling],
        isolation=[r.record() for r in state.tables.isolation],
        nccl=[r.record() for r in state.tables.nccl],
        trends=[t.record() for t in state.trends],
        thresholds=thresholds,
        reasons=context.reasons,
        sections=[*probe_sections(state, context.probes, thresholds), *([shown] if shown is not None else [])],
        links=context.links,
        fleet=fleet,
    )
    return render(build_context(run_info, verdicts, data), state.run_dir.path)
