"""Between nodes, the smallest set of suspected settings proved the way it is inside one: arm by arm.

When the all-reduce between nodes failed (a node isolation pulled, nodes slow together, a run that crashed), the
settings each implicated node's ranks ran with (``job_settings.py`` before every rank) that a node outside the
trouble did not run with, and that are neither the library's defaults nor pinned by the profile, are suspects
(:mod:`analysis.suspects`). One search runs over the suspects of every implicated node together
(:class:`analysis.minimal_cause.Search`, each suspect named ``node:KEY``): a setting on one node can break or slow
the collective of all of them (``NCCL_MAX_NCHANNELS`` on one host of two: the ranks disagree and the all-reduce
aborts on both), so the arms are the group's all-reduce (with one good partner when only one node is
implicated) run with some suspects reverted on their own nodes, and the culprit is the one kept alone whose
all-reduce fails while reverting it restores it. An arm is restored when the all-reduce completes and reaches the
profile's floor between nodes; low when it fails again or stays below; void when a node could not run its rank.
Only the all-reduce family is proved here: a failing training or rail figure on its own is left to its rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from cluster_accept.analysis.minimal_cause import Finding, Outcome, Search
from cluster_accept.analysis.nccl_log import nccl_warnings
from cluster_accept.analysis.proof import figure_note, finding_rows
from cluster_accept.analysis.reference import DEFAULTS, Change
from cluster_accept.analysis.scaling import StepVerdict
from cluster_accept.analysis.suspects import BETWEEN_NODES_FAILURES, JobSetting, suspects, unproved_rows
from cluster_accept.checks.base import BAD_STATUSES, CheckRow, NodeRow
from cluster_accept.inventory.model import Inventory, Node
from cluster_accept.probes.scripts import REMOVED_SETTINGS, tool_keys
from cluster_accept.remote.launch import GroupJob, GroupRun, RankRun
from cluster_accept.remote.result import NodeStatus, RemoteCommand
from cluster_accept.tasks.multi_node.group_stage import MultiNodeOutcome
from cluster_accept.tasks.multi_node.ranks import ALLREDUCE_JOB, launch_groups
from cluster_accept.tasks.prove_causes import SUFFIX, noted
from cluster_accept.vocabulary.rows import Measurement
from cluster_accept.vocabulary.text import run_output


class _Stage(Protocol):
    """What proving reads and writes of the multi-node stage (which passes itself)."""

    run_id: str
    inventory: Inventory
    concurrency: int
    out: MultiNodeOutcome
    unreachable: set[str]
    steps: list[StepVerdict]
    settings: dict[str, list[JobSetting]]

    @property
    def cluster(self) -> str: ...

    def row(self, node: str, row: CheckRow, raw: str = "") -> None: ...


NAME = "multi-node"
RUN_FAILURES = frozenset({"collective_failed", "collective_timeout"})


def without(job: GroupJob, removed: Mapping[str, Mapping[str, str | None]]) -> GroupJob:
    """``job`` whose rank on each node runs without that node's ``removed`` settings (by node name): the
    command is built while :data:`probes.scripts.REMOVED_SETTINGS` names them, in the thread that builds it."""

    def command(node: Node, rank: int, world: int, master: str, port: int, tag: str) -> RemoteCommand:
        token = REMOVED_SETTINGS.set(removed.get(node.name, {}))
        try:
            return job.command(node, rank, world, master, port, tag)
        finally:
            REMOVED_SETTINGS.reset(token)

    return replace(job, command=command)


def _failing(stage: _Stage) -> list[NodeRow]:
    return [
        r
        for r in stage.out.rows
        if r.status in BAD_STATUSES
        and (r.check, r.reason) in BETWEEN_NODES_FAILURES
        and r.node not in stage.unreachable
    ]


def _suspected(stage: _Stage, bad: Sequence[str], good: Sequence[Node]) -> dict[str, list[JobSetting]]:
    healthy = [stage.settings.get(n.name, []) for n in good]
    found = {}
    for name in bad:
        node = stage.inventory.node(name)
        mine = suspects(stage.settings.get(name, []), node.profile, tool_keys(node), healthy)
        if mine:
            found[name] = mine
    return found


def _unproved(stage: _Stage, suspected: Mapping[str, list[JobSetting]], why: str) -> None:
    for name, found in suspected.items():
        for row in unproved_rows(found, why):
            stage.row(name, row)


def prove_between(stage: _Stage, nodes: Sequence[Node]) -> None:
    """The suspects of a failed all-reduce between ``nodes`` named, and the smallest set of them whose reverting
    restores it found and proved arm by arm (a slow all-reduce is proved only against a floor)."""
    failing = _failing(stage)
    bad = sorted({r.node for r in failing})
    good = [n for n in nodes if n.name not in bad and n.name not in stage.unreachable]
    suspected = _suspected(stage, bad, good) if bad else {}
    if not suspected:
        return
    profile = stage.inventory.node(bad[0]).profile
    floor = profile.thresholds.allreduce_inter_busbw_gbps_min
    broken = any(r.reason in RUN_FAILURES for r in failing)
    if not profile.probes.prove_causes or (floor is None and not broken):
        off = "not measured again without it (probes.prove_causes: false)"
        _unproved(stage, suspected, off if profile.probes.prove_causes is False else "not measured again: no floor")
        return
    group = [stage.inventory.node(n) for n in bad] + (good[:1] if len(bad) < 2 else [])
    suspect_of = {f"{name}:{s.key}": (name, s) for name, found in suspected.items() for s in found}
    every = [Change(key, setting, None) for key, (_, setting) in suspect_of.items()]
    names = {key: f"{name}'s {setting.said}" for key, (name, setting) in suspect_of.items()}
    search = Search(list(suspect_of), profile.probes.prove_arms_extra)
    finding = search_between(search, _arm_runner(stage, group, suspect_of), floor, names)
    reference = "the nodes whose all-reduce passed" if good else DEFAULTS
    for row in finding_rows(every, finding, reference):
        name, setting = suspect_of[row.item]
        stage.row(name, replace(row, item=setting.key))
    # the failing rows of every node say whose setting it was (half-a's all-reduce failed for half-b's setting)
    whose = [Change(key, replace(setting, key=key), None) for key, (_, setting) in suspect_of.items()]
    note = figure_note(finding, whose, reference)
    stage.out.rows = noted(stage.out.rows, {id(r): note for r in failing if r.node in suspected})


def _arm_runner(
    stage: _Stage, group: Sequence[Node], suspect_of: Mapping[str, tuple[str, JobSetting]]
) -> Callable[[frozenset[str]], GroupRun]:
    """How an arm is measured: the group's all-reduce, each reverted suspect (``node:KEY``) removed on its own
    node only; its figures kept under the stage ``multi-node:without-suspects``."""

    def arm(reverted: frozenset[str]) -> GroupRun:
        removed: dict[str, dict[str, str | None]] = {}
        for key in sorted(reverted):
            name, setting = suspect_of[key]
            removed.setdefault(name, {})[setting.key] = setting.removal()
        run = launch_groups([group], stage.concurrency, job=without(ALLREDUCE_JOB, removed))[0]
        where = (stage.run_id, stage.cluster, f"{NAME}{SUFFIX}", group[0].name, group[0].profile_name)
        for record in run.measurements:
            stage.out.measurements.append(Measurement.of(replace(record, probe=ALLREDUCE_JOB.name), *where))
        return run

    return arm


def search_between(
    search: Search, arm: Callable[[frozenset[str]], GroupRun], floor: float | None, names: Mapping[str, str]
) -> Finding:
    """``search`` run to its end, each arm the group's all-reduce with the suspects it names reverted (``arm``),
    judged against ``floor`` (None: completing restores it); ``names``: each suspect in words."""
    while (reverted := search.next_arm()) is not None:
        outcome, said = arm_judged(arm(reverted), floor)
        search.record(outcome, f"without {', '.join(names[k] for k in sorted(reverted))}: {said}")
    assert search.finding is not None
    return search.finding


def arm_judged(run: GroupRun, floor: float | None) -> tuple[Outcome, str]:
    """One arm's all-reduce: void when a node could not run its rank (unreachable, the tool's own error), low
    when it failed or stayed below ``floor``, restored when it completed at or above it."""
    lost = [r for r in run.ranks.values() if r.status in (NodeStatus.UNREACHABLE, NodeStatus.TOOL_ERROR)]
    if lost or not run.ranks:
        return "void", f"no all-reduce: {', '.join(f'{r.node} {r.said}' for r in lost) or 'no rank ran'}"
    after = run.busbw_gbps
    if after is None:
        failed = [r for r in run.ranks.values() if not r.ok and not r.stopped]
        return "low", f"the all-reduce did not complete ({'; '.join(_ended(r) for r in failed)})"
    if floor is not None and after < floor:
        return "low", f"{after:.3g} GB/s (below {floor:g})"
    return "restored", f"{after:.3g} GB/s"


def _ended(rank: RankRun) -> str:
    """How a failed rank ended, NCCL's first warning first (what the ranks disagreed on)."""
    output = run_output(rank.result.stdout, rank.result.stderr) if rank.result is not None else ""
    warned = nccl_warnings(output, limit=1)
    return f"{rank.node}: {rank.said}" + (f", NCCL WARN {warned[0]}" if warned else "")
