"""When a re-test runs (once the job has left the nodes it measures) and when it confirms a node the watch named:
the node not accepted while a peer of the same run is."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import cast

import pytest

from cluster_accept.analysis.verdicts import Verdict, VerdictRow
from cluster_accept.flows.watch import _settle, job_left
from cluster_accept.inventory.model import Inventory, Node
from cluster_accept.vocabulary.status import Status
from cluster_accept.watch.judge import WatchRules
from cluster_accept.watch.policy import NOT_RETESTED, confirmation, retest_peers
from cluster_accept.watch.read import NodeRead
from cluster_accept.watch.request import WatchRequest, WatchSpec
from cluster_accept.watch.rounds import WatchState
from cluster_accept.watch.words import RankSeen, RankState, WatchFinding
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
    return NodeRead(name, [RankSeen("j", name, int(name[-1]), 0, 10, RankState(state), 5)], node_ns=5)


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


def test_peers_are_nodes_the_job_has_left_where_there_are() -> None:
    """A job requeued without its suspect runs on the others again: a node it has left is measured at once."""
    assert retest_peers(["n2"], ["n1", "n2", "n3", "n4"], living={"n1", "n4"}) == ["n3"]
    waits = retest_peers(["n2"], ["n1", "n2", "n3", "n4"], living={"n1", "n3", "n4"})
    assert waits == ["n1", "n3"]  # it waits for them


def _three(wait_s: float = 600) -> WatchRequest:
    spec = WatchSpec(inventory=Path("inv.yaml"), nodes="n[1-3]", job="j", retest_wait_s=wait_s, interval_s=0.5)
    return WatchRequest(spec, cast(Inventory, None), [node("n1"), node("n2"), node("n3")], "j", WatchRules())


def _finding(status: Status, **said: object) -> WatchFinding:
    return WatchFinding("j", "compute_straggler", "n2", status, "arrives_last", "late", "", "", "", 1, 0, 7, **said)  # type: ignore[arg-type]


WAITED = f"{NOT_RETESTED} n[1-3] after 600 s"


def _stub_retest(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], bool]]:
    """``retest`` confirms every suspect; each call's suspects and whether it was allowed to wait are kept."""
    calls: list[tuple[list[str], bool]] = []

    def retest(_r: WatchRequest, suspects: list[WatchFinding], _s: WatchState, wait: bool = True) -> list[WatchFinding]:
        calls.append(([f.node for f in suspects], wait))
        return [replace(f, confirmed=True, retest="run r2: rejected", action="drained") for f in suspects]

    monkeypatch.setattr("cluster_accept.flows.watch.retest", retest)
    return calls


@pytest.mark.parametrize(("n1", "n2", "n3", "retried"), [
    ("running", "exited", "exited", True),  # the job left the suspect and a peer: re-tested now
    ("running", "running", "exited", False),  # still on the suspect
    ("exited", "exited", "exited", True),  # the job ended everywhere
    ("running", "exited", "running", False),  # left the suspect only: no peer to measure it against
    ("running", "exited", None, False),  # n3 not read: not known to have left, no peer
])  # fmt: skip
def test_a_finding_not_re_tested_while_the_job_ran_is_re_tested_once_the_job_has_left(
    monkeypatch: pytest.MonkeyPatch, n1: str, n2: str, n3: str | None, retried: bool
) -> None:
    calls = _stub_retest(monkeypatch)
    waited = _finding(Status.WARN, confirmed=False, retest=WAITED, action="x")
    state = WatchState(keep_s=120)
    state.add([_read("n1", n1), _read("n2", n2), _read("n3", n3)])
    findings = [_finding(Status.PASS)]  # the job left n2: nothing of it in the window
    acted = {("n2", "compute_straggler"): waited}
    _settle(_three(), findings, acted, state)
    if not retried:
        assert calls == [] and (findings[0].status, findings[0].retest) == (Status.WARN, WAITED)
        return
    assert calls == [(["n2"], False)]  # a retry does not wait: the job has left, or it is tried again later
    assert (findings[0].status, findings[0].confirmed, findings[0].action) == (Status.FAIL, True, "drained")
    _settle(_three(), findings, acted, state)  # confirmed: never re-tested again
    assert len(calls) == 1


def test_two_suspects_the_job_left_are_no_peers_of_each_other(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _stub_retest(monkeypatch)
    acted = {(n, "compute_straggler"): replace(_finding(Status.WARN, retest=WAITED), node=n) for n in ("n2", "n3")}
    state = WatchState(keep_s=120)
    state.add([_read("n1", "running"), _read("n2", "exited"), _read("n3", "exited")])
    _settle(_three(), [], acted, state)
    assert calls == []


def test_a_finding_dropped_from_the_window_stays_in_the_record(monkeypatch: pytest.MonkeyPatch) -> None:
    _stub_retest(monkeypatch)
    acted = {("n2", "compute_straggler"): _finding(Status.WARN, retest=WAITED)}
    state = WatchState(keep_s=120)
    state.add([_read("n1", "exited"), _read("n2", "exited"), _read("n3", "exited")])
    findings: list[WatchFinding] = []
    _settle(_three(), findings, acted, state)
    assert [(f.node, f.status, f.confirmed) for f in findings] == [("n2", Status.FAIL, True)]


def test_a_retry_that_finds_the_job_back_does_not_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """The state said the job had left; the re-test's own read finds it on n2 again: not re-tested, at once."""
    _scripted(monkeypatch, [[_read("n2", "running"), _read("n3", "exited")]])

    def no_sleep(_s: float) -> None:
        raise AssertionError("a retry waited")

    monkeypatch.setattr("cluster_accept.flows.watch.time.sleep", no_sleep)
    acted = {("n2", "compute_straggler"): _finding(Status.WARN, retest=WAITED)}
    state = WatchState(keep_s=120)
    state.add([_read("n1", "running"), _read("n2", "exited"), _read("n3", "exited")])
    findings = [_finding(Status.PASS)]
    _settle(_three(), findings, acted, state)
    assert findings[0].status is Status.WARN and findings[0].retest.startswith(f"{NOT_RETESTED} n2 after 0 s")


def test_a_slurm_job_whose_rank_files_are_gone_has_not_left_while_slurm_runs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ranks' files are the job user's to remove: a job that deletes them (every rank read 'exited') while it
    still loads its GPUs has not left its nodes until Slurm says so; a Slurm that cannot be asked holds them."""
    from cluster_accept.ops.slurm import SlurmJob
    from cluster_accept.watch import request as watch_request

    inventory = Inventory("c", [node("n1"), node("n2")], {}, "inv.yaml", "")  # Slurm names them as the inventory
    spec = WatchSpec(inventory=Path("inv.yaml"), slurm_job="9", retest_wait_s=0, interval_s=0.5)
    request = WatchRequest(spec, inventory, [node("n1"), node("n2")], "9", WatchRules(),
                           slurm=SlurmJob("9", "n[1-2]", 1000, "alice", "RUNNING"))  # fmt: skip
    _scripted(monkeypatch, [[_read("n1", "exited"), _read("n2", "exited")]])
    answers = iter([SlurmJob("9", "n2", 1000, "alice", "RUNNING"), SlurmJob("9", "n[1-2]", 1000, "alice", "COMPLETED")])
    monkeypatch.setattr(watch_request, "read_job", lambda *_: next(answers))
    assert job_left(request, ["n1", "n2"], WatchState(keep_s=120)).startswith("not re-tested: the job still runs on n2")
    assert job_left(request, ["n1", "n2"], WatchState(keep_s=120)) == ""

    def unreachable(*_: object) -> SlurmJob:
        raise ValueError("cannot ask Slurm for job 9: timed out")

    monkeypatch.setattr(watch_request, "read_job", unreachable)
    said = job_left(request, ["n1", "n2"], WatchState(keep_s=120))
    assert said.startswith("not re-tested: the job still runs on n[1-2]")
