"""Slow-node isolation on a simulated cluster: which nodes are named, and in how many rounds.

The simulated cluster gives a group 40 GB/s when healthy and 5 GB/s when it holds a bad node (or both
nodes of a slow pair), times a seeded ±2% noise: under the 5% straggler margin even at its extremes
(0.98 / 1.02 > 0.95), so a healthy node is never named by noise alone.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest

from cluster_accept.analysis.isolation import (
    GroupResult,
    IsolationPolicy,
    IsolationVerdict,
    Isolator,
    budget,
    drive,
    threshold_for,
    to_rows,
)

HEALTHY, SLOW = 40.0, 5.0
RunRound = Callable[[list[tuple[str, ...]]], list[GroupResult]]


def names(n: int) -> list[str]:
    return [f"n{i:03d}" for i in range(1, n + 1)]


def cluster(
    bad: Iterable[str] = (),
    slow_pairs: Iterable[tuple[str, str]] = (),
    failed: Iterable[str] = (),
    noise: float = 0.02,
    seed: int = 0,
    slow: float = SLOW,
) -> RunRound:
    """One round's results; asserts what the launcher relies on: groups of a round are disjoint."""
    bad, failed, pairs = set(bad), set(failed), [set(p) for p in slow_pairs]
    rng = random.Random(seed)

    def run_round(groups: list[tuple[str, ...]]) -> list[GroupResult]:
        members = [n for g in groups for n in g]
        assert len(members) == len(set(members)), f"a node in two groups of one round: {groups}"
        out = []
        for group in groups:
            nodes = set(group)
            if nodes & failed:
                out.append(GroupResult(group, None))
                continue
            hit = bool(nodes & bad) or any(p <= nodes for p in pairs)
            out.append(GroupResult(group, (slow if hit else HEALTHY) * (1 + rng.uniform(-noise, noise))))
        return out

    return run_round


def isolate(
    nodes: Sequence[str], run_round: RunRound, known_good: Iterable[str] = (), **policy: Any
) -> tuple[IsolationVerdict, Isolator]:
    isolator = Isolator(nodes, IsolationPolicy(**policy), known_good=known_good)
    return drive(isolator, run_round), isolator


def test_no_bad_node_is_one_screening_round() -> None:
    verdict, iso = isolate(names(16), cluster())
    assert (verdict.bad_nodes, verdict.bad_pairs, verdict.unresolved) == ([], [], [])
    assert verdict.good_nodes == names(16) and verdict.rounds_used == 1
    assert [r.phase for r in iso.rounds] == ["screen"]
    assert iso.rounds[0].groups == [tuple(names(16)[i : i + 2]) for i in range(0, 16, 2)]
    assert verdict.detail == "no slow node among 16; 1 round."


@pytest.mark.parametrize("n", [8, 16, 32, 64, 256])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_one_bad_node_is_named_in_two_rounds(n: int, where: str) -> None:
    bad = {"first": names(n)[0], "middle": names(n)[n // 2 - 1], "last": names(n)[-1]}[where]
    verdict, iso = isolate(names(n), cluster([bad], seed=n))
    assert verdict.bad_nodes == [bad] and verdict.bad_pairs == [] and verdict.unresolved == []
    assert verdict.good_nodes == [x for x in names(n) if x != bad]
    assert verdict.rounds_used == 2 <= budget(n)
    assert [r.phase for r in iso.rounds] == ["screen", "confirm"]
    # The confirming pair: the suspect with the first known-good node; its partner with the next.
    assert sum(iso.rounds[1].bad) == 1 and len(iso.rounds[1].groups) == 2


@pytest.mark.parametrize("n", [16, 64, 256])
@pytest.mark.parametrize("group_size", [4, 8])
def test_larger_groups_bisect_then_confirm_within_budget(n: int, group_size: int) -> None:
    bad = names(n)[n // 3]
    verdict, iso = isolate(names(n), cluster([bad], seed=group_size), group_size=group_size)
    assert verdict.bad_nodes == [bad] and verdict.unresolved == [] and verdict.bad_pairs == []
    bisections = group_size.bit_length() - 1  # log2 of the group size
    assert [r.phase for r in iso.rounds] == ["screen"] + ["bisect"] * bisections + ["confirm"]
    assert verdict.rounds_used == bisections + 2 <= budget(n)
    # Bisect groups keep the screening size (comparable busbw); the lone confirm pair brings a control pair.
    assert all(len(g) == group_size for r in iso.rounds[:-1] for g in r.groups)
    assert iso.rounds[-1].kinds == ["confirm", "control"] and [len(g) for g in iso.rounds[-1].groups] == [2, 2]


@pytest.mark.parametrize("slow", [36.0, 30.0, 20.0])  # 10%, 25%, 50% below the healthy 40 GB/s
def test_a_mild_straggler_is_named_too(slow: float) -> None:
    verdict, _ = isolate(names(32), cluster(["n017"], slow=slow, seed=7))
    assert verdict.bad_nodes == ["n017"] and verdict.bad_pairs == [] and verdict.rounds_used == 2


def test_two_bad_nodes_in_one_screening_pair() -> None:
    verdict, iso = isolate(names(16), cluster(["n007", "n008"]))
    assert verdict.bad_nodes == ["n007", "n008"] and verdict.bad_pairs == [] and verdict.rounds_used == 2
    assert iso.rounds[1].groups == [("n001", "n007"), ("n002", "n008")] and iso.rounds[1].bad == [True, True]


def test_two_bad_nodes_in_different_screening_groups() -> None:
    verdict, iso = isolate(names(16), cluster(["n003", "n010"]))
    assert verdict.bad_nodes == ["n003", "n010"] and verdict.rounds_used == 2
    assert iso.rounds[1].groups == [("n001", "n003"), ("n002", "n004"), ("n005", "n009"), ("n006", "n010")]


def test_two_bad_nodes_with_groups_of_four() -> None:
    verdict, _ = isolate(names(32), cluster(["n002", "n003"]), group_size=4)
    assert verdict.bad_nodes == ["n002", "n003"] and verdict.unresolved == [] and verdict.rounds_used == 4


def test_scarce_padding_never_judges_a_pair_without_a_reference() -> None:
    # Groups of 4, both bad nodes in the first: singleton halves need 3 padding nodes each, so they run one
    # per round; a confirm pair waits until a control pair fits beside it (alone, 5 GB/s would be its own norm).
    verdict, iso = isolate(names(8), cluster(["n002", "n003"], seed=3), group_size=4)
    assert verdict.bad_nodes == ["n002", "n003"] and verdict.unresolved == [] and verdict.rounds_used == 7
    assert iso.rounds[-1].kinds == ["confirm", "confirm", "control"]
    assert all(t is not None for r in iso.rounds[1:] for t in r.thresholds)


def test_a_failed_control_means_measuring_again() -> None:
    healthy = cluster(["n006"])
    spoilt: list[tuple[str, ...]] = []

    def run_round(groups: list[tuple[str, ...]]) -> list[GroupResult]:
        results = healthy(groups)
        if len(groups[-1]) == 2 and not spoilt:  # the first control pair fails
            spoilt.append(groups[-1])
            results[-1] = GroupResult(groups[-1], None)
        return results

    verdict, iso = isolate(names(16), run_round, group_size=4)
    assert [r.kinds for r in iso.rounds[3:]] == [["confirm", "control"], ["confirm", "control"]]
    assert iso.rounds[3].thresholds == [None, None] and iso.rounds[3].groups == iso.rounds[4].groups
    assert verdict.bad_nodes == ["n006"] and verdict.rounds_used == 5


def test_five_bad_of_64() -> None:
    bad = ["n003", "n017", "n030", "n031", "n060"]
    verdict, iso = isolate(names(64), cluster(bad, seed=5))
    assert verdict.bad_nodes == bad and verdict.bad_pairs == [] and verdict.unresolved == []
    assert verdict.rounds_used == 2 and len(iso.rounds[1].groups) == 10


def test_few_known_good_nodes_spread_the_pairs_over_rounds() -> None:
    # 3 of 4 pairs slow: the median is slow too, so the floor does the judging; only n007, n008 are
    # known-good after the screen, so one slow pair is split per round until more nodes are cleared.
    verdict, iso = isolate(names(8), cluster(["n001", "n003", "n005"]), min_busbw_gbps=20.0)
    assert verdict.bad_nodes == ["n001", "n003", "n005"] and verdict.unresolved == []
    assert [r.groups for r in iso.rounds[1:]] == [
        [("n001", "n007"), ("n002", "n008")],
        [("n002", "n003"), ("n004", "n007"), ("n005", "n008")],
        [("n002", "n006")],
    ]
    assert verdict.rounds_used == 4


def test_a_slow_majority_hides_behind_its_own_median_without_a_floor() -> None:
    verdict, _ = isolate(names(8), cluster(["n001", "n003", "n005"]))
    assert verdict.bad_nodes == [] and verdict.rounds_used == 1


@pytest.mark.parametrize("seed", range(20))
def test_noise_within_the_margin_never_names_a_healthy_node(seed: int) -> None:
    run = cluster(noise=0.03, seed=seed)
    verdict, iso = isolate(names(32), run, straggler_pct=7.0)  # 0.97 / 1.03 = 0.942 > 0.93
    assert verdict.bad_nodes == [] and verdict.bad_pairs == [] and iso.rounds[0].bad == [False] * 16
    verdict, _ = isolate(names(32), cluster(["n011"], noise=0.03, seed=seed), straggler_pct=7.0)
    assert verdict.bad_nodes == ["n011"] and verdict.bad_pairs == [] and verdict.rounds_used == 2


def test_noise_wider_than_the_margin_does_flag_healthy_groups() -> None:
    # What the margin buys: at ±10% noise and 5%, healthy screening groups are flagged for some seed.
    flagged = [any(isolate(names(32), cluster(noise=0.10, seed=s))[1].rounds[0].bad) for s in range(20)]
    assert any(flagged)


def test_a_slow_pair_is_a_path_not_a_node() -> None:
    verdict, iso = isolate(names(16), cluster(slow_pairs=[("n005", "n006")]))
    assert verdict.bad_pairs == [("n005", "n006")] and verdict.bad_nodes == [] and verdict.unresolved == []
    assert "n005" not in verdict.good_nodes and "n006" not in verdict.good_nodes
    assert iso.rounds[1].bad == [False, False] and verdict.rounds_used == 2
    assert "n005+n006" in verdict.detail


def test_a_slow_pair_split_across_halves_is_searched_for() -> None:
    verdict, iso = isolate(names(16), cluster(slow_pairs=[("n001", "n003")]), group_size=4)
    assert verdict.bad_pairs == [("n001", "n003")] and verdict.bad_nodes == [] and verdict.unresolved == []
    assert [r.kinds[0] for r in iso.rounds] == ["screen", "bisect", "search", "search"]
    # n002 and n004 were fine with known-good nodes and are not part of the pair.
    assert {"n002", "n004"} <= set(verdict.good_nodes) and verdict.rounds_used == 4


def test_a_failed_run_counts_as_slow() -> None:
    verdict, iso = isolate(names(8), cluster(failed=["n007"]))
    assert verdict.bad_nodes == ["n007"] and verdict.rounds_used == 2
    row = next(r for r in to_rows(iso.rounds) if r.round == 0 and r.nodes == "n[007-008]")
    assert row.busbw_gbps is None and row.bad is True


@pytest.mark.parametrize("how", ["failed", "floor"])
def test_everything_bad_is_unresolved_without_a_crash(how: str) -> None:
    run = cluster(failed=names(8)) if how == "failed" else cluster(bad=names(8))
    verdict, iso = isolate(names(8), run, min_busbw_gbps=20.0)
    assert verdict.unresolved == names(8) and verdict.bad_nodes == [] and verdict.good_nodes == []
    assert verdict.rounds_used == 1 and iso.next_round() == []
    assert verdict.detail == "n[001-008] unresolved (no known-good node to pair with); 1 round."


def test_two_nodes_cannot_be_told_apart_without_a_third() -> None:
    verdict, iso = isolate(names(2), cluster(["n002"]), min_busbw_gbps=20.0)
    assert (
        verdict.unresolved == ["n001", "n002"]
        and verdict.bad_nodes == []
        and iso.rounds[0].groups == [("n001", "n002")]
    )
    # One group has no peers: without a floor a slow pair passes (documented), with a known-good node it is found.
    assert isolate(names(2), cluster(["n002"]))[0].good_nodes == ["n001", "n002"]
    verdict, iso = isolate(names(2), cluster(["n002"]), known_good=["spare01", "spare02", "spare03"])
    assert iso.rounds[0].groups == [("n001", "n002"), ("spare01", "spare02")]  # the spares as a control
    assert verdict.bad_nodes == ["n002"] and verdict.rounds_used == 2


def test_three_nodes_screen_the_third_against_the_first_pair() -> None:
    verdict, iso = isolate(names(3), cluster(["n003"]))
    assert [r.groups for r in iso.rounds] == [[("n001", "n002")], [("n001", "n003")]]
    assert verdict.bad_nodes == ["n003"] and verdict.rounds_used == 2
    # A slow first pair with no third node known-good: nothing to compare with.
    verdict, _ = isolate(names(3), cluster(["n001"]), min_busbw_gbps=20.0)
    assert verdict.unresolved == names(3) and verdict.bad_nodes == []


@pytest.mark.parametrize("bad", [[], ["n004"], ["n009"]])
def test_odd_node_count_screens_the_leftover_next_round(bad: list[str]) -> None:
    verdict, iso = isolate(names(9), cluster(bad))
    assert verdict.bad_nodes == bad and verdict.unresolved == [] and verdict.rounds_used == 2
    assert len(iso.rounds[0].groups) == 4 and ("n001", "n009") in iso.rounds[1].groups


def test_leftover_of_a_larger_group_is_padded_next_round() -> None:
    verdict, iso = isolate(names(6), cluster(["n006"]), group_size=4)
    assert [r.groups for r in iso.rounds[:2]] == [
        [("n001", "n002", "n003", "n004")],
        [("n001", "n002", "n005", "n006")],
    ]
    # Each half needs 3 of the 4 known-good nodes as padding: the halves run one round each, then confirm.
    assert [r.kinds for r in iso.rounds[2:]] == [["bisect"], ["bisect"], ["confirm", "control"]]
    assert verdict.bad_nodes == ["n006"] and verdict.unresolved == [] and verdict.rounds_used == 5 <= budget(6)


def test_known_good_nodes_pad_and_control_from_the_first_round() -> None:
    suspects, spares = ["n003", "n004", "n005"], ["n010", "n011", "n012", "n013"]
    verdict, iso = isolate(suspects + spares, cluster(["n005"]), known_good=spares)
    assert iso.rounds[0].groups == [("n003", "n004"), ("n005", "n010"), ("n011", "n012")]
    assert iso.rounds[0].kinds == ["screen", "screen", "control"]
    assert verdict.bad_nodes == ["n005"] and verdict.rounds_used == 1
    assert verdict.good_nodes == ["n003", "n004", *spares]


def test_round_limit_leaves_suspects_unresolved() -> None:
    verdict, iso = isolate(names(8), cluster(["n002"]), max_rounds=1)
    assert verdict.unresolved == ["n001", "n002"] and verdict.bad_nodes == [] and len(iso.rounds) == 1
    assert "round limit (1) reached" in verdict.detail


def test_same_input_same_rounds() -> None:
    first = isolate(names(32), cluster(["n005", "n020"], seed=3), group_size=4)[1].rounds
    second = isolate(names(32), cluster(["n005", "n020"], seed=3), group_size=4)[1].rounds
    assert first == second and len(first) == 4


def test_record_checks_the_groups_and_next_round_repeats_until_recorded() -> None:
    iso = Isolator(names(4), IsolationPolicy())
    with pytest.raises(ValueError, match="not yet recorded"):
        iso.record([])
    groups = iso.next_round()
    assert iso.next_round() == groups == [("n001", "n002"), ("n003", "n004")]
    with pytest.raises(ValueError, match="exactly the planned groups"):
        iso.record([GroupResult(("n001", "n003"), 40.0), GroupResult(("n002", "n004"), 40.0)])
    assert iso.verdict().unresolved == names(4)  # measured nothing yet
    iso.record([GroupResult(("n004", "n003"), 40.0), GroupResult(("n002", "n001"), 39.0)])
    assert iso.next_round() == [] and iso.verdict().good_nodes == names(4)
    with pytest.raises(ValueError, match="group_size"):
        IsolationPolicy(group_size=1)


def test_threshold_for() -> None:
    policy = IsolationPolicy(straggler_pct=5.0)
    groups = [GroupResult(("a", "b"), v) for v in (40.0, 40.0, 5.0, None)]
    assert threshold_for(groups, policy) == pytest.approx(38.0)
    assert threshold_for(groups, IsolationPolicy(min_busbw_gbps=39.0)) == 39.0
    assert threshold_for(groups[:1], policy) is None  # one figure is its own median
    assert threshold_for(groups[:1], IsolationPolicy(min_busbw_gbps=20.0)) == 20.0
    assert threshold_for([], policy, trusted=groups[:1]) == pytest.approx(38.0)  # a known-good figure is enough
    assert threshold_for(groups[2:], policy, trusted=groups[:2]) == pytest.approx(38.0)


def test_rows_for_the_report() -> None:
    _, iso = isolate(names(4), cluster(["n002"], noise=0.0))
    rows = to_rows(iso.rounds)
    assert [r.record() for r in rows] == [
        {**_row(0, "screen", 0, "screen", "n[001-002]", SLOW, True), "threshold_gbps": pytest.approx(21.375)},
        {**_row(0, "screen", 1, "screen", "n[003-004]", HEALTHY, False), "threshold_gbps": pytest.approx(21.375)},
        {**_row(1, "confirm", 0, "bisect", "n[001,003]", HEALTHY, False), "threshold_gbps": pytest.approx(38.0)},
        {**_row(1, "confirm", 1, "bisect", "n[002,004]", SLOW, True), "threshold_gbps": pytest.approx(38.0)},
    ]


def _row(rnd: int, phase: str, index: int, kind: str, nodes: str, busbw: float, bad: bool) -> dict[str, object]:
    return {
        "round": rnd,
        "phase": phase,
        "group_index": index,
        "kind": kind,
        "nodes": nodes,
        "size": 2,
        "busbw_gbps": busbw,
        "bad": bad,
        "signal": "allreduce",  # placed in its run by the stage
        "run_id": "",
        "cluster": "",
    }


def test_budget() -> None:
    assert [budget(n) for n in (2, 3, 8, 9, 256)] == [4, 5, 6, 7, 11]
