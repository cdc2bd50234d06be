"""The multi-node stage: a scaling sweep of all-reduce across 2, 4, 8, … nodes, the transport NCCL used
between nodes, and — when a run underperforms — isolation of the node (or pair) to pull, round by round.

The sweep answers "does the cluster scale"; isolation answers "which node makes it not scale". Isolation
plans are made by :mod:`analysis.isolation` (pure); this module only runs the groups each round asks for,
in parallel (disjoint groups), and turns the outcome into rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext

from cluster_accept.analysis import between_nodes, suspects
from cluster_accept.analysis.isolation import (
    GroupResult,
    IsolationPolicy,
    IsolationRow,
    IsolationVerdict,
    Isolator,
    drive,
    to_rows,
)
from cluster_accept.analysis.nccl_account import NcclRun, read_account
from cluster_accept.analysis.scaling import (
    ScalingPoint,
    ScalingRow,
    StepVerdict,
    TrainingScalingRow,
    judge_steps,
    scaling_table,
    sweep_sizes,
)
from cluster_accept.analysis.suspects import JobSetting
from cluster_accept.checks.base import CheckRow, NodeRow, Status
from cluster_accept.checks.declarations import Expectation, Link
from cluster_accept.checks.reasons import Action, FindingKind, Reason, declare
from cluster_accept.inventory.hostlist import fold
from cluster_accept.inventory.model import Inventory, Node
from cluster_accept.probes.training import train_arguments
from cluster_accept.remote.launch import GroupJob, GroupRun
from cluster_accept.remote.ssh_launcher import DEFAULT_CONCURRENCY
from cluster_accept.tasks.multi_node.group_rows import (
    GROUP_REASONS,
    failed_run_rows,
    probe_error_rows,
    teardown_rows,
    transport_rows,
)
from cluster_accept.tasks.multi_node.group_stage import MultiNodeOutcome
from cluster_accept.tasks.multi_node.prove import prove_between, rank_settings
from cluster_accept.tasks.multi_node.rails import REASONS as RAIL_REASONS
from cluster_accept.tasks.multi_node.rails import collective_rows, collectives_not_reached, rail_runs
from cluster_accept.tasks.multi_node.ranks import ALLREDUCE_JOB, COLLECTIVES_JOB, launch_groups
from cluster_accept.tasks.multi_node.slow_together import REASON as SLOW_TOGETHER
from cluster_accept.tasks.multi_node.slow_together import slow_together_rows
from cluster_accept.tasks.multi_node.training_sweep import REASONS as TRAINING_REASONS
from cluster_accept.tasks.multi_node.training_sweep import isolate_training, training_sweep
from cluster_accept.tasks.rows import node_row, unreachable_row
from cluster_accept.tasks.stage import RunState, unwalked
from cluster_accept.vocabulary.rows import Measurement, NcclFact

NAME = "multi-node"


def _policy(nodes: Sequence[Node]) -> IsolationPolicy:
    thresholds = nodes[0].profile.thresholds
    return IsolationPolicy(
        min_busbw_gbps=thresholds.allreduce_inter_busbw_gbps_min,
        straggler_pct=thresholds.straggler_pct,
    )


@task(name="multi-node", task_run_name="multi-node-{label}", cache_policy=NO_CACHE, persist_result=False)
def multi_node_round(
    groups: Sequence[Sequence[Node]], concurrency: int, label: str, job: GroupJob = ALLREDUCE_JOB
) -> list[GroupRun]:
    """One round of the multi-node stage: disjoint groups launched at once (``label`` names them)."""
    return launch_groups(groups, concurrency, job=job)


class _Stage:
    def __init__(self, run_id: str, inventory: Inventory, concurrency: int = DEFAULT_CONCURRENCY) -> None:
        self.run_id = run_id
        self.inventory = inventory
        self.concurrency = concurrency  # SSH operations in flight at once, for all groups of a round together
        self.out = MultiNodeOutcome()
        self.unreachable: set[str] = set()
        self.steps: list[StepVerdict] = []  # the all-reduce sweep's, with the nodes of each step's group
        self.groups: dict[int, list[Node]] = {}
        self.settings: dict[str, list[JobSetting]] = {}  # what each node's first rank ran with (job_settings.py)

    @property
    def cluster(self) -> str:
        return self.inventory.cluster

    def row(self, node: str, row: CheckRow, raw: str = "") -> None:
        self.out.rows.append(node_row(self.run_id, self.inventory.cluster, NAME, node, row, raw))

    def launch(self, nodes: Sequence[Node], job: GroupJob = ALLREDUCE_JOB) -> GroupRun:
        return self.launch_round([nodes], job)[0]

    def launch_round(self, groups: Sequence[Sequence[Node]], job: GroupJob = ALLREDUCE_JOB) -> list[GroupRun]:
        """Disjoint groups at once, all their ranks under the stage's one bound; rows in group order. Inside a
        flow run each round is a Prefect task run (``multi-node-<groups>``), like every other stage's work."""
        label = " ".join(fold([n.name for n in nodes]) for nodes in groups)
        if FlowRunContext.get() is None:
            runs = launch_groups(groups, self.concurrency, job=job)
        else:
            runs = multi_node_round.submit(
                unwalked(groups), self.concurrency, f"{job.name} {label}", unwalked(job)
            ).result()
        for nodes, run in zip(groups, runs, strict=True):
            self._record(nodes, run, job)
        return runs

    def _record(self, nodes: Sequence[Node], run: GroupRun, job: GroupJob) -> None:
        group = fold(run.nodes)
        for name, rank in run.ranks.items():
            if rank.cause is not None and name not in self.unreachable:
                self.unreachable.add(name)
                self.row(name, unreachable_row(rank.cause, rank.detail))
        for name, row in teardown_rows(run, job.check) + probe_error_rows(run, job.check):
            self.row(name, row)
        for name, rank in run.ranks.items():
            if rank.result is not None and name not in self.settings:
                self.settings[name] = rank_settings(rank)
        for name, rank in run.ranks.items():  # NCCL's own account of each rank's part, whatever the run's outcome
            if rank.result is not None:
                where = NcclRun(self.run_id, self.cluster, NAME, name, job.name, group)
                self.out.nccl += read_account(rank.result.stdout, where)
        if not job.collective:
            return  # the job's own sweep reads its figures and transports
        for record in run.measurements:
            between = ",".join(sorted(t for t in run.transports if t.startswith("NET/"))) or None
            # which run measured it (allreduce, collectives, rail0 …), and the transport NCCL used between nodes
            figure = replace(record, probe=job.name, transport=between, group=group)
            placed = (self.run_id, self.inventory.cluster, NAME, nodes[0].name, nodes[0].profile_name)
            self.out.measurements.append(Measurement.of(figure, *placed))
        for name, rank in run.ranks.items():
            if rank.ok and rank.result is not None:
                self._transport(self.inventory.node(name), rank.result.stdout, group)

    def _transport(self, node: Node, log: str, group: str) -> None:
        for row in transport_rows(node, log, group):
            self.row(node.name, row)

    def rows_from(self, rows: list[CheckRow], nodes: Sequence[Node]) -> None:
        """The same rows (a group's finding) on every node of the group."""
        for node in nodes:
            for row in rows:
                self.row(node.name, row)

    def failed_run(self, run: GroupRun, check: str = "allreduce", what: str = "all-reduce") -> None:
        for name, row, raw in failed_run_rows(run, check, what):
            self.row(name, row, raw)

    def sweep(self, nodes: list[Node]) -> bool:
        """Scaling sweep; True when isolation is needed: a run failed, or a step is below the profile's floor,
        below what the cluster's own smaller groups achieved (beyond ``straggler_pct``), or below the minimum
        scaling efficiency. Every step is a judged row on each node of its group."""
        points, trouble, groups = [], False, {}
        thresholds = nodes[0].profile.thresholds
        sizes = sweep_sizes(len(nodes))
        for size in sizes:
            group = [n for n in nodes if n.name not in self.unreachable][:size]
            if len(group) < size:
                break
            # the largest group also measures the profile's other collectives (once, where it costs least)
            largest = size == sizes[-1] and bool(group[0].profile.probes.collectives)
            run = self.launch(group, COLLECTIVES_JOB if largest else ALLREDUCE_JOB)
            if largest:
                self.rows_from(collective_rows(run, group[0].profile), group)
            if run.busbw_gbps is None:
                self.failed_run(run)
                trouble = True
                continue
            gpus = (run.measurements[-1].world_size or size) // size
            points.append(ScalingPoint(nodes=size, busbw_gbps=run.busbw_gbps, gpus_per_node=max(1, gpus)))
            groups[size] = group
        collectives_not_reached(self, nodes)
        table = scaling_table(points, thresholds.scaling_efficiency_min)
        self.out.scaling = [replace(r, run_id=self.run_id, cluster=self.inventory.cluster) for r in table.rows]
        steps = judge_steps(
            points,
            thresholds.allreduce_inter_busbw_gbps_min,
            thresholds.straggler_pct,
            thresholds.scaling_efficiency_min,
        )
        self.steps, self.groups = steps, groups  # what isolation could not pin on a node fails together
        for step in steps:
            status = Status.PASS if step.ok else Status.WARN  # the group's symptom: isolation names the node
            observed = f"{step.busbw_gbps:.3g} GB/s"
            row = CheckRow("scaling", f"{step.nodes} nodes", status, step.reason, observed, step.expected, step.detail)
            if step.ok and step.expected == "completed":  # no floor, no smaller group, no efficiency: unjudged
                unset = "none: set thresholds.allreduce_inter_busbw_gbps_min"
                row = replace(row, status=Status.NOT_JUDGED, reason="no_expectation", expected=unset)
            for node in groups[step.nodes]:
                self.row(node.name, row)
        # Nodes no completed group measured, and no failed group's row names: skipped, with why.
        answered = {n.name for g in groups.values() for n in g} | self.unreachable
        answered |= {r.node for r in self.out.rows if r.check == "allreduce"}
        for node in nodes:
            if node.name not in answered:
                said = "no sweep group completed with this node (see the failed groups)"
                self.row(node.name, CheckRow("scaling", "sweep", Status.SKIP, "not_reached", None, None, said))
        return trouble or any(not s.ok for s in steps)

    def isolate(self, nodes: list[Node], known_good: Iterable[str] = ()) -> None:
        """Isolation by all-reduce groups: the node or pair that slows the collective."""
        figure: Callable[[GroupRun], float | None] = lambda run: run.busbw_gbps  # noqa: E731
        self.out.verdict = self.isolate_with(
            nodes, ALLREDUCE_JOB, figure, _policy(nodes), "allreduce_inter", known_good
        )

    def isolate_with(
        self,
        nodes: list[Node],
        job: GroupJob,
        figure: Callable[[GroupRun], float | None],
        policy: IsolationPolicy,
        item: str,
        known_good: Iterable[str] = (),
        reason: str = "slow_node",
        named: Callable[[str], str] = str,
    ) -> IsolationVerdict:
        """Adaptive group testing with ``job`` runs judged by ``figure`` (higher is better); rows under
        ``isolation`` with ``item`` naming the signal."""
        by_name = {n.name: n for n in self.inventory.nodes}
        candidates = [n.name for n in nodes if n.name not in self.unreachable]
        isolator = Isolator(candidates, policy, known_good=known_good)

        def run_round(groups: list[tuple[str, ...]]) -> list[GroupResult]:
            """One round: its disjoint groups launched at once."""
            runs = self.launch_round([[by_name[name] for name in g] for g in groups], job)
            return [GroupResult(tuple(g), figure(r)) for g, r in zip(groups, runs, strict=True)]

        verdict = drive(isolator, run_round)
        run_id, cluster = self.run_id, self.inventory.cluster
        self.out.isolation += [
            replace(r, signal=job.name, run_id=run_id, cluster=cluster) for r in to_rows(isolator.rounds)
        ]
        for name in verdict.bad_nodes:
            if name not in self.unreachable:
                self.row(name, CheckRow("isolation", item, Status.FAIL, reason, named(name), None, verdict.detail))
        for a, b in verdict.bad_pairs:
            for name in (a, b):
                row = CheckRow("isolation", item, Status.WARN, "slow_pair", f"{a}+{b}", None, verdict.detail)
                self.row(name, row)
        for name in verdict.unresolved:
            if name not in self.unreachable:
                self.row(name, CheckRow("isolation", item, Status.WARN, "unresolved", None, None, verdict.detail))
        return verdict

    def train(self, nodes: list[Node]) -> None:
        """The training sweep on the nodes that trained alone and that isolation did not pull; isolation with
        training runs when it scales badly."""
        bad = set(self.out.verdict.bad_nodes) if self.out.verdict else set()
        chosen = [n for n in nodes if n.profile.training.enabled and n.name not in bad | self.unreachable]
        if not chosen:
            return
        # Ranks of one run must train one model the same way: nodes whose profiles differ sweep apart.
        groups: dict[tuple[str, str], list[Node]] = {}
        for node in chosen:
            groups.setdefault((train_arguments(node, False), node.profile.probes.device), []).append(node)
        for group in groups.values():
            scaling, trouble = training_sweep(self, group)
            self.out.training_scaling += scaling
            if trouble:
                isolate_training(self, group, scaling)


def run_multi_node(
    run_id: str, inventory: Inventory, nodes: list[Node], concurrency: int = DEFAULT_CONCURRENCY
) -> MultiNodeOutcome:
    """Sweep, then isolate when the sweep says so; at most ``concurrency`` SSH operations in flight."""
    stage = _Stage(run_id, inventory, concurrency)
    if len(nodes) < 2:
        for node in nodes:
            stage.row(node.name, CheckRow("allreduce", "inter_node", Status.SKIP, "fewer_than_two_nodes", None, None))
            if node.profile.training.enabled:
                said = "one node: the single-node stage measured its training"
                stage.row(
                    node.name,
                    CheckRow("training_scaling", "sweep", Status.SKIP, "fewer_than_two_nodes", None, None, said),
                )
        return stage.out
    if stage.sweep(nodes):
        stage.isolate(nodes)
        for name, row in slow_together_rows(stage.steps, stage.groups, stage.out.verdict, stage.out.measurements):
            stage.row(name, row)
        prove_between(stage, nodes)
    rail_runs(stage, nodes)
    stage.train(nodes)
    return stage.out


def run_bisect(
    run_id: str,
    inventory: Inventory,
    suspects: list[Node],
    known_good: list[Node],
    concurrency: int = DEFAULT_CONCURRENCY,
) -> MultiNodeOutcome:
    """Isolation only, on nodes an operator suspects (after a job reported a slow collective)."""
    stage = _Stage(run_id, inventory, concurrency)
    stage.isolate(suspects + known_good, known_good=[n.name for n in known_good])
    return stage.out


REASONS = {
    "scaling": declare(
        Reason(
            "below_min",
            Status.WARN,
            "this group's all-reduce is below the profile's floor: isolation names the node or pair to blame",
            Action.RERUN,
            kind=FindingKind.RELATIVE,
        ),
        Reason(
            "below_smaller_groups",
            Status.WARN,
            "this group is far below what its smaller groups achieved (beyond straggler_pct): a slow node or "
            "link joined it; isolation names it",
            Action.RERUN,
            kind=FindingKind.RELATIVE,
        ),
        Reason(
            "efficiency_low",
            Status.WARN,
            "scaling efficiency against the 2-node run is below the profile's minimum: isolation looks for the cause",
            Action.RERUN,
            kind=FindingKind.RELATIVE,
        ),
        Reason("not_reached", Status.SKIP, "no sweep group completed with this node, so it was not measured here"),
        SLOW_TOGETHER,
    ),
    "isolation": declare(
        Reason(
            "slow_node",
            Status.FAIL,
            "slows every group it joins (all-reduce or training runs, as the item says): check its HCAs, cables "
            "and NCCL's transport",
            Action.RESEAT_CABLE,
            kind=FindingKind.RELATIVE,
        ),
        Reason(
            "slow_rail",
            Status.FAIL,
            "slows every group on this rail and only on it: this node's NIC, transceiver or cable of that rail (the "
            "item names the rail, the value its NIC); reseat it, then swap the optic",
            Action.RESEAT_CABLE,
            kind=FindingKind.RELATIVE,
        ),
        Reason(
            "slow_pair",
            Status.WARN,
            "slow only with one partner: check the link (and switch path) between the two",
            Action.RESEAT_CABLE,
            kind=FindingKind.RELATIVE,
        ),
        Reason(
            "unresolved",
            Status.WARN,
            "isolation could not tell which node: bisect again with known-good nodes (--good)",
            Action.RERUN,
            kind=FindingKind.RELATIVE,
        ),
    ),
    suspects.NAME: suspects.REASONS,
    **GROUP_REASONS,
    **TRAINING_REASONS,
    **RAIL_REASONS,
}


@dataclass(frozen=True)
class SavedOutcome:
    """The stage's checkpoint: what its outcome adds to the run (its verdict only drove the stage), read back
    through the checkpoints' codec, so a saved file of another shape counts as not saved."""

    rows: list[NodeRow]
    measurements: list[Measurement]
    isolation: list[IsolationRow]
    scaling: list[ScalingRow]
    training_scaling: list[TrainingScalingRow] = field(default_factory=list)
    nccl: list[NcclFact] = field(default_factory=list)

    @classmethod
    def of(cls, outcome: MultiNodeOutcome) -> SavedOutcome:
        o = outcome
        return cls(o.rows, o.measurements, o.isolation, o.scaling, o.training_scaling, o.nccl)

    def outcome(self) -> MultiNodeOutcome:
        s = self
        return MultiNodeOutcome(s.rows, s.measurements, s.isolation, s.scaling, s.training_scaling, nccl=s.nccl)


class MultiNodeStage:
    """All-reduce across 2, 4, 8 … of the nodes still accepted, scaling efficiency, the transport between
    nodes, and isolation of the node to pull when a run underperforms. Driven as one sequence (each round
    depends on the last), checkpointed whole when it completes; its group runs share ``--concurrency``."""

    name = NAME
    suites = frozenset({"full"})
    tables = ("checks", "measurements", "isolation", "scaling", "training_scaling", "nccl")

    def run(self, state: RunState) -> None:
        state.progress.start(NAME, 1)
        saved = state.checkpoints.load_stage(NAME, SavedOutcome)
        if saved is not None:
            outcome = saved.outcome()
        else:
            outcome = run_multi_node(state.run_id, state.inventory, state.still_accepted(), state.concurrency)
            state.checkpoints.save_stage(NAME, SavedOutcome.of(outcome))
        self._add(state, outcome)
        state.progress.advance(NAME)

    def bisect(self, state: RunState, suspects: list[Node], known_good: list[Node]) -> None:
        """Isolation only, on nodes an operator suspects (``cluster-accept bisect``)."""
        self._add(state, run_bisect(state.run_id, state.inventory, suspects, known_good, state.concurrency))

    @staticmethod
    def _add(state: RunState, outcome: MultiNodeOutcome) -> None:
        state.rows += outcome.rows
        state.measurements += outcome.measurements
        state.tables.isolation = list(outcome.isolation)
        state.tables.scaling = list(outcome.scaling)
        state.tables.training_scaling = list(outcome.training_scaling)
        state.tables.nccl.extend(outcome.nccl)

    def reasons(self) -> list[tuple[str, Mapping[str, Reason]]]:
        return list(REASONS.items())

    def causes(self) -> tuple[Link, ...]:
        return suspects.causes(suspects.BETWEEN_NODES_SYMPTOMS, NAME) + between_nodes.CAUSES

    def expectations(self) -> tuple[Expectation, ...]:
        return between_nodes.EXPECTATIONS


STAGE = MultiNodeStage()
