"""When a re-test confirms a node the watch named: the node not accepted while a peer of the same run is."""

from __future__ import annotations

import pytest

from cluster_accept.analysis.verdicts import Verdict, VerdictRow
from cluster_accept.flows.watch import confirmation

pytestmark = pytest.mark.unit


def _v(node: str, verdict: Verdict, *reasons: str) -> VerdictRow:
    return VerdictRow("r1", "c", node, "p", verdict, list(reasons))


def test_a_rejected_node_beside_an_accepted_peer_is_confirmed() -> None:
    got = confirmation("n2", ["n1"], [_v("n1", Verdict.ACCEPTED), _v("n2", Verdict.REJECTED, "gemm:straggler")])
    assert got == (True, "n2 rejected: gemm:straggler; peers accepted: n1")


@pytest.mark.parametrize(
    ("suspect", "peer"),
    [
        (Verdict.ACCEPTED, Verdict.ACCEPTED),  # the hardware passed: a job-level straggler
        (Verdict.REJECTED, Verdict.REJECTED),  # every node failed: the run or the job's load, not the node
        (Verdict.TOOL_ERROR, Verdict.ACCEPTED),  # the tool failed on it: nothing was measured
        (Verdict.REJECTED, Verdict.TOOL_ERROR),  # no peer measured beside it
    ],
)
def test_anything_else_confirms_nothing(suspect: Verdict, peer: Verdict) -> None:
    confirmed, _ = confirmation("n2", ["n1"], [_v("n1", peer), _v("n2", suspect)])
    assert confirmed is False


def test_a_node_the_run_never_judged_is_said_so() -> None:
    assert confirmation("n2", ["n1"], [_v("n1", Verdict.ACCEPTED)]) == (False, "n2 not judged; peers accepted: n1")
