"""A sweep step below the floor that isolation pins on no node fails every node of it, the floor and the transport
in the row; a step isolation explains, or one above the floor, does not."""

from __future__ import annotations

from cluster_accept.analysis.isolation import IsolationVerdict
from cluster_accept.analysis.scaling import ScalingPoint, judge_steps
from cluster_accept.checks.base import Status
from cluster_accept.inventory.model import Node, Profile, SshSettings
from cluster_accept.tasks.multi_node.slow_together import slow_together_rows
from cluster_accept.vocabulary.figures import Figure
from cluster_accept.vocabulary.rows import Measurement

NODES = [
    Node(
        f"n{i}",
        SshSettings(),
        "p",
        Profile.model_validate({"probes": {"expected_transport": {"inter_node": "NET/IB"}}}),
    )
    for i in range(1, 5)
]
GROUPS = {2: NODES[:2], 4: NODES}
SOCKETS = [
    Measurement.of(
        Figure("allreduce_busbw_gbps", 1.0, group=g, transport="NET/Socket"), "r", "c", "multi-node", "n1", None
    )
    for g in ("n[1-2]", "n[1-4]")
]


def _verdict(bad: list[str] | None = None) -> IsolationVerdict:
    return IsolationVerdict(bad or [], [], [] if bad else [n.name for n in NODES], [], 4, "no group stands out")


def test_every_pair_equally_slow_fails_every_node_with_the_floor_and_the_transport() -> None:
    # 8 x 400 Gb/s: a 200 GB/s floor; sockets everywhere move 4.6 GB/s from the first multi-node step on
    steps = judge_steps([ScalingPoint(2, 4.6, 8), ScalingPoint(4, 4.5, 8)], 200.0, 5.0)
    found = slow_together_rows(steps, GROUPS, _verdict(), SOCKETS)
    assert sorted((node, row.item) for node, row in found) == [
        ("n1", "2 nodes"),
        ("n1", "4 nodes"),
        ("n2", "2 nodes"),
        ("n2", "4 nodes"),
        ("n3", "4 nodes"),
        ("n4", "4 nodes"),
    ]
    row = dict(found)["n3"]
    assert (row.check, row.status, row.reason) == ("scaling", Status.FAIL, "below_floor_together")
    assert row.observed == "4.5 GB/s" and (row.expected or "").startswith(">= 200 GB/s and ")
    assert "transport between nodes: NET/Socket, expected NET/IB" in (row.detail or "")


def test_a_step_isolation_explains_or_above_the_floor_fails_nobody_here() -> None:
    slow = judge_steps([ScalingPoint(2, 4.6, 8), ScalingPoint(4, 4.5, 8)], 200.0, 5.0)
    assert slow_together_rows(slow, GROUPS, _verdict(["n3"]), SOCKETS) == []  # n3 fails its isolation row
    healthy = judge_steps([ScalingPoint(2, 370.0, 8), ScalingPoint(4, 365.0, 8)], 200.0, 5.0)
    assert slow_together_rows(healthy, GROUPS, _verdict(), []) == []
    unjudged = judge_steps([ScalingPoint(2, 4.6, 8)], None, 5.0)  # no floor: nothing to be below
    assert slow_together_rows(unjudged, GROUPS, _verdict(), SOCKETS) == []
