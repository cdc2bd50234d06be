"""Between nodes, the cause of a failed all-reduce proved arm by arm over the suspects of every implicated node
(:func:`tasks.multi_node.prove.search_between`): each arm is the group's all-reduce with some suspects reverted on
their own nodes. The runs here are the data a group run gives (ranks' ends, figures), made for each arm."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from cluster_accept.analysis.minimal_cause import Search, arm_bound
from cluster_accept.analysis.proof import figure_note, finding_rows
from cluster_accept.analysis.reference import DEFAULTS, Change
from cluster_accept.analysis.suspects import JobSetting
from cluster_accept.checks.base import Status
from cluster_accept.remote.launch import GroupRun, RankRun
from cluster_accept.remote.result import CommandResult, NodeStatus
from cluster_accept.tasks.multi_node.prove import arm_judged, search_between
from cluster_accept.vocabulary.figures import Figure
from cluster_accept.vocabulary.secrets import MaskedText

# What a 2 x H200 host seen as two "nodes" ran with (bench/results/h200x2-halves/): two harmless settings on both
# halves, and a channel cap on half-b only, which made the ranks disagree and the all-reduce abort on both.
SUSPECTS = {
    "half-a:NCCL_DEBUG_SUBSYS": ("half-a", JobSetting("NCCL_DEBUG_SUBSYS", "INIT,ENV", "env")),
    "half-a:NCCL_IB_TIMEOUT": ("half-a", JobSetting("NCCL_IB_TIMEOUT", "22", "env")),
    "half-b:NCCL_DEBUG_SUBSYS": ("half-b", JobSetting("NCCL_DEBUG_SUBSYS", "INIT,ENV", "env")),
    "half-b:NCCL_IB_TIMEOUT": ("half-b", JobSetting("NCCL_IB_TIMEOUT", "22", "env")),
    "half-b:NCCL_MAX_NCHANNELS": ("half-b", JobSetting("NCCL_MAX_NCHANNELS", "1", "env")),
}
NAMES = {key: f"{node}'s {setting.said}" for key, (node, setting) in SUSPECTS.items()}
CULPRIT = "half-b:NCCL_MAX_NCHANNELS"


def _completed(busbw_gbps: float) -> GroupRun:
    done = CommandResult("allreduce", 0, MaskedText('{"info": "rank_done"}\n'), MaskedText(""))
    ranks = {n: RankRun(n, NodeStatus.OK, result=done) for n in ("half-a", "half-b")}
    figure = Figure("allreduce_busbw_gbps", busbw_gbps, "allreduce", unit="GB/s", size=1 << 30, label="inter_node")
    return GroupRun(("half-a", "half-b"), "t", ranks, [figure])


def _aborted() -> GroupRun:
    said = "NCCL WARN Message truncated : received 1024 bytes instead of 512"
    ranks = {
        n: RankRun(n, NodeStatus.OK, result=CommandResult("allreduce", 1, MaskedText(""), MaskedText(said)))
        for n in ("half-a", "half-b")
    }
    return GroupRun(("half-a", "half-b"), "t", ranks)


def _unreachable() -> GroupRun:
    ranks = {
        "half-a": RankRun(
            "half-a", NodeStatus.OK, result=CommandResult("allreduce", 1, MaskedText(""), MaskedText(""))
        ),
        "half-b": RankRun("half-b", NodeStatus.UNREACHABLE, cause="connect_timeout"),
    }
    return GroupRun(("half-a", "half-b"), "t", ranks)


def _arms(
    measure: Callable[[frozenset[str]], GroupRun],
) -> tuple[Callable[[frozenset[str]], GroupRun], list[frozenset[str]]]:
    asked: list[frozenset[str]] = []

    def arm(reverted: frozenset[str]) -> GroupRun:
        asked.append(reverted)
        return measure(reverted)

    return arm, asked


def test_a_setting_on_one_node_that_aborts_the_all_reduce_of_both_is_named_alone_on_its_node() -> None:
    arm, asked = _arms(lambda reverted: _completed(3.42) if CULPRIT in reverted else _aborted())
    finding = search_between(Search(list(SUSPECTS)), arm, 1.85, NAMES)
    assert (finding.kind, finding.alone, finding.together) == ("named", (CULPRIT,), ())
    assert asked[0] == frozenset(SUSPECTS) and len(asked) <= arm_bound(len(SUSPECTS))
    kept_alone = frozenset(SUSPECTS) - {CULPRIT}
    assert kept_alone in asked and frozenset({CULPRIT}) in asked  # proved kept alone (low) and reverted (restored)
    assert finding.arms[asked.index(kept_alone)].outcome == "low"
    every = [Change(key, setting, None) for key, (_, setting) in SUSPECTS.items()]
    rows = {row.item: row for row in finding_rows(every, finding, DEFAULTS)}
    assert (rows[CULPRIT].status, rows[CULPRIT].reason) == (Status.FAIL, "confirmed")
    assert {k: r.reason for k, r in rows.items() if k != CULPRIT} == dict.fromkeys(set(SUSPECTS) - {CULPRIT}, "cleared")
    note = figure_note(finding, [Change(k, replace(s, key=k), None) for k, (_, s) in SUSPECTS.items()], DEFAULTS)
    assert "the cause is half-b:NCCL_MAX_NCHANNELS=1 (each slows it by itself)" in note, note
    said = finding.arms[asked.index(kept_alone)].said
    assert said.startswith("without half-a's NCCL_DEBUG_SUBSYS=INIT,ENV") and "did not complete" in said, said
    assert "half-b: exit 1, NCCL WARN Message truncated : received 1024 bytes instead of 512" in said, said


def test_a_slow_all_reduce_is_restored_only_at_the_floor_between_nodes() -> None:
    arm, asked = _arms(lambda reverted: _completed(3.4 if CULPRIT in reverted else 0.9))
    finding = search_between(Search(list(SUSPECTS)), arm, 1.85, NAMES)
    assert finding.alone == (CULPRIT,)
    # still below the floor with everything reverted: none of them is the cause, after one arm
    arm, asked = _arms(lambda reverted: _completed(1.2))
    finding = search_between(Search(list(SUSPECTS)), arm, 1.85, NAMES)
    assert (finding.kind, finding.named, len(asked)) == ("cleared", (), 1)


def test_without_a_floor_an_all_reduce_that_completes_again_is_restored() -> None:
    """A run that aborted is proved without a floor: completing is what comes back."""
    arm, _ = _arms(lambda reverted: _completed(0.9) if CULPRIT in reverted else _aborted())
    assert search_between(Search(list(SUSPECTS)), arm, None, NAMES).alone == (CULPRIT,)


def test_an_arm_a_node_could_not_run_is_void_and_nothing_is_named() -> None:
    outcome, said = arm_judged(_unreachable(), 1.85)
    assert outcome == "void" and "half-b" in said
    arm, _ = _arms(lambda reverted: _unreachable())
    finding = search_between(Search(list(SUSPECTS)), arm, 1.85, NAMES)
    assert finding.kind == "void" and finding.named == ()


def test_what_an_arm_measured_is_judged_against_the_floor() -> None:
    assert arm_judged(_completed(3.42), 1.85) == ("restored", "3.42 GB/s")
    assert arm_judged(_completed(1.2), 1.85) == ("low", "1.2 GB/s (below 1.85)")
    outcome, said = arm_judged(_aborted(), 1.85)
    assert outcome == "low" and said.startswith("the all-reduce did not complete (half-a: exit 1")
