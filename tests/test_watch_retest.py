"""When a re-test runs (once the job has left the nodes it measures, beside the read rounds, which go on) and when it
confirms a node the watch named: the node not accepted while a peer of the same run is."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import cast

import pytest

from cluster_accept.analysis.verdicts import Verdict, VerdictRow
from cluster_accept.flows import watch as watch_flow
from cluster_accept.flows.watch import _settle
from cluster_accept.flows.watch_retests import RUNNING, WAITING, Retests, RunRetest, still_on
from cluster_accept.inventory.model import Inventory, Node
from cluster_accept.vocabulary.status import Status
from cluster_accept.watch.judge import WatchRules
from cluster_accept.watch.policy import (
    NOT_RETESTED,
    acted_on,
    carry_over,
    confirmation,
    implicated,
    not_confirmed,
    retest_nodes,
    retest_peers,
    retest_stages,
    retested,
)
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


def _read(name: str, state: str | None) -> NodeRead:
    """A node's read: its one rank in ``state``, or (None) no answer at all."""
    if state is None:
        return NodeRead(name, problems=["ssh: connection timed out"])
    return NodeRead(name, [RankSeen("j", name, int(name[-1]), 0, 10, RankState(state), 5)], node_ns=5)


def _three(wait_s: float = 600) -> WatchRequest:
    spec = WatchSpec(inventory=Path("inv.yaml"), nodes="n[1-3]", job="j", retest_wait_s=wait_s, interval_s=0.5)
    return WatchRequest(spec, cast(Inventory, None), [node("n1"), node("n2"), node("n3")], "j", WatchRules())


def _finding(status: Status, **said: object) -> WatchFinding:
    return WatchFinding("j", "compute_straggler", "n2", status, "arrives_last", "late", "", "", "", 1, 0, 7, **said)  # type: ignore[arg-type]


WAITED = f"{NOT_RETESTED} n[1-3] after 600 s"
Calls = list[tuple[list[str], list[str]]]


def _confirming(calls: Calls) -> RunRetest:
    """A re-test run that confirms every suspect; each call's suspects and peers are kept."""

    def run(_r: WatchRequest, suspects: Sequence[WatchFinding], peers: Sequence[str]) -> list[WatchFinding]:
        calls.append(([f.node for f in suspects], list(peers)))
        return [replace(f, confirmed=True, retest="run r2: rejected", action="drained") for f in suspects]

    return run


def _settled(retests: Retests, findings: list[WatchFinding], state: WatchState) -> None:
    """One round's settling, then the re-tests it started finished and the next round's settling records them."""
    _settle(retests, findings, state)
    for group in list(retests.groups):
        if group.future is not None:
            group.future.result(timeout=30)
    _settle(retests, findings, state)


def test_a_re_test_waits_for_the_job_to_leave_its_nodes_and_then_runs() -> None:
    """Running, then a node that does not answer (not known to have left), then every rank ended: it runs."""
    calls: Calls = []
    retests, state = Retests(_request(600), _confirming(calls)), WatchState(keep_s=120)
    state.add([_read("n1", "running"), _read("n2", "dead")])
    retests.begin([_finding(Status.FAIL)], state)
    assert retests.acted[("n2", "compute_straggler")].retest == f"{WAITING} n[1-2]" and retests.waiting
    for round_ in ([_read("n1", None), _read("n2", "dead")], [_read("n1", "dead"), _read("n2", "exited")]):
        state.add(round_)
        retests.advance(state.latest_ranks().values(), state.unread)
    assert retests.acted[("n2", "compute_straggler")].retest == f"{RUNNING} n[1-2]" and not retests.waiting
    retests.finish(lambda *_: ([], set()))
    assert calls == [(["n2"], ["n1"])] and not retests.busy
    assert retests.acted[("n2", "compute_straggler")].action == "drained"


def test_a_job_that_stays_past_the_wait_leaves_the_node_not_re_tested() -> None:
    calls: Calls = []
    retests, state = Retests(_request(0), _confirming(calls)), WatchState(keep_s=120)
    state.add([_read("n1", "stopped"), _read("n2", "running")])
    retests.begin([_finding(Status.FAIL)], state)
    retests.advance(state.latest_ranks().values(), state.unread)
    said = retests.acted[("n2", "compute_straggler")]
    assert said.retest.startswith("not re-tested: the job still runs on n[1-2] after 0 s") and calls == []
    assert (said.status, said.confirmed) == (Status.WARN, False)


def test_a_re_test_that_fails_on_the_controller_is_a_finding_not_confirmed() -> None:
    def broken(*_: object) -> list[WatchFinding]:
        raise OSError("no space left on device")

    retests, state = Retests(_request(600), broken), WatchState(keep_s=120)
    state.add([_read("n1", "exited"), _read("n2", "exited")])
    retests.begin([_finding(Status.FAIL)], state)
    retests.advance(state.latest_ranks().values(), state.unread)
    retests.finish(lambda *_: ([], set()))
    said = retests.acted[("n2", "compute_straggler")]
    assert said.confirmed is False and "failed on the controller: OSError: no space left on device" in said.retest


def test_peers_are_nodes_the_job_has_left_where_there_are() -> None:
    """A job requeued without its suspect runs on the others again: a node it has left is measured at once."""
    assert retest_peers(["n2"], ["n1", "n2", "n3", "n4"], living={"n1", "n4"}) == ["n3"]
    waits = retest_peers(["n2"], ["n1", "n2", "n3", "n4"], living={"n1", "n3", "n4"})
    assert waits == ["n1", "n3"]  # it waits for them


@pytest.mark.parametrize(("n1", "n2", "n3", "retried"), [
    ("running", "exited", "exited", True),  # the job left the suspect and a peer: re-tested now
    ("running", "running", "exited", False),  # still on the suspect
    ("exited", "exited", "exited", True),  # the job ended everywhere
    ("running", "exited", "running", False),  # left the suspect only: no peer to measure it against
    ("running", "exited", None, False),  # n3 not read: not known to have left, no peer
])  # fmt: skip
def test_a_finding_not_re_tested_while_the_job_ran_is_re_tested_once_the_job_has_left(
    n1: str, n2: str, n3: str | None, retried: bool
) -> None:
    calls: Calls = []
    waited = _finding(Status.WARN, confirmed=False, retest=WAITED, action="x")
    retests = Retests(_three(), _confirming(calls), {("n2", "compute_straggler"): waited})
    state = WatchState(keep_s=120)
    state.add([_read("n1", n1), _read("n2", n2), _read("n3", n3)])
    findings = [_finding(Status.PASS)]  # the job left n2: nothing of it in the window
    _settled(retests, findings, state)
    if not retried:
        assert calls == [] and (findings[0].status, findings[0].retest) == (Status.WARN, WAITED)
        return
    assert [c[0] for c in calls] == [["n2"]]
    assert (findings[0].status, findings[0].confirmed, findings[0].action) == (Status.FAIL, True, "drained")
    _settled(retests, findings, state)  # confirmed: never re-tested again
    assert len(calls) == 1


def test_two_suspects_the_job_left_are_no_peers_of_each_other() -> None:
    calls: Calls = []
    acted = {(n, "compute_straggler"): replace(_finding(Status.WARN, retest=WAITED), node=n) for n in ("n2", "n3")}
    retests = Retests(_three(), _confirming(calls), acted)
    state = WatchState(keep_s=120)
    state.add([_read("n1", "running"), _read("n2", "exited"), _read("n3", "exited")])
    _settled(retests, [], state)
    assert calls == []


def test_a_finding_dropped_from_the_window_stays_in_the_record() -> None:
    acted = {("n2", "compute_straggler"): _finding(Status.WARN, retest=WAITED)}
    retests = Retests(_three(), _confirming([]), acted)
    state = WatchState(keep_s=120)
    state.add([_read("n1", "exited"), _read("n2", "exited"), _read("n3", "exited")])
    findings: list[WatchFinding] = []
    _settled(retests, findings, state)
    assert [(f.node, f.status, f.confirmed) for f in findings] == [("n2", Status.FAIL, True)]


def test_a_retry_whose_nodes_the_job_is_back_on_does_not_wait() -> None:
    calls: Calls = []
    retests, state = Retests(_three(), _confirming(calls)), WatchState(keep_s=120)
    state.add([_read("n1", "running"), _read("n2", "running"), _read("n3", "exited")])
    retests.begin([_finding(Status.FAIL)], state, wait=False)
    retests.advance(state.latest_ranks().values(), state.unread)
    said = retests.acted[("n2", "compute_straggler")]
    assert said.status is Status.WARN and said.retest.startswith(f"{NOT_RETESTED} n2 after 0 s") and calls == []


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
    gone = [r for read in (_read("n1", "exited"), _read("n2", "exited")) for r in read.ranks]
    answers = iter([SlurmJob("9", "n2", 1000, "alice", "RUNNING"), SlurmJob("9", "n[1-2]", 1000, "alice", "COMPLETED")])
    monkeypatch.setattr(watch_request, "read_job", lambda *_: next(answers))
    assert still_on(request, ["n1", "n2"], gone, set()) == ["n2"]
    assert still_on(request, ["n1", "n2"], gone, set()) == []

    def unreachable(*_: object) -> SlurmJob:
        raise ValueError("cannot ask Slurm for job 9: timed out")

    monkeypatch.setattr(watch_request, "read_job", unreachable)
    assert still_on(request, ["n1", "n2"], gone, set()) == ["n1", "n2"]


def test_the_read_rounds_go_on_while_a_re_test_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """n2 is named in the first round and the job leaves it and its two peers at once (n4 runs on); its re-test
    runs until the watch has read three more rounds, and its word is in the findings the watch ends with."""
    rounds: list[int] = []
    let_go = threading.Event()

    def read(nodes: list[Node], *_: object) -> list[NodeRead]:
        rounds.append(len(nodes))
        if len(rounds) >= 4:
            let_go.set()
        state = "running" if len(rounds) == 1 else "exited"
        return [_read("n1", state), _read("n2", state), _read("n3", state), _read("n4", "running")]

    def judge(*_: object) -> object:
        status = Status.FAIL if len(rounds) == 1 else Status.PASS
        return watch_flow.Judgement([_finding(status)], {}, (0, 0))

    def run(_r: WatchRequest, suspects: Sequence[WatchFinding], peers: Sequence[str]) -> list[WatchFinding]:
        assert let_go.wait(20), "the rounds stopped while the re-test ran"
        said = f"run r2 beside {','.join(peers)}"
        return [replace(f, confirmed=True, retest=said, action="drained") for f in suspects]

    monkeypatch.setattr(watch_flow, "read_task", read)
    monkeypatch.setattr(watch_flow, "judge", judge)
    monkeypatch.setattr(watch_flow, "run_retest", run)
    inventory = Inventory("c", [node(f"n{i}") for i in range(1, 5)], {}, "inv.yaml", "")
    spec = WatchSpec(inventory=Path("inv.yaml"), nodes="n[1-4]", job="j", interval_s=0.5, for_s=30, retest_wait_s=20,
                     until_named=True, out_dir=tmp_path)  # fmt: skip
    outcome = watch_flow.watch_job(WatchRequest(spec, inventory, inventory.nodes, "j", WatchRules()))
    assert len(rounds) >= 4 and outcome.rounds >= 4  # read on while the re-test waited for let_go
    [finding] = [f for f in outcome.findings if f.node == "n2"]
    assert (finding.confirmed, finding.action, finding.retest) == (True, "drained", "run r2 beside n1,n3"), finding


def test_the_owner_is_told_to_exclude_only_what_a_re_test_confirmed() -> None:
    """Named, the line says to exclude the node; accepted by its re-test beside a peer, it says to keep it and where
    else to look; not re-tested because the job stayed, to exclude it only to have it re-tested. The next round's
    finding of the same node carries the re-test's line, never the naming one."""
    named = replace(_finding(Status.FAIL), owner_line="exclude n2: rank 1 late")
    verdicts = [_v("n1", Verdict.ACCEPTED), _v("n2", Verdict.ACCEPTED)]
    cleared = acted_on(named, *confirmation("n2", ["n1"], verdicts), False, False, None)
    assert cleared.owner_line.startswith("keep n2: its re-test (preflight, single-node) did not confirm the compute")
    assert "n2 accepted" in cleared.owner_line and "the links between nodes" in cleared.owner_line
    stayed = not_confirmed(named, f"{NOT_RETESTED} n2 after 600 s")
    assert stayed.owner_line.startswith("n2 not re-tested yet (the job still ran there): exclude it only to have")
    findings = [named]
    carry_over(findings, {("n2", "compute_straggler"): cleared})
    assert findings[0].status is Status.WARN and findings[0].owner_line == cleared.owner_line
    confirmed = acted_on(named, True, "run r2: n2 rejected", True, True, None)
    findings = [named]
    carry_over(findings, {("n2", "compute_straggler"): confirmed})
    assert findings[0].owner_line == "exclude n2: rank 1 late" and findings[0].action == "drained"


def test_a_rank_ended_while_a_re_test_waits_is_the_owner_taking_the_job_down() -> None:
    """A rank dead before the re-test began (the finding it re-tests) is no teardown; one that ends while it waits
    is, and stays one once the re-test runs (the job it waited for is gone, not dead); a torn-down rank running
    again (the job requeued) is judged again."""
    retests, state = Retests(_three(600), _confirming([])), WatchState(keep_s=120)
    state.add([_read("n1", "running"), _read("n2", "dead"), _read("n3", "running")])
    assert not retests.teardown(state)  # nothing waits
    retests.begin([_finding(Status.FAIL)], state)
    assert not retests.teardown(state)  # n2's rank was dead already: judged as before
    state.add([_read("n1", "zombie"), _read("n2", "dead"), _read("n3", "running")])
    assert retests.teardown(state)  # killed and not yet reaped by its launcher: ended all the same
    state.add([_read("n1", "dead"), _read("n2", "dead"), _read("n3", "running")])
    assert retests.teardown(state)
    state.add([_read("n1", "dead"), _read("n2", "dead"), _read("n3", "exited")])
    retests.advance(state.latest_ranks().values(), state.unread)  # the job has left: the re-test runs
    assert not retests.waiting and retests.teardown(state)  # n1's rank is still down: no death to judge
    state.add([_read("n1", "running"), _read("n2", "dead"), _read("n3", "exited")])
    assert not retests.teardown(state)  # n1's rank is back: judged again
    retests.finish(lambda *_: ([], set()))


def test_an_unresolved_late_rank_is_re_tested_with_its_ring_neighbours_and_the_rejected_one_is_named() -> None:
    """A late rank its host did not show slow involves its ring neighbours: the re-test measures the three (compute
    and links) beside peers the finding does not involve; where it rejects a neighbour (its link), the
    neighbour is named a communication straggler on its own row, drained, and the owner told to exclude it, while
    the late node's row passes with the line to keep it; where it rejects the late node, that node."""
    late = WatchFinding(
        "j", "compute_straggler", "n3", Status.FAIL, "late_unresolved", "rank 2 late", "", "", "", rank=2,
        involves="n[2,4]", owner_line="exclude n3 and n[2,4]: rank 2 late",
    )  # fmt: skip
    assert retest_stages(late) == ("preflight", "single-node", "multi-node")
    assert retest_nodes(late) == ["n3", "n2", "n4"]
    assert retest_peers(retest_nodes(late), ["n1", "n2", "n3", "n4", "n5"], set()) == ["n1", "n5"]
    link = [_v("n1", Verdict.ACCEPTED), _v("n2", Verdict.REJECTED, "allreduce:straggler"), _v("n3", Verdict.ACCEPTED)]
    culprits, said = implicated(late, ["n1", "n5"], link + [_v("n4", Verdict.ACCEPTED)])
    assert culprits == ["n2"]
    assert said == "n3 accepted: ; n2 rejected: allreduce:straggler; n4 accepted: ; peers accepted: n1"
    cleared, link_row = retested(late, culprits, said, {"n2"}, {"n2"}, None)
    assert (link_row.node, link_row.kind, link_row.reason, link_row.status) == (
        "n2", "comm_straggler", "slow_link_neighbour", Status.FAIL,
    )  # fmt: skip
    assert link_row.confirmed is True and link_row.action == "drained" and link_row.involves == "n3"
    assert link_row.owner_line.startswith("exclude n2: the re-test (preflight, single-node, multi-node) of n3's late")
    assert (cleared.node, cleared.status, cleared.reason, cleared.confirmed) == (
        "n3", Status.PASS, "late_by_neighbour", False,
    )  # fmt: skip
    assert cleared.owner_line.startswith("keep n3: its late arrivals were the link of n2") and cleared.action
    window = [late, replace(late, kind="comm_straggler", node="n2", status=Status.NOT_JUDGED, reason="no_exec_time")]
    carry_over(window, {("n3", "compute_straggler"): cleared, ("n2", "comm_straggler"): link_row})
    assert [(f.node, f.status, f.reason, f.owner_line) for f in window] == [
        ("n3", Status.PASS, "late_by_neighbour", cleared.owner_line),
        ("n2", Status.FAIL, "slow_link_neighbour", link_row.owner_line),
    ]  # the next rounds' rows say what the re-test found, the neighbour's over its own row not judged
    (undrained,) = retested(late, ["n3"], said, set(), {"n3"}, None)
    assert undrained.node == "n3" and undrained.confirmed and undrained.action.startswith("drain planned")
    (kept,) = retested(late, [], said, set(), set(), None)
    assert kept.status is Status.WARN and kept.confirmed is False
    own = [_v("n1", Verdict.ACCEPTED), _v("n2", Verdict.ACCEPTED), _v("n3", Verdict.REJECTED, "gemm:straggler")]
    assert implicated(late, ["n1"], own)[0] == ["n3"]
    assert implicated(late, ["n1"], [_v(n, Verdict.ACCEPTED) for n in ("n1", "n2", "n3")])[0] == []
