"""Between nodes, the cause of a failed all-reduce proved arm by arm over the suspects of every implicated node
(:mod:`tasks.multi_node.prove`): each arm is the group's all-reduce with some suspects reverted on their own nodes.
The runs here are the data a group run gives (ranks' ends, what each rank said it ran with, figures), made for each
arm."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from cluster_accept.analysis.minimal_cause import Search, arm_bound
from cluster_accept.analysis.proof import finding_rows
from cluster_accept.analysis.reference import DEFAULTS, Change
from cluster_accept.analysis.suspects import JobSetting
from cluster_accept.checks.base import CheckRow, NodeRow, Status
from cluster_accept.remote.launch import GroupRun, RankRun
from cluster_accept.remote.result import CommandResult, NodeStatus
from cluster_accept.tasks.multi_node.prove import (
    ArmRun,
    Suspect,
    _proof_rows,
    _ran_otherwise,
    arm_judged,
    search_between,
    spared,
    suspects_between,
)
from cluster_accept.vocabulary.figures import Figure
from cluster_accept.vocabulary.secrets import MaskedText

# What a 2 x H200 host seen as two "nodes" ran with (bench/results/h200x2-halves/): two harmless settings on both
# halves, and a channel cap on half-b only, which made the ranks disagree and the all-reduce abort on both.
SUBSYS, TIMEOUT = JobSetting("NCCL_DEBUG_SUBSYS", "INIT,ENV", "env"), JobSetting("NCCL_IB_TIMEOUT", "22", "env")
CAP = JobSetting("NCCL_MAX_NCHANNELS", "1", "env")
FOUND = suspects_between({"half-a": [SUBSYS, TIMEOUT], "half-b": [SUBSYS, TIMEOUT, CAP]})
CULPRIT = "half-b:NCCL_MAX_NCHANNELS"
PAIR = ("half-a", "half-b")


def _result(code: int, stdout: str = "", stderr: str = "") -> CommandResult:
    return CommandResult("allreduce", code, MaskedText(stdout), MaskedText(stderr))


def _completed(busbw_gbps: float) -> GroupRun:
    ranks = {n: RankRun(n, NodeStatus.OK, result=_result(0, '{"info": "rank_done"}\n')) for n in PAIR}
    figure = Figure("allreduce_busbw_gbps", busbw_gbps, "allreduce", unit="GB/s", size=1 << 30, label="inter_node")
    return GroupRun(PAIR, "t", ranks, [figure])


def _aborted() -> GroupRun:
    said = "NCCL WARN Message truncated : received 1024 bytes instead of 512"
    return GroupRun(PAIR, "t", {n: RankRun(n, NodeStatus.OK, result=_result(1, "", said)) for n in PAIR})


def _unreachable() -> GroupRun:
    ranks = {
        "half-a": RankRun("half-a", NodeStatus.ERROR, result=_result(1), stopped=True),
        "half-b": RankRun("half-b", NodeStatus.UNREACHABLE, cause="connect_timeout"),
    }
    return GroupRun(PAIR, "t", ranks)


Asked = list[frozenset[str]]


def _arms(measure: Callable[[frozenset[str]], GroupRun]) -> tuple[Callable[[frozenset[str]], ArmRun], Asked]:
    asked: Asked = []

    def arm(reverted: frozenset[str]) -> ArmRun:
        asked.append(reverted)
        return ArmRun(measure(reverted))

    return arm, asked


@dataclass
class _Rows:
    """The stage's rows as proving writes them, by node."""

    rows: list[tuple[str, CheckRow]] = field(default_factory=list)

    def row(self, node: str, row: CheckRow, raw: str = "") -> None:
        self.rows.append((node, row))


def test_a_setting_several_nodes_run_alike_is_one_suspect_named_with_its_nodes() -> None:
    assert sorted(FOUND) == ["half-a,half-b:NCCL_DEBUG_SUBSYS", "half-a,half-b:NCCL_IB_TIMEOUT", CULPRIT]
    assert FOUND[CULPRIT] == Suspect(("half-b",), CAP) and FOUND[CULPRIT].said == "half-b's NCCL_MAX_NCHANNELS=1"
    other_value = suspects_between({"n1": [CAP], "n2": [JobSetting("NCCL_MAX_NCHANNELS", "2", "env")]})
    assert sorted(other_value) == ["n1:NCCL_MAX_NCHANNELS", "n2:NCCL_MAX_NCHANNELS"]


def test_a_setting_on_one_node_that_aborts_the_all_reduce_of_both_is_named_alone_on_its_node() -> None:
    arm, asked = _arms(lambda reverted: _completed(3.42) if CULPRIT in reverted else _aborted())
    finding = search_between(Search(list(FOUND)), arm, 1.85, FOUND)
    assert (finding.kind, finding.alone, finding.together) == ("named", (CULPRIT,), ())
    assert asked[0] == frozenset(FOUND) and len(asked) <= arm_bound(len(FOUND))
    kept_alone = frozenset(FOUND) - {CULPRIT}
    assert kept_alone in asked and frozenset({CULPRIT}) in asked  # kept alone (low), reverted alone (restored)
    said = finding.arms[asked.index(kept_alone)].said
    assert said.startswith("without half-a,half-b's NCCL_DEBUG_SUBSYS=INIT,ENV") and "did not complete" in said
    assert "half-b: exit 1, NCCL WARN Message truncated : received 1024 bytes instead of 512" in said, said
    stage = _Rows()
    named = [Change(key, replace(s.setting, key=key), None) for key, s in FOUND.items()]
    _proof_rows(stage, FOUND, finding_rows(named, finding, DEFAULTS))  # type: ignore[arg-type]
    placed = {(node, row.item): (row.reason, row.observed) for node, row in stage.rows}
    assert placed == {
        ("half-a", "NCCL_DEBUG_SUBSYS"): ("cleared", "NCCL_DEBUG_SUBSYS=INIT,ENV (reference: unset)"),
        ("half-b", "NCCL_DEBUG_SUBSYS"): ("cleared", "NCCL_DEBUG_SUBSYS=INIT,ENV (reference: unset)"),
        ("half-a", "NCCL_IB_TIMEOUT"): ("cleared", "NCCL_IB_TIMEOUT=22 (reference: unset)"),
        ("half-b", "NCCL_IB_TIMEOUT"): ("cleared", "NCCL_IB_TIMEOUT=22 (reference: unset)"),
        ("half-b", "NCCL_MAX_NCHANNELS"): ("confirmed", "NCCL_MAX_NCHANNELS=1 (reference: unset)"),
    }
    confirmed = next(row for node, row in stage.rows if row.reason == "confirmed")
    assert confirmed.status == Status.FAIL and "restored it (arm " in confirmed.detail, confirmed.detail


def test_a_slow_all_reduce_is_restored_only_at_the_floor_between_nodes() -> None:
    arm, _ = _arms(lambda reverted: _completed(3.4 if CULPRIT in reverted else 0.9))
    assert search_between(Search(list(FOUND)), arm, 1.85, FOUND).alone == (CULPRIT,)
    # still below the floor with everything reverted: none of them is the cause, after one arm
    arm, asked = _arms(lambda reverted: _completed(1.2))
    finding = search_between(Search(list(FOUND)), arm, 1.85, FOUND)
    assert (finding.kind, finding.named, len(asked)) == ("cleared", (), 1)


def test_without_a_floor_an_all_reduce_that_completes_again_is_restored() -> None:
    """A run that aborted is proved without a floor: completing is what comes back."""
    arm, _ = _arms(lambda reverted: _completed(0.9) if CULPRIT in reverted else _aborted())
    assert search_between(Search(list(FOUND)), arm, None, FOUND).alone == (CULPRIT,)


def test_an_arm_no_rank_failed_of_itself_is_void_and_nothing_is_named() -> None:
    outcome, said = arm_judged(_unreachable(), 1.85)
    assert outcome == "void" and "half-b: unreachable (connect_timeout)" in said, said
    refused = GroupRun(PAIR, "t", detail="no free port on half-a")
    assert arm_judged(refused, 1.85) == ("void", "no all-reduce (no free port on half-a)")
    arm, _ = _arms(lambda reverted: _unreachable())
    finding = search_between(Search(list(FOUND)), arm, 1.85, FOUND)
    assert finding.kind == "void" and finding.named == ()


def test_an_arm_whose_rank_ran_otherwise_than_asked_is_void() -> None:
    """half-b said it still had the channel cap the arm reverted (a file the removal did not reach)."""
    said = "".join(
        json.dumps({"info": "settings", "setting": {"name": s.key, "value": s.value, "source": s.source}}) + "\n"
        for s in (SUBSYS, TIMEOUT, CAP)
    )
    run = _completed(3.4)
    run.ranks["half-b"] = RankRun("half-b", NodeStatus.OK, result=_result(0, f'{said}{{"info": "rank_done"}}\n'))
    wrong = _ran_otherwise(run, FOUND, frozenset({CULPRIT}))
    assert wrong == "half-b: NCCL_MAX_NCHANNELS ran '1', asked unset", wrong
    assert _ran_otherwise(run, FOUND, frozenset()) == ""  # kept: it ran as the failing run did
    arm = lambda reverted: ArmRun(run, _ran_otherwise(run, FOUND, reverted))  # noqa: E731
    finding = search_between(Search(list(FOUND)), arm, 1.85, FOUND)
    first = finding.arms[0].said  # everything reverted, and half-b said it still ran with all of it
    assert finding.kind == "void" and "void: half-b: " in first and "NCCL_MAX_NCHANNELS ran '1', asked unset" in first


def test_what_an_arm_measured_is_judged_against_the_floor() -> None:
    assert arm_judged(_completed(3.42), 1.85) == ("restored", "3.42 GB/s")
    assert arm_judged(_completed(1.2), 1.85) == ("low", "1.2 GB/s (below 1.85)")
    outcome, said = arm_judged(_aborted(), 1.85)
    assert outcome == "low" and said.startswith("the all-reduce did not complete (half-a: exit 1")


def _stage_rows() -> list[NodeRow]:
    """The halves' multi-node rows after half-b's channel cap aborted the all-reduce (bench/results/h200x2-halves/),
    and a figure half-a measured low on its own."""

    def row(node: str, check: str, item: str, reason: str, status: Status = Status.ERROR) -> NodeRow:
        return NodeRow("r", "c", "multi-node", node, check, item, status, reason, detail="the run failed")

    return [
        *(row(n, "allreduce", "inter_node half-a,half-b", "collective_failed") for n in PAIR),
        *(row(n, "collectives", "all_gather_inter", "not_measured") for n in PAIR),
        row("half-a", "training", "scaling_efficiency", "below_threshold", Status.FAIL),
        row("half-a", "hostname", "resolves", "ok", Status.PASS),
    ]


def test_a_node_that_runs_none_of_the_cause_proved_on_its_partner_is_warned_not_rejected() -> None:
    arm, _ = _arms(lambda reverted: _completed(2.55) if CULPRIT in reverted else _aborted())
    finding = search_between(Search(list(FOUND)), arm, 1.85, FOUND)
    after = {(r.node, r.check): r for r in spared(_stage_rows(), finding, FOUND, PAIR)}
    for check in ("allreduce", "collectives"):
        mine = after[("half-a", check)]
        assert mine.status == Status.WARN, mine
        assert "half-b's NCCL_MAX_NCHANNELS=1 proved the cause" in mine.detail and "2.55 GB/s" in mine.detail
        assert mine.detail.startswith("the run failed; ") and mine.reason in ("collective_failed", "not_measured")
        assert after[("half-b", check)].status == Status.ERROR  # the node with the cause stays what it was
    assert after[("half-a", "training")].status == Status.FAIL  # a figure that ran and came out low: not spared
    assert after[("half-a", "hostname")].status == Status.PASS


def test_nothing_is_spared_without_a_named_cause_and_a_restoring_arm() -> None:
    arm, _ = _arms(lambda reverted: _completed(1.2))  # nothing restores it: cleared, nobody's cause
    cleared = search_between(Search(list(FOUND)), arm, 1.85, FOUND)
    assert spared(_stage_rows(), cleared, FOUND, PAIR) == _stage_rows()
    both = suspects_between({"half-a": [CAP], "half-b": [CAP]})  # the cause on every implicated node: nobody spared
    arm, _ = _arms(lambda reverted: _completed(2.55) if reverted else _aborted())
    finding = search_between(Search(list(both)), arm, 1.85, both)
    assert finding.kind == "named" and spared(_stage_rows(), finding, both, PAIR) == _stage_rows()
