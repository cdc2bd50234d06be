"""A run sharded over Prefect workers: the tested nodes split by a label (rack, pod) into shards, each an
acceptance run that a Prefect worker executes on its own controller host, merged into one run directory and
one report.

Why: one controller's SSH fan-out, CPU and memory grow with the cluster, and on many sites a rack or pod is
reached only from its own management host. Each shard is the ``acceptance`` flow itself, deployed by its
module path (every worker host has cluster-accept installed, nothing is shipped) to a work pool; with
``queue_per_shard`` each shard goes to the work queue named after its label value, so the worker started
for that rack (``prefect worker start --pool POOL --work-queue RACK``) runs it. Shards write under this run's
``shards/<key>/``: ``--out`` must be a directory every controller host sees (NFS, as run directories usually
are). The parent waits, reads every shard back (:mod:`flows.shard_results`) and finishes the run as one: verdicts,
report, history and Slurm operations happen once, here. A shard no worker starts within ``start_wait_s`` is
cancelled; a shard that fails, crashes or cannot be read gives its nodes ``tool:shard_not_finished`` rows.

Multi-node stages run within each shard (a rack's all-reduce); no collective spans shards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prefect import flow
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments import run_deployment
from prefect.deployments.runner import RunnerDeployment
from prefect.exceptions import ObjectNotFound
from prefect.settings import PREFECT_API_URL
from prefect.states import Cancelling
from prefect.types.entrypoint import EntrypointType

from cluster_accept.analysis.probe_verdicts import measurement_frame
from cluster_accept.flows import progress
from cluster_accept.flows.acceptance import TABLES, acceptance, new_state, run_choices, write_tables
from cluster_accept.flows.finish import ReportContext, RunOutcome, finish
from cluster_accept.flows.shard_results import (
    SHARD_CHECK,
    SHARD_REASONS,
    SHARDS_DIR,
    drift_across_shards,
    merge_shard,
    not_finished_rows,
    read_shard,
    shard_plan,
)
from cluster_accept.inventory.hostlist import fold
from cluster_accept.inventory.model import Inventory
from cluster_accept.ops.after_run import Operations
from cluster_accept.probes.base import discover as discover_probes
from cluster_accept.probes.base import load_checked_inventory
from cluster_accept.rundir.run import Run
from cluster_accept.tasks.single_node import STAGE as SINGLE_NODE
from cluster_accept.tasks.stage import RunState
from cluster_accept.tasks.stages import declared_links, reason_catalog

SHARD_DEPLOYMENT = "cluster-accept-shard"
POLL_S = 2.0
START_WAIT_S = 900.0  # a shard no worker has started after this long is cancelled and reported
_NOT_STARTED = (StateType.SCHEDULED, StateType.PENDING)


def require_server() -> str:
    """The Prefect API that workers poll; sharding cannot run on the ephemeral API of one process."""
    url = PREFECT_API_URL.value()
    if not url:
        raise ValueError(
            "--shard-by runs shards on Prefect workers, which need a Prefect server: set PREFECT_API_URL "
            "(e.g. http://prefect-host:4200/api) on this host and the workers' hosts"
        )
    return str(url)


def check_pool(client: SyncPrefectClient, pool: str) -> None:
    try:
        client.read_work_pool(pool)
    except ObjectNotFound:
        raise ValueError(
            f"work pool {pool!r} does not exist on {require_server()}: create it (prefect work-pool create {pool} "
            f"--type process) and start a worker per controller host (prefect worker start --pool {pool})"
        ) from None


def require_pool(pool: str) -> None:
    """The server is reachable and has ``pool``: checked before the run starts, as a usage error."""
    url = require_server()
    try:
        with get_client(sync_client=True) as client:
            check_pool(client, pool)
    except httpx.HTTPError as exc:
        raise ValueError(f"the Prefect server at {url} (PREFECT_API_URL) did not answer: {exc}") from None


def register_shard_deployment(pool: str) -> str:
    """The acceptance flow as the pool's shard deployment, by module path; its ``flow/deployment`` name."""
    deployment: RunnerDeployment = acceptance.to_deployment(  # type: ignore[assignment] # sync here
        name=SHARD_DEPLOYMENT,
        entrypoint_type=EntrypointType.MODULE_PATH,
        description="One shard of a sharded cluster-accept run (started by run --shard-by)",
        tags=["cluster-accept", "shard"],
    )
    deployment.apply(work_pool_name=pool)
    return f"{acceptance.name}/{SHARD_DEPLOYMENT}"


def ensure_queues(client: SyncPrefectClient, pool: str, names: list[str]) -> None:
    for name in names:
        try:
            client.read_work_queue_by_name(name, work_pool_name=pool)
        except ObjectNotFound:
            client.create_work_queue(name=name, work_pool_name=pool)


@dataclass
class Shard:
    key: str
    nodes: list[str]
    queue: str | None
    flow_run: FlowRun | None = None
    launched: float = 0.0
    ended: FlowRun | None = None
    why: str = ""  # what the parent did or saw, when the shard did not run to its end


def shard_parameters(request: dict[str, Any], shard: Shard, shards_dir: Path) -> dict[str, Any]:
    """The shard's acceptance run: this run's stages or suite, the shard's nodes, under ``shards_dir``."""
    return {
        **request,
        "out_dir": str(shards_dir),
        "nodes": fold(shard.nodes),
        "run_id": shard.key,
        "record_history": False,
    }


def launch(shards: list[Shard], name: str, parameters: dict[str, Any], run_id: str, shards_dir: Path) -> None:
    for shard in shards:
        shard.flow_run = run_deployment(  # type: ignore[assignment] # sync here
            name,
            parameters=shard_parameters(parameters, shard, shards_dir),
            flow_run_name=f"{run_id}-{shard.key}",
            timeout=0,
            work_queue_name=shard.queue,
            tags=["cluster-accept", "shard"],
            idempotency_key=f"{run_id}/{shard.key}",
        )
        shard.launched = time.monotonic()


def _still_waiting(client: SyncPrefectClient, shard: Shard, pool: str, start_wait_s: float) -> bool:
    """Whether ``shard`` is still to be watched; a shard never started within ``start_wait_s`` is cancelled."""
    assert shard.flow_run is not None
    now = client.read_flow_run(shard.flow_run.id)
    if now.state is not None and now.state.is_final():
        shard.ended = now
        return False
    if now.state_type in _NOT_STARTED and time.monotonic() - shard.launched > start_wait_s:
        where = f"work queue {shard.queue!r} of pool {pool!r}" if shard.queue else f"work pool {pool!r}"
        shard.why = f"no worker of {where} started it within {start_wait_s:.0f} s; it was cancelled"
        cancel(client, [shard])
        shard.ended = now
        return False
    return True


def wait(client: SyncPrefectClient, shards: list[Shard], pool: str, start_wait_s: float) -> None:
    """Until every shard ended or was given up; each end advances the progress bar."""
    bar = progress.current()
    bar.start(SHARDS_DIR, len(shards))
    waiting = list(shards)
    try:
        while waiting:
            still = [s for s in waiting if _still_waiting(client, s, pool, start_wait_s)]
            bar.advance(SHARDS_DIR, len(waiting) - len(still))
            waiting = still
            if waiting:
                time.sleep(POLL_S)
    except BaseException:
        cancel(client, waiting)  # interrupted: no shard keeps running for a run nobody will merge
        raise
    bar.finish(SHARDS_DIR)


def cancel(client: SyncPrefectClient, shards: list[Shard]) -> None:
    for shard in shards:
        if shard.flow_run is not None:
            client.set_flow_run_state(shard.flow_run.id, Cancelling(message="cancelled by its sharded run"), force=True)


def _state_said(shard: Shard) -> str:
    if shard.ended is None or shard.ended.state is None:
        return "no state"
    state = shard.ended.state
    said = f"flow run {shard.ended.name} {state.name}"
    return f"{said}: {state.message}" if state.message else said


def merge(state: RunState, shards: list[Shard], shards_dir: Path, sharded: dict[str, Any]) -> None:
    """Every shard's results into the run's state, and how each ended into ``sharded`` (``run.json``'s record of
    the shards); a shard without results gives its nodes their rows."""
    recorded = sharded["shards"]
    for shard in shards:
        found = read_shard(shards_dir / shard.key)
        entry = recorded[shard.key]
        entry["state"] = _state_said(shard)
        entry["flow_run_id"] = str(shard.flow_run.id) if shard.flow_run else None
        if isinstance(found, str):
            why = shard.why or f"{_state_said(shard)}; {found}"
            state.rows += not_finished_rows(state, shard.nodes, shard.key, why)
            entry["error"] = why
            continue
        entry["controller"] = found.info.get("controller")
        entry["stage_seconds"] = found.info.get("stage_seconds", {})
        merge_shard(state, found, shards_dir / shard.key)


@dataclass
class ShardSetup:
    """What a sharded run makes of its refused selection before its directory exists: the shards, one per value of
    the label ``by`` (a node without it is refused), their work queues and the deployment that runs them; what it
    returns is the ``sharded`` record of ``run.json``."""

    client: SyncPrefectClient
    by: str
    work_pool: str
    queue_per_shard: bool
    shards: list[Shard] = field(default_factory=list)
    deployment: str = ""

    def __call__(self, inventory: Inventory) -> dict[str, Any]:
        plan = shard_plan(inventory, self.by)
        self.shards = [Shard(key, names, key if self.queue_per_shard else None) for key, names in plan.items()]
        check_pool(self.client, self.work_pool)
        if self.queue_per_shard:
            ensure_queues(self.client, self.work_pool, list(plan))
        self.deployment = register_shard_deployment(self.work_pool)
        recorded = {s.key: {"nodes": fold(s.nodes), "queue": s.queue} for s in self.shards}
        return {"sharded": {"by": self.by, "work_pool": self.work_pool, "shards": recorded}}


@flow(name="acceptance-sharded", log_prints=False)
def sharded_acceptance(
    inventory_path: str,
    shard_by: str,
    work_pool: str,
    out_dir: str = "runs",
    stages: list[str] | None = None,
    suite: str | None = None,
    nodes: str | None = None,
    run_id: str | None = None,
    history: str | None = None,
    operations: Operations | None = None,
    concurrency: int = 64,
    queue_per_shard: bool = False,
    start_wait_s: float = START_WAIT_S,
) -> RunOutcome:
    """The run over the inventory's tested nodes, one shard per value of the node label ``shard_by``, each run
    by a worker of ``work_pool``; merged into ``out_dir/<run_id>`` (``out_dir`` shared by the workers' hosts)."""
    require_server()
    ops = operations or Operations()
    choices = run_choices(inventory_path, out_dir, stages, suite, nodes, history, ops, concurrency)
    with get_client(sync_client=True) as client:
        setup = ShardSetup(client, shard_by, work_pool, queue_per_shard)
        run = Run.begin(choices, load_checked_inventory, Path(out_dir), run_id, setup)
        shards, name = setup.shards, setup.deployment
        history_path, chosen, quick = choices.history, choices.stages, choices.quick
        run_dir, record = run.directory, run.record
        shards_dir = (run_dir.path / SHARDS_DIR).resolve()
        parameters = {
            "inventory_path": str(Path(inventory_path).resolve()),
            "stages": None if suite else chosen,
            "suite": suite,
            "history": str(history_path.resolve()) if history_path else "-",
            "concurrency": concurrency,
        }
        began = time.perf_counter()
        launch(shards, name, parameters, run_dir.run_id, shards_dir)
        wait(client, shards, work_pool, start_wait_s)
    state = new_state(run.inventory, run_dir, history_path, quick, concurrency)
    merge(state, shards, shards_dir, record.sharded or {})
    record.stage_seconds = {SHARDS_DIR: round(time.perf_counter() - began, 3)}
    state.rows += drift_across_shards(state, {s.key: s.nodes for s in shards})
    write_tables(state, tuple(TABLES))
    state.trends = SINGLE_NODE.trend_records(state, measurement_frame(state.measurements))
    reasons = reason_catalog([(SHARD_CHECK, SHARD_REASONS)])
    return finish(state, record, history_path, ops, ReportContext(reasons, discover_probes(), declared_links()))
