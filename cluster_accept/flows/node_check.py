"""A node checking itself, synchronously, in seconds: ``cluster-accept check --local``.

What Slurm's Prolog and HealthCheckProgram need: the preflight of this machine (no SSH, no Prefect and no API
server), judged by the same checks, the same coverage rule and the same verdict rules as a run; one line in the
form Slurm's reason field takes (``cluster-accept: nvlink:inactive gpu3, persistence:off``) and an exit status
that *is* the verdict: 0 healthy, 1 not, 2 a usage or inventory error, 3 the tool failed. The node is named by
``--node``, else ``SLURMD_NODENAME`` (a Slurm name, mapped by the inventory's ``slurm.node_names``), else this
host's short name; an inventory of one node needs none of them. The checks' marks (where the kernel log was read)
are kept on the node from one check to the next (:mod:`.node_marks`), as a run keeps them in the history: an
application's XID is judged by one check, not again before every job; a hardware XID is never marked as judged
(:func:`checks.xid.marks`), so it fails every check of its boot whatever became of the first one's drain.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster_accept.analysis import between_nodes, coverage, suspects
from cluster_accept.analysis.verdicts import Verdict, VerdictRow, node_verdict
from cluster_accept.checks.base import BAD_STATUSES, Check, NodeRow, Status, retested
from cluster_accept.checks.declarations import Link
from cluster_accept.flows.node_gather import StartedCheck, start_check
from cluster_accept.flows.node_marks import read_marks, write_marks
from cluster_accept.inventory.model import Inventory
from cluster_accept.ops.slurm import REASON_MAX, REASON_PREFIX, SlurmPlan, slurm_step
from cluster_accept.probes.base import discover as discover_probes
from cluster_accept.remote.result import NodeStatus
from cluster_accept.tasks.preflight.auto_profile import GPU_CHECK, NIC_CHECK, NVLINK_CHECK, resolve_auto_nodes
from cluster_accept.tasks.preflight.evaluate import NAME, evaluate_preflight, preflight_causes, since_previous
from cluster_accept.tasks.rows import node_row
from cluster_accept.vocabulary.own_files import replace_whole

HEALTHY, UNHEALTHY, TOOL_FAILURE = 0, 1, 3


@dataclass(frozen=True)
class SlurmOps:
    """What a node's own check may do to it in Slurm (``--drain``, ``--resume-passing``, ``--apply``)."""

    drain: bool = False
    resume_passing: bool = False
    apply: bool = False
    scontrol: str = "scontrol"


@dataclass
class NodeCheck:
    """What a node's own check found: its rows, its verdict and the line Slurm's reason field takes."""

    node: str
    rows: list[NodeRow] = field(default_factory=list)
    verdict: VerdictRow | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # what the operator should know beside the verdict (marks)

    @property
    def exit_code(self) -> int:
        if self.verdict is None or self.verdict.verdict == Verdict.TOOL_ERROR:
            return TOOL_FAILURE
        return HEALTHY if self.verdict.verdict == Verdict.ACCEPTED else UNHEALTHY

    @property
    def reason_line(self) -> str:
        """``cluster-accept: <code> [gpuN], …`` cause first, cut to Slurm's field; ``cluster-accept: ok`` when
        healthy, with its warnings named (``cluster-accept: ok (warn: xid:xid_13)``)."""
        if self.verdict is None or not self.verdict.reasons:
            warned = list(dict.fromkeys(row.code for row in self.rows if row.status is Status.WARN))
            text = f"{REASON_PREFIX}ok" + (f" (warn: {', '.join(warned)})" if warned else "")
            return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3] + "..."
        return slurm_reason(self.verdict.reasons, self.rows)


def slurm_reason(codes: Sequence[str], rows: Sequence[NodeRow]) -> str:
    """The verdict's codes in their order, each with the GPUs its failing rows name, as one short line."""
    gpus: dict[str, list[int]] = {}
    for row in rows:
        if row.status in BAD_STATUSES and row.gpu is not None and row.gpu not in gpus.setdefault(row.code, []):
            gpus[row.code].append(row.gpu)
    parts = [" ".join([code, *(f"gpu{g}" for g in sorted(gpus.get(code, [])))]) for code in codes]
    text = REASON_PREFIX + ", ".join(parts)
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3] + "..."


def preflight_links(checks: list[Check[Any]]) -> tuple[Link, ...]:
    """The cause links a run's verdicts use, gathered as the stages gather them (``checks``' own, probes of the
    single-node stage, the burn's, those between nodes), without importing the stages (and Prefect)."""
    probes = discover_probes()
    single = [p for p in probes if p.stage == "single-node"]
    ordered = single + [p for p in probes if p.stage == "burn"]
    return (
        preflight_causes(checks)
        + suspects.probe_stage_causes(frozenset(p.check for p in single), "single-node")
        + tuple(link for probe in ordered for link in probe.causes)
        + suspects.causes(suspects.BETWEEN_NODES_SYMPTOMS, "multi-node")
        + between_nodes.CAUSES
    )


def check_node(
    inventory: Inventory, node_name: str, run_id: str, fresh: bool = False, state: Path | None = None
) -> NodeCheck:
    """The preflight of ``node_name`` on this machine, judged and held to its profile as in a run: its commands
    started (:func:`flows.node_gather.start_check`), then :func:`finish_check`."""
    return finish_check(start_check(inventory, node_name, fresh), run_id, state)


def finish_check(check: StartedCheck, run_id: str, state: Path | None = None) -> NodeCheck:
    """The started check's answer judged. With a ``state`` dir, what is new since the node's previous check is
    judged, and this check's marks are kept there (:mod:`.node_marks`)."""
    node_name, checks = check.node, check.checks
    outcome = check.outcome.result()
    answered = [] if outcome.result.status in (NodeStatus.TOOL_ERROR, NodeStatus.UNREACHABLE) else [node_name]
    gpu, nic = {node_name: outcome.models.get(GPU_CHECK)}, {node_name: outcome.models.get(NIC_CHECK)}
    inventory, rows = resolve_auto_nodes(
        run_id, check.inventory, gpu, answered, nic, {node_name: outcome.models.get(NVLINK_CHECK)}
    )
    kept = read_marks(state, node_name) if state is not None else None
    if kept is not None:
        since_previous([outcome], checks, {node_name: kept.marks})
    rows += evaluate_preflight(run_id, inventory, [outcome], checks)
    node = inventory.node(node_name)
    expectations = tuple(e for c in checks for e in c.expectations)
    for name, expectation in coverage.missing(NAME, {node_name: node.profile}, rows, expectations):
        rows.append(node_row(run_id, inventory.cluster, NAME, name, coverage.gap_row(expectation)))
    judged = node_verdict(node_name, rows, preflight_links(checks))
    verdict = judged.row(run_id, inventory.cluster, node.profile_name)
    notes = [] if kept is None or kept.note is None else [kept.note]
    if state is not None:
        notes += _keep_marks(state, node_name, checks, outcome.models, kept.marks if kept else {})
    return NodeCheck(node_name, rows, verdict, time.monotonic() - check.started, notes)


def _keep_marks(
    state: Path, node: str, checks: list[Check[Any]], models: Mapping[str, Any], before: Mapping[str, Mapping[str, str]]
) -> list[str]:
    """This check's marks kept for the node's next check; a check that read nothing this time (its log unreadable)
    keeps its previous marks, which still say what was judged. Returns why nothing was kept, if so."""
    marks = {c.name: c.marks(models[c.name]) for c in checks if c.marks is not None and c.name in models}
    why = write_marks(state, node, {**before, **{name: found for name, found in marks.items() if found}})
    return [why] if why else []


def slurm_actions(found: NodeCheck, slurm_node: str, ops: SlurmOps) -> SlurmPlan:
    """Drain this node with its reasons when it fails, resume it when cluster-accept drained it and it passes
    again (only for findings this check looked at again): the run's own Slurm rules, for one node."""
    if found.verdict is None:
        return SlurmPlan()
    judged = {found.node: retested(found.rows)}  # an XID passed as seen before was not looked at again
    return slurm_step(
        [found.verdict],
        found.verdict.run_id,
        ops.drain,
        ops.resume_passing,
        ops.apply,
        ops.scontrol,
        {found.node: slurm_node},
        judged,
    )


def write_prometheus(path: Path, found: NodeCheck, cluster: str, run_id: str) -> None:
    """The node's verdict as a node_exporter textfile (written whole, then renamed into place)."""
    from cluster_accept.reports.summary import prometheus_text

    if found.verdict is None:
        return
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    text = prometheus_text({"run_id": run_id, "cluster": cluster, "ended": stamp}, [found.verdict], {})
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_whole(path, text)  # never through a link planted in the textfile directory
