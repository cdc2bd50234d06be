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

import os
import socket
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster_accept.analysis import between_nodes, coverage, suspects
from cluster_accept.analysis.verdicts import Verdict, VerdictRow, node_verdict
from cluster_accept.checks.base import BAD_STATUSES, Check, NodeRow, Status, discover, retested
from cluster_accept.checks.declarations import Link
from cluster_accept.checks.probe_python import IMPORT_CACHE_ENV
from cluster_accept.flows.node_marks import read_marks, write_marks
from cluster_accept.inventory.load import as_local, select_nodes
from cluster_accept.inventory.model import Inventory
from cluster_accept.ops.slurm import REASON_MAX, REASON_PREFIX, SlurmPlan, slurm_step
from cluster_accept.probes.base import discover as discover_probes
from cluster_accept.remote.result import NodeStatus
from cluster_accept.tasks.preflight.auto_profile import GPU_CHECK, NIC_CHECK, NVLINK_CHECK, resolve_auto_nodes
from cluster_accept.tasks.preflight.check_batch import run_preflight_on_node
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


def this_node(inventory: Inventory, named: str | None, environ: Mapping[str, str]) -> str:
    """The inventory node this machine is (:func:`_which_node`); ValueError when it is excluded in the inventory:
    a node taken out of testing is not checked, and its check is no verdict."""
    name = _which_node(inventory, named, environ)
    if inventory.node(name).excluded:
        raise ValueError(f"{name} is excluded in the inventory: it is not checked")
    return name


def _which_node(inventory: Inventory, named: str | None, environ: Mapping[str, str]) -> str:
    """``named``, else Slurm's name for this machine, else the host's short name; the one node of a one-node
    inventory. Raises ValueError naming what was looked for."""
    if named:
        return inventory.node(named).name if _known(inventory, named) else _unknown(named, "--node")
    slurm_name = environ.get("SLURMD_NODENAME")
    if slurm_name:
        by_slurm = {n.slurm_node: n.name for n in inventory.nodes}
        return by_slurm.get(slurm_name) or _unknown(slurm_name, "SLURMD_NODENAME (slurm.node_names)")
    if len(inventory.nodes) == 1:
        return inventory.nodes[0].name
    host = socket.gethostname().split(".")[0]
    return host if _known(inventory, host) else _unknown(host, "this host's short name (give --node)")


def _known(inventory: Inventory, name: str) -> bool:
    return any(n.name == name for n in inventory.nodes)


def _unknown(name: str, source: str) -> str:
    raise ValueError(f"{name!r}, from {source}, is no node of the inventory")


def preflight_links() -> tuple[Link, ...]:
    """The cause links a run's verdicts use, gathered as the stages gather them (probes of the single-node stage,
    the burn's, those between nodes), without importing the stages (and Prefect)."""
    probes = discover_probes()
    single = [p for p in probes if p.stage == "single-node"]
    ordered = single + [p for p in probes if p.stage == "burn"]
    return (
        preflight_causes(discover())
        + suspects.probe_stage_causes(frozenset(p.check for p in single), "single-node")
        + tuple(link for probe in ordered for link in probe.causes)
        + suspects.causes(suspects.BETWEEN_NODES_SYMPTOMS, "multi-node")
        + between_nodes.CAUSES
    )


def import_cache() -> Path:
    """Where this node keeps the last good answer of torch's import (:data:`checks.probe_python.IMPORT_CACHE_ENV`):
    the user's runtime directory, else ``/run`` (root, a Slurm prolog), else the temporary directory; cleared at
    boot where it is a tmpfs, and keyed by the boot where it is not."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime else Path("/run") if os.access("/run", os.W_OK) else Path(tempfile.gettempdir())
    return base / f"cluster-accept-{os.getuid()}" / "probe-import.json"


def check_node(
    inventory: Inventory, node_name: str, run_id: str, fresh: bool = False, state: Path | None = None
) -> NodeCheck:
    """The preflight of ``node_name`` on this machine, judged and held to its profile as in a run. Unless ``fresh``,
    the probe interpreter's CUDA start is taken from the last good one while nothing it rests on changed. With a
    ``state`` dir, what is new since the node's previous check is judged, and this check's marks are kept there
    (:mod:`.node_marks`)."""
    started = time.monotonic()
    inventory = as_local(select_nodes(inventory, node_name))
    checks = discover()
    env = {} if fresh else {IMPORT_CACHE_ENV: str(import_cache())}
    outcome = run_preflight_on_node(inventory.node(node_name), checks, env)
    answered = [] if outcome.result.status in (NodeStatus.TOOL_ERROR, NodeStatus.UNREACHABLE) else [node_name]
    gpu, nic = {node_name: outcome.models.get(GPU_CHECK)}, {node_name: outcome.models.get(NIC_CHECK)}
    inventory, rows = resolve_auto_nodes(
        run_id, inventory, gpu, answered, nic, {node_name: outcome.models.get(NVLINK_CHECK)}
    )
    kept = read_marks(state, node_name) if state is not None else None
    if kept is not None:
        since_previous([outcome], checks, {node_name: kept.marks})
    rows += evaluate_preflight(run_id, inventory, [outcome], checks)
    node = inventory.node(node_name)
    expectations = tuple(e for check in checks for e in check.expectations)
    for name, expectation in coverage.missing(NAME, {node_name: node.profile}, rows, expectations):
        rows.append(node_row(run_id, inventory.cluster, NAME, name, coverage.gap_row(expectation)))
    verdict = node_verdict(node_name, rows, preflight_links()).row(run_id, inventory.cluster, node.profile_name)
    notes = [] if kept is None or kept.note is None else [kept.note]
    if state is not None:
        notes += _keep_marks(state, node_name, checks, outcome.models, kept.marks if kept else {})
    return NodeCheck(node_name, rows, verdict, time.monotonic() - started, notes)


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
