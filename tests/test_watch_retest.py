"""When a re-test runs (once the job has left the nodes it measures) and when it confirms a node the watch named:
the node not accepted while a peer of the same run is."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from cluster_accept.analysis.live_job import WatchRules
from cluster_accept.analysis.verdicts import Verdict, VerdictRow
from cluster_accept.flows.watch import confirmation, job_left
from cluster_accept.flows.watch_request import WatchRequest, WatchSpec
from cluster_accept.inventory.model import Inventory, Node
from cluster_accept.tasks.watch import WatchState
from cluster_accept.vocabulary.live_job import RankSeen
from cluster_accept.watch.read import NodeRead
from tests.injection_sandbox import node

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


def _request(wait_s: float) -> WatchRequest:
    spec = WatchSpec(inventory=Path("inv.yaml"), nodes="n[1-2]", job="j", retest_wait_s=wait_s, interval_s=0.5)
    return WatchRequest(spec, cast(Inventory, None), [node("n1"), node("n2")], "j", WatchRules())


def _scripted(monkeypatch: pytest.MonkeyPatch, rounds: list[list[NodeRead]]) -> list[int]:
    """Each read of the nodes answers the next round of ``rounds``; the waits between them take no time."""
    calls: list[int] = []

    def read(nodes: list[Node], *_: object) -> list[NodeRead]:
        calls.append(len(nodes))
        return rounds[min(len(calls), len(rounds)) - 1]

    monkeypatch.setattr("cluster_accept.flows.watch.read_task", read)
    monkeypatch.setattr("cluster_accept.flows.watch.time.sleep", lambda _s: None)
    return calls


def _read(name: str, state: str | None) -> NodeRead:
    """A node's read: its one rank in ``state``, or (None) no answer at all."""
    if state is None:
        return NodeRead(name, problems=["ssh: connection timed out"])
    return NodeRead(name, [RankSeen("j", name, int(name[-1]), 0, 10, state, 5)], node_ns=5)


def test_a_re_test_waits_for_the_job_to_leave_its_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Running, then a node that does not answer (not known to have left), then every rank ended: it goes."""
    rounds = [[_read("n1", "running"), _read("n2", "dead")], [_read("n1", None), _read("n2", "dead")],
              [_read("n1", "dead"), _read("n2", "exited")]]  # fmt: skip
    calls, state = _scripted(monkeypatch, rounds), WatchState(keep_s=120)
    state.add(rounds[0])
    assert not state.job_over()
    assert job_left(_request(600), ["n1", "n2"], state) == "" and calls == [2, 2, 2]
    assert state.job_over()  # the job left every node while the re-test waited: the watch of it is over


def test_a_job_that_stays_past_the_wait_leaves_the_node_not_re_tested(monkeypatch: pytest.MonkeyPatch) -> None:
    _scripted(monkeypatch, [[_read("n1", "stopped"), _read("n2", "running")]])
    said = job_left(_request(0), ["n1", "n2"], WatchState(keep_s=120))
    assert said.startswith("not re-tested: the job still runs on n[1-2] after 0 s")
