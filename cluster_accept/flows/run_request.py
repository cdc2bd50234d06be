"""What ``run`` (and ``demo``) were asked to do, every usage and inventory error found before Prefect starts,
and the run itself: on this controller, or sharded over Prefect workers (:mod:`flows.sharding`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cluster_accept.inventory.load import from_slurm_names
from cluster_accept.inventory.model import Inventory
from cluster_accept.ops.after_run import Operations
from cluster_accept.probes.base import load_checked_inventory

if TYPE_CHECKING:
    from cluster_accept.flows.finish import RunOutcome


@dataclass
class RunRequest:
    """What ``run`` (and ``demo``) were asked to do."""

    inventory: Path | None
    out_dir: Path = Path("runs")
    nodes: str | None = None
    stages: list[str] | None = None
    concurrency: int = 64
    history: str | None = None
    resume: str | None = None
    suite: str | None = None
    operations: Operations = field(default_factory=Operations)
    slurm_nodes: str | None = None  # the nodes by their Slurm names (a job's SLURM_JOB_NODELIST)
    local: bool = False  # the one selected node is this machine: no SSH
    shards: ShardRequest | None = None  # split over Prefect workers by a node label
    run_id: str | None = None  # the new run's id (default: one made when it starts)


@dataclass
class ShardRequest:
    """``run --shard-by LABEL --work-pool POOL``: one shard per label value, each run by a Prefect worker."""

    by: str
    work_pool: str | None
    queue_per_shard: bool = False
    start_wait_s: float = 900.0


def check_request(request: RunRequest) -> None:
    """Every usage and inventory error before Prefect starts (~10 s), each as one clear line."""
    from cluster_accept.analysis.calibration import latest_table
    from cluster_accept.flows.acceptance import run_choices
    from cluster_accept.rundir.run import refuse_resume
    from cluster_accept.tasks.stages import STAGE_NAMES

    if request.resume:
        selection = request.inventory or request.nodes or request.stages or request.suite or request.slurm_nodes
        options = request.history or request.operations != Operations() or request.concurrency != RunRequest.concurrency
        given = bool(selection or request.local or request.shards), bool(options)
        refuse_resume(request.out_dir, request.resume, STAGE_NAMES, load_checked_inventory, *given)
        return
    if request.inventory is None:
        raise ValueError("give --inventory FILE (or --resume RUN_ID to finish an interrupted run)")
    if request.slurm_nodes is not None:
        if request.nodes:
            raise ValueError("give --nodes or --slurm-nodes, not both")
        request.nodes = from_slurm_names(load_checked_inventory(request.inventory), request.slurm_nodes)
    choices = run_choices(
        request.inventory,
        request.out_dir,
        request.stages,
        request.suite,
        request.nodes,
        request.history,
        request.operations,
        request.concurrency,
        request.local,
    )
    inventory = choices.selection(load_checked_inventory)  # the refusals the run begins with, before Prefect starts
    if request.shards is not None:
        check_shards(request.shards, request.local, inventory)
    if choices.history is not None:
        latest_table(choices.history, inventory.cluster)  # a calibration that does not hold up: named before any stage
    why = unwritable(request.out_dir)
    if why:
        raise ValueError(f"cannot write run directories under {request.out_dir}: {why}")


def check_shards(shards: ShardRequest, local: bool, inventory: Inventory) -> None:
    """A sharded run's errors, on the selected nodes (``--nodes`` or ``--slurm-nodes`` already applied)."""
    from cluster_accept.flows.shard_results import shard_plan
    from cluster_accept.flows.sharding import require_pool

    if local:
        raise ValueError("--local checks this machine itself: it cannot be sharded (--shard-by)")
    if not shards.work_pool:
        raise ValueError("--shard-by needs --work-pool POOL: the Prefect work pool whose workers run the shards")
    require_pool(shards.work_pool)
    shard_plan(inventory, shards.by)


def outcome_of(request: RunRequest) -> RunOutcome:
    """The run itself: on this controller, or sharded over Prefect workers."""
    from cluster_accept.flows.acceptance import run_acceptance
    from cluster_accept.flows.sharding import sharded_acceptance

    if request.shards is not None:
        return sharded_acceptance(
            inventory_path=str(request.inventory),
            shard_by=request.shards.by,
            work_pool=str(request.shards.work_pool),
            out_dir=str(request.out_dir),
            stages=request.stages,
            suite=request.suite,
            nodes=request.nodes,
            history=request.history,
            operations=request.operations,
            concurrency=request.concurrency,
            queue_per_shard=request.shards.queue_per_shard,
            start_wait_s=request.shards.start_wait_s,
        )
    return run_acceptance(
        request.inventory or "",
        request.out_dir,
        request.stages,
        request.nodes,
        concurrency=request.concurrency,
        history=request.history,
        resume=request.resume,
        suite=request.suite,
        operations=request.operations,
        local=request.local,
        run_id=request.run_id,
    )


def unwritable(out_dir: Path) -> str | None:
    """Why run directories cannot be written under ``out_dir`` (None when they can): checked before any
    node is touched, so a read-only or full disk is one clear line, not a traceback after an hour."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        return exc.strerror or str(exc)
    return None
