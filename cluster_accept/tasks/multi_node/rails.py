"""Across nodes, beyond all-reduce: the profile's other collectives at the sweep's largest group, and per-rail
runs that name a slow NIC or cable as (node, rail).

A node has one NIC per GPU (a rail); a job's traffic between GPU i of every node crosses rail i. An all-reduce
using every GPU averages the rails, so one weak NIC costs the whole run a few percent and hides. Each rail runs
alone here (one rank per node on that rail's GPU, NCCL held to its HCA, gloo to its interface); a rail slower
than its siblings (or the profile's ``rail_busbw_gbps_min``) is isolated on that rail, and the node found is
named with the rail and its NIC. Verdicts are pure (:mod:`analysis.rails`); this module runs the groups.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cluster_accept.analysis.isolation import IsolationPolicy
from cluster_accept.analysis.probe_output import parse_json_lines
from cluster_accept.analysis.probe_verdicts import NO_EXPECTATION
from cluster_accept.analysis.rails import judge_rails
from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.checks.reasons import Action, FindingKind, Reason, declare
from cluster_accept.inventory.model import COLLECTIVE_METRICS, Node, Profile, Rail, busbw_threshold
from cluster_accept.probes import collectives as collectives_probe
from cluster_accept.remote.launch import GroupRun
from cluster_accept.tasks.multi_node.group_rows import PROBE_ERROR, STOPPED, TEARDOWN
from cluster_accept.tasks.multi_node.group_stage import GroupStage
from cluster_accept.tasks.multi_node.ranks import rail_job

RAILS = "rails"
COLLECTIVES = "collectives"


def collective_rows(run: GroupRun, profile: Profile) -> list[CheckRow]:
    """The profile's other collectives across the group: each against ``*_inter_busbw_gbps_min``, not judged
    where the profile sets none (one run of the whole group: no peer to compare it with), or why not measured.
    Nothing when the run failed: its all-reduce rows say why."""
    if not run.ok:
        return []
    skipped = {
        str(i.members["collective"]): str(i.get("reason"))
        for i in parse_json_lines(run.stdout).info
        if i.kind == "skip" and "collective" in i.members
    }
    rows = []
    for op in profile.probes.collectives:
        item, key = f"{op}_inter", busbw_threshold(op, "inter")
        minimum = getattr(profile.thresholds, key)
        expected = f">= {minimum:g} GB/s" if minimum is not None else None
        value = run.busbw_of(COLLECTIVE_METRICS[op])
        if op in skipped:
            rows.append(CheckRow(COLLECTIVES, item, Status.SKIP, "unsupported", None, expected, skipped[op]))
        elif value is None:
            said = f"the run across {len(run.nodes)} nodes printed no {op} figure"
            rows.append(CheckRow(COLLECTIVES, item, Status.ERROR, "not_measured", None, expected, said))
        else:
            rows.append(_judged(item, key, value, minimum, len(run.nodes)))
    return rows


def _judged(item: str, key: str, value: float, minimum: float | None, nodes: int) -> CheckRow:
    """One collective's bus bandwidth across the group against its minimum; with none, not judged (nothing
    derives one between nodes for collectives other than all-reduce), naming the key to write."""
    said = f"{value:.4g} GB/s across {nodes} nodes at the largest size"
    if minimum is None:
        said += ": the profile sets no minimum, and one run of the group has no peer to compare it with"
        return CheckRow(
            COLLECTIVES, item, Status.NOT_JUDGED, NO_EXPECTATION, f"{value:.4g}", f"none: set thresholds.{key}", said
        )
    status, reason = (Status.PASS, "ok") if value >= minimum else (Status.FAIL, "below_threshold")
    return CheckRow(COLLECTIVES, item, status, reason, f"{value:.4g}", f">= {minimum:g} GB/s", said)


def collectives_not_reached(stage: GroupStage, nodes: Sequence[Node]) -> None:
    """A sweep cut short (nodes lost) never ran its largest group: its collectives say so on the rest."""
    if not nodes[0].profile.probes.collectives or any(r.check == COLLECTIVES for r in stage.out.rows):
        return
    said = "the sweep stopped before its largest group (nodes were lost), so no collective ran across all of them"
    for node in nodes:
        if node.name not in stage.unreachable:
            rows = [
                CheckRow(COLLECTIVES, f"{op}_inter", Status.ERROR, "not_measured", None, None, said)
                for op in node.profile.probes.collectives
            ]
            stage.rows_from(rows, [node])


def _nic(rail: Rail) -> str:
    return rail.nic or rail.ifname or "?"


def _naming(rail: Rail) -> Callable[[str], str]:
    """How an isolation row names what to pull: ``node03 rail1 (mlx5_1)``."""
    return lambda name: f"{name} {rail.name} ({_nic(rail)})"


def rail_runs(stage: GroupStage, nodes: Sequence[Node]) -> None:
    """Each rail alone across the nodes still in (isolation's bad nodes and unreachable ones left out), then
    isolation on each rail found slow; nodes whose profiles name different rails run apart."""
    pulled = set(stage.out.verdict.bad_nodes) if stage.out.verdict else set()
    groups: dict[tuple[Rail, ...], list[Node]] = {}
    for node in nodes:
        if node.profile.probes.rails and node.name not in pulled | stage.unreachable:
            groups.setdefault(tuple(node.profile.probes.rails), []).append(node)
    for rails, group in groups.items():
        if len(group) < 2:
            said = "fewer than two nodes left for per-rail runs"
            stage.rows_from([CheckRow(RAILS, "rails", Status.SKIP, "fewer_than_two_nodes", None, None, said)], group)
            continue
        _one_node_set(stage, list(rails), group)


def _one_node_set(stage: GroupStage, rails: list[Rail], group: list[Node]) -> None:
    thresholds = group[0].profile.thresholds
    runs = {rail.name: stage.launch(group, rail_job(rail)) for rail in rails}
    for rail in rails:
        if runs[rail.name].busbw_gbps is None:
            stage.failed_run(runs[rail.name], RAILS, f"{rail.name} ({_nic(rail)}) all-reduce")
    figures = {name: run.busbw_gbps for name, run in runs.items()}
    verdicts = judge_rails(figures, thresholds.rail_busbw_gbps_min, thresholds.straggler_pct, thresholds.noise_k)
    by_name = {rail.name: rail for rail in rails}
    for verdict in verdicts:
        rail = by_name[verdict.rail]
        if verdict.busbw_gbps is not None:
            # the rail's symptom (isolation names the node), or a difference inside the rails' spread
            status = Status.PASS if verdict.ok and verdict.reason == "ok" else Status.WARN
            said = f"{rail.name} (GPU {rail.gpu}, {_nic(rail)}) across {len(group)} nodes, one rank each"
            row = CheckRow(
                RAILS, rail.name, status, verdict.reason, f"{verdict.busbw_gbps:.3g}", verdict.expected, said
            )
            stage.rows_from([row], group)
    for verdict in verdicts:
        if verdict.ok:
            continue
        rail = by_name[verdict.rail]
        policy = IsolationPolicy(min_busbw_gbps=verdict.floor_gbps, straggler_pct=thresholds.straggler_pct)
        stage.isolate_with(
            group,
            rail_job(rail),
            lambda run: run.busbw_gbps,
            policy,
            rail.name,
            reason="slow_rail",
            named=_naming(rail),
        )


REASONS = {
    COLLECTIVES: collectives_probe.REASONS,
    RAILS: declare(
        Reason("ok", Status.PASS, "the rail's all-reduce across the nodes is within the margins"),
        Reason(
            "below_min",
            Status.WARN,
            "this rail's all-reduce is below the profile's rail_busbw_gbps_min: isolation on the rail names the node",
            Action.RERUN,
            kind=FindingKind.RELATIVE,
        ),
        Reason(
            "below_other_rails",
            Status.WARN,
            "this rail is far slower than the node set's other rails: isolation on the rail names the node and NIC",
            Action.RERUN,
            kind=FindingKind.RELATIVE,
        ),
        Reason("fewer_than_two_nodes", Status.SKIP, "fewer than two nodes left to run rails across"),
        STOPPED,
        TEARDOWN,
        PROBE_ERROR,
        Reason(
            "collective_timeout",
            Status.TIMEOUT,
            "the rail's all-reduce hung and was stopped: rerun; if it repeats, check the rail's NICs and cables",
            Action.RERUN,
        ),
        Reason(
            "collective_failed",
            Status.ERROR,
            "the rail's all-reduce did not complete (see what each rank said): check the rail's NIC and interface "
            "names",
            Action.RERUN,
        ),
        Reason(
            "launch_failed",
            Status.ERROR,
            "the rail's run could not be started (see why): fix the launcher settings, then rerun",
            Action.FIX_CONFIG,
        ),
    ),
}
