"""NCCL's RAS in the watch: its reports as captured on a lent 2 × H200 host (NCCL 2.28.9, a data-parallel job of two
"nodes", one rank stopped and then one killed; tests/data/watch/README.md says how), read by the watcher from one
node a round, and used by the judgement beside the Flight Recorder: a node the watcher cannot reach is named dead
by its peers' NCCL, a hang whose ranks all entered the collective is held by the process RAS finds not answering,
and the evidence of a named rank carries what RAS said of it."""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from cluster_accept.vocabulary.status import Status
from cluster_accept.watch import rounds
from cluster_accept.watch.judge import WatchRules, judge
from cluster_accept.watch.ras import RasSeen, RasStatus, parse_ras_answer
from cluster_accept.watch.read import NodeRead
from cluster_accept.watch.words import CollectiveSeen, FindingKind, RankSeen, RankState, WatchFinding
from tests.ras_replay import answer
from tests.test_live_job_localize import KINDS, MS, Job, S
from tests.test_remote import local_node

CAPTURED = Path(__file__).parent / "data" / "watch" / "ras" / "captured-2.28.9"


def captured(name: str) -> str:
    return (CAPTURED / f"{name}.line").read_text()


# The captures, parsed ------------------------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("form", ["json", "txt"])
def test_the_captured_reports_read_as_nccl_wrote_them(form: str) -> None:
    """Healthy: one communicator, nothing named. Stopped 10 and 30 s: rank 1's process (pid 2348) unresponsive;
    70 s: considered dead (RAS's 60 s). Killed: rank 1 unresponsive and rank 0 in error, the remote error it saw
    (ncclRemoteError, 6): the survivor's error names no node on its own."""
    healthy = parse_ras_answer(captured(f"healthy-half-a.{form}"))
    assert (healthy.available, healthy.nccl_version, healthy.communicators, healthy.ranks) == (True, "2.28.9", 1, ())
    assert healthy.form == ("json" if form == "json" else "text")
    for name, state in (("stopped10", "unresponsive"), ("stopped30", "unresponsive"), ("stopped70", "dead")):
        status = parse_ras_answer(captured(f"{name}-half-a.{form}"))
        assert [(r.communicator, r.rank, r.state, r.pid, r.host) for r in status.ranks] == [
            ("0x88cacb0bb8c594fe", 1, state, 2348, "192.0.2.2")
        ], name
        assert [(p.pid, p.state) for p in status.processes] == [(2348, state)]
    killed = parse_ras_answer(captured(f"killed5-half-a.{form}"))
    assert sorted((r.rank, r.state, r.pid) for r in killed.ranks) == [(0, "error", 2771), (1, "unresponsive", 2772)]
    error = next(r for r in killed.ranks if r.state == "error")
    assert error.detail == ("init_state 0, async_error 6, abort False" if form == "json" else "Remote process error")


# Judged beside the Flight Recorder -------------------------------------------------------------------------------


def onto(status: RasStatus, pids: dict[int, int]) -> RasStatus:
    """The captured report with its processes' pids put on the synthetic job's (captured pid -> job pid)."""
    ranks = tuple(replace(r, pid=pids.get(r.pid or 0, r.pid)) for r in status.ranks)
    processes = tuple(replace(p, pid=pids.get(p.pid, p.pid)) for p in status.processes)
    return replace(status, ranks=ranks, processes=processes)


def rows_of(
    ranks: list[RankSeen], collectives: list[CollectiveSeen], now: int, ras: RasSeen | None
) -> list[WatchFinding]:
    rows = judge(ranks, collectives, WatchRules(persist_min_s=0.0), now, ras).findings
    assert sorted({r.kind for r in rows}) == sorted(KINDS)
    return rows


def failed(rows: list[WatchFinding]) -> list[tuple[str, str, str, int | None]]:
    return sorted((r.node, r.kind, r.reason, r.rank) for r in rows if r.status is Status.FAIL)


def the(rows: list[WatchFinding], node: str, kind: FindingKind) -> WatchFinding:
    return next(r for r in rows if r.node == node and r.kind == kind.value)


def unreachable_node() -> tuple[Job, list[RankSeen], list[CollectiveSeen], int]:
    """Two nodes of one rank: both read until 60 s ago, then only node00 (node01 no longer answers the watcher)."""
    job = Job(nodes=2, per_node=1, steps=10, seed=3)
    collectives = job.collectives()
    now = job.end_ns + 90 * S
    reads = job.reads(now - 80 * S, now - 60 * S) + [job.read(0, now - 30 * S), job.read(0, now - 2 * S)]
    return job, reads, collectives, now


@pytest.mark.unit
def test_a_node_the_watcher_cannot_reach_is_named_dead_by_its_peers_nccl() -> None:
    """Without RAS the watcher can say nothing of node01 (its last read ran); with RAS's report, asked on node00 a
    second ago, that rank 1's process is considered dead, node01 is named, and the hang is the death's."""
    job, reads, collectives, now = unreachable_node()
    assert failed(rows_of(reads, collectives, now, None)) == []
    dead = onto(parse_ras_answer(captured("stopped70-half-a.json")), {2348: 4001})
    rows = rows_of(reads, collectives, now, RasSeen("node00", now - S, dead))
    assert failed(rows) == [("node01", "dead_rank", "ras_dead", 1)]
    found = the(rows, "node01", FindingKind.DEAD_RANK)
    assert found.evidence == (
        "NCCL RAS (asked on node00 1.0 s ago): rank 1's process 4001 on 192.0.2.2 considered dead "
        "(no answer over the RAS network for 60 s)"
    )
    assert found.persistence == "last read 60.0 s ago (running)"
    assert found.owner_line == (
        "exclude node01: rank 1 (GPU 0) dead by NCCL's RAS (no answer over its network for 60 s), and its node is "
        "not read (last read 60.0 s ago (running))"
    )
    assert {(r.status, r.reason) for r in rows if r.kind == "hang"} == {(Status.NOT_JUDGED, "after_death")}
    # Unresponsive (not yet 60 s) names nothing: a slow answer is not a death.
    slow = onto(parse_ras_answer(captured("stopped10-half-a.json")), {2348: 4001})
    assert failed(rows_of(reads, collectives, now, RasSeen("node00", now - S, slow))) == []


@pytest.mark.unit
def test_a_dead_verdict_of_ras_on_a_rank_the_watcher_reads_is_left_to_that_read() -> None:
    """node01 read a second ago, running: RAS's older word of its death does not override the read."""
    job, reads, collectives, now = unreachable_node()
    reads.append(job.read(1, now - S))
    dead = onto(parse_ras_answer(captured("stopped70-half-a.json")), {2348: 4001})
    assert failed(rows_of(reads, collectives, now, RasSeen("node00", now - 10 * S, dead))) == []


def all_entered(job: Job, state: str = "running") -> tuple[list[RankSeen], list[CollectiveSeen], int]:
    """Every rank entered all_reduce #61 after #60 completed and nothing completed for 200 s; rank 2 in ``state``
    at the last read."""
    collectives = job.collectives()
    entered = [
        replace(c, seq=61, enqueue_ns=c.enqueue_ns + 300 * MS, completed=False, complete_ns=None, exec_ms=None)
        for c in collectives
        if c.seq == 60
    ]
    reads = []
    for i, after_s in enumerate((10, 100, 200)):
        for rank in job.ranks:
            last = rank == 2 and i == 2
            read_state = state if last else "running"
            enqueued = 60 if last and state == "stopped" else 61
            reads.append(
                job.read(rank, job.end_ns + after_s * S, read_state, last_enqueued_seq=enqueued, last_completed_seq=60)
            )
    return reads, collectives + entered, job.end_ns + 201 * S


@pytest.mark.unit
def test_a_hang_inside_the_collective_is_held_by_the_process_ras_finds_not_answering() -> None:
    """Every rank entered #61: the Flight Recorder cannot tell who holds it (a warning, no node); RAS finds rank 2's
    process unresponsive: node01 is named, the others wait."""
    job = Job(steps=20, seed=9)
    reads, collectives, now = all_entered(job)
    alone = rows_of(reads, collectives, now, None)
    assert failed(alone) == [] and {r.reason for r in alone if r.kind == "hang"} == {"hang_unlocalized"}
    stuck = onto(parse_ras_answer(captured("stopped10-half-a.txt")), {2348: 4002})
    rows = rows_of(reads, collectives, now, RasSeen("node00", now - 2 * S, stuck))
    assert failed(rows) == [("node01", "hang", "ras_unresponsive", 2)]
    found = the(rows, "node01", FindingKind.HANG)
    assert found.observed.startswith("holds the job: in the collective with the others, its process 4002 unresponsive")
    assert found.evidence.endswith(
        "rank 2 (node01) in the collective with the others, its process 4002 unresponsive by NCCL's RAS; "
        "NCCL RAS (asked on node00 2.0 s ago): rank 2's process 4002 on 192.0.2.2 unresponsive"
    )
    assert (the(rows, "node00", FindingKind.HANG).status, the(rows, "node00", FindingKind.HANG).reason) == (
        Status.PASS,
        "waiting",
    )


@pytest.mark.unit
def test_a_stopped_rank_is_named_by_its_state_with_what_ras_said_of_it() -> None:
    job = Job(steps=20, seed=9)
    reads, collectives, now = all_entered(job, state="stopped")
    dead = onto(parse_ras_answer(captured("stopped70-half-a.json")), {2348: 4002})
    rows = rows_of(reads, collectives, now, RasSeen("node01", now - S, dead))
    assert failed(rows) == [("node01", "hang", "rank_stopped", 2)]
    assert the(rows, "node01", FindingKind.HANG).evidence == (
        "ranks 0,1,3 entered all_reduce #61; rank 2 (node01) last at #61, stopped; NCCL RAS (asked on node01 1.0 s "
        "ago): rank 2's process 4002 on 192.0.2.2 considered dead (no answer over the RAS network for 60 s)"
    )


@pytest.mark.unit
def test_ras_names_a_process_by_its_pid_and_where_pids_repeat_by_its_rank() -> None:
    """Ranks 1 and 2 have one pid on two machines: RAS's rank (1) says which; a pid no rank has is never guessed."""
    job, reads, collectives, now = unreachable_node()
    dead = parse_ras_answer(captured("stopped70-half-a.json"))
    clash = [replace(r, pid=4001) for r in reads]  # every rank read with one pid
    rows = rows_of(clash, collectives, now, RasSeen("node00", now - S, onto(dead, {2348: 4001})))
    assert failed(rows) == [("node01", "dead_rank", "ras_dead", 1)]
    assert failed(rows_of(reads, collectives, now, RasSeen("node00", now - S, dead))) == []  # pid 2348: no rank


# Asked of one node a round ---------------------------------------------------------------------------------------


@pytest.mark.unit
def test_one_node_is_asked_a_round_and_one_without_ras_is_passed_over() -> None:
    nodes = ["n0", "n1", "n2"]
    state = rounds.WatchState(keep_s=60)
    assert state.ras_ask(nodes, 28028, "alice") == rounds.RasAsk("n0", "alice", 28028)  # before any rank: the first
    seen = RankSeen("j", "n0", 0, 0, 10, RankState.RUNNING, 1)
    state.ranks = [seen, replace(seen, node="n1", rank=1), replace(seen, node="n2", rank=2)]
    state.ras = RasSeen("n0", 1, RasStatus(True, form="json"))
    assert state.ras_ask(nodes, 28100, "alice") == rounds.RasAsk("n0", "alice", 28100)  # it answered: asked again
    state.ras = RasSeen("n0", 2, RasStatus(False, "nothing listens on localhost:28028"))
    assert state.ras_ask(nodes, 28028, "alice") == rounds.RasAsk("n1", "alice", 28028)
    state.ras = RasSeen("n2", 3, RasStatus(False, "nothing listens"))
    assert state.ras_ask(nodes, 28028, "alice") == rounds.RasAsk("n0", "alice", 28028)  # round the ring
    state.unread = {"n0"}
    assert state.ras_ask(nodes, 28028, "alice") == rounds.RasAsk("n1", "alice", 28028)  # an unread node: not asked
    state.ranks = [replace(r, state=RankState.EXITED) for r in state.ranks]
    assert state.ras_ask(nodes, 28028, "alice") is None  # the job has left every node


@pytest.mark.unit
def test_without_the_jobs_user_ras_is_asked_only_of_the_owner_of_the_jobs_directory_read_on_that_node() -> None:
    """A watch given no job user never asks whatever listens on the port: a node is asked once its reader found
    the job's directory, and only of a listener of that directory's owner."""
    nodes = ["n0", "n1"]
    state = rounds.WatchState(keep_s=60)
    assert state.ras_ask(nodes, 28028) is None  # nothing read yet: nobody to tie a listener to
    seen = RankSeen("j", "n0", 0, 0, 10, RankState.RUNNING, 1)
    state.add([NodeRead("n0", ranks=[seen], node_ns=10), NodeRead("n1", ranks=[replace(seen, node="n1", rank=1)],
                                                                   node_ns=10, job_uid=1234)])  # fmt: skip
    assert state.ras_ask(nodes, 28028) == rounds.RasAsk("n1", "1234", 28028)  # n0's directory owner unknown
    assert rounds.ras_command(local_node("n1"), 28028, "1234").script.count("--user 1234") == 1


def serve_ras(body: str) -> tuple[int, threading.Thread]:
    """A listener answering one RAS client as NCCL does (``src/ras/client_support.cc``), with ``body``."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        with listener:
            answer(listener.accept()[0], body)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return port, thread


@pytest.mark.integration
def test_a_round_asks_ras_on_the_chosen_node_only(tmp_path: Path) -> None:
    """Over the real fan-out (this machine as two nodes), the node-side RAS reader asks a listener replaying the
    captured report of a stopped rank: n1's read carries it and its coverage row; n0 was not asked."""
    import json

    body = json.loads(captured("stopped70-half-a.json"))["body"]
    port, server = serve_ras(body)
    reads = rounds.read_round(
        [local_node("n0"), local_node("n1")],
        "job1",
        str(tmp_path),
        {},
        10,
        2,
        asks=rounds.Asks(rounds.RasAsk("n1", str(os.getuid()), port)),
    )
    server.join(10)
    n0, n1 = reads
    assert n0.ras is None and not any(c.signal == "ras" for c in n0.coverage)
    assert n1.ras is not None and n1.ras.node == "n1" and n1.ras.status.available
    assert [(r.rank, r.state, r.pid) for r in n1.ras.status.ranks] == [(1, "dead", 2348)]
    (row,) = [c for c in n1.coverage if c.signal == "ras"]
    assert row.available and row.detail == (
        "asked on n1: NCCL 2.28.9 (json), 1 communicator(s); processes 2348 on 192.0.2.2 (dead)"
    )
