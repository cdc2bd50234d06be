"""What ``watch`` is asked to do: the options as a typed, JSON-able spec (what a served deployment keeps as its
parameters), and the request a watch runs on, resolved from it (the inventory read, the job's nodes found).

Resolving is where every usage and inventory error is found, before Prefect starts. Nothing here imports Prefect
or the analysis: the CLI loads this module at start-up, for every command."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from cluster_accept.inventory.hostlist import expand
from cluster_accept.inventory.load import from_slurm_names, select_nodes
from cluster_accept.inventory.model import Inventory, Node
from cluster_accept.ops.after_run import Operations
from cluster_accept.ops.slurm import SlurmJob, read_job
from cluster_accept.probes.base import load_checked_inventory
from cluster_accept.watch.rounds import DEFAULT_WATCH_DIR

if TYPE_CHECKING:
    from cluster_accept.watch.judge import WatchRules


class WatchSpec(BaseModel):
    """The watch's options; paths absolute where a served deployment runs them from another directory."""

    model_config = ConfigDict(extra="forbid")

    inventory: Path
    nodes: str | None = None  # inventory names (a hostlist); or
    slurm_job: str | None = None  # a Slurm job, its nodes asked of Slurm at each watch
    job: str | None = None  # the name the ranks were armed with (CA_WATCH_JOB); a Slurm job's id by default
    job_user: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")  # name or uid
    out_dir: Path = Path("runs")
    watch_dir: str = DEFAULT_WATCH_DIR
    interval_s: float = Field(default=5.0, ge=0.5)
    for_s: float = Field(default=600.0, ge=0)
    window_s: float = Field(default=60.0, ge=1)
    hang_after_s: float = Field(default=120.0, ge=1)
    until_named: bool = False
    retest: bool = True
    retest_wait_s: float = Field(default=600.0, ge=0)  # how long a re-test waits for the job to leave its nodes
    ras_port: int = Field(default=28028, ge=0, le=65535)  # NCCL RAS's port on the nodes; 0: RAS is not asked
    operations: Operations = Field(default_factory=Operations)
    history: str | None = None


@dataclass
class WatchRequest:
    """A spec resolved: the inventory and the job's nodes in it, the localization's rules."""

    spec: WatchSpec
    inventory: Inventory
    nodes: list[Node]
    job: str
    rules: WatchRules
    concurrency: int = 64
    record_limit: int = 1500  # collective records per rank per read: eight ranks stay under a read's 4 MB
    slurm: SlurmJob | None = None  # the Slurm job watched, read by field: its nodes and the user it runs as

    @property
    def job_user(self) -> str | None:
        """The user whose files alone the node readers trust (its job directory, rank files, sockets): given, else
        the Slurm job's uid; None lets a reader take the owner of the one job directory it finds."""
        if self.spec.job_user:
            return self.spec.job_user
        return str(self.slurm.user_id) if self.slurm is not None else None


# Job states in which Slurm no longer holds the job's nodes (squeue's %T; the JSON's job_state words).
ENDED_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PENDING",
    "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT",
})  # fmt: skip


def slurm_holds(request: WatchRequest, names: Sequence[str]) -> set[str]:
    """Which of ``names`` Slurm still runs the watched job on: the job's own files (its ranks' records) are its
    user's to write or remove, so a Slurm job has left a node only once Slurm says so too. A Slurm that cannot be
    asked holds every node (a re-test then waits, never measures under the job); a watch of ``--nodes`` has no
    Slurm job: nothing held here."""
    if request.slurm is None:
        return set()
    try:
        job = read_job(request.slurm.job_id, request.spec.operations.scontrol)
        if not job.nodes or set(job.state.split("+")) <= ENDED_STATES:
            return set()
        held = set(expand(from_slurm_names(request.inventory, job.nodes)))
    except ValueError:
        return set(names)
    return held & set(names)


def _selection(spec: WatchSpec) -> tuple[str, SlurmJob | None]:
    """(the inventory nodes to read, the Slurm job when one is watched) from ``nodes`` or ``slurm_job``. A
    Slurm job's nodes are the ones Slurm gives as its own field (:func:`ops.slurm.read_job`), never text its
    user wrote (its name, comment or output path)."""
    if (spec.nodes is None) == (spec.slurm_job is None):
        raise ValueError("give --nodes EXPR (with --job NAME) or --slurm-job ID")
    if spec.slurm_job is not None:
        job = read_job(spec.slurm_job, spec.operations.scontrol)
        return from_slurm_names(load_checked_inventory(spec.inventory), job.nodes_to_watch()), job
    return str(spec.nodes), None


def resolve(spec: WatchSpec) -> WatchRequest:
    """The request ``spec`` asks for; a ValueError (or the inventory's error) naming what is wrong."""
    from cluster_accept.watch.judge import WatchRules

    selected, slurm = _selection(spec)
    name = spec.job or (slurm.job_id if slurm else "")
    if not name:
        raise ValueError("give --job NAME: the job's name its ranks were armed with (CA_WATCH_JOB)")
    inventory = select_nodes(load_checked_inventory(spec.inventory), selected)
    if not inventory.nodes:
        raise ValueError("no node to watch")
    rules = WatchRules(window_s=spec.window_s, hang_after_s=spec.hang_after_s)
    return WatchRequest(spec, inventory, list(inventory.nodes), name, rules, slurm=slurm)
