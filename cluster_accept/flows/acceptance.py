"""The ``acceptance`` Prefect flow: stages over an inventory, results on disk, a verdict per node.

The stages are modules of ``tasks/`` (:mod:`cluster_accept.tasks.stage`), run in the order
:data:`tasks.stages.STAGES` lists them; this flow times them, reports their progress and writes their tables, once,
after each stage (what completed is on disk). One Prefect task per node per stage (never per check: ~5 ms of
Prefect bookkeeping per task run adds up at 1,000 nodes). Runs on Prefect's ephemeral local API by default and
against a server when ``PREFECT_API_URL`` is set. The run directory, not Prefect's database, is the record: its
start, resume, saved options and refusals are the :class:`~rundir.run.Run`'s.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from cluster_accept.analysis.history import RunHistory
from cluster_accept.analysis.schemas import (
    CHECKS,
    ISOLATION,
    MEASUREMENTS,
    NCCL,
    NODE_VALUES,
    SCALING,
    SETTINGS,
    TRAINING_SCALING,
    write_table,
)
from cluster_accept.flows import progress
from cluster_accept.flows.finish import ReportContext, RunOutcome, finish
from cluster_accept.inventory.model import Inventory
from cluster_accept.ops.after_run import Operations
from cluster_accept.probes.base import discover as discover_probes
from cluster_accept.probes.base import load_checked_inventory
from cluster_accept.rundir.checkpoints import Checkpoints
from cluster_accept.rundir.outputs import RunDir
from cluster_accept.rundir.run import BisectChoices, Run, RunChoices, history_dir
from cluster_accept.tasks.multi_node.stage import STAGE as MULTI_NODE
from cluster_accept.tasks.probe_stage import judged_rules
from cluster_accept.tasks.stage import RunState, run_stage
from cluster_accept.tasks.stages import STAGE_NAMES, STAGES, declared_links, reason_catalog, resolve_suite

# The tables each part of a run fills, and where they come from in the run's state.
TABLES = {
    "checks": (CHECKS, lambda state: state.rows),
    "node_values": (NODE_VALUES, lambda state: state.values),
    "measurements": (MEASUREMENTS, lambda state: state.measurements),
    "isolation": (ISOLATION, lambda state: state.tables.isolation),
    "scaling": (SCALING, lambda state: state.tables.scaling),
    "training_scaling": (TRAINING_SCALING, lambda state: state.tables.training_scaling),
    "nccl": (NCCL, lambda state: state.tables.nccl),
    "settings": (SETTINGS, lambda state: state.tables.settings),
}


def write_tables(state: RunState, names: tuple[str, ...]) -> None:
    for name in names:
        schema, rows = TABLES[name]
        write_table(state.run_dir.path / f"{name}.parquet", rows(state), schema)


def new_state(inventory: Inventory, run_dir: RunDir, history: Path | None, quick: bool, concurrency: int) -> RunState:
    """A run's state; the history is read lazily, once, by whatever needs it."""
    rules = judged_rules(discover_probes())
    past = RunHistory(history, inventory.cluster, run_dir.run_id, rules) if history is not None else None
    return RunState(run_dir, inventory, Checkpoints(run_dir.path), progress.current(), past, quick, concurrency)


def _acceptance(
    run: Run, history: Path | None, operations: Operations, concurrency: int = 64, record_history: bool = True
) -> RunOutcome:
    """The run's stages in order, each timed, its tables written when it ends; nodes with a checkpoint (a
    resumed run) are loaded, not run again. ``record_history``: False for a shard of a sharded run, which
    compares with the history but leaves recording the run to the parent that merges it."""
    state = new_state(run.inventory, run.directory, history, run.quick, concurrency)
    timings = run.record.stage_seconds = dict(run.record.stage_seconds)  # set: run.json holds them, if none ran
    for stage in STAGES:
        if stage.name not in run.record.stages:
            continue
        began = time.perf_counter()
        run_stage(state, stage)
        write_tables(state, stage.tables)
        timings[stage.name] = round(timings.get(stage.name, 0.0) + time.perf_counter() - began, 3)
        state.progress.finish(stage.name)
    context = ReportContext(reason_catalog(), discover_probes(), declared_links())
    return finish(state, run.record, history if record_history else None, operations, context)


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
    concurrency: int = 64,
    local: bool = False,
    record_history: bool = True,
) -> RunOutcome:
    """Run the requested stages over the inventory's tested nodes; write the run directory and append it
    to the history (``history``: a directory, default ``OUT/history``; ``-`` for none).

    ``suite``: ``light`` (preflight and short probes) or ``full`` (every stage), instead of ``stages``.
    ``resume``: the id of an interrupted run under ``out_dir`` to finish instead (its inventory, nodes,
    stages and suite; ``inventory_path``, ``stages``, ``suite`` and ``nodes`` are then ignored).
    ``operations``: summary files and the Slurm step after the verdicts. ``concurrency``: the bound on
    nodes worked on at once where a stage fans out by itself (the multi-node stage's ranks). ``local``: the one
    selected node is this machine, checked without SSH (a node's own health check). ``record_history``: False
    for a shard of a sharded run (:mod:`flows.sharding`): the history is read, the parent records the run."""
    ops = operations or Operations()
    if resume:
        run = Run.resume(Path(out_dir), resume, STAGE_NAMES, load_checked_inventory)
        past, ops, concurrency = run.options(history_dir(out_dir, history), ops, concurrency)
        return _acceptance(run, past, ops, concurrency, record_history)
    choices = run_choices(inventory_path, out_dir, stages, suite, nodes, history, ops, concurrency, local)
    run = Run.begin(choices, load_checked_inventory, Path(out_dir), run_id)
    return _acceptance(run, choices.history, ops, concurrency, record_history)


def run_choices(
    inventory_path: str | Path,
    out_dir: str | Path,
    stages: list[str] | None,
    suite: str | None,
    nodes: str | None,
    history: str | None,
    operations: Operations,
    concurrency: int,
    local: bool = False,
) -> RunChoices:
    """A new run as asked, its suite resolved into stages (the flows' and the command line's, which refuses
    before Prefect starts by the same :meth:`RunChoices.selection` the run begins with)."""
    chosen, quick = resolve_suite(suite, stages)
    past = history_dir(out_dir, history)
    return RunChoices(inventory_path, chosen, quick, past, operations, concurrency, nodes, suite, local)


@flow(name="bisect", log_prints=False)
def bisect(
    inventory_path: str,
    suspects: str,
    good: str | None = None,
    out_dir: str = "runs",
    run_id: str | None = None,
    history: str | None = None,
    concurrency: int = 64,
) -> RunOutcome:
    """Isolation only, on suspect nodes (and optional known-good ones): after a job saw a slow collective."""
    choices = BisectChoices(inventory_path, suspects, good)
    run, suspect_nodes, good_nodes = Run.begin_bisect(choices, load_checked_inventory, Path(out_dir), run_id)
    history_path = history_dir(out_dir, history)
    state = new_state(run.inventory, run.directory, history_path, False, concurrency)
    MULTI_NODE.bisect(state, suspect_nodes, good_nodes)
    write_tables(state, MULTI_NODE.tables)
    context = ReportContext(reason_catalog(), discover_probes(), declared_links())
    return finish(state, run.record, history_path, Operations(), context)


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
    local: bool = False,
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
        concurrency=concurrency,
        local=local,
    )
    return result
