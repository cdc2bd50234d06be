"""How a multi-node rank ended, read from what it printed: real ``torchrun`` outputs (three CPU ranks on
loopback, torch 2.13: one rank's worker killed with SIGKILL mid-training, its peers failing of the lost
connection), and the attribution of a failed run to the node whose rank failed of itself."""

from __future__ import annotations

from pathlib import Path

from cluster_accept.checks.base import Status
from cluster_accept.checks.reasons import TOOL_CHECK
from cluster_accept.remote.launch import GroupRun, RankRun
from cluster_accept.remote.rank_end import peer_loss_line, rank_done, rank_end, worker_signal
from cluster_accept.remote.result import CommandResult, NodeStatus
from cluster_accept.tasks.multi_node.group_rows import culprits, failed_run_rows, teardown_rows
from cluster_accept.vocabulary.figures import Figure

DATA = Path(__file__).parent / "data" / "torchrun"
KILLED = (DATA / "killed-rank-sigkill.txt").read_text()
PEER = (DATA / "peer-of-killed-rank-gloo.txt").read_text()
DONE = '{"info": "rank_done", "rank": %d, "local_rank": %d, "local_world_size": %d}\n'


def test_the_killed_rank_is_its_own_culprit_and_its_peer_a_victim() -> None:
    assert worker_signal(KILLED) == 9
    killed = rank_end(1, KILLED)
    assert killed.own and killed.why == "exit 1, a worker ended by SIGKILL"
    assert "Signal 9 (SIGKILL) received by PID 13968" in killed.lines
    assert worker_signal(PEER) is None
    assert "Read error [127.0.0.1]:57507: Connection reset by peer" in peer_loss_line(PEER)
    peer = rank_end(1, PEER)
    assert not peer.own and peer.why.startswith("exit 1 after losing a peer: [rank0]: RuntimeError: ")


def test_signals_and_plain_failures() -> None:
    assert rank_end(137, "").why == "exit 137, a worker ended by SIGKILL" and rank_end(137, "").own
    assert rank_end(3, "rank 3: simulated crash").own  # no word of a peer: its own failure
    # NCCL's watchdog aborts a rank whose peer vanished: SIGABRT beside a peer-loss line is a victim's end...
    abort = "exitcode  : -6 (pid: 7)  (SIGABRT)\nNCCL error: remote process exited or there was a network error"
    assert not rank_end(1, abort).own
    # ... and its own without one; SIGSEGV is the node's own even beside a peer-loss line
    assert rank_end(1, "exitcode  : -6 (pid: 7)  (SIGABRT)").own
    assert rank_end(1, "exitcode  : -11 (pid: 7)\nConnection reset by peer").own
    assert rank_end(None, "").why == "no exit status"


def test_a_node_is_done_when_every_local_rank_said_so() -> None:
    assert rank_done(DONE % (0, 0, 1))
    assert not rank_done(DONE % (0, 0, 2))  # one of the node's two processes did not get there
    assert rank_done(DONE % (2, 0, 2) + "noise\n" + DONE % (3, 1, 2))
    assert not rank_done('{"info": "rank_done"')  # cut mid-line
    assert not rank_done(KILLED) and not rank_done("")


def _rank(name: str, code: int | None, text: str = "", stopped: bool = False, timed_out: bool = False) -> RankRun:
    status = NodeStatus.OK if code is not None or text.count("rank_done") else NodeStatus.ERROR
    result = CommandResult("training_inter", code, text, "", timed_out=timed_out)
    detail = "stopped with the run" if stopped else ""
    return RankRun(name, status, None, detail, result, stopped=stopped)


def _run(*ranks: RankRun) -> GroupRun:
    run = GroupRun(tuple(r.node for r in ranks), "t")
    run.ranks = {r.node: r for r in ranks}
    return run


def test_the_failed_rank_is_blamed_and_its_peers_are_not() -> None:
    run = _run(_rank("node01", 1, PEER), _rank("node02", 1, KILLED), _rank("node03", None, stopped=True))
    rows = {node: row for node, row, _ in failed_run_rows(run, "training_scaling", "training run")}
    assert set(culprits(run)) == {"node02"}
    assert rows["node02"].status is Status.ERROR and rows["node02"].reason == "collective_failed"
    assert rows["node02"].observed == "exit 1, a worker ended by SIGKILL"
    assert "Signal 9 (SIGKILL) received by PID 13968" in rows["node02"].detail
    for peer in ("node01", "node03"):  # stopped with the run, or failed only of losing node02: not rejected
        assert rows[peer].status is Status.SKIP and rows[peer].reason == "stopped_with_run", rows[peer]
        assert rows[peer].detail.startswith("stopped with the run: node02 failed")
    assert "exit None" not in " ".join(r.detail for r in rows.values())


def test_no_rank_to_blame_rejects_nobody() -> None:
    hung = _run(_rank("node01", 124, timed_out=True), _rank("node02", 124, timed_out=True))
    victims = _run(_rank("node01", 1, PEER), _rank("node02", None, stopped=True))
    for run in (hung, victims):
        assert culprits(run) == {}
        rows = failed_run_rows(run)
        assert {n for n, _, _ in rows} == {"node01", "node02"}
        assert {(r.check, r.status, r.reason) for _, r, _ in rows} == {(TOOL_CHECK, Status.ERROR, "run_unattributed")}
    said = failed_run_rows(hung)[0][1].detail
    assert "no rank of it can be blamed (node01: killed at the probe timeout; node02: killed at" in said


def test_a_teardown_error_after_every_rank_finished_leaves_the_run_complete() -> None:
    figures = '{"metric": "allreduce_busbw_gbps", "value": 1.5, "size": 1}\n'
    first = _rank("node01", 0, figures + DONE % (0, 0, 1))
    second = _rank("node02", 1, DONE % (1, 0, 1) + "terminate called without an active exception\n")
    stopped = _rank("node03", None, DONE % (2, 0, 1), stopped=True)  # stopped after it had finished
    run = _run(first, second, stopped)
    run.measurements = [Figure("allreduce_busbw_gbps", 1.5, size=1)]
    assert run.ok and run.busbw_gbps == 1.5
    warned = {node: row for node, row in teardown_rows(run, "allreduce")}
    assert set(warned) == {"node02", "node03"}
    assert warned["node02"].status is Status.WARN and warned["node02"].observed == "exit 1"
