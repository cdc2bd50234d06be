"""Rows read off one multi-node group run: the transport NCCL chose between nodes on each rank, the lines of its
output that gave no figure, and what a group that failed (or never started) says about each of its nodes, leading
with the line that says why."""

from __future__ import annotations

from dataclasses import replace

from cluster_accept.analysis.nccl_log import nccl_transports, transport_matches, why_first
from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.checks.reasons import TOOL_CHECK, Action, Reason, declare
from cluster_accept.inventory.hostlist import fold
from cluster_accept.inventory.model import Node
from cluster_accept.probes.allreduce import UNREADABLE
from cluster_accept.remote.launch import GroupRun, RankRun
from cluster_accept.remote.rank_end import RankEnd, rank_end
from cluster_accept.remote.result import NodeStatus
from cluster_accept.tasks.rows import tool_error_row
from cluster_accept.vocabulary.text import keep_head, keep_tail, run_output

OBSERVED_CHARS = 80  # of how a failed rank ended, in its row's observed column (the whole of it is in the detail)
LAST_LINES_CHARS = 600  # of a failed rank's last lines in its row's detail


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
    collective that fails once in acceptance is a finding even when the isolation re-tests pass.

    The node whose rank failed of itself carries the failure, with its rank's evidence (exit status, signal,
    last lines, masked); its peers were stopped with the run, or failed only of the lost connection, and say so
    without being rejected for it (:mod:`remote.rank_end`). An unreachable node carries its own row.
    When no rank can be blamed (every rank hung alike, or each failed only of another), no node is rejected:
    the run is a rerun, said as such on every node. A group that never started fails every node with why."""
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
    blamed = culprits(run)
    if not blamed and not unreachable:
        return _unattributed(run, item, what)
    named = ", ".join(sorted(blamed) or sorted(unreachable))
    found = []
    for name, rank in run.ranks.items():
        if name in unreachable:
            continue  # its own row says so
        if name in blamed:
            found.append(_blamed_row(name, rank, blamed[name], check, item, what))
            continue
        said = f"stopped with the run: {named} failed; {rank.said}"
        found.append((name, CheckRow(check, item, Status.SKIP, STOPPED.code, "stopped", "completed", said), ""))
    return found


def culprits(run: GroupRun) -> dict[str, RankEnd]:
    """The ranks that failed of themselves, by node, with how: neither complete, nor stopped by the run, nor
    unreachable (those carry their own row), nor hung (a hang stops every rank alike: none stands out), nor
    failing only of a peer's loss."""
    found = {}
    for name, rank in run.ranks.items():
        if rank.ok or rank.stopped or rank.cause is not None or rank.status is NodeStatus.TOOL_ERROR:
            continue
        result = rank.result
        if result is None:  # it never ran: its start failed on its node (a refused copy, srun did not start it)
            found[name] = RankEnd(True, rank.detail or "it did not start")
        elif not result.timed_out:
            end = rank_end(result.exit_code, run_output(result.stdout, result.stderr))
            if end.own:
                found[name] = end
    return found


def _blamed_row(name: str, rank: RankRun, end: RankEnd, check: str, item: str, what: str) -> tuple[str, CheckRow, str]:
    """The failed rank's node: its own evidence first (the NCCL line saying why, its last lines), as masked where
    the rank's output entered the controller."""
    result = rank.result
    if result is None:
        why, evidence = "", rank.detail
    else:
        text = run_output(result.stdout, result.stderr)
        why, evidence = why_first(text, keep_tail(result.stdout, 1500) + keep_tail(result.stderr, 500))
    last = keep_tail(end.lines, LAST_LINES_CHARS)
    said = end.why
    failed = f"{name}'s rank failed ({said}); the {what} did not complete"
    parts = (why, failed, f"its last lines: {last}" if last else "")
    detail = "; ".join(p for p in parts if p)
    observed = keep_head(said, OBSERVED_CHARS)
    return name, CheckRow(check, item, Status.ERROR, "collective_failed", observed, "completed", detail), evidence


def _unattributed(run: GroupRun, item: str, what: str) -> list[tuple[str, CheckRow, str]]:
    """No rank of a failed run can be blamed: every node is left unjudged by it (a rerun), each saying what
    its rank did, never rejected for it."""
    ranks = "; ".join(f"{name}: {rank.said}" for name, rank in run.ranks.items())
    said = f"the {what} of {fold(run.nodes)} did not complete and no rank of it can be blamed ({ranks})"
    row = CheckRow(TOOL_CHECK, item, Status.ERROR, "run_unattributed", None, "completed", said)
    return [(n, row, "") for n in run.nodes]


def teardown_rows(run: GroupRun, check: str) -> list[tuple[str, CheckRow]]:
    """A warning on each node whose rank finished its work, then did not exit cleanly: the run stands."""
    rows = []
    item = f"inter_node {fold(run.nodes)}"
    for name, rank in run.ranks.items():
        if rank.teardown_error and rank.result is not None:
            code = rank.result.exit_code
            said = (
                f"{name}'s rank finished its part of the run (every process said so), then ended with "
                f"{'no exit status' if code is None else f'exit {code}'}: the run's figures stand"
            )
            observed = "stopped" if code is None else f"exit {code}"
            rows.append((name, CheckRow(check, item, Status.WARN, TEARDOWN.code, observed, "exit 0", said)))
    return rows


def probe_error_rows(run: GroupRun, check: str) -> list[tuple[str, CheckRow]]:
    """An error row on every node of the group for each line of the run's output that gave no figure (a key no
    node script declares, a value of another type, an error the job printed), whatever the run's outcome: a
    figure the controller cannot read is never dropped in silence, as in the single-node stage."""
    item = f"inter_node {fold(run.nodes)}"
    rows = [CheckRow(check, item, Status.ERROR, PROBE_ERROR.code, None, None, error) for error in run.errors]
    return [(name, row) for row in rows for name in run.nodes]


PROBE_ERROR = Reason(
    "probe_error",
    Status.ERROR,
    "a line of the run's output could not be read as a figure (a key no node script declares, a value of another "
    "type) or is an error the job printed (the detail quotes it): the run was not fully judged; rerun, and if it "
    "repeats, the node script and the controller are of different versions",
    Action.RERUN,
)
STOPPED = Reason(
    "stopped_with_run",
    Status.SKIP,
    "another node's rank failed and this one was stopped with the run, or failed only of losing it: not judged "
    "by this run (the failed node is named; isolation re-tests the rest)",
)
TEARDOWN = Reason(
    "teardown_error",
    Status.WARN,
    "the rank finished its work, then exited with an error: the run's figures stand; if it repeats, check the "
    "node's torch and NCCL versions",
    Action.RERUN,
)


GROUP_REASONS = {
    "allreduce": declare(
        Reason(
            "collective_timeout",
            Status.TIMEOUT,
            "the all-reduce across nodes hung and was stopped on every node: first the job_settings rows (a setting "
            "run again without), then NCCL's warnings in each rank's output, the node's HCAs and cables; bisect "
            "with known-good nodes (cluster-accept bisect --good)",
            Action.CHECK_NODE,
        ),
        Reason(
            "collective_failed",
            Status.ERROR,
            "the all-reduce across nodes did not complete: the NCCL warning in the detail says why; the job_settings "
            "rows say whether a setting of this node, run again without it, was the cause; else its HCAs, cables "
            "and NCCL's environment",
            Action.CHECK_NODE,
        ),
        Reason("fewer_than_two_nodes", Status.SKIP, "fewer than two nodes passed the earlier stages"),
        STOPPED,
        TEARDOWN,
        PROBE_ERROR,
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
