"""Training across nodes: the profile's model at 1, 2, 4 … N nodes, tokens/s per GPU and scaling efficiency.

All-reduce bandwidth can look healthy while training scales at 21% (seed 002): what a cluster is bought for
is measured here, with the same model the single-node stage trains. The one-node run is the baseline (same
model, same GPUs per node); each larger run keeps ``efficiency`` of its per-GPU tokens/s. A step below the
profile's ``training_scaling_efficiency_min``, or a run that fails, makes the stage isolate with training
groups (adaptive pairs, :mod:`analysis.isolation`); when no node or pair is to blame, every node of the slow
steps fails with why: the fabric or NCCL's configuration, not a node, loses the throughput.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from cluster_accept.analysis.isolation import IsolationPolicy
from cluster_accept.analysis.scaling import TrainingScalingRow, sweep_sizes
from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.checks.reasons import Action, FindingKind, Reason, declare
from cluster_accept.inventory.hostlist import expand, fold
from cluster_accept.inventory.model import Node
from cluster_accept.probes import training
from cluster_accept.probes.training.judge import TrainingPoint, training_scaling
from cluster_accept.remote.launch import GroupRun
from cluster_accept.tasks.multi_node.group_rows import PROBE_ERROR, STOPPED, TEARDOWN
from cluster_accept.tasks.multi_node.group_stage import GroupStage
from cluster_accept.tasks.multi_node.ranks import TRAINING_JOB

CHECK = "training_scaling"
ITEM = "training_inter"


def per_gpu(run: GroupRun) -> float | None:
    """Tokens/s per GPU of a completed training run; None when it did not complete."""
    if not run.ok:
        return None
    figure = next((m for m in run.measurements if m.metric == training.PER_GPU), None)
    return figure.value if figure is not None else None


def point_of(run: GroupRun, size: int) -> TrainingPoint | None:
    """A completed run as a scaling point, with the transport NCCL used between nodes and the model."""
    output = training.parse(run.stdout)
    figures = {m.metric: m for m in output.measurements if m.gpu is None}
    if training.PER_GPU not in figures:
        return None
    value = {k: m.value for k, m in figures.items()}
    between = sorted(t for t in run.transports if t.startswith(("NET/", "COLLNET/")))
    return TrainingPoint(
        nodes=size,
        gpus=figures[training.PER_GPU].world_size or size,
        tokens_per_s_per_gpu=value[training.PER_GPU],
        step_ms=value.get("training_step_ms"),
        tflops_per_gpu=value.get("training_tflops_per_gpu"),
        mfu=value.get("training_mfu"),
        group=fold(run.nodes),
        transport=",".join(between) or None,
        model=figures[training.PER_GPU].model,
    )


UNSET = "none: set thresholds.training_scaling_efficiency_min"  # a step nothing is expected of: never a pass


def _step_row(record: TrainingScalingRow, base: float | None, minimum: float | None) -> CheckRow:
    nodes, efficiency = record.nodes, record.efficiency
    item = "1 node" if nodes == 1 else f"{nodes} nodes"
    said = f"{record.tokens_per_s_per_gpu:.4g} tokens/s per GPU at {nodes} nodes ({record.gpus} GPUs)"
    between = f"; NCCL between nodes: {record.transport}" if record.transport else ""
    if efficiency is None:
        detail = f"{said}{between}; {record.model}"
        if minimum is not None:  # the expectation is answered, with why it could not be judged
            why = f"no one-node run completed to take efficiency against; {detail}"
            return CheckRow(CHECK, item, Status.SKIP, "no_baseline", said, f">= {minimum:.0%}", why)
        return CheckRow(CHECK, item, Status.NOT_JUDGED, "no_expectation", said, UNSET, detail)
    detail = f"{said} against {base:.4g} on one node{between}; {record.model}"
    observed = f"{efficiency:.1%}"
    if minimum is None:
        return CheckRow(CHECK, item, Status.NOT_JUDGED, "no_expectation", observed, UNSET, detail)
    status, reason = (Status.WARN, "efficiency_low") if record.below_min else (Status.PASS, "ok")
    return CheckRow(CHECK, item, status, reason, observed, f">= {minimum:.0%}", detail)


def training_sweep(stage: GroupStage, nodes: list[Node]) -> tuple[list[TrainingScalingRow], bool]:
    """(scaling rows, trouble): the model at 1, 2, 4 … N nodes; trouble when a run failed or a step is below
    the profile's minimum efficiency. Every node of a completed run gets a row per step; the rest a skip."""
    thresholds = nodes[0].profile.thresholds
    minimum = thresholds.training_scaling_efficiency_min
    points, groups, trouble = [], {}, False
    failed: set[str] = set()
    for size in [1, *sweep_sizes(len(nodes))]:
        group = [n for n in nodes if n.name not in stage.unreachable][:size]
        if len(group) < size:
            break
        run = stage.launch(group, TRAINING_JOB)
        point = point_of(run, size) if run.ok else None
        if point is None:
            stage.failed_run(run, CHECK, "training run")
            failed.update(run.nodes)
            trouble = True
            continue
        points.append(point)
        groups[size] = group
    table = training_scaling(points, minimum)
    base = next((p.tokens_per_s_per_gpu for p in points if p.nodes == 1), None)
    for record in table:
        row = _step_row(record, base, minimum)
        trouble = trouble or record.below_min
        for node in groups[record.nodes]:
            stage.row(node.name, row)
    answered = {n.name for g in groups.values() for n in g} | stage.unreachable | failed
    for node in nodes:
        if node.name not in answered:
            said = "no training run completed with this node (see the failed runs)"
            stage.row(node.name, CheckRow(CHECK, "sweep", Status.SKIP, "not_reached", None, None, said))
    return [replace(r, run_id=stage.run_id, cluster=stage.cluster) for r in table], trouble


def isolate_training(stage: GroupStage, nodes: list[Node], scaling: list[TrainingScalingRow]) -> None:
    """Pairs (then halves) of training runs name the node or link that slows training; when none is to
    blame, the slow steps fail on every node of their group, saying so."""
    thresholds = nodes[0].profile.thresholds
    base = next((r.tokens_per_s_per_gpu for r in scaling if r.nodes == 1), None)
    minimum = thresholds.training_scaling_efficiency_min
    floor = base * minimum if base is not None and minimum is not None else None
    candidates = [n for n in nodes if n.name not in stage.unreachable]
    if len(candidates) < 2:
        return
    policy = IsolationPolicy(min_busbw_gbps=floor, straggler_pct=thresholds.straggler_pct)
    verdict = stage.isolate_with(candidates, TRAINING_JOB, per_gpu, policy, ITEM)
    if verdict.bad_nodes:
        return  # named: each fails its isolation row
    for record in scaling:
        if not record.below_min or record.efficiency is None:
            continue
        said = (
            f"training keeps {record.efficiency:.1%} of one node's tokens/s per GPU at {record.nodes} nodes, "
            f"and isolation blames no node ({verdict.detail}): the nodes are slow together; check the transport "
            f"between nodes ({record.transport or 'not read'}), NCCL's environment and the fabric"
        )
        # the row that carries the verdict says its own figure and expectation (a cause sentence starts with them)
        observed, expected = f"{record.efficiency:.1%}", f">= {minimum:.0%}"
        row = CheckRow(CHECK, f"{record.nodes} nodes", Status.FAIL, "unattributed", observed, expected, said)
        for name in _names(record.group or "", candidates):
            stage.row(name, row)


def _names(group: str, nodes: Sequence[Node]) -> list[str]:
    """The candidates in a folded group (the group was made of them, in order)."""
    members = set(expand(group))
    return [n.name for n in nodes if n.name in members]


REASONS = {
    CHECK: declare(
        Reason(
            "efficiency_low",
            Status.WARN,
            "training at this many nodes keeps less of one node's tokens/s per GPU than the profile's minimum: "
            "isolation looks for the node or link",
            Action.RERUN,
            kind=FindingKind.RELATIVE,
        ),
        Reason(
            "unattributed",
            Status.FAIL,
            "training scales below the profile's minimum and isolation names no node (at most a slow pair): the "
            "fabric, the transport NCCL chose between nodes or its environment (NCCL_SOCKET_IFNAME, NCCL_IB_HCA …)",
            Action.FIX_CONFIG,
            kind=FindingKind.RELATIVE,
        ),
        Reason("not_reached", Status.SKIP, "no training run across nodes completed with this node"),
        Reason("no_baseline", Status.SKIP, "the one-node training run failed (see its row): no efficiency to judge"),
        Reason("fewer_than_two_nodes", Status.SKIP, "fewer than two nodes passed the earlier stages: nothing to scale"),
        STOPPED,
        TEARDOWN,
        PROBE_ERROR,
        Reason(
            "collective_timeout",
            Status.TIMEOUT,
            "the training run across nodes hung and was stopped on every node: rerun; if it repeats, bisect",
            Action.RERUN,
        ),
        Reason(
            "collective_failed",
            Status.ERROR,
            "the training run across nodes did not complete (see what each rank said): rerun, then bisect",
            Action.RERUN,
        ),
        Reason(
            "launch_failed",
            Status.ERROR,
            "the training run could not be started (see why): fix the launcher settings, then rerun",
            Action.FIX_CONFIG,
        ),
    ),
}
