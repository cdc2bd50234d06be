"""Between nodes, a suspected setting proved the way it is inside one: the all-reduce measured once more without it.

When the all-reduce between nodes failed (a node isolation pulled, nodes slow together), the settings each
implicated node's ranks ran with (``job_settings.py`` before every rank) that a node outside the trouble did not
run with, and that are neither the library's defaults nor pinned by the profile, are suspects
(:mod:`analysis.suspects`). The implicated nodes (with one good partner when only one is implicated) run the
all-reduce once more, each without its own suspects; the figure against the profile's floor between nodes
confirms or clears them. Only the all-reduce family is proved here: a failing training or rail figure on its
own is left to its rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from cluster_accept.analysis.scaling import StepVerdict
from cluster_accept.analysis.suspects import (
    BETWEEN_NODES_FAILURES,
    JobSetting,
    Retest,
    proof_rows,
    retest_note,
    suspects,
    unproved_rows,
)
from cluster_accept.checks.base import BAD_STATUSES, CheckRow, NodeRow, Status
from cluster_accept.inventory.model import Inventory, Node
from cluster_accept.probes.scripts import REMOVED_SETTINGS, tool_keys
from cluster_accept.remote.launch import GroupJob
from cluster_accept.remote.result import RemoteCommand
from cluster_accept.tasks.multi_node.group_rows import probe_error_rows
from cluster_accept.tasks.multi_node.group_stage import MultiNodeOutcome
from cluster_accept.tasks.multi_node.ranks import ALLREDUCE_JOB, launch_groups
from cluster_accept.tasks.prove_causes import SUFFIX, noted
from cluster_accept.tasks.rows import node_row
from cluster_accept.vocabulary.rows import Measurement


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


def _noted(stage: _Stage, failing: Sequence[NodeRow], notes: Mapping[str, str]) -> None:
    """Each failing row of a node with suspects followed by what the all-reduce measured without them."""
    stage.out.rows = noted(stage.out.rows, {id(r): notes[r.node] for r in failing if r.node in notes})


def prove_between(stage: _Stage, nodes: Sequence[Node]) -> None:
    """The suspects of a failed all-reduce between ``nodes`` named, and proved or cleared by one all-reduce of
    the implicated nodes without them: it must complete, and reach the profile's floor between nodes (a slow
    all-reduce is proved only against a floor)."""
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
    removed = {name: {s.key: s.removal() for s in found} for name, found in suspected.items()}
    run = launch_groups([group], stage.concurrency, job=without(ALLREDUCE_JOB, removed))[0]
    for name, row in probe_error_rows(run, ALLREDUCE_JOB.check):
        stage.row(name, row)
    for record in run.measurements:
        where = (stage.run_id, stage.cluster, f"{NAME}{SUFFIX}", group[0].name, group[0].profile_name)
        stage.out.measurements.append(Measurement.of(replace(record, probe=ALLREDUCE_JOB.name), *where))
    retest = _retest(stage, bad[0], broken, run.busbw_gbps, floor)
    for name, found in suspected.items():
        for row in proof_rows(found, [retest]):
            stage.row(name, row)
    _noted(stage, failing, {name: retest_note(retest, found) for name, found in suspected.items()})


def _retest(stage: _Stage, node: str, broken: bool, after: float | None, floor: float | None) -> Retest:
    """The failing all-reduce (slow, or not completed) next to the one without the suspects."""
    before = min((step.busbw_gbps for step in stage.steps if not step.ok), default=None)
    observed = "did not complete" if broken and before is None else f"{before:.3g} GB/s" if before else "-"
    said = CheckRow("allreduce", "allreduce_busbw_gbps", Status.FAIL, "below_threshold", observed)
    symptom = node_row(stage.run_id, stage.cluster, NAME, node, said)
    recovered = after is not None and (floor is None or after >= floor)
    return Retest(symptom, None if after is None else f"{after:.3g} GB/s", recovered)
