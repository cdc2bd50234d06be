"""Between nodes, the smallest set of suspected settings proved the way it is inside one: arm by arm.

When the all-reduce between nodes failed (a node isolation pulled, nodes slow together, a run that crashed), the
settings each implicated node's ranks ran with (``job_settings.py`` before every rank) that a node outside the
trouble did not run with, and that are neither the library's defaults nor pinned by the profile, are suspects
(:mod:`analysis.suspects`). One search runs over the suspects of every implicated node together
(:class:`analysis.minimal_cause.Search`): a setting on one node can break or slow the collective of all of them
(``NCCL_MAX_NCHANNELS`` on one host of two: the ranks disagree and the all-reduce aborts on both), so each arm is the
group's all-reduce (with one good partner when only one node is implicated) run with some suspects reverted on
their own nodes, and the culprit is the one whose all-reduce still fails kept alone while reverting it restores
it. A setting several implicated nodes run the same way is one suspect, reverted on all of them at once (reverted
on one only, a setting the ranks must agree on would break the collective by itself); each is named with its nodes
(``half-b:NCCL_MAX_NCHANNELS``). An arm is restored when the all-reduce completes and reaches the profile's floor
between nodes; low when a rank fails again or the figure stays below; void when no rank failed of itself (a node
could not run its rank, the run was refused) or a rank said it ran otherwise than asked. Only the all-reduce
family is proved here: a failing training or rail figure on its own is left to its rows.

An implicated node that runs none of the proved cause (half-a, beside half-b's channel cap) is not rejected for
it: its failing rows between nodes become warnings saying whose setting was proved and what the restoring arm
measured with this node in it (:func:`spared`): the all-reduce, and the figures between nodes that did not run at
all. Its figures were measured with another node's cause in effect, so they are not a pass either.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from cluster_accept.analysis.between_nodes import DID_NOT_RUN
from cluster_accept.analysis.minimal_cause import Finding, Outcome, Search
from cluster_accept.analysis.nccl_log import nccl_warnings
from cluster_accept.analysis.proof import arm_settings_wrong, figure_note, finding_rows
from cluster_accept.analysis.reference import DEFAULTS, Change
from cluster_accept.analysis.suspects import BETWEEN_NODES_FAILURES, JobSetting, read_settings, suspects, unproved_rows
from cluster_accept.checks.base import BAD_STATUSES, CheckRow, NodeRow, Status
from cluster_accept.inventory.hostlist import fold
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


@dataclass(frozen=True)
class Suspect:
    """One setting suspected between nodes, with every implicated node that runs it the same way: reverted on all
    of them at once (a setting ranks must agree on, reverted on one node only, would itself break the collective)."""

    nodes: tuple[str, ...]
    setting: JobSetting

    @property
    def name(self) -> str:
        """``node:KEY`` (``node[01-02]:KEY`` for several): the search's name for it, and the cause's in words."""
        return f"{fold(self.nodes)}:{self.setting.key}"

    @property
    def said(self) -> str:
        return f"{fold(self.nodes)}'s {self.setting.said}"


def suspects_between(suspected: Mapping[str, Sequence[JobSetting]]) -> dict[str, Suspect]:
    """The implicated nodes' suspects, one per setting (key, value and where it is set), with its nodes."""
    nodes_of: dict[JobSetting, list[str]] = {}
    for name, found in sorted(suspected.items()):
        for setting in found:
            nodes_of.setdefault(setting, []).append(name)
    found_all = [Suspect(tuple(nodes), setting) for setting, nodes in nodes_of.items()]
    return {suspect.name: suspect for suspect in found_all}


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
    group = [stage.inventory.node(n) for n in bad] + (good[:1] if len(bad) < 2 else [])
    if not profile.probes.prove_causes or (floor is None and not broken) or len(group) < 2:
        off = "not measured again without it (probes.prove_causes: false)"
        why = "no node left to run the all-reduce with" if len(group) < 2 else "not measured again: no floor"
        _unproved(stage, suspected, off if profile.probes.prove_causes is False else why)
        return
    found = suspects_between(suspected)
    finding = search_between(
        Search(list(found), profile.probes.prove_arms_extra), _arm_runner(stage, group, found), floor, found
    )
    reference = "the nodes whose all-reduce passed" if good else DEFAULTS
    # every suspect in words with its nodes (``half-b:NCCL_MAX_NCHANNELS=1``): the same key can be another node's too
    named = [Change(key, replace(suspect.setting, key=key), None) for key, suspect in found.items()]
    _proof_rows(stage, found, finding_rows(named, finding, reference))
    note = figure_note(finding, named, reference)
    stage.out.rows = spared(noted(stage.out.rows, {id(r): note for r in failing}), finding, found, bad)


def spared(
    rows: Sequence[NodeRow], finding: Finding, found: Mapping[str, Suspect], implicated: Sequence[str]
) -> list[NodeRow]:
    """``rows`` with each failing row of an implicated node that runs none of the proved cause made a warning:
    another node's setting broke or slowed the group, proved by an arm that restored the all-reduce with this node
    in it (:func:`_spared_kind`). Nothing changes unless the search named a cause and an arm with all of it reverted
    was restored."""
    if finding.kind != "named":
        return list(rows)
    cause = set(finding.named)
    restoring = next((a for a in finding.arms if a.outcome == "restored" and cause <= a.reverted), None)
    culprits = {node for key in cause for node in found[key].nodes}
    innocent = set(implicated) - culprits
    if restoring is None or not innocent:
        return list(rows)
    named = ", ".join(found[key].said for key in sorted(cause))
    said = (
        f"{named} proved the cause of the group's failure; this node runs none of it, so it is not rejected for a "
        f"figure measured with it in effect (the restoring arm, with this node in it: {restoring.said})"
    )
    return [
        replace(r, status=Status.WARN, detail=f"{r.detail}; {said}" if r.detail else said)
        if r.node in innocent and r.status in BAD_STATUSES and _spared_kind(r)
        else r
        for r in rows
    ]


def _spared_kind(row: NodeRow) -> bool:
    """A failing row the proved cause accounts for on a node that runs none of it: the all-reduce the arm restored,
    or a figure between nodes that did not run at all (the group's run broke). A figure that ran and came out low
    (an all-gather below its floor) was not measured again, and stays what it is."""
    return (row.check, row.reason) in BETWEEN_NODES_FAILURES or row.reason in DID_NOT_RUN | {"not_measured"}


def _proof_rows(stage: _Stage, found: Mapping[str, Suspect], rows: Sequence[CheckRow]) -> None:
    """Each suspect's row (named ``node:KEY``) on each node that runs it, under the setting's own key."""
    for row in rows:
        suspect = found[row.item]
        plain = Change(suspect.setting.key, suspect.setting, None)
        for name in suspect.nodes:
            stage.row(name, replace(row, item=plain.key, observed=plain.said))


def _arm_runner(
    stage: _Stage, group: Sequence[Node], found: Mapping[str, Suspect]
) -> Callable[[frozenset[str]], ArmRun]:
    """How an arm is measured: the group's all-reduce, each reverted suspect removed on its own nodes only; its
    figures kept under the stage ``multi-node:without-suspects``; whether each node ran as asked."""

    def arm(reverted: frozenset[str]) -> ArmRun:
        removed: dict[str, dict[str, str | None]] = {}
        for key in sorted(reverted):
            for name in found[key].nodes:
                removed.setdefault(name, {})[found[key].setting.key] = found[key].setting.removal()
        run = launch_groups([group], stage.concurrency, job=without(ALLREDUCE_JOB, removed))[0]
        where = (stage.run_id, stage.cluster, f"{NAME}{SUFFIX}", group[0].name, group[0].profile_name)
        for record in run.measurements:
            stage.out.measurements.append(Measurement.of(replace(record, probe=ALLREDUCE_JOB.name), *where))
        return ArmRun(run, _ran_otherwise(run, found, reverted))

    return arm


@dataclass(frozen=True)
class ArmRun:
    """An arm's all-reduce and how its ranks ran otherwise than asked ("" when as asked)."""

    run: GroupRun
    wrong: str = ""


def _ran_otherwise(run: GroupRun, found: Mapping[str, Suspect], reverted: frozenset[str]) -> str:
    """Each node's settings as its rank said them against what the arm asked of that node (reverted suspects as
    the reference, the others as in the failing run): a rank that said none is not held to it."""
    wrong = []
    for name, rank in run.ranks.items():
        ran = rank_settings(rank)
        mine = {key: s for key, s in found.items() if name in s.nodes}
        if not ran or not mine:
            continue
        changes = [Change(s.setting.key, s.setting, None) for s in mine.values()]
        said = arm_settings_wrong(changes, frozenset(found[k].setting.key for k in reverted if k in mine), ran)
        wrong += [f"{name}: {said}"] if said else []
    return "; ".join(wrong)


def rank_settings(rank: RankRun) -> list[JobSetting]:
    """The settings a rank said it ran with (``job_settings.py`` before it, on either stream)."""
    return read_settings(f"{rank.result.stdout}\n{rank.result.stderr}") if rank.result is not None else []


def search_between(
    search: Search, arm: Callable[[frozenset[str]], ArmRun], floor: float | None, found: Mapping[str, Suspect]
) -> Finding:
    """``search`` run to its end, each arm the group's all-reduce with the suspects it names reverted (``arm``),
    judged against ``floor`` (None: completing restores it)."""
    while (reverted := search.next_arm()) is not None:
        measured = arm(reverted)
        outcome: Outcome = "void"
        said = f"void: {measured.wrong}"
        if not measured.wrong:
            outcome, said = arm_judged(measured.run, floor)
        search.record(outcome, f"without {', '.join(found[k].said for k in sorted(reverted))}: {said}")
    assert search.finding is not None
    return search.finding


def arm_judged(run: GroupRun, floor: float | None) -> tuple[Outcome, str]:
    """One arm's all-reduce: void when no rank failed of itself (a node could not run its rank, the run was refused
    or abandoned), low when a rank failed or the figure stayed below ``floor``, restored when it completed at or
    above it."""
    after = run.busbw_gbps
    if after is not None:
        if floor is not None and after < floor:
            return "low", f"{after:.3g} GB/s (below {floor:g})"
        return "restored", f"{after:.3g} GB/s"
    lost = (NodeStatus.UNREACHABLE, NodeStatus.TOOL_ERROR)
    failed = [r for r in run.ranks.values() if not r.ok and not r.stopped and r.status not in lost]
    errors = f"; the job printed: {run.errors[0]}" if run.errors else ""
    if not failed:
        ended = "; ".join(f"{r.node}: {r.said}" for r in run.ranks.values()) or run.detail or "no rank ran"
        return "void", f"no all-reduce ({ended}){errors}"
    return "low", f"the all-reduce did not complete ({'; '.join(_ended(r) for r in failed)}){errors}"


def _ended(rank: RankRun) -> str:
    """How a failed rank ended, NCCL's first warning first (what the ranks disagreed on)."""
    output = run_output(rank.result.stdout, rank.result.stderr) if rank.result is not None else ""
    warned = nccl_warnings(output, limit=1)
    return f"{rank.node}: {rank.said}" + (f", NCCL WARN {warned[0]}" if warned else "")
