"""A round of reads goes over the project's one fan-out (:func:`remote.fanout.fan_out`): every node comes back in
the nodes' order, a node no session reaches and a reader that times out as problems of that node (data, never an
exception), and the clocks of the nodes that answered settled against each other."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cluster_accept.inventory.model import Node
from cluster_accept.remote import fanout
from cluster_accept.remote.result import RemoteCommand, Unreachable, UnreachableCause
from cluster_accept.remote.session import NodeSession
from cluster_accept.watch import rounds
from cluster_accept.watch.read import NodeRead
from tests.test_remote import local_node

pytestmark = pytest.mark.integration


def test_a_round_reads_every_node_in_order_with_what_failed_as_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n1 cannot be reached, n3's reader outlives its timeout; n0 and n2 (this machine: one boot id, one clock)
    answer, their reads stamped between the round's start and end."""
    real_connect, real_command = fanout.connect, rounds.reader_command

    def connect(node: Node) -> NodeSession | Unreachable:
        return Unreachable(UnreachableCause.REFUSED, "nothing listens") if node.name == "n1" else real_connect(node)

    def reader_command(node: Node, *args: object, **kwargs: object) -> RemoteCommand:
        if node.name == "n3":
            return RemoteCommand("job_read", "sleep 10", timeout_s=0.5, reads_only=True)
        return real_command(node, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fanout, "connect", connect)
    monkeypatch.setattr(rounds, "reader_command", reader_command)
    nodes = [local_node(f"n{i}") for i in range(4)]
    started = time.time_ns()
    reads = rounds.read_round(nodes, "job1", str(tmp_path), {}, 10, concurrency=2)
    ended = time.time_ns()
    assert [r.node for r in reads] == ["n0", "n1", "n2", "n3"]
    n0, n1, n2, n3 = reads
    assert n1.node_ns is None and n1.problems[0] == "unreachable: nothing listens"
    assert n3.node_ns is None and n3.problems[0].startswith("reader exit")
    for read in (n0, n2):
        assert isinstance(read, NodeRead) and read.problems == [] and read.node_ns is not None
        assert started <= read.node_ns <= ended
        assert read.clock is not None and read.clock.boot_id == n0.clock.boot_id  # type: ignore[union-attr]
