"""What the multi-node stage's helpers (the training sweep, the per-rail and collective runs) need of the stage
that drives them (:class:`tasks.multi_node.stage._Stage`): its outcome so far, how it launches a group, records rows
and isolates a slow node. Named here, below the stage, so that they read it without importing it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from cluster_accept.analysis.isolation import IsolationPolicy, IsolationRow, IsolationVerdict
from cluster_accept.analysis.scaling import ScalingRow, TrainingScalingRow
from cluster_accept.checks.base import CheckRow, NodeRow
from cluster_accept.inventory.model import Node
from cluster_accept.remote.launch import GroupJob, GroupRun
from cluster_accept.vocabulary.rows import Measurement, NcclFact


@dataclass
class MultiNodeOutcome:
    """What the multi-node stage found: its rows, figures, isolation groups, scaling tables and verdict."""

    rows: list[NodeRow] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)
    isolation: list[IsolationRow] = field(default_factory=list)
    scaling: list[ScalingRow] = field(default_factory=list)
    training_scaling: list[TrainingScalingRow] = field(default_factory=list)
    verdict: IsolationVerdict | None = None
    nccl: list[NcclFact] = field(default_factory=list)  # NCCL's account of every rank's run


class GroupStage(Protocol):
    """The multi-node stage as its helpers see it."""

    run_id: str
    unreachable: set[str]
    out: MultiNodeOutcome

    @property
    def cluster(self) -> str: ...

    def launch(self, nodes: Sequence[Node], job: GroupJob) -> GroupRun: ...

    def row(self, node: str, row: CheckRow, raw: str = "") -> None: ...

    def rows_from(self, rows: list[CheckRow], nodes: Sequence[Node]) -> None: ...

    def failed_run(self, run: GroupRun, check: str = ..., what: str = ...) -> None: ...

    def isolate_with(
        self,
        nodes: list[Node],
        job: GroupJob,
        figure: Callable[[GroupRun], float | None],
        policy: IsolationPolicy,
        item: str,
        known_good: Iterable[str] = ...,
        reason: str = ...,
        named: Callable[[str], str] = ...,
    ) -> IsolationVerdict: ...
