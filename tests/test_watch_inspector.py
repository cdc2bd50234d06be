"""NCCL Inspector's GPU times in the watch: put on the Flight Recorder's records of the same collectives, learned
from a real pair — one rank's Flight Recorder (its dump at the job's abort) and its Inspector file, of one job on a
lent 2 × H200 host (NCCL 2.28.9, armed by ``cluster-accept arm --inspector``; tests/data/watch/README.md) — and read
on a node only where the job's reader found the Inspector's directory."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cluster_accept.inventory.model import Node
from cluster_accept.remote.result import CommandResult, NodeResult, NodeStatus
from cluster_accept.vocabulary.secrets import MaskedText
from cluster_accept.watch import rounds
from cluster_accept.watch.inspector import parse_inspector_lines
from cluster_accept.watch.inspector_join import join_inspector
from cluster_accept.watch.read import ReadWindow, parse_node_read
from cluster_accept.watch.words import CollectiveSeen
from tests.test_remote import local_node

PAIR = Path(__file__).parent / "data" / "watch" / "inspector-2.28.9" / "killed-job"
NODE = Path(__file__).resolve().parent.parent / "cluster_accept" / "watch" / "node"


def recorded() -> list[CollectiveSeen]:
    """Rank 0's Flight Recorder records (seq 640-704; NCCL's timing on) as the watcher parses the node's read."""
    text = '{"read": {"node_ns": 1796048404800000000}}\n' + (PAIR / "fr-rank0.jsonl").read_text()
    read = parse_node_read(text, "kill", "half-a", ReadWindow(0, 1))
    assert read.problems == []
    return read.collectives


def inspected(shift_ns: int = 0) -> list[CollectiveSeen]:
    rows = parse_inspector_lines((PAIR / "vm-pid2771.log").read_text(), "kill", "half-a")
    return [replace(r, enqueue_ns=r.enqueue_ns + shift_ns) for r in rows]


@pytest.mark.unit
def test_the_inspectors_times_land_on_the_flight_recorders_records_of_the_same_collectives() -> None:
    """Without NCCL's timing the records have no execution time; the Inspector's sequence (coll_sn 630-693) is the
    Flight Recorder's less 8, learned from enqueue stamps 0.024 ms apart at the median, within 0.006 ms of that:
    62 records timed, and their times are NCCL timing's own to 0.01 ms."""
    with_timing = recorded()
    untimed = [replace(c, exec_ms=None, start_ns=None) for c in with_timing]
    joined, alignments = join_inspector(untimed, inspected())
    (alignment,) = alignments
    assert (alignment.rank, alignment.inspector, alignment.group) == (0, "0x9c164e0e6dd21a", "0:default_pg")
    assert (alignment.offset, alignment.skew_ms, alignment.spread_ms, alignment.matches) == (8, 0.024, 0.0063, 62)
    timed = [c for c in joined if c.source == "inspector"]
    assert len(timed) == 62 and {c.seq for c in timed} == set(range(640, 702))
    first = next(c for c in timed if c.seq == 640)
    assert (first.exec_ms, first.busbw_gbps, first.complete_ns) == (18.675, 3.594391, 1796048403521181000)
    nccl = {c.seq: c.exec_ms for c in with_timing if c.exec_ms is not None}
    agree = [abs(nccl[c.seq] - c.exec_ms) for c in timed if c.seq in nccl and c.exec_ms is not None]
    assert len(agree) == 58 and statistics.median(agree) < 0.02
    assert [c for c in joined if c.source != "inspector"] == [c for c in untimed if c.seq >= 702]  # not dumped yet


@pytest.mark.unit
@pytest.mark.parametrize("shift_us", [-900, -300, -125, 125, 300, 900])
def test_a_constant_skew_between_the_two_stamps_keeps_the_offset(shift_us: int) -> None:
    """The Inspector's stamps moved by a constant (up to 0.9 ms: a whole spacing of the job's collectives and
    more), the right offset is still the tightest: 8, never its neighbours."""
    _, alignments = join_inspector([replace(c, exec_ms=None) for c in recorded()], inspected(shift_us * 1000))
    assert [a.offset for a in alignments] == [8]


@pytest.mark.unit
def test_an_alignment_that_is_not_clearly_the_tightest_or_too_far_times_nothing() -> None:
    """Stamps 3 ms apart are not one collective's; a job whose collectives are evenly spaced (every 1 ms) fits two
    offsets equally: no record gets a time it may not be of."""
    untimed = [replace(c, exec_ms=None) for c in recorded()]
    joined, alignments = join_inspector(untimed, inspected(3_000_000))
    assert alignments == [] and joined == untimed
    grid = [replace(c, enqueue_ns=c.seq * 1_000_000) for c in untimed]
    even = [replace(r, enqueue_ns=(r.seq + 8) * 1_000_000 + 500_000) for r in inspected()]
    joined, alignments = join_inspector(grid, even)
    assert alignments == [] and joined == grid


@pytest.mark.unit
def test_a_record_read_again_without_the_inspectors_time_keeps_it() -> None:
    """The Flight Recorder's ring gives a record again at the next read, where the Inspector's records dumped
    since do not hold it: its time stays."""
    timed, _ = join_inspector([replace(c, exec_ms=None) for c in recorded()], inspected())
    earlier = next(c for c in timed if c.seq == 650)
    again = replace(earlier, exec_ms=None, start_ns=None, complete_ns=None, source="flight_recorder")
    kept = rounds.timed_kept(earlier, again)
    assert (kept.exec_ms, kept.source) == (earlier.exec_ms, "inspector")
    newer = replace(again, exec_ms=21.0)
    assert rounds.timed_kept(earlier, newer) is newer  # a time of its own wins


@pytest.mark.integration
def test_the_node_readers_find_the_inspector_and_the_watcher_times_the_records(tmp_path: Path) -> None:
    """The job's reader names ``<job>/inspector`` (a real directory of the job's user); the Inspector's reader reads
    the captured file there as the node runs it; the watcher's read then carries the Inspector's times and its
    coverage row says how they were joined."""
    job = tmp_path / "watch" / "kill"
    (job / "inspector").mkdir(parents=True)
    (job / "inspector" / "vm-pid2771.log").write_text((PAIR / "vm-pid2771.log").read_text())
    said = subprocess.run([sys.executable, str(NODE / "job_read.py"), "--dir", str(job)], capture_output=True,
                          text=True, timeout=60, check=True).stdout  # fmt: skip
    read = parse_node_read(said, "kill", "half-a", ReadWindow(0, 1))
    assert read.inspector_dir == (str(job / "inspector"), os.getuid())
    node: Node = local_node("half-a")
    ask = rounds.InspectorAsk(*read.inspector_dir, since_us=0)
    command = rounds.inspector_command(node, ask, limit=200)
    out = subprocess.run(["sh", "-c", command.script], capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(out.splitlines()[-1]) == {
        "inspector": "read", "dir": str(job / "inspector"), "files": 1, "records": 64, "skipped": 0
    }  # fmt: skip
    fr = '{"read": {"node_ns": 1796048404800000000}}\n' + (PAIR / "fr-rank0.jsonl").read_text()
    untimed = "\n".join(line.replace('"ms": ', '"ms_off": ') for line in fr.splitlines())
    result = NodeResult("half-a", NodeStatus.OK, commands=[
        CommandResult("job_read", 0, MaskedText(untimed), MaskedText("")),
        CommandResult("inspector_read", 0, MaskedText(out), MaskedText("")),
    ])  # fmt: skip
    watched = rounds.node_read(node, "kill", result, 1, rounds.Asks(inspector={"half-a": ask}))
    assert sum(c.source == "inspector" for c in watched.collectives) == 62
    (row,) = [c for c in watched.coverage if c.signal == "inspector"]
    assert row.available and row.detail == (
        "64 records, 62 Flight Recorder records timed by them: rank 0 0:default_pg +8 (skew 0.024 ms)"
    )
