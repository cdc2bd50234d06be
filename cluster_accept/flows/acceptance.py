"""The ``acceptance`` Prefect flow: stages over an inventory, results on disk, a verdict per node.

The stages are modules of ``tasks/`` (:mod:`cluster_accept.tasks.stage`), run in their order; this flow
times them, reports their progress and writes their tables, once, after each stage (what completed is on
disk). One Prefect task per node per stage (never per check: ~5 ms of Prefect bookkeeping per task run adds
up at 1,000 nodes). Runs on Prefect's ephemeral local API by default and against a server when
``PREFECT_API_URL`` is set. The run directory, not Prefect's database, is the record.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from cluster_accept.analysis import coverage
from cluster_accept.analysis.history import RunHistory
from cluster_accept.analysis.schemas import (
    CHECKS,
    ISOLATION,
    MEASUREMENTS,
    NCCL,
    NODE_VALUES,
    SCALING,
    TRAINING_SCALING,
    write_table,
)
from cluster_accept.checks.reasons import Reason, ReasonCatalog, catalog
from cluster_accept.flows import progress
from cluster_accept.flows.finish import NothingToTest, ReportContext, RunOutcome, finish, refuse_nothing_to_test
from cluster_accept.flows.run_record import check_run_record
from cluster_accept.inventory.builtin import is_auto
from cluster_accept.inventory.hostlist import fold
from cluster_accept.inventory.load import as_local, select_nodes
from cluster_accept.inventory.model import Inventory, Node
from cluster_accept.ops.after_run import Operations
from cluster_accept.probes.base import discover as discover_probes
from cluster_accept.probes.base import load_checked_inventory
from cluster_accept.rundir.checkpoints import Checkpoints
from cluster_accept.rundir.outputs import ResumeError, RunDir, RunLocked, now_iso, resumable_info, start_run
from cluster_accept.tasks.multi_node.stage import STAGE as MULTI_NODE
from cluster_accept.tasks.single_node import judged_rules
from cluster_accept.tasks.stage import RunState, Stage, run_stage
from cluster_accept.tasks.stages import STAGES as STAGE_ORDER
from cluster_accept.tasks.stages import declared_links

STAGE_LIST: list[Stage] = list(STAGE_ORDER)
STAGES = tuple(s.name for s in STAGE_LIST)
# Suites for scheduled checks: light is minutes (its stages with short probes and a short burn), full is every
# stage, burn is preflight and the burn (idle nodes burned in, DCGM's diagnostics run).
SUITES: dict[str, tuple[tuple[str, ...], bool]] = {
    "light": (tuple(s.name for s in STAGE_LIST if "light" in s.suites), True),
    "full": (tuple(s.name for s in STAGE_LIST if "full" in s.suites), False),
    "burn": (tuple(s.name for s in STAGE_LIST if "burn" in s.suites), False),
}
# The tables each part of a run fills, and where they come from in the run's state.
TABLES = {
    "checks": (CHECKS, lambda state: state.rows),
    "node_values": (NODE_VALUES, lambda state: state.values),
    "measurements": (MEASUREMENTS, lambda state: state.measurements),
    "isolation": (ISOLATION, lambda state: state.tables.isolation),
    "scaling": (SCALING, lambda state: state.tables.scaling),
    "training_scaling": (TRAINING_SCALING, lambda state: state.tables.training_scaling),
    "nccl": (NCCL, lambda state: state.tables.nccl),
}
__all__ = [
    "NothingToTest",
    "ResumeError",
    "RunLocked",
    "RunOutcome",
    "STAGES",
    "SUITES",
    "acceptance",
    "bisect",
    "run_acceptance",
    "select_nodes",
]


def resolve_stages(requested: list[str] | None) -> list[str]:
    """The requested stages in run order (default: all); an unknown name is a usage error."""
    if not requested:
        return list(STAGES)
    for name in requested:
        if name not in STAGES:
            raise ValueError(f"unknown stage {name!r}; stages are: {', '.join(STAGES)}")
    return [s for s in STAGES if s in requested]


def _start(
    inventory: Inventory,
    out_dir: Path,
    stages: list[str],
    run_id: str | None,
    suite: str | None = None,
    more: Mapping[str, Any] | None = None,
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
            "controller": socket.gethostname(),  # the host that ran it: shards of one run may run on several
            **(more or {}),
        },
    )


@dataclass(frozen=True)
class RunChoices:
    """How a new acceptance run goes, as its ``run.json`` keeps it (a resume does as the run did)."""

    stages: list[str]
    quick: bool
    history: Path | None
    operations: Operations
    concurrency: int
    local: bool = False


def start_acceptance_run(
    inventory: Inventory, out_dir: Path, run_id: str | None, suite: str | None, choices: RunChoices, **more: Any
) -> tuple[RunDir, dict[str, Any]]:
    """A new run directory whose ``run.json`` holds the choices (and ``more``, e.g. a sharded run's shards)."""
    recorded = {
        "quick_probes": choices.quick,
        "local": choices.local,
        "simulated": any(n.simulated is not None for n in inventory.tested),  # scale work, not a cluster
        "options": recorded_options(choices.history, choices.operations, choices.concurrency),
        **more,
    }
    return _start(inventory, out_dir, choices.stages, run_id, suite, recorded)


def resumable(out_dir: Path, run_id: str) -> tuple[dict[str, Any], Inventory]:
    """``run.json`` of the interrupted run ``run_id`` under ``out_dir`` and its nodes; writes nothing. A key a
    resume reads that was edited into a wrong value is named (:func:`flows.run_record.check_run_record`)."""
    run_info = resumable_info(out_dir, run_id)
    if run_info.get("sharded"):
        raise ResumeError(
            f"cannot resume {run_id}: it was sharded over Prefect workers (run --shard-by); start a new run "
            "(the finished shards' results stay under its shards/)"
        )
    check_run_record(run_id, out_dir / run_id / "run.json", run_info)
    inventory = load_checked_inventory(run_info["inventory"])
    if inventory.digest != run_info.get("inventory_digest"):
        raise ResumeError(
            f"cannot resume {run_id}: {run_info['inventory']} changed since the run started "
            f"(sha256 {inventory.digest[:12]}, the run used {str(run_info.get('inventory_digest'))[:12]})"
        )
    names = set(run_info.get("nodes_tested") or []) | set(run_info.get("nodes_excluded") or [])
    return run_info, replace(inventory, nodes=[n for n in inventory.nodes if n.name in names])


def reopen(out_dir: Path, run_id: str) -> tuple[RunDir, dict[str, Any], Inventory]:
    """Reopen the interrupted run for resuming: its directory (its lock held: a second resume, or the run
    itself still going, is refused), ``run.json`` (with the resume noted), nodes."""
    run_dir = RunDir(out_dir / run_id, run_id)
    resumable_info(out_dir, run_id)  # an unknown or finished run is named as such before any lock is taken
    run_dir.hold()
    try:
        run_info, inventory = resumable(out_dir, run_id)
        run_info.setdefault("resumed", []).append(now_iso())
        run_dir.write_json("run.json", run_info)
    except BaseException:
        run_dir.release()
        raise
    return run_dir, run_info, inventory


def recorded_options(history: Path | None, operations: Operations, concurrency: int) -> dict[str, Any]:
    """What a resume must do as the run did: ``run.json``'s ``options`` (paths made absolute: a resume may
    start elsewhere)."""
    ops = operations.model_dump()
    if ops.get("prometheus"):
        ops["prometheus"] = str(Path(ops["prometheus"]).resolve())
    return {"history": str(history.resolve()) if history else None, "operations": ops, "concurrency": concurrency}


def restored_options(
    run_info: dict[str, Any], history: Path | None, operations: Operations, concurrency: int
) -> tuple[Path | None, Operations, int]:
    """The interrupted run's own options (history, Slurm and Prometheus operations, concurrency); a run
    recorded before options were kept goes on with the ones given."""
    recorded = run_info.get("options")
    if not isinstance(recorded, dict):
        return history, operations, concurrency
    kept = recorded.get("history")
    return Path(kept) if kept else None, Operations.model_validate(recorded["operations"]), int(recorded["concurrency"])


def reason_catalog(extra: Sequence[tuple[str, Mapping[str, Reason]]] = ()) -> ReasonCatalog:
    """Every reason the stages and their checks and probes declare (and ``extra``, a sharded run's own): what
    the report's wording reads."""
    stages = [pair for stage in STAGE_LIST for pair in stage.reasons()]
    return catalog([*stages, (coverage.NAME, coverage.REASONS), *extra])


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
    inventory: Inventory,
    run_dir: RunDir,
    run_info: dict[str, Any],
    history: Path | None,
    operations: Operations,
    concurrency: int = 64,
    record_history: bool = True,
) -> RunOutcome:
    """The chosen stages in order, each timed, its tables written when it ends; nodes with a checkpoint (a
    resumed run) are loaded, not run again. ``record_history``: False for a shard of a sharded run, which
    compares with the history but leaves recording the run to the parent that merges it."""
    state = new_state(inventory, run_dir, history, bool(run_info.get("quick_probes")), concurrency)
    timings: dict[str, float] = run_info.setdefault("stage_seconds", {})
    for stage in STAGE_LIST:
        if stage.name not in run_info["stages"]:
            continue
        began = time.perf_counter()
        run_stage(state, stage)
        write_tables(state, stage.tables)
        timings[stage.name] = round(timings.get(stage.name, 0.0) + time.perf_counter() - began, 3)
        state.progress.finish(stage.name)
    context = ReportContext(reason_catalog(), discover_probes(), declared_links())
    return finish(state, run_info, history if record_history else None, operations, context)


def history_dir(out_dir: str | Path, history: str | None) -> Path | None:
    """Where the history lives: ``--history`` when given, ``OUT/history`` by default, none for ``-``."""
    if history == "-":
        return None
    return Path(history) if history else Path(out_dir) / "history"


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
        run_dir, run_info, inventory = reopen(Path(out_dir), resume)
        past, ops, concurrency = restored_options(run_info, history_dir(out_dir, history), ops, concurrency)
        inventory = as_local(inventory) if run_info.get("local") else inventory
        return _acceptance(inventory, run_dir, run_info, past, ops, concurrency, record_history)
    inventory = select_nodes(load_checked_inventory(inventory_path), nodes)
    inventory = as_local(inventory) if local else inventory
    chosen, quick = resolve_suite(suite, stages)
    refuse_unresolved_auto(inventory, chosen)
    past = history_dir(out_dir, history)
    choices = RunChoices(chosen, quick, past, ops, concurrency, local)
    run_dir, run_info = start_acceptance_run(inventory, Path(out_dir), run_id, suite, choices)
    return _acceptance(inventory, run_dir, run_info, past, ops, concurrency, record_history)


# What a recording answers (simulator.nodes, simulator.launch): bisect runs the multi-node launcher.
SIMULATED_STAGES = ("preflight", "single-node", "multi-node", "bisect")


def refuse_unresolved_auto(inventory: Inventory, stages: list[str]) -> None:
    """The refusals of a selection before anything runs. No node to test (:func:`refuse_nothing_to_test`).
    ``profile: auto`` is resolved from the GPU model preflight reads: without preflight there is no profile
    to judge by, and the nodes would be probed against nothing. A simulated inventory runs only the stages its
    recording answers (no burn), and multi-node runs only as the recording's all-reduce (no training, rails or
    other collectives between nodes)."""
    refuse_nothing_to_test(inventory)
    simulated = [n for n in inventory.tested if n.simulated is not None]
    wanted = stages or ["bisect"]
    beyond = [s for s in wanted if s not in SIMULATED_STAGES]
    if simulated and beyond:
        raise ValueError(
            f"nodes {fold([n.name for n in simulated])} are simulated (the inventory's simulation block): their "
            f"recording answers {', '.join(SIMULATED_STAGES)} only, not {', '.join(beyond)}"
        )
    unrecorded = [n.name for n in simulated if _beyond_allreduce(n)]
    if unrecorded and {"multi-node", "bisect"} & set(wanted):
        raise ValueError(
            f"nodes {fold(unrecorded)} are simulated and their profile asks the multi-node stage for training, rails "
            "or collectives beside the all-reduce, which the recording does not answer: turn those off in the profile"
        )
    auto = [n.name for n in inventory.tested if is_auto(n.profile)]
    if auto and "preflight" not in stages:
        raise ValueError(
            f"nodes {fold(auto)} use profile auto, which the preflight stage resolves from each node's GPU model: "
            "add preflight to --stages, or name their built-in profile (e.g. profile: h100-sxm)"
        )


def _beyond_allreduce(node: Node) -> bool:
    probes = node.profile.probes
    return node.profile.training.enabled or bool(probes.rails) or bool(probes.collectives)


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
    concurrency: int = 64,
) -> RunOutcome:
    """Isolation only, on suspect nodes (and optional known-good ones): after a job saw a slow collective."""
    inventory = load_checked_inventory(inventory_path)
    refuse_unresolved_auto(inventory, [])
    suspect_nodes = select_nodes(inventory, suspects).tested
    good_nodes = select_nodes(inventory, good).tested if good else []
    scope = replace(inventory, nodes=suspect_nodes + [n for n in good_nodes if n not in suspect_nodes])
    run_dir, run_info = _start(scope, Path(out_dir), ["bisect"], run_id)
    history_path = history_dir(out_dir, history)
    state = new_state(scope, run_dir, history_path, False, concurrency)
    MULTI_NODE.bisect(state, suspect_nodes, good_nodes)
    write_tables(state, MULTI_NODE.tables)
    return finish(
        state,
        run_info,
        history_path,
        Operations(),
        ReportContext(reason_catalog(), discover_probes(), declared_links()),
    )


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
