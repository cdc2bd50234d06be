"""The ``acceptance`` Prefect flow: stages over an inventory, results on disk, a verdict per node.

One Prefect task per node per stage (never per check: ~5 ms of Prefect bookkeeping per task run adds up
at 1,000 nodes). Runs on Prefect's ephemeral local API by default and against a server when
``PREFECT_API_URL`` is set. The run directory, not Prefect's database, is the record.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import flow
from prefect.futures import PrefectFuture, as_completed
from prefect.task_runners import ThreadPoolTaskRunner

from cluster_accept.analysis.history import append_run, key_figures, load, node_trends, past_figures
from cluster_accept.analysis.regressions import counter_growth, figure_regressions
from cluster_accept.analysis.schemas import (
    CHECKS,
    ISOLATION,
    MEASUREMENTS,
    NODE_VALUES,
    RUNS,
    SCALING,
    VERDICTS,
    write_table,
)
from cluster_accept.analysis.verdicts import Verdict, node_verdict
from cluster_accept.checks.base import Check, discover
from cluster_accept.flows import progress
from cluster_accept.flows.artifacts import publish
from cluster_accept.inventory.hostlist import expand, fold
from cluster_accept.inventory.load import load_inventory
from cluster_accept.inventory.model import Inventory
from cluster_accept.reports.render import ReportData, build_context, render
from cluster_accept.tasks.after_run import Operations, after_run
from cluster_accept.tasks.checkpoints import Checkpoints
from cluster_accept.tasks.multi_node import MultiNodeOutcome, run_bisect, run_multi_node
from cluster_accept.tasks.outputs import ResumeError, RunDir, now_iso, resumable_info, runs_row, start_run
from cluster_accept.tasks.preflight import COUNTER, evaluate_preflight, node_values, preflight_node, saved_preflight
from cluster_accept.tasks.rows import row_dict
from cluster_accept.tasks.single_node import (
    NodeProbes,
    evaluate_single_node,
    probe_script,
    saved_probes,
    single_node_probes,
)
from cluster_accept.tasks.slurm import SlurmPlan

STAGES = ("preflight", "single-node", "multi-node")
# Suites for scheduled checks: light is minutes (preflight and short probes), full is every stage.
SUITES: dict[str, tuple[tuple[str, ...], bool]] = {
    "light": (("preflight", "single-node"), True),
    "full": (STAGES, False),
}
__all__ = ["ResumeError", "STAGES", "SUITES", "acceptance", "bisect", "run_acceptance", "select_nodes"]


def resolve_stages(requested: list[str] | None) -> list[str]:
    """The requested stages in run order (default: all); an unknown name is a usage error."""
    if not requested:
        return list(STAGES)
    for name in requested:
        if name not in STAGES:
            raise ValueError(f"unknown stage {name!r}; stages are: {', '.join(STAGES)}")
    return [s for s in STAGES if s in requested]


@dataclass
class RunOutcome:
    run_id: str
    run_dir: Path
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    slurm: SlurmPlan = field(default_factory=SlurmPlan)

    @property
    def exit_code(self) -> int:
        bad = {Verdict.REJECTED, Verdict.UNREACHABLE}
        return 1 if any(v["verdict"] in bad for v in self.verdicts) else 0

    def count(self, verdict: str) -> int:
        return sum(1 for v in self.verdicts if v["verdict"] == verdict)


def _write_multi_node(
    run_dir: RunDir, multi: MultiNodeOutcome, rows: list[dict[str, Any]], measurements: list[dict[str, Any]]
) -> None:
    rows += multi.rows
    measurements += multi.measurements
    write_table(run_dir.path / "checks.parquet", rows, CHECKS)
    write_table(run_dir.path / "measurements.parquet", measurements, MEASUREMENTS)
    write_table(run_dir.path / "isolation.parquet", multi.isolation, ISOLATION)
    write_table(run_dir.path / "scaling.parquet", multi.scaling, SCALING)


def _rows_of(rows: list[dict[str, Any]], node: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["node"] == node]


def _start(
    inventory: Inventory, out_dir: Path, stages: list[str], run_id: str | None, suite: str | None = None
) -> tuple[RunDir, dict[str, Any]]:
    return start_run(
        out_dir,
        run_id,
        {
            "cluster": inventory.cluster,
            "inventory": inventory.source,
            "inventory_digest": inventory.digest,
            "stages": stages,
            "suite": suite,
            "nodes_tested": [n.name for n in inventory.tested],
            "nodes_excluded": [n.name for n in inventory.excluded],
        },
    )


def resumable(out_dir: Path, run_id: str) -> tuple[dict[str, Any], Inventory]:
    """``run.json`` of the interrupted run ``run_id`` under ``out_dir`` and its nodes; writes nothing."""
    run_info = resumable_info(out_dir, run_id)
    inventory = load_inventory(run_info["inventory"])
    if inventory.digest != run_info.get("inventory_digest"):
        raise ResumeError(
            f"cannot resume {run_id}: {run_info['inventory']} changed since the run started "
            f"(sha256 {inventory.digest[:12]}, the run used {str(run_info.get('inventory_digest'))[:12]})"
        )
    names = set(run_info.get("nodes_tested") or []) | set(run_info.get("nodes_excluded") or [])
    return run_info, replace(inventory, nodes=[n for n in inventory.nodes if n.name in names])


def reopen(out_dir: Path, run_id: str) -> tuple[RunDir, dict[str, Any], Inventory]:
    """Reopen the interrupted run for resuming: its directory, ``run.json`` (with the resume noted), nodes."""
    run_info, inventory = resumable(out_dir, run_id)
    run_info.setdefault("resumed", []).append(now_iso())
    run_dir = RunDir(out_dir / run_id, run_id)
    run_dir.write_json("run.json", run_info)
    return run_dir, run_info, inventory


def _finish(
    run_dir: RunDir,
    run_info: dict[str, Any],
    inventory: Inventory,
    rows: list[dict[str, Any]],
    values: list[dict[str, Any]],
    measurements: list[dict[str, Any]],
    multi: MultiNodeOutcome | None,
    history: Path | None,
    operations: Operations,
    past: pd.DataFrame | None = None,
) -> RunOutcome:
    """Verdicts, the run's row, the history append, the report, artifacts and operations; ``past``: the
    history's earlier figures when the single-node stage read them, for the report's trends."""
    verdicts = []
    for node in inventory.nodes:
        verdict = node_verdict(node.name, _rows_of(rows, node.name), excluded=node.excluded)
        verdicts.append(
            {
                "run_id": run_dir.run_id,
                "cluster": inventory.cluster,
                "node": node.name,
                "profile": node.profile_name,
                "verdict": verdict.verdict,
                "reasons": verdict.reasons,
            }
        )
    write_table(run_dir.path / "verdicts.parquet", verdicts, VERDICTS)
    run_info["ended"] = now_iso()
    write_table(run_dir.path / "runs.parquet", [runs_row(run_info, verdicts)], RUNS)
    trends = pd.DataFrame()
    if past is not None:
        trends = node_trends(past, pd.DataFrame(measurements), [n.name for n in inventory.tested])
    if history is not None:
        append_run(history, run_dir.path, run_dir.run_id, str(run_info["started"])[:10])
    data = ReportData(
        rows=rows,
        values=values,
        measurements=measurements,
        scaling=multi.scaling if multi else (),
        isolation=multi.isolation if multi else (),
        trends=[{str(k): v for k, v in r.items()} for r in trends.to_dict("records")],
        thresholds={n.profile_name: n.profile.thresholds.model_dump() for n in inventory.nodes},
    )
    html, _ = render(build_context(run_info, verdicts, data), run_dir.path)
    publish(run_info, verdicts, html)
    slurm = after_run(run_dir.path, run_info, verdicts, rows, measurements, operations)
    # run.json's ``ended`` is the mark of a finished run: written last, then the checkpoints can go.
    run_dir.write_json("run.json", run_info)
    Checkpoints(run_dir.path).clear()
    return RunOutcome(run_dir.run_id, run_dir.path, verdicts, slurm)


def _collect(stage: str, futures: list[PrefectFuture[Any]]) -> list[Any]:
    """Wait for a stage's per-node futures, reporting progress as each node finishes; keep inventory order."""
    for _ in as_completed(futures):
        progress.current().advance(stage)
    return [future.result() for future in futures]


def _regression_rows(
    run_dir: RunDir, inventory: Inventory, measurements: list[dict[str, Any]], past: pd.DataFrame, quick: bool
) -> list[dict[str, Any]]:
    """Each measured node against its own earlier runs (``past``, oldest first): scheduled checks watch for
    drift."""
    if not measurements:
        return []
    thresholds = {n.name: n.profile.thresholds for n in inventory.nodes}
    cpu = [n.name for n in inventory.nodes if n.profile.probes.device == "cpu"]
    found = figure_regressions(key_figures(pd.DataFrame(measurements)), past, thresholds, warn_only=cpu)
    return [
        row_dict(
            run_dir.run_id,
            inventory.cluster,
            "single-node",
            node_name,
            row,
            "",
            probe_script(inventory.node(node_name), row.check, quick),
        )
        for node_name, row in found
    ]


def _counter_rows(
    run_dir: RunDir, inventory: Inventory, values: list[dict[str, Any]], history: Path | None, checks: list[Check]
) -> list[dict[str, Any]]:
    """Error counters (NVLink, ECC) that grew since each node's previous run in the history."""
    if history is None:
        return []

    def counters(frame: Iterable[Mapping[Any, Any]]) -> dict[str, dict[str, str]]:
        found: dict[str, dict[str, str]] = {}
        for v in frame:
            if str(v["key"]).startswith(COUNTER):
                found.setdefault(str(v["node"]), {})[f"{v['check']}.{v['key']}"] = str(v["value"])
        return found

    past = load(history, "node_values", inventory.cluster)
    past = past[past["run_id"] != run_dir.run_id]
    previous: dict[str, dict[str, str]] = {}
    if not past.empty:
        latest = past.groupby("node")["run_id"].max()  # run ids start with their UTC start time
        last = past[past["run_id"] == past["node"].map(latest)]
        previous = counters(last.to_dict("records"))
    commands = {c.name: c.command for c in checks}
    return [
        row_dict(run_dir.run_id, inventory.cluster, "preflight", node, row, "", commands.get(row.check, ""))
        for node, row in counter_growth(counters(values), previous)
    ]


def _acceptance(
    inventory: Inventory,
    run_dir: RunDir,
    run_info: dict[str, Any],
    history: Path | None,
    operations: Operations,
) -> RunOutcome:
    """The stages in order. Nodes with a checkpoint (a resumed run) are loaded, not run again."""
    stages = list(run_info["stages"])
    quick = bool(run_info.get("quick_probes"))
    checkpoints = Checkpoints(run_dir.path)
    timings: dict[str, float] = run_info.setdefault("stage_seconds", {})
    rows: list[dict[str, Any]] = []
    values: list[dict[str, Any]] = []
    measurements: list[dict[str, Any]] = []
    past: pd.DataFrame | None = None
    report = progress.current()
    if "preflight" in stages:
        checks = discover()
        done = saved_preflight(checkpoints, checks)
        todo = [n for n in inventory.tested if n.name not in done]
        began = time.perf_counter()
        report.start("preflight", len(inventory.tested))
        report.advance("preflight", len(inventory.tested) - len(todo))
        fresh = _collect("preflight", [preflight_node.submit(node, checks, checkpoints) for node in todo])
        done.update((o.node, o) for o in fresh)
        outcomes = [done[n.name] for n in inventory.tested]
        rows = evaluate_preflight(run_dir.run_id, inventory, outcomes, checks)
        values = node_values(run_dir.run_id, inventory.cluster, outcomes, checks)
        rows += _counter_rows(run_dir, inventory, values, history, checks)
        write_table(run_dir.path / "checks.parquet", rows, CHECKS)
        write_table(run_dir.path / "node_values.parquet", values, NODE_VALUES)
        timings["preflight"] = round(timings.get("preflight", 0.0) + time.perf_counter() - began, 3)
        report.finish("preflight")

    if "single-node" in stages:
        # Only nodes that passed preflight are measured (when preflight ran in this run).
        eligible = [
            n for n in inventory.tested if node_verdict(n.name, _rows_of(rows, n.name)).verdict == Verdict.ACCEPTED
        ]
        measured: dict[str, NodeProbes] = {
            k: v for k, v in saved_probes(checkpoints, inventory).items() if k in {n.name for n in eligible}
        }
        todo = [n for n in eligible if n.name not in measured]
        limits = [n.profile.probes.max_parallel_nodes for n in todo if n.profile.probes.max_parallel_nodes]
        wave = min(limits) if limits else max(1, len(todo))
        began = time.perf_counter()
        report.start("single-node", len(eligible))
        report.advance("single-node", len(eligible) - len(todo))
        for start in range(0, len(todo), wave):
            batch = [single_node_probes.submit(node, checkpoints, quick) for node in todo[start : start + wave]]
            measured.update((o.node, o) for o in _collect("single-node", batch))
        probe_outcomes = [measured[n.name] for n in eligible]
        stage_rows, measurements = evaluate_single_node(run_dir.run_id, inventory, probe_outcomes, quick)
        rows += stage_rows
        if history is not None:
            past = past_figures(history, inventory.cluster, exclude_run=run_dir.run_id)
            rows += _regression_rows(run_dir, inventory, measurements, past, quick)
        write_table(run_dir.path / "checks.parquet", rows, CHECKS)
        write_table(run_dir.path / "measurements.parquet", measurements, MEASUREMENTS)
        timings["single-node"] = round(timings.get("single-node", 0.0) + time.perf_counter() - began, 3)
        report.finish("single-node")

    multi = None
    if "multi-node" in stages:
        participants = [
            n for n in inventory.tested if node_verdict(n.name, _rows_of(rows, n.name)).verdict == Verdict.ACCEPTED
        ]
        began = time.perf_counter()
        report.start("multi-node", 1)
        saved = checkpoints.load_stage("multi-node")
        if saved is not None:
            multi = MultiNodeOutcome(**saved)
        else:
            multi = run_multi_node(run_dir.run_id, inventory, participants)
            checkpoints.save_stage(
                "multi-node",
                {
                    "rows": multi.rows,
                    "measurements": multi.measurements,
                    "isolation": multi.isolation,
                    "scaling": multi.scaling,
                },
            )
        _write_multi_node(run_dir, multi, rows, measurements)
        timings["multi-node"] = round(timings.get("multi-node", 0.0) + time.perf_counter() - began, 3)
        report.advance("multi-node")
        report.finish("multi-node")

    return _finish(run_dir, run_info, inventory, rows, values, measurements, multi, history, operations, past)


def history_dir(out_dir: str | Path, history: str | None) -> Path | None:
    """Where the history lives: ``--history`` when given, ``OUT/history`` by default, none for ``-``."""
    if history == "-":
        return None
    return Path(history) if history else Path(out_dir) / "history"


def select_nodes(inventory: Inventory, expression: str | None) -> Inventory:
    """Restrict the tested nodes to ``expression`` (a hostlist); naming a node not in the inventory is an error."""
    if not expression:
        return inventory
    wanted = set(expand(expression))
    known = {n.name for n in inventory.nodes}
    unknown = sorted(wanted - known)
    if unknown:
        raise ValueError(f"--nodes names nodes not in the inventory: {fold(unknown)}")
    nodes = [n for n in inventory.nodes if n.name in wanted]
    return replace(inventory, nodes=nodes)


# Threads bounded by default (a served deployment runs the flow as declared); run_acceptance sets its own.
DEFAULT_TASK_RUNNER: Any = ThreadPoolTaskRunner(max_workers=64)


@flow(name="acceptance", log_prints=False, task_runner=DEFAULT_TASK_RUNNER)
def acceptance(
    inventory_path: str,
    out_dir: str = "runs",
    stages: list[str] | None = None,
    nodes: str | None = None,
    run_id: str | None = None,
    history: str | None = None,
    resume: str | None = None,
    suite: str | None = None,
    operations: Operations | None = None,
) -> RunOutcome:
    """Run the requested stages over the inventory's tested nodes; write the run directory and append it
    to the history (``history``: a directory, default ``OUT/history``; ``-`` for none).

    ``suite``: ``light`` (preflight and short probes) or ``full`` (every stage), instead of ``stages``.
    ``resume``: the id of an interrupted run under ``out_dir`` to finish instead (its inventory, nodes,
    stages and suite; ``inventory_path``, ``stages``, ``suite`` and ``nodes`` are then ignored).
    ``operations``: summary files and the Slurm step after the verdicts."""
    ops = operations or Operations()
    if resume:
        run_dir, run_info, inventory = reopen(Path(out_dir), resume)
        return _acceptance(inventory, run_dir, run_info, history_dir(out_dir, history), ops)
    inventory = select_nodes(load_inventory(inventory_path), nodes)
    chosen, quick = resolve_suite(suite, stages)
    run_dir, run_info = _start(inventory, Path(out_dir), chosen, run_id, suite)
    run_info["quick_probes"] = quick
    run_dir.write_json("run.json", run_info)
    return _acceptance(inventory, run_dir, run_info, history_dir(out_dir, history), ops)


def resolve_suite(suite: str | None, stages: list[str] | None) -> tuple[list[str], bool]:
    """(stages, short probes) of a suite, or of the requested stages when no suite is named."""
    if suite is None:
        return resolve_stages(stages), False
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; suites are: {', '.join(SUITES)}")
    if stages:
        raise ValueError("give a suite or stages, not both")
    suite_stages, quick = SUITES[suite]
    return list(suite_stages), quick


@flow(name="bisect", log_prints=False)
def bisect(
    inventory_path: str,
    suspects: str,
    good: str | None = None,
    out_dir: str = "runs",
    run_id: str | None = None,
    history: str | None = None,
) -> RunOutcome:
    """Isolation only, on suspect nodes (and optional known-good ones): after a job saw a slow collective."""
    inventory = load_inventory(inventory_path)
    suspect_nodes = select_nodes(inventory, suspects).tested
    good_nodes = select_nodes(inventory, good).tested if good else []
    scope = replace(inventory, nodes=suspect_nodes + [n for n in good_nodes if n not in suspect_nodes])
    run_dir, run_info = _start(scope, Path(out_dir), ["bisect"], run_id)
    multi = run_bisect(run_dir.run_id, scope, suspect_nodes, good_nodes)
    rows: list[dict[str, Any]] = []
    measurements: list[dict[str, Any]] = []
    _write_multi_node(run_dir, multi, rows, measurements)
    history_path = history_dir(out_dir, history)
    return _finish(run_dir, run_info, scope, rows, [], measurements, multi, history_path, Operations())


def run_acceptance(
    inventory_path: str | Path,
    out_dir: str | Path = "runs",
    stages: list[str] | None = None,
    nodes: str | None = None,
    concurrency: int = 64,
    run_id: str | None = None,
    history: str | None = None,
    resume: str | None = None,
    suite: str | None = None,
    operations: Operations | None = None,
) -> RunOutcome:
    """The flow with a task runner bounded to ``concurrency`` threads (unbounded threads by default)."""
    task_runner: Any = ThreadPoolTaskRunner(max_workers=concurrency)
    bounded = acceptance.with_options(task_runner=task_runner)
    result: RunOutcome = bounded(
        inventory_path=str(inventory_path),
        out_dir=str(out_dir),
        stages=stages,
        nodes=nodes,
        run_id=run_id,
        history=history,
        resume=resume,
        suite=suite,
        operations=operations,
    )
    return result
