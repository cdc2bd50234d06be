"""A node against its own history: the small-sample bound, the minimum depth, the confirmation beside a control, and
one finding when most nodes moved together (pure; synthetic figures)."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from cluster_accept.analysis.probe_verdicts import MetricRule
from cluster_accept.analysis.regressions import (
    MOVED,
    Control,
    confirmed_again,
    figure_regressions,
    moved_together,
    own_noise,
    peers_levels,
    student_t_cdf,
    student_t_quantile,
)
from cluster_accept.checks.base import NodeRow, Status
from cluster_accept.inventory.model import Thresholds

RULES = {"gemm_fp32_gflops": MetricRule("gemm", None, False)}


@pytest.mark.parametrize(
    ("p", "dof", "t"),
    [(0.975, 1, 12.706), (0.975, 4, 2.776), (0.975, 30, 2.042), (0.995, 3, 5.841), (0.95, 5, 2.015)],
)
def test_student_t_quantiles_match_the_published_table(p: float, dof: int, t: float) -> None:
    assert student_t_quantile(p, dof) == pytest.approx(t, abs=0.001)
    assert student_t_cdf(-t, dof) == pytest.approx(1 - p, abs=1e-4)


def test_the_bound_of_a_nodes_own_runs_narrows_as_they_grow() -> None:
    three, ten = own_noise([100.0, 101.0, 99.0], 3.0), own_noise([100.0, 101.0, 99.0] * 3 + [100.0], 3.0)
    assert three is not None and ten is not None
    # 3 × cv is the margin: t(2) 19.2 · s 1 · √(4/3) over 100 = 22 %; t(9) 4.09 · s 0.82 · √1.1 = 3.5 %
    assert 3 * three.cv == pytest.approx(0.222, abs=0.002) and 3 * ten.cv == pytest.approx(0.035, abs=0.002)
    assert own_noise([100.0], 3.0) is None


def _figures(node_values: dict[str, list[float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"run_id": f"r{i}", "node": n, "metric": "gemm_fp32_gflops", "unit": "GFLOP/s", "model": "", "value": v}
            for n, values in node_values.items()
            for i, v in enumerate(values)
        ]
    )


def test_two_runs_21_percent_apart_judge_nothing_and_three_make_only_an_inconclusive_row() -> None:
    """The figures the field saw: fp32 GEMM 78.7 against its own 74.6 and 92.5."""
    now = _figures({"n1": [78.7]})
    [(_, shallow)] = figure_regressions(now, _figures({"n1": [74.6, 92.5]}), {"n1": Thresholds()}, RULES)
    assert (shallow.status, shallow.reason) == (Status.WARN, "inconclusive") and "only 2 earlier run" in shallow.detail
    [(_, three)] = figure_regressions(now, _figures({"n1": [74.6, 92.5, 88.0]}), {"n1": Thresholds()}, RULES)
    assert (three.status, three.reason) == (Status.WARN, "inconclusive"), three


def _row(
    node: str, reason: str, status: Status = Status.WARN, expected: str = ">= 90.0 GFLOP/s (own median - 5%)"
) -> NodeRow:
    return NodeRow(
        "r", "c", "single-node", node, "gemm", "gemm_fp32_gflops_vs_history", status, reason, "80", expected, "d"
    )


def test_most_nodes_falling_together_is_one_finding_of_the_cluster_not_a_rejection_of_each() -> None:
    rows = [
        _row("n1", "regression", Status.FAIL),
        _row("n2", "inconclusive"),
        _row("n3", "ok", Status.PASS),
        _row("n4", "regression", Status.FAIL),
    ]
    moved = moved_together(rows, lambda: "OMP_NUM_THREADS: unset -> 1")
    assert [(r.node, r.status, r.reason) for r in moved] == [
        ("n1", Status.WARN, MOVED), ("n2", Status.WARN, MOVED), ("n3", Status.PASS, "ok"), ("n4", Status.WARN, MOVED),
    ]  # fmt: skip
    assert "3 of the 4 nodes judged fell below their own history together" in moved[0].detail
    assert moved[0].detail.endswith("what changed between the runs: OMP_NUM_THREADS: unset -> 1")
    one = [_row("n1", "regression", Status.FAIL), _row("n2", "ok", Status.PASS), _row("n3", "ok", Status.PASS)]
    assert moved_together(one) == one  # one node of three: its own regression


def test_a_regression_stays_one_only_when_it_is_still_low_beside_a_control_that_held() -> None:
    row = _row("n1", "regression", Status.FAIL)
    kept = confirmed_again(row, 70.0, Control("n3", 101.0, 95.0))
    assert (kept.status, kept.reason) == (Status.FAIL, "regression") and kept.detail.endswith(
        "measured again: 70.0 beside n3 (101.0, within its own history): confirmed"
    )
    back = confirmed_again(row, 93.0, Control("n3", 101.0, 95.0))
    assert (back.status, back.reason) == (Status.WARN, "inconclusive") and "back within its own history" in back.detail
    machine = confirmed_again(row, 70.0, Control("n3", 80.0, 95.0))
    assert (machine.status, machine.reason) == (Status.WARN, "inconclusive") and "the machine moved" in machine.detail
    alone = confirmed_again(row, 70.0, None)
    assert (alone.status, alone.reason) == (Status.FAIL, "regression") and alone.detail.endswith(": confirmed")
    nothing = confirmed_again(row, None, None)
    assert nothing.reason == "inconclusive" and "no figure" in nothing.detail


def test_a_regression_is_held_to_its_floor_with_the_controls_own_fall_taken_out() -> None:
    """The history soak's false rejection: node01's GEMM, its history tight (σ 0.5 %), measured again 5.5 % below
    its median and under its floor, beside node04 measured again 11.9 % below its own median but inside its wider
    history. Against the control's fall the suspect held: the machine moved. A real regression stays one beside a
    control that fell a little, and a control that rose takes nothing away."""
    row = _row("n1", "regression", Status.FAIL)  # its floor 90.0
    soak = confirmed_again(row, 88.0, Control("n4", 190.6, 185.0, 216.3))
    assert (soak.status, soak.reason) == (Status.WARN, "inconclusive"), soak.detail
    assert soak.detail.endswith(
        "measured again: 88.0 beside n4 (190.6, 11.9% below its own median 216.3): 99.9 with that fall taken out, "
        "within its own history: the machine moved, not confirmed"
    ), soak.detail
    real = confirmed_again(row, 70.0, Control("n4", 210.0, 185.0, 216.3))
    assert (real.status, real.reason) == (Status.FAIL, "regression") and real.detail.endswith(": confirmed")
    risen = confirmed_again(row, 88.0, Control("n4", 230.0, 185.0, 216.3))
    assert (risen.status, risen.reason) == (Status.FAIL, "regression"), risen.detail
    unknown = confirmed_again(row, 88.0, Control("n4", 190.6, 185.0))
    assert (unknown.status, unknown.reason) == (Status.FAIL, "regression"), unknown.detail  # no median: as before


def test_a_regression_is_held_to_every_measurement_again_of_its_figure_in_the_run() -> None:
    """The history soak's second false rejection (a busy loop on the machine's cores): node04's GEMM 41.7 GFLOP/s
    against a floor of 69.7, measured again 43.9 beside a control that held, but 98.9, 98.3 and 98.6 in the stage's
    straggler rounds beside its peers: one low measurement again proves nothing where most came back. A node low in
    the rounds too stays a regression."""
    row = replace(_row("n4", "regression", Status.FAIL), expected=">= 69.7 GFLOP/s (own median - 28.5%)")
    busy = confirmed_again(row, 43.9, Control("n1", 96.0, 69.0), [98.94, 98.29, 98.6])
    assert (busy.status, busy.reason) == (Status.WARN, "inconclusive"), busy.detail
    assert busy.detail.endswith(
        "measured again: 43.9; in the straggler rounds beside its peers: 98.9, 98.3, 98.6: the median of the 4 "
        "measurements again, 98.4, is back within its own history: not confirmed"
    ), busy.detail
    low = confirmed_again(row, 43.9, Control("n1", 96.0, 69.0), [44.0, 98.3, 45.1])
    assert (low.status, low.reason) == (Status.FAIL, "regression"), low.detail
    assert "in the straggler rounds beside its peers: 44.0, 98.3, 45.1 beside n1 (96.0" in low.detail
    only_rounds = confirmed_again(row, None, None, [98.9, 98.3, 98.6])
    assert only_rounds.reason == "inconclusive" and "back within its own history" in only_rounds.detail


def test_a_round_every_node_was_slow_in_counts_at_the_peers_level_and_most_measurements_must_be_low() -> None:
    """The history soak's third false rejection (turn 19 of 20, the busy loop): node02's GEMM 48.5 GFLOP/s against
    a floor of 87.5, measured again 49.7 beside a control that held, and 39.9, 98.6, 93.1 in the straggler rounds,
    whose first round the peers too measured at half (their median 48.8, 100.2, 100.9): at the peers' usual level
    81.9, 98.6, 92.4; with 49.7, two of four under the floor: a split, not a regression."""
    row = replace(_row("node02", "regression", Status.FAIL), expected=">= 87.5 GFLOP/s (own median - 12.4%)")
    levels = [48.81, 100.2, 100.9]
    busy = confirmed_again(row, 49.7, Control("node03", 99.4, 87.0), [39.91, 98.6, 93.06], levels)
    assert (busy.status, busy.reason) == (Status.WARN, "inconclusive"), busy.detail
    assert busy.detail.endswith(
        "measured again: 49.7; in the straggler rounds beside its peers: 39.9, 98.6, 93.1 (its peers' median 48.8, "
        "100.2, 100.9: at their usual level 81.9, 98.6, 92.4): only 2 of the 4 measurements again are under its "
        "floor 87.5: not confirmed"
    ), busy.detail
    slow = confirmed_again(row, 49.7, Control("node03", 99.4, 87.0), [39.91, 52.0, 50.1], levels)
    assert (slow.status, slow.reason) == (Status.FAIL, "regression"), slow.detail  # low in every round


def test_the_peers_level_of_each_round_is_the_median_of_the_other_nodes_measured_in_it() -> None:
    rounds = {("n2", "gemm"): [39.9, 98.6, 93.1], ("n1", "gemm"): [48.0, 99.0, 101.0], ("n3", "gemm"): [49.6, 101.4,
              100.8], ("n4", "gemm"): [48.8, 100.2, 100.9], ("n3", "hbm"): [1.0, 2.0, 3.0]}  # fmt: skip
    assert peers_levels(rounds, "n2", "gemm", 3) == [48.8, 100.2, 100.9]
    assert peers_levels(rounds, "n2", "gemm", 2) == []  # rounds of another length are not the same rounds
    assert peers_levels({("n2", "gemm"): [39.9]}, "n2", "gemm", 1) == []  # no peer measured
