"""The smallest set of settings whose reverting restores a figure, found arm by arm (pure; synthetic arms).

Each test's node is a model: a figure of 100 slowed by the culprits still in effect (each by its factor; a pair
only when both are), judged ``restored`` at 95 or more, as the stage judges a figure against its floor."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import pytest

from cluster_accept.analysis.minimal_cause import Finding, Outcome, Search, arm_bound

SUSPECTS = [f"S{i:02d}" for i in range(20)]
Figure = Callable[[frozenset[str]], float]


def slowed_by(alone: Mapping[str, float], pairs: Sequence[tuple[str, str, float]] = ()) -> Figure:
    """The figure with ``in_effect`` settings: 100 times each culprit's factor, each pair's when both are in."""

    def figure(in_effect: frozenset[str]) -> float:
        value = 100.0
        value *= math.prod(f for s, f in alone.items() if s in in_effect)
        value *= math.prod(f for a, b, f in pairs if a in in_effect and b in in_effect)
        return value

    return figure


def searched(
    figure: Figure, suspects: Sequence[str] = SUSPECTS, void: Callable[[frozenset[str]], bool] = lambda r: False
) -> Finding:
    search = Search(suspects)
    while (reverted := search.next_arm()) is not None:
        value = figure(frozenset(suspects) - reverted)
        outcome: Outcome = "void" if void(reverted) else ("restored" if value >= 95 else "low")
        search.record(outcome, f"{value:.0f}")
    assert search.finding is not None
    return search.finding


@pytest.mark.parametrize("culprit", ["S00", "S07", "S13", "S19"])
def test_one_culprit_among_twenty_is_named_alone_within_the_bound(culprit: str) -> None:
    finding = searched(slowed_by({culprit: 0.2}))
    assert (finding.kind, finding.alone, finding.together, finding.left) == ("named", (culprit,), (), ())
    assert len(finding.arms) <= arm_bound(20, 0) == 12
    # proved arm by arm: an arm kept the culprit alone in effect and stayed low; reverting it alone restored
    kept_alone = frozenset(SUSPECTS) - {culprit}
    assert any(a.reverted == kept_alone and a.outcome == "low" for a in finding.arms)
    assert any(a.reverted == {culprit} and a.outcome == "restored" for a in finding.arms)


def test_two_independent_culprits_are_both_named_each_alone() -> None:
    finding = searched(slowed_by({"S03": 0.5, "S16": 0.6}))
    assert (finding.kind, finding.alone, finding.together) == ("named", ("S03", "S16"), ())
    assert len(finding.arms) <= arm_bound(20, 2)
    assert finding.arms[-1].reverted == {"S03", "S16"} and finding.arms[-1].outcome == "restored"


def test_a_pair_that_slows_the_figure_only_together_is_named_as_a_pair() -> None:
    finding = searched(slowed_by({}, [("S04", "S11", 0.3)]))
    assert (finding.kind, finding.alone, finding.together) == ("named", (), ("S04", "S11"))
    # neither alone slows it: an arm kept each alone in effect and was restored
    for member in ("S04", "S11"):
        assert any(a.reverted == frozenset(SUSPECTS) - {member} and a.outcome == "restored" for a in finding.arms)


def test_a_culprit_beside_a_pair_names_both_kinds() -> None:
    finding = searched(slowed_by({"S01": 0.5}, [("S08", "S15", 0.4)]))
    assert (finding.kind, finding.alone, finding.together) == ("named", ("S01",), ("S08", "S15"))


def test_settings_that_do_not_matter_are_cleared_by_the_first_arm() -> None:
    finding = searched(lambda in_effect: 50.0)  # the figure is low whatever is reverted: the hardware path
    assert (finding.kind, finding.named, len(finding.arms)) == ("cleared", (), 1)


def test_a_void_first_arm_proves_nothing() -> None:
    finding = searched(slowed_by({"S02": 0.2}), void=lambda reverted: len(reverted) == 20)
    assert (finding.kind, finding.named, len(finding.arms)) == ("void", (), 1)


def test_two_pairs_that_each_slow_only_together_are_all_named_and_nothing_else() -> None:
    finding = searched(slowed_by({}, [("S00", "S03", 0.5), ("S01", "S02", 0.5)]), SUSPECTS[:8])
    assert (finding.kind, finding.alone, finding.together) == ("named", (), ("S00", "S01", "S02", "S03"))


def test_a_void_arm_the_halving_cannot_go_round_stops_the_search_naming_nothing_harmless() -> None:
    """Two suspects, the arm keeping the first alone void and the other half not slowing: which half holds the
    culprit cannot be told, so the search stops there, every suspect still in question."""
    finding = searched(slowed_by({"a": 0.2}), ["a", "b"], void=lambda reverted: reverted == {"b"})
    assert (finding.kind, finding.named, finding.left) == ("unfinished", (), ("a", "b"))
    assert "did not run as asked" in finding.note


def test_a_void_arm_in_the_halving_is_gone_round_by_measuring_the_other_half() -> None:
    first_half = frozenset(SUSPECTS) - frozenset(SUSPECTS[:10])
    finding = searched(slowed_by({"S15": 0.2}), void=lambda reverted: reverted == first_half)
    assert (finding.kind, finding.alone) == ("named", ("S15",))
    assert any(a.outcome == "void" for a in finding.arms)


def test_the_bound_reached_first_says_so_and_names_what_is_left() -> None:
    search = Search(SUSPECTS, extra=-5)  # a bound of 5 arms: the halving cannot finish
    figure = slowed_by({"S09": 0.2})
    while (reverted := search.next_arm()) is not None:
        search.record("restored" if figure(frozenset(SUSPECTS) - reverted) >= 95 else "low")
    finding = search.finding
    assert finding is not None and finding.kind == "unfinished"
    assert len(finding.arms) == 5 and finding.named == ()
    assert finding.left == tuple(SUSPECTS) and "bound of 5" in finding.note  # nothing proved harmless yet


def test_the_bound_grows_with_each_culprit_found() -> None:
    assert arm_bound(1) == 2 and arm_bound(20) == 12 and arm_bound(20, 1) == 19
    assert arm_bound(2) == 4 and arm_bound(21, extra=3) == 13 and arm_bound(20, interactions=1) == 24


def test_recording_without_a_waiting_arm_is_refused() -> None:
    search = Search(["A"])
    search.record("restored")
    assert search.finding is not None and search.finding.alone == ("A",)
    with pytest.raises(ValueError, match="no arm is waiting"):
        search.record("low")
