"""Rows read off one multi-node group run: the transport NCCL chose between nodes on each rank, and what a
group that failed (or never started) says about each of its nodes, leading with the line that says why."""

from __future__ import annotations

from dataclasses import replace

from cluster_accept.analysis.nccl_log import nccl_transports, transport_matches, why_first
from cluster_accept.analysis.secrets import masked_tail
from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.checks.reasons import Action, Reason, declare
from cluster_accept.inventory.hostlist import fold
from cluster_accept.inventory.model import Node
from cluster_accept.probes.allreduce import UNREADABLE
from cluster_accept.remote.result import NodeStatus
from cluster_accept.tasks.launcher import GroupRun
from cluster_accept.tasks.rows import tool_error_row


def transport_rows(node: Node, log: str, group: str) -> list[CheckRow]:
    """What NCCL chose between nodes, from this node's log; a log without one is a warning, not silence."""
    if node.profile.probes.device != "cuda":
        return []
    item = f"inter_node {group}"
    expected = node.profile.probes.expected_transport.inter_node
    used = {t: n for t, n in nccl_transports(log).items() if t.startswith(("NET/", "COLLNET/"))}
    if not used:
        said = "no connection between nodes in NCCL's log"
        return [CheckRow("transport", item, Status.WARN, "unreadable", None, expected, said)]
    observed = ",".join(sorted(used))
    if expected is None:
        return [CheckRow("transport", item, Status.PASS, "recorded", observed, None)]
    bad = sorted(t for t in used if not transport_matches(t, expected))
    status, reason = (Status.FAIL, "unexpected_inter_node") if bad else (Status.PASS, "ok")
    said = "what NCCL chose between nodes, from this node's NCCL_DEBUG log"
    return [CheckRow("transport", item, status, reason, observed, expected, said)]


def failed_run_rows(
    run: GroupRun, check: str = "allreduce", what: str = "all-reduce"
) -> list[tuple[str, CheckRow, str]]:
    """(node, row, evidence) for a sweep run that hung, failed or never started, with what each rank said: a
    collective that hangs once in acceptance is a finding even when the isolation re-tests pass.

    When the failure has an evident culprit (a node that became unreachable, or whose session was lost
    without an exit status: a node that died), only that node carries it; the others are re-tested. A group
    that never started fails every node with why, so that none is accepted silently."""
    group = fold(run.nodes)
    item = f"inter_node {group}"
    if not run.ranks:
        said = f"the {what} of {group} could not start: {run.detail or 'no rank was launched'}"
        return [(n, CheckRow(check, item, Status.ERROR, "launch_failed", None, "started", said), "") for n in run.nodes]
    unreachable = {name for name, rank in run.ranks.items() if rank.cause is not None}
    failed_here = [(name, rank) for name, rank in run.ranks.items() if rank.status is NodeStatus.TOOL_ERROR]
    if failed_here:  # the run's result is unknown because of the tool, not of any node
        name, rank = failed_here[0]
        row, raw = tool_error_row(rank.detail)
        said = f"the {what} of {group} could not be judged: the controller failed on {name}'s rank ({row.detail})"
        return [(n, replace(row, item=item, detail=said), raw) for n in run.nodes if n not in unreachable]
    lost = {
        name
        for name, rank in run.ranks.items()
        if rank.cause is None and (rank.result is None or (rank.result.exit_code is None and not rank.result.timed_out))
    }
    # An unreachable node explains the failure (the others were stopped with it); failing that, the nodes
    # whose sessions were lost, unless every rank was (then nobody stands out).
    blamed = unreachable or (lost if lost != set(run.ranks) else set())
    found = []
    for name, rank in run.ranks.items():
        if name in unreachable or (blamed and name not in blamed):
            continue  # unreachable: its own row says so; peers of a dead node are not to blame
        result = rank.result
        if result is not None and result.timed_out:
            status, reason, said = Status.TIMEOUT, "collective_timeout", "killed at the probe timeout"
        elif result is not None and result.ok:
            status, reason, said = Status.ERROR, "collective_failed", "this rank finished; another did not"
        else:
            code = "none" if result is None else result.exit_code
            status, reason, said = Status.ERROR, "collective_failed", f"exit {code}"
        if result is not None:
            why, evidence = why_first(
                result.stdout + "\n" + result.stderr,
                masked_tail(result.stdout, 1500) + masked_tail(result.stderr, 500),
            )
        else:
            why, evidence = "", rank.detail
        detail = "; ".join(p for p in (why, f"{what} of {group} did not complete ({said})", run.detail) if p)
        found.append((name, CheckRow(check, item, status, reason, said, "completed", detail), evidence))
    return found


GROUP_REASONS = {
    "allreduce": declare(
        Reason(
            "collective_timeout",
            Status.TIMEOUT,
            "the all-reduce across nodes hung and was stopped on every node: rerun; if it repeats, bisect",
            Action.RERUN,
        ),
        Reason(
            "collective_failed",
            Status.ERROR,
            "the all-reduce across nodes did not complete (see what each rank said): rerun, then bisect",
            Action.RERUN,
        ),
        Reason("fewer_than_two_nodes", Status.SKIP, "fewer than two nodes passed the earlier stages"),
        Reason(
            "launch_failed",
            Status.ERROR,
            "the multi-node run could not be started (see why): fix the launcher settings, then rerun",
            Action.FIX_CONFIG,
        ),
    ),
    "transport": declare(
        UNREADABLE,
        Reason(
            "unexpected_inter_node",
            Status.FAIL,
            "NCCL fell back between nodes: check NCCL_SOCKET_IFNAME, NCCL_IB_HCA and the HCAs",
            Action.FIX_CONFIG,
        ),
    ),
}
