"""What every stage shares: the run's state handed from stage to stage, the per-node fan-out with
checkpoints and progress, and what a stage is.

A stage is one module in ``tasks/`` that defines ``STAGE``, an object with:

- ``name`` (``preflight``, ``single-node``, ``multi-node``) and ``suites``
  (the scheduled suites it belongs to; ``light`` ones run with short probes);
- ``reasons()``, ``causes()`` and ``expectations()``: what its checks or probes declare (their reasons, the
  findings that explain theirs, the profile's keys they answer), gathered from them;
- ``run(state)``: which nodes it takes (usually those still accepted), the work per node — or per group — as
  Prefect tasks, resumed from checkpoints, and the cluster-wide evaluation; it adds rows, values,
  measurements and tables to ``state``.

The flow runs the chosen stages in the order :data:`tasks.stages.STAGES` lists them; timing, progress and
writing the tables live there, once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Any, Protocol, TypeVar, cast

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

from cluster_accept.analysis import coverage
from cluster_accept.analysis.calibration import NoiseTable
from cluster_accept.analysis.history import RunHistory, Trend
from cluster_accept.analysis.isolation import IsolationRow
from cluster_accept.analysis.scaling import ScalingRow, TrainingScalingRow
from cluster_accept.analysis.verdicts import is_accepted
from cluster_accept.checks.base import NodeRow
from cluster_accept.checks.base import discover as discover_checks
from cluster_accept.checks.declarations import Expectation, Link
from cluster_accept.checks.reasons import Reason
from cluster_accept.inventory.hostlist import fold
from cluster_accept.inventory.model import Inventory, Node
from cluster_accept.rundir.checkpoints import Checkpoints
from cluster_accept.rundir.outputs import RunDir
from cluster_accept.tasks.rows import node_row
from cluster_accept.vocabulary.rows import Measurement, NcclFact, NodeValue, Record, SettingRow

_T = TypeVar("_T")
_I = TypeVar("_I")


def unwalked(value: _T) -> _T:
    """A task argument Prefect passes through as it is. Unwrapped, Prefect walks every argument for futures
    before each task run (a node's profile, the list of checks): ~16 ms of controller CPU per task run, most
    of Prefect's cost per node."""
    return cast(_T, quote(value))


class StageProgress(Protocol):
    def start(self, stage: str, total: int) -> None: ...

    def advance(self, stage: str, done: int = 1) -> None: ...

    def finish(self, stage: str) -> None: ...


# Checks that judge the environment a job runs in (settings a fix-config repairs), not the node's hardware, as
# each declares (``Check.environment``): the node is still measured and its slow step is shown with the setting as
# its cause.
ENVIRONMENT_CHECKS = frozenset(check.name for check in discover_checks() if check.environment)


@dataclass
class RunTables:
    """The run's tables beyond its rows, values and figures, typed per table until they are written (each row's
    ``record()`` at the Parquet edge, and for the report)."""

    isolation: list[IsolationRow] = field(default_factory=list)
    scaling: list[ScalingRow] = field(default_factory=list)
    training_scaling: list[TrainingScalingRow] = field(default_factory=list)
    nccl: list[NcclFact] = field(default_factory=list)
    settings: list[SettingRow] = field(default_factory=list)  # what each probe run said it ran with
    # The thinned copy of each per-node series a probe declares (``Probe.series``: the burn's), by its table: what
    # the report charts; the whole series went to its own files as each node was judged.
    series: dict[str, list[Record]] = field(default_factory=dict)

    def records(self) -> dict[str, list[Mapping[str, Any]]]:
        """Every table by name, as records: what the report and the operations' files read (the one place the
        run's typed tables become records for them)."""
        typed = {f.name: [row.record() for row in getattr(self, f.name)] for f in fields(self) if f.name != "series"}
        return {**typed, **{table: [row.record() for row in rows] for table, rows in self.series.items()}}


@dataclass
class RunState:
    """Everything a run has gathered so far; each stage reads what it needs and adds its own part."""

    run_dir: RunDir
    inventory: Inventory
    checkpoints: Checkpoints
    progress: StageProgress
    history: RunHistory | None = None
    quick: bool = False
    concurrency: int = 64
    rows: list[NodeRow] = field(default_factory=list)
    values: list[NodeValue] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)
    tables: RunTables = field(default_factory=lambda: RunTables())  # isolation, scaling …
    trends: list[Trend] = field(default_factory=list)  # each node against its earlier runs

    @property
    def run_id(self) -> str:
        return self.run_dir.run_id

    @property
    def calibration(self) -> NoiseTable | None:
        """The cluster's noise table from the history (``cluster-accept calibrate``); None without either."""
        return self.history.noise if self.history is not None else None

    @property
    def cluster(self) -> str:
        return self.inventory.cluster

    def still_accepted(self) -> list[Node]:
        """Tested nodes with no failing row so far: what a later stage measures. Findings about the job's
        environment only (:data:`ENVIRONMENT_CHECKS`) do not stop a node: its hardware is still measured, so
        the report shows what the setting costs ("all-reduce 24.9 GB/s because NCCL_P2P_DISABLE=1"); the
        node stays rejected for the setting."""
        by_node: dict[str, list[NodeRow]] = {}
        for row in self.rows:
            if row.check not in ENVIRONMENT_CHECKS:
                by_node.setdefault(row.node, []).append(row)
        return [n for n in self.inventory.tested if is_accepted(by_node.get(n.name, []))]


class Stage(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def suites(self) -> frozenset[str]: ...

    @property
    def tables(self) -> tuple[str, ...]: ...  # the run's tables it adds to (written when it ends)

    def run(self, state: RunState) -> None: ...

    def reasons(self) -> list[tuple[str, Mapping[str, Reason]]]: ...

    def causes(self) -> tuple[Link, ...]: ...  # what explains its rows' findings, as its plug-ins declare

    def expectations(self) -> tuple[Expectation, ...]: ...  # what its rows answer of a profile


# Task runs per worker thread in a stage: enough that a slow node's chunk leaves the others work to take, few
# enough that Prefect's cost per task run (its states, events and records, ~17 ms of controller CPU) is paid per
# chunk of nodes, not per node. 8,192 nodes in one task run each flooded Prefect's event queue.
CHUNKS_PER_WORKER = 2


def chunks(nodes: Sequence[Node], workers: int) -> list[list[Node]]:
    """``nodes`` cut into consecutive chunks, at most ``CHUNKS_PER_WORKER × workers`` of them and of even
    sizes: one node per chunk while there are few nodes (a small cluster's task runs name a node each)."""
    if not nodes:
        return []
    size = math.ceil(len(nodes) / max(1, CHUNKS_PER_WORKER * workers))
    return [list(nodes[start : start + size]) for start in range(0, len(nodes), size)]


@task(name="nodes", task_run_name="{stage}-{label}", cache_policy=NO_CACHE, persist_result=False)
def node_chunk(
    stage: str, label: str, nodes: Sequence[Node], work: Callable[[Node], _T], done: Callable[[], None]
) -> list[_T]:
    """One task run for a chunk of a stage's nodes (``label``: their node set), each worked on in turn; ``work``
    never raises and keeps its own checkpoint, so what a chunk finished is on disk whatever follows."""
    outcomes = []
    for node in nodes:
        outcomes.append(work(node))
        done()
    return outcomes


def wave_of(nodes: Sequence[Node]) -> int | None:
    """How many of ``nodes`` are probed at once: the smallest ``probes.max_parallel_nodes`` of their profiles;
    None where no profile bounds it."""
    limits = [n.profile.probes.max_parallel_nodes for n in nodes if n.profile.probes.max_parallel_nodes]
    return max(1, min(limits)) if limits else None


def in_waves(items: Sequence[_I], node_of: Callable[[_I], Node], work: Callable[[_I], _T]) -> list[_T]:
    """``work`` on every item (each one node's), in threads, as many at once as :func:`wave_of` allows their
    nodes (all at once where no profile bounds it): what a probe stage measures again (a straggler, a node
    without its suspected settings) loads the nodes no more than the stage itself did. Results in ``items``
    order."""
    wave = wave_of([node_of(item) for item in items]) or len(items)
    with ThreadPoolExecutor(max_workers=max(1, min(wave, len(items)))) as pool:
        return list(pool.map(work, items))


def per_node(
    state: RunState,
    stage: str,
    nodes: Sequence[Node],
    saved: Mapping[str, _T],
    work: Callable[[Node], _T],
    wave: int | None = None,
) -> list[_T]:
    """Every node's outcome in ``nodes`` order: those in ``saved`` (a resumed run's checkpoints) as they
    were, the others by ``work`` in Prefect task runs over chunks of nodes (:func:`chunks`, ``state.concurrency``
    workers), ``wave`` nodes at a time when the profile bounds how many are probed at once; progress advances as
    each node finishes."""
    wanted = {n.name for n in nodes}
    done = {name: outcome for name, outcome in saved.items() if name in wanted}
    todo = [n for n in nodes if n.name not in done]
    state.progress.start(stage, len(nodes))
    state.progress.advance(stage, len(nodes) - len(todo))
    size = wave or max(1, len(todo))
    advance = unwalked(partial(state.progress.advance, stage))
    for start in range(0, len(todo), size):
        parts = chunks(todo[start : start + size], min(size, state.concurrency))
        futures = [
            node_chunk.submit(stage, fold([n.name for n in part]), unwalked(part), unwalked(work), advance)
            for part in parts
        ]
        for part, future in zip(parts, futures, strict=True):
            done.update((node.name, outcome) for node, outcome in zip(part, future.result(), strict=True))
    return [done[n.name] for n in nodes]


def run_stage(state: RunState, stage: Stage) -> None:
    """Run ``stage`` on the nodes still accepted, then hold it to the profile: an expectation the stage left
    without a row on a node it tested becomes a ``coverage:no_row`` error there, never a silent pass."""
    entering = [node.name for node in state.still_accepted()]
    stage.run(state)
    # the profiles after the stage: preflight puts ``profile: auto`` nodes on the profile their GPUs picked
    judged_by = {name: state.inventory.node(name).profile for name in entering}
    for node, expectation in coverage.missing(stage.name, judged_by, state.rows, stage.expectations()):
        row = coverage.gap_row(expectation)
        state.rows.append(node_row(state.run_id, state.inventory.cluster, stage.name, node, row))
