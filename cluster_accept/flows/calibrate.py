"""``cluster-accept calibrate``: the cluster's noise, measured by A=A runs on nodes the operator trusts.

K ordinary runs (the same request, checks and flow as ``cluster-accept run``, each its own run directory and
history entry) measure the same figures on the same nodes; every figure measured in two runs or more gets its
coefficient of variation across them, and the table of their p95 per (GPU model, metric, size tier)
(:func:`analysis.calibration.noise_table`) goes into the history, where every later run of the cluster reads it:
a figure is called below its peers or its history only beyond ``noise_k`` times that noise
(:mod:`analysis.noise`). A run that fails on some node loses only that node's figures of that run. A row whose
noise no run would judge by (above :data:`analysis.calibration.CV_CEILING`) is left out, said on its own line. The
table goes to ``HISTORY/calibration/<cluster>/<calibration id>.parquet``, its id and cluster in its footer, and
never outside the history (checked before the first run, links followed). The command prints the table with the
relative threshold each row gives and the false rejections it costs per run at the inventory's size.

Exit codes (:mod:`flows.exits`): 0 the table was written; 1 no figure was measured twice, or every row was left
out (the line says why); 2 a usage or inventory error; 3 the tool failed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from cluster_accept.analysis.calibration import (
    figure_cvs,
    model_key,
    noise_table,
    plausible_rows,
    table_path,
    write_table,
)
from cluster_accept.analysis.calibration_said import (
    CalibratedThreshold,
    calibrated_thresholds,
    calibration_figures,
    figures_per_node,
    resolved_profiles,
)
from cluster_accept.flows.exits import ACCEPTED, NOT_ACCEPTED, USAGE_ERROR, inventory_error
from cluster_accept.flows.exits import say as _say
from cluster_accept.flows.run_request import RunRequest
from cluster_accept.inventory.hostlist import HostlistError
from cluster_accept.inventory.load import InventoryError, select_nodes
from cluster_accept.inventory.model import Inventory
from cluster_accept.probes.base import discover, load_checked_inventory
from cluster_accept.rundir.outputs import new_run_id
from cluster_accept.vocabulary.lazy import pandas as pd
from cluster_accept.vocabulary.text import visible

DEFAULT_STAGES = ["single-node"]
RunOne = Callable[[RunRequest], int]  # one ordinary run, as ``run`` makes it: its exit code


@dataclass(frozen=True)
class CalibrationRequest:
    """What ``calibrate`` was asked: K runs of these stages on these (trusted) nodes."""

    inventory: Path
    runs: int = 5
    stages: list[str] | None = None
    nodes: str | None = None  # the trusted nodes (hostlist); None: every node of the inventory
    out_dir: Path = Path("runs")
    history: str | None = None  # default OUT/history, as ``run``


@dataclass
class CalibrationRuns:
    """The runs a calibration made, and what went wrong in any of them (said, never fatal on its own)."""

    run_ids: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def history_of(request: CalibrationRequest) -> Path:
    """Where the table goes: the runs' history (``--history``, default ``OUT/history``); ``-`` keeps none, and a
    calibration nobody reads is refused."""
    from cluster_accept.rundir.run import history_dir

    path = history_dir(request.out_dir, request.history)
    if path is None:
        raise ValueError("calibrate writes its table into the history, which --history - turns off: give a directory")
    return path


def make_runs(request: CalibrationRequest, run_one: RunOne) -> tuple[CalibrationRuns, int | None]:
    """The K runs, one after the other, as ``run`` would make each; (the runs, None), or the exit code where a
    run was refused as asked (a usage error: the next one would be refused the same way)."""
    made = CalibrationRuns()
    stages = request.stages or DEFAULT_STAGES
    for number in range(1, request.runs + 1):
        run_id = new_run_id()
        _say(f"calibrate: run {number} of {request.runs}: {run_id}")
        asked = RunRequest(request.inventory, request.out_dir, request.nodes, stages, history=request.history)
        asked.run_id = run_id
        code = run_one(asked)
        if code == USAGE_ERROR:
            return made, code
        made.run_ids.append(run_id)
        if code != ACCEPTED:
            made.notes.append(
                f"run {run_id} exited {code} (a node not accepted, or the tool failed on one): its report says why; "
                "the figures its nodes measured still count"
            )
    return made, None


def read_runs(out_dir: Path, made: CalibrationRuns) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The runs' measurements (as the noise table reads them) and checks; a run that left no table is noted."""
    measured, checks = [], []
    for run_id in made.run_ids:
        run_dir = out_dir / run_id
        path = run_dir / "measurements.parquet"
        if not path.exists():
            made.notes.append(f"run {run_id} measured nothing (no {path.name}): its report or run.json says why")
            continue
        measured.append(pd.read_parquet(path).assign(run_id=run_id))
        if (run_dir / "checks.parquet").exists():
            checks.append(pd.read_parquet(run_dir / "checks.parquet"))
    return calibration_figures(measured), pd.concat(checks, ignore_index=True) if checks else pd.DataFrame()


def why_nothing(figures: pd.DataFrame, made: CalibrationRuns) -> str:
    """Why the table is empty: every row's noise left out (each said above), or no figure measured twice (what
    each run measured)."""
    if not figures.empty and not figure_cvs(figures).empty:
        return "every row of the noise was left out (each said above), so there is no noise to calibrate with"
    counts = figures.groupby("run_id").size().to_dict() if not figures.empty else {}
    said = ", ".join(f"{run_id}: {counts.get(run_id, 0)} figures" for run_id in made.run_ids)
    return (
        f"no figure was measured in two runs or more ({said}), so there is no noise to calibrate: "
        "look at the runs' reports for why their probes measured nothing, and calibrate again"
    )


def noise_of(
    inventory: Inventory, figures: pd.DataFrame, checks: pd.DataFrame, made: CalibrationRuns
) -> tuple[pd.DataFrame, list[CalibratedThreshold]]:
    """The noise table of the runs' figures, each node's under the GPU model of its profile as the runs resolved
    it, and each row's threshold at the size of the whole inventory (its tested nodes). A row no run would judge
    by (a noise above :data:`analysis.calibration.CV_CEILING`, or not finite) is left out and noted in ``made``."""
    profiles = resolved_profiles(inventory.tested, checks)
    model_of = {node: model_key(profile) for node, profile in profiles.items()}
    table, left_out = plausible_rows(noise_table(figures, model_of))
    made.notes += [f"{note}: its figures are judged by their peers' spread alone" for note in left_out]
    rules = {metric: rule for probe in discover() for metric, rule in probe.metrics.items()}
    cluster = {node: (model_of[node], profile.thresholds) for node, profile in profiles.items()}
    return table, calibrated_thresholds(table, figures_per_node(figures, rules, model_of), cluster)


def calibrate(request: CalibrationRequest, run_one: RunOne, out: Console) -> int:
    """The calibration: K runs, their noise table into the history, the table printed; the exit code."""
    try:
        inventory = load_checked_inventory(request.inventory)
        select_nodes(inventory, request.nodes)
        history = history_of(request)
        calibration_id = new_run_id()  # sorts by the time the calibration began, as run ids do
        table_path(history, inventory.cluster, calibration_id)  # where it goes stays in the history
    except InventoryError as exc:
        return inventory_error(exc).exit_code
    except (ValueError, HostlistError) as exc:
        _say(f"error: {exc}")
        return USAGE_ERROR
    made, refused = make_runs(request, run_one)
    if refused is not None:
        return refused
    figures, checks = read_runs(request.out_dir, made)
    table, rows = noise_of(inventory, figures, checks, made)
    for note in made.notes:
        _say(f"calibrate: {note}")
    if table.empty:
        _say(f"error: {why_nothing(figures, made)}")
        return NOT_ACCEPTED
    path = write_table(history, inventory.cluster, calibration_id, table)
    for line in threshold_lines(rows, inventory.cluster, calibration_id, len(made.run_ids)):
        out.print(visible(line), highlight=False, markup=False, soft_wrap=True)
    out.print(visible(f"calibration {calibration_id} written to {path}"), highlight=False, markup=False, soft_wrap=True)
    return ACCEPTED


def threshold_lines(rows: list[CalibratedThreshold], cluster: str, calibration_id: str, runs: int) -> list[str]:
    """The noise table as printed, one line a row (whole at any terminal width, and for grep): each row's noise,
    the margin it gives and the false rejections it costs per run at the inventory's size."""
    lines = [
        f"cluster {cluster}: calibration {calibration_id} over {runs} runs; margin = max(straggler_pct, noise_k × "
        "noise p95); false rejections per run = figures judged a run × the normal tail beyond the margin (the "
        "peers' median moving too)"
    ]
    for r in rows:
        tier = f" ({r.size_tier})" if r.size_tier else ""
        judged = (
            f"{r.comparisons} judged a run on {r.nodes} nodes: {r.expected_false_rejections:.2g} false rejections a run"
            if r.comparisons
            else "not judged against peers"
        )
        lines.append(
            f"{r.gpu_model} {r.metric}{tier}: noise p95 {100 * r.cv_p95:.2f}% (median {100 * r.cv_median:.2f}%, "
            f"{r.figures} figures, {r.runs} runs); margin {r.margin_pct:.1f}% (straggler_pct {r.straggler_pct:g}%, "
            f"noise_k {r.noise_k:g}); {judged}"
        )
    return lines
