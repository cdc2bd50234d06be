"""The scaling table: efficiency against the 2-node run, the drop from one node, and the sweep sizes."""

from __future__ import annotations

import pytest

from cluster_accept.analysis.scaling import ScalingPoint, algbw_gbps, scaling_table, sweep_sizes


@pytest.mark.parametrize(
    ("n", "sizes"),
    [
        (0, []),
        (1, []),
        (2, [2]),
        (3, [2, 3]),
        (6, [2, 4, 6]),
        (8, [2, 4, 8]),
        (9, [2, 4, 8, 9]),
        (64, [2, 4, 8, 16, 32, 64]),
    ],
)
def test_sweep_sizes(n: int, sizes: list[int]) -> None:
    assert sweep_sizes(n) == sizes


def _seed_example() -> list[ScalingPoint]:
    # Like the seed report: NVLink inside a node, 79% of it gone across two nodes, 72% kept at eight.
    return [ScalingPoint(8, 75.6, 8), ScalingPoint(1, 500.0, 8), ScalingPoint(4, 94.5, 8), ScalingPoint(2, 105.0, 8)]


def test_seed_example_table() -> None:
    table = scaling_table(_seed_example(), 0.90)
    assert [(r.nodes, r.gpus, r.busbw_gbps) for r in table.rows] == [
        (1, 8, 500.0),
        (2, 16, 105.0),
        (4, 32, 94.5),
        (8, 64, 75.6),
    ]
    assert [r.efficiency for r in table.rows] == [None, 1.0, pytest.approx(0.90), pytest.approx(0.72)]
    assert 1 - table.rows[1].vs_one_node == pytest.approx(0.79)  # the drop from one node to two
    assert [r.vs_one_node for r in table.rows] == pytest.approx([1.0, 0.21, 0.189, 0.1512])
    # algbw = busbw * n / (2 (n - 1)): 16 ranks -> 105 * 16 / 30 = 56; a node's 8 GPUs together 448.
    assert (table.rows[1].algbw_gbps, table.rows[1].node_algbw_gbps) == pytest.approx((56.0, 448.0))
    assert (table.rows[3].algbw_gbps, table.rows[3].node_algbw_gbps) == pytest.approx((38.4, 307.2))
    # 4 nodes sit exactly on the 90% minimum and pass; 8 nodes at 72% do not.
    assert [r.below_min for r in table.rows] == [False, False, False, True]
    assert (table.below_min, table.ok) == ([8], False)
    assert table.detail == (
        "busbw 75.6 GB/s at 8 nodes, 72% of the 2-node run; under the 90% minimum at 8 nodes (lowest 72% at 8)."
    )


def test_a_lower_minimum_passes_every_size() -> None:
    table = scaling_table(_seed_example(), 0.70)
    assert (table.below_min, table.ok) == ([], True)
    assert table.detail.endswith("every size at or above the 70% minimum.")


def test_no_minimum_or_no_baseline_gives_no_verdict() -> None:
    assert scaling_table(_seed_example()).ok is None
    table = scaling_table([ScalingPoint(4, 90.0, 8), ScalingPoint(8, 60.0, 8)], 0.9)
    assert [r.efficiency for r in table.rows] == [None, None]
    assert (table.below_min, table.ok) == ([], None)
    assert table.detail == "no 2-node run to measure scaling efficiency against."
    assert scaling_table([], 0.9).rows == [] and scaling_table([], 0.9).ok is None


def test_only_two_nodes_is_the_baseline_itself() -> None:
    table = scaling_table([ScalingPoint(2, 100.0, 4)], 0.9)
    assert table.rows[0].efficiency == 1.0 and table.ok is None and table.below_min == []


def test_non_power_of_two_last_size_is_judged_too() -> None:
    points = [ScalingPoint(2, 100.0, 8), ScalingPoint(4, 95.0, 8), ScalingPoint(6, 85.0, 8)]
    table = scaling_table(points, 0.9)
    assert [r.nodes for r in table.rows] == [2, 4, 6] and table.below_min == [6]


def test_bad_points_are_refused() -> None:
    with pytest.raises(ValueError, match="two scaling points"):
        scaling_table([ScalingPoint(2, 100.0, 8), ScalingPoint(2, 90.0, 8)])
    with pytest.raises(ValueError, match="at least one node"):
        scaling_table([ScalingPoint(0, 100.0, 8)])


def test_algbw_of_one_rank_is_undefined() -> None:
    assert algbw_gbps(100.0, 1) is None and algbw_gbps(100.0, 2) == 100.0
    row = scaling_table([ScalingPoint(1, 50.0, 1), ScalingPoint(2, 40.0, 1)]).rows[0]
    assert row.algbw_gbps is None and row.node_algbw_gbps is None
