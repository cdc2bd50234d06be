"""The node-side reader's answers, captured from a real armed two-rank gloo job, read into typed rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_accept.watch.read import ReadWindow, backend_of, clock_estimate, op_name, parse_node_read, settle_clocks
from cluster_accept.watch.words import Signal

pytestmark = pytest.mark.unit

DATA = Path(__file__).parent / "data" / "watch" / "flight_recorder"
WINDOW = ReadWindow(sent_ns=1795784687900000000, received_ns=1795784688000000000)


def _read(name: str):
    return parse_node_read((DATA / name).read_text(), "j1", "node01", WINDOW)


def test_running_job_gives_both_ranks_and_their_collectives() -> None:
    read = _read("gloo_2ranks_running.txt")
    assert read.problems == []
    assert [(r.rank, r.state, r.pid, r.gpu, r.answered, r.last_enqueued_seq) for r in read.ranks] == [
        (0, "running", 9797, 0, True, 427), (1, "running", 9798, 1, True, 427),
    ]  # fmt: skip
    assert len(read.collectives) == 10
    first = read.collectives[0]
    assert (first.rank, first.communicator, first.op, first.seq, first.enqueue_ns) == (
        0, "0:default_pg", "all_reduce", 423, 1795784687873753096,
    )  # fmt: skip
    assert first.size_bytes == 65792 * 4 and first.completed and first.exec_ms is None
    assert first.comm_ranks == "[0, 1]" and read.collectives[-1].gpu == 1
    # rank 1 entered #427 0.754 ms before rank 0
    by = {(c.rank, c.seq): c.enqueue_ns for c in read.collectives}
    assert by[(0, 427)] - by[(1, 427)] == 753974
    assert read.node_ns == 1795784687937936669
    assert read.ranks[0].clock_offset_ns == 1795784687937936669 - 1795784687950000000
    assert read.ranks[0].clock_error_ns == 50_000_000


def test_coverage_says_gloo_gives_no_execution_times() -> None:
    rows = {c.signal: c for c in _read("gloo_2ranks_running.txt").coverage}
    assert rows[Signal.WORKER_SERVER.value].available and rows[Signal.FLIGHT_RECORDER.value].available
    assert not rows[Signal.NCCL_TIMING.value].available
    assert "gloo records none" in rows[Signal.NCCL_TIMING.value].detail


def test_stopped_rank_is_not_asked_and_its_peer_waits_in_flight() -> None:
    read = _read("gloo_rank1_stopped.txt")
    stopped = read.ranks[1]
    assert (stopped.state, stopped.answered, stopped.last_enqueued_seq) == ("stopped", False, None)
    waiting = read.ranks[0]
    assert (waiting.last_enqueued_seq, waiting.last_completed_seq) == (436, 435)
    assert [(c.seq, c.completed) for c in read.collectives] == [(434, True), (435, True), (436, False)]


def test_killed_rank_is_dead_and_the_rank_torchrun_ended_exited() -> None:
    read = _read("gloo_rank1_killed.txt")
    assert [(r.rank, r.state) for r in read.ranks] == [(0, "exited"), (1, "dead")]
    assert read.collectives == []


def test_a_broken_answer_is_named_not_skipped() -> None:
    text = (DATA / "gloo_2ranks_running.txt").read_text().replace('"state":"running"', '"state":"sleeping"', 1)
    read = parse_node_read(text + "not json\n", "j1", "node01", WINDOW)
    assert any("not JSON" in p for p in read.problems)
    assert any("sleeping" in p for p in read.problems) and len(read.ranks) == 1
    empty = parse_node_read("", "j1", "node01", WINDOW)
    assert empty.problems == ["no 'read' line: the reader did not run"]


def test_names_and_clock() -> None:
    assert op_name("nccl:all_reduce") == "all_reduce" and op_name("gloo:all_gather") == "all_gather"
    assert op_name(None) == "unknown"
    assert (backend_of("nccl:all_reduce"), backend_of("gloo:broadcast"), backend_of("all_reduce")) == (
        "nccl",
        "gloo",
        "",
    )
    assert clock_estimate(1_000, ReadWindow(0, 400)) == (800, 200)


def _with_clock(boot: str, synced: bool | None, maxerror_us: int, node: str):
    text = (DATA / "gloo_2ranks_running.txt").read_text()
    said = "null" if synced is None else str(synced).lower()
    clock = f'"clock":{{"boot_id":"{boot}","synced":{said},"maxerror_us":{maxerror_us}}}'
    text = text.replace('"hostname":"vm"}', f'"hostname":"vm",{clock}}}', 1)
    return parse_node_read(text, "j1", node, WINDOW)


def test_clocks_of_one_machine_agree_and_a_synced_clock_is_trusted_to_its_error() -> None:
    same = settle_clocks([_with_clock("b1", False, 16_000_000, "n1"), _with_clock("b1", False, 16_000_000, "n2")])
    assert {(r.clock_offset_ns, r.clock_error_ns) for read in same for r in read.ranks} == {(0, 0)}
    apart = settle_clocks([_with_clock("b1", True, 2_000, "n1"), _with_clock("b2", False, 16_000_000, "n2")])
    assert {(r.clock_offset_ns, r.clock_error_ns) for r in apart[0].ranks} == {(0, 2_000_000)}
    # unsynchronised: the read's own round trip is all there is
    assert {(r.clock_offset_ns, r.clock_error_ns) for r in apart[1].ranks} == {(-12_063_331, 50_000_000)}


def test_an_nccl_ranks_records_carry_their_own_execution_time() -> None:
    """A real read of rank 1 of an armed two-host NCCL job (2 x H200 as two NCCL hosts, torch's NCCL Flight
    Recorder with TORCH_NCCL_ENABLE_TIMING): the CPU queues each launch long before the GPU runs it (#296 was
    queued 357 ms before the watchdog saw it start), so the arrival a straggler shows is in the execution time."""
    text = (DATA / "nccl_h200x2_rank1.txt").read_text()
    read = parse_node_read(text, "strag", "half-b", ReadWindow(1795787877925110518, 1795787877925112518))
    assert read.problems == [] and len(read.collectives) == 40
    (rank,) = read.ranks
    assert (rank.rank, rank.gpu, rank.last_enqueued_seq, rank.last_completed_seq) == (1, 1, 334, 316)
    second = read.collectives[1]
    assert (second.op, second.seq, second.size_bytes, second.gpu) == ("all_reduce", 296, 227033088, 1)
    assert {c.backend for c in read.collectives} == {"nccl"}
    assert second.exec_ms == pytest.approx(84.12742614746094)
    assert second.start_ns is not None and second.start_ns - second.enqueue_ns == 356979499
    rows = {c.signal: c.available for c in read.coverage}
    # RAS answers for the whole job from the one node asked a round (tests/test_watch_ras.py): no row of its own here
    assert rows == {"worker_server": True, "flight_recorder": True, "nccl_timing": True, "inspector": False}
    assert [c.detail for c in read.coverage if not c.available] == [
        "no Inspector files of the job on this node (cluster-accept arm --inspector arms it)"
    ]
