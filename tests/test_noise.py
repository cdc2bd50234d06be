"""Relative judgements rest on the figure's measured noise: a shortfall inside it is inconclusive, never a
rejection; one beyond it is still found. Synthetic figures with exact numbers."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import pandas as pd
import pytest

from cluster_accept.analysis import stragglers
from cluster_accept.analysis.calibration import NoiseTable, annotate, noise_table, size_tier
from cluster_accept.analysis.noise import Noise, call, expected_false_rejections, false_rejection_rate, robust_cv
from cluster_accept.analysis.probe_verdicts import judge
from cluster_accept.analysis.rails import judge_rails
from cluster_accept.analysis.regressions import figure_regressions
from cluster_accept.checks.base import CheckRow, NodeRow, Status
from cluster_accept.inventory.model import Profile, Thresholds
from cluster_accept.probes import gemm
from cluster_accept.probes.training.judge import slowest_rank

pytestmark = pytest.mark.unit

CPU = Profile.model_validate({"probes": {"device": "cpu"}})
METRIC = "gemm_bf16_gflops"


def _figures(values: dict[str, float], **extra: object) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"node": n, "profile": "cpu", "metric": METRIC, "value": v, "gpu": None, "unit": "GFLOP/s", **extra}
            for n, v in values.items()
        ]
    )


def _relative(rows: list[tuple[str, CheckRow]]) -> dict[str, tuple[Status, str]]:
    return {node: (r.status, r.reason) for node, r in rows if r.item.endswith("_vs_cluster")}


def test_the_margin_is_the_larger_of_straggler_pct_and_k_times_the_noise() -> None:
    spread = Noise(0.04, "peers")
    assert call(95.0, 100.0, 5, [spread]).outcome == "inconclusive"  # 5% short, margin 12%
    assert call(88.0, 100.0, 5, [spread]).outcome == "below"
    assert call(96.0, 100.0, 5, [spread]).outcome == "ok"
    judged = call(90.0, 100.0, 5, [Noise(0.01, "a"), spread, None], k=3)
    assert (judged.margin_pct, judged.noise) == (pytest.approx(12.0), spread)
    assert call(90.0, 100.0, 5, []).outcome == "below"  # no noise known: the profile's margin alone
    spread_of_four = robust_cv([100.0, 100.0, 90.0, 110.0], "s")
    assert spread_of_four is not None and spread_of_four.cv == pytest.approx(0.074130)
    assert robust_cv([100.0, 50.0], "two figures say nothing of the noise apart from their difference") is None


def test_false_rejections_are_the_normal_tail_beyond_the_margin_times_the_comparisons() -> None:
    assert false_rejection_rate(15.0, 0.05) == pytest.approx(0.0013499, rel=1e-4)  # 3 sigma
    assert expected_false_rejections(15.0, 0.05, 8000) == pytest.approx(10.8096, rel=1e-4)  # the median moves too
    assert expected_false_rejections(15.0, 0.05, 4) == pytest.approx(4 * 0.0055, rel=0.05)
    assert false_rejection_rate(5.0, 0.0) == 0.0
    assert math.isclose(false_rejection_rate(0.0, 0.05), 0.5)


def test_peers_spread_too_wide_to_call_is_inconclusive_and_a_quiet_15_pct_straggler_still_fails() -> None:
    # four healthy nodes on a busy machine: their MAD is most of their median
    busy = judge(_figures({"n1": 2854.0, "n2": 12000.0, "n3": 30000.0, "n4": 39022.0}), gemm.METRICS, {})
    assert _relative(busy)["n1"] == (Status.WARN, "inconclusive")
    assert all(status != Status.FAIL for status, _ in _relative(busy).values())
    said = next(r.detail for node, r in busy if node == "n1" and r.item.endswith("_vs_cluster"))
    assert "inside the noise" in said and "measure again with nothing else running" in said
    quiet = judge(_figures({"n1": 100.0, "n2": 101.0, "n3": 99.0, "n4": 85.0}), gemm.METRICS, {})
    assert _relative(quiet)["n4"] == (Status.FAIL, "straggler")
    assert _relative(quiet)["n1"] == (Status.PASS, "ok")


def test_a_figure_own_repeats_and_the_calibration_widen_its_margin() -> None:
    values = {"n1": 100.0, "n2": 101.0, "n3": 99.0, "n4": 90.0}
    assert _relative(judge(_figures(values), gemm.METRICS, {}))["n4"] == (Status.FAIL, "straggler")
    wobbly = _figures(values).assign(repeat_cv=0.05)  # every GPU's repeats wobble by 5 %: a 9.5 % gap is within
    assert _relative(judge(wobbly, gemm.METRICS, {}))["n4"] == (Status.WARN, "inconclusive")
    alone = _figures(values).assign(repeat_cv=[0.002, 0.002, 0.002, 0.05])  # only the slow one wobbles: it is
    assert _relative(judge(alone, gemm.METRICS, {}))["n4"] == (Status.FAIL, "straggler")  # the finding
    calibrated = _figures(values).assign(calibrated_cv=0.04, calibrated_source="calibration c1")
    rows = judge(calibrated, gemm.METRICS, {})
    assert _relative(rows)["n4"] == (Status.WARN, "inconclusive")
    expected = next(r.expected for node, r in rows if node == "n4" and r.item.endswith("_vs_cluster"))
    assert expected == ">= 87.6 GFLOP/s (median - 12.0% (3 × 4.0%: calibration c1))"


def test_a_confirmation_inside_the_noise_does_not_confirm() -> None:
    row = NodeRow("r", "c", "single-node", "n1", "gemm", f"{METRIC}_vs_cluster", Status.FAIL, "straggler")
    limits = {n: Thresholds() for n in ("n1", "n2", "n3", "n4", "n5")}
    tight = _figures({"n1": 1713.0, "n2": 5476.0, "n3": 5500.0, "n4": 5450.0})
    # slow both times among steady peers, however much it wobbled between the two: confirmed
    wobbled = stragglers.confirm([row], tight, _figures({"n1": 3884.0}), gemm.METRICS, limits)[0]
    assert (wobbled.status, wobbled.reason) == (Status.FAIL, "straggler") and wobbled.detail.endswith("confirmed")
    gone = stragglers.confirm([row], tight, _figures({"n1": 5480.0}), gemm.METRICS, limits)[0]
    assert (gone.status, gone.reason) == (Status.WARN, "straggler_unconfirmed")
    # peers that spread (robust CV 8.6 %: margin 25.7 % under the median 5200): 19 % below is inside the noise,
    # 29 % below is beyond it
    loose = _figures({"n1": 1713.0, "n2": 5000.0, "n3": 5500.0, "n4": 6000.0, "n5": 5200.0})
    inside = stragglers.confirm([row], loose, _figures({"n1": 4200.0}), gemm.METRICS, limits)[0]
    assert (inside.status, inside.reason) == (Status.WARN, "inconclusive")
    assert "inside the noise" in inside.detail and inside.detail.endswith("not confirmed")
    beyond = stragglers.confirm([row], loose, _figures({"n1": 3700.0}), gemm.METRICS, limits)[0]
    assert (beyond.status, beyond.reason) == (Status.FAIL, "straggler")


def test_a_regression_inside_the_node_own_spread_is_inconclusive() -> None:
    def key(run: str, value: float) -> dict[str, object]:
        return {"run_id": run, "node": "n1", "metric": METRIC, "unit": "GFLOP/s", "model": "", "value": value}

    steady = pd.DataFrame([key(f"r{i}", v) for i, v in enumerate([100.0, 101.0, 99.0, 100.0])])
    wobbly = pd.DataFrame([key(f"r{i}", v) for i, v in enumerate([100.0, 70.0, 130.0, 100.0])])
    now = pd.DataFrame([key("now", 85.0)])
    limits = {"n1": Thresholds()}
    [(_, found)] = figure_regressions(now, steady, limits, gemm.METRICS)
    assert (found.status, found.reason) == (Status.FAIL, "regression")
    [(_, unsure)] = figure_regressions(now, wobbly, limits, gemm.METRICS)
    assert (unsure.status, unsure.reason) == (Status.WARN, "inconclusive")
    calibrated = {("n1", METRIC): Noise(0.06, "calibration c1")}
    [(_, wide)] = figure_regressions(now, steady, limits, gemm.METRICS, calibrated=calibrated)
    assert wide.reason == "inconclusive" and "calibration c1" in (wide.expected or "")


def test_rails_and_ranks_inside_their_spread_are_inconclusive() -> None:
    tight = judge_rails({"rail0": 10.0, "rail1": 10.1, "rail2": 9.9, "rail3": 8.0}, None, 5)
    assert [(j.rail, j.ok, j.reason) for j in tight][-1] == ("rail3", False, "below_other_rails")
    loose = judge_rails({"rail0": 10.0, "rail1": 13.0, "rail2": 7.5, "rail3": 8.0, "rail4": 12.0}, None, 5)
    assert [(j.rail, j.ok, j.reason) for j in loose if j.reason != "ok"] == [
        ("rail2", True, "inconclusive"),
        ("rail3", True, "inconclusive"),
    ]
    slow = slowest_rank({"gpu 0": 100.0, "gpu 1": 101.0, "gpu 2": 99.0, "gpu 3": 120.0}, 5)
    assert slow is not None and (slow.slow, slow.inconclusive) == (True, False)
    unsure = slowest_rank({"gpu 0": 100.0, "gpu 1": 130.0, "gpu 2": 80.0, "gpu 3": 140.0}, 5)
    assert unsure is not None and (unsure.slow, unsure.inconclusive) == (False, True)


def test_the_noise_table_keeps_the_p95_of_each_figure_cv_per_model_metric_and_tier() -> None:
    runs = pd.DataFrame(
        [
            {"run_id": f"r{k}", "node": node, "gpu": gpu, "metric": METRIC, "size": 4096, "label": None, "value": v}
            for k in range(3)
            for node, gpu, v in (("n1", 0, 100.0 + k), ("n1", 1, 100.0), ("n2", 0, 100.0 + 4 * k))
        ]
        + [
            {
                "run_id": f"r{k}",
                "node": "n1",
                "gpu": None,
                "metric": "allreduce_busbw_gbps",
                "size": s,
                "label": "x",
                "value": v,
            }
            for k in range(2)
            for s, v in ((1024, 10.0 + k), (1 << 30, 300.0))
        ]  # fmt: skip
    )
    table = noise_table(runs, {"n1": "H100", "n2": "H100"})
    by_key = {(r.metric, r.size_tier): r for r in table.itertuples()}
    gemm_row = by_key[(METRIC, "")]
    # cvs: n1 gpu0 std([100,101,102])/101 = 0.0099; n1 gpu1 0; n2 std([100,104,108])/104 = 0.03846
    assert (gemm_row.runs, gemm_row.figures) == (3, 3)
    assert gemm_row.cv_median == pytest.approx(0.009901, rel=1e-3)
    assert gemm_row.cv_p95 == pytest.approx(0.009901 + 0.9 * (0.038462 - 0.009901), rel=1e-3)
    assert by_key[("allreduce_busbw_gbps", "large")].cv_p95 == 0.0
    assert by_key[("allreduce_busbw_gbps", "small")].cv_p95 == pytest.approx(0.067344, rel=1e-3)
    assert [size_tier(s) for s in (None, float("nan"), 1024, 1 << 20, 64 << 20)] == ["", "", "small", "medium", "large"]
    assert size_tier(8192, "gemm_bf16_tflops") == ""  # a GEMM's size is its matrix dimension, not bytes
    noise = NoiseTable(table, "c1").noise("H100", METRIC, 4096)
    assert noise is not None and noise.source == "calibration c1: p95 of 3 figures over 3 runs"
    assert NoiseTable(table, "c1").noise("H200", METRIC, 4096) is None  # another GPU model: not calibrated


def test_annotate_puts_each_figure_calibrated_noise_beside_it() -> None:
    table = pd.DataFrame(
        [
            {
                "gpu_model": "cpu",
                "metric": METRIC,
                "size_tier": "",
                "runs": 5,
                "figures": 4,
                "cv_median": 0.01,
                "cv_p95": 0.03,
            }
        ]  # fmt: skip
    )
    figures = _figures({"n1": 100.0, "n2": 90.0})
    out = annotate(figures, NoiseTable(table, "c1"), {"n1": CPU, "n2": CPU})
    assert list(out["calibrated_cv"]) == [0.03, 0.03]
    assert annotate(figures, None, {"n1": CPU}) is figures


def test_a_burn_drop_inside_the_noise_of_its_two_medians_is_inconclusive() -> None:
    from cluster_accept.inventory.burn_settings import BurnSettings
    from cluster_accept.probes.burn.judge import GpuBurn
    from cluster_accept.probes.burn.judge import judge as judge_burn

    def burn(first_cv: float) -> GpuBurn:
        return GpuBurn(
            gpu=0, first=100.0, last=80.0, unit="TFLOP/s", first_clock_mhz=None, late_clock_mhz=None,
            floor_mhz=None, reasons_seen=0, reason_samples=0, hardware_bits=0, hardware_samples=0, late_samples=0,
            temp_max_c=None, late_temp_c=None, pcie_link=None, power_median_w=None, ecc_corrected_grew=0.0,
            ecc_uncorrected_grew=0.0, first_cv=first_cv, windows=(8, 8),
        )  # fmt: skip

    settings = BurnSettings()
    assert settings.throughput_drop_max_pct < 20
    # noise of the drop: 1.2533 x cv x sqrt(2 (1/8 + 1/8)) = 0.8862 cv; margin 3 x that
    assert burn(0.1).drop_noise == pytest.approx(0.08862, rel=1e-3)
    assert [f.reason for f in judge_burn([burn(0.02)], settings)] == ["throughput_dropped"]  # margin 5.3 %
    [unsure] = judge_burn([burn(0.1)], settings)  # margin 26.6 %
    assert unsure.reason == "inconclusive" and "inside 26.6 %" in unsure.detail
    assert unsure.expected.startswith("≤ 26.6 % drop")
    assert [f.reason for f in judge_burn([burn(0.1)], settings, noise_k=2.0)] == ["throughput_dropped"]  # 17.7 %


def test_a_swept_collective_is_compared_with_its_history_by_the_noise_of_the_size_it_is_judged_at() -> None:
    from cluster_accept.analysis.calibration import calibrated_by_figure
    from cluster_accept.analysis.probe_verdicts import judged_figures
    from cluster_accept.probes import allreduce

    metric = "allreduce_busbw_gbps"
    frame = pd.DataFrame(
        [
            {
                "node": "n1",
                "gpu": None,
                "metric": metric,
                "size": size,
                "value": v,
                "unit": "GB/s",
                "calibrated_cv": cv,
                "calibrated_source": f"calibration c1 ({tier})",
            }
            for size, v, cv, tier in ((1024, 0.5, 0.20, "small"), (1 << 30, 350.0, 0.01, "large"))
        ]  # fmt: skip
    )
    assert calibrated_by_figure(judged_figures(frame, allreduce.METRICS)) == {
        ("n1", metric): Noise(0.01, "calibration c1 (large)")
    }


def test_gpu_pairs_read_the_calibration_beside_their_figures() -> None:
    from cluster_accept.analysis.gpu_pairs import judge_pairs

    def pairs(node: str, slow: float, **extra: object) -> list[dict[str, object]]:
        return [
            {"node": node, "profile": "p", "metric": "gpu_pair_copy_gbps", "label": f"GPU{i}->GPU{j}",
             "value": slow if (i, j) == (0, 1) else 300.0 + i + j, **extra}
            for i in range(4) for j in range(4) if i != j
        ]  # fmt: skip

    plain = pd.DataFrame(pairs("n1", 270.0))
    assert {f.reason for f in judge_pairs(plain, {})} == {"weak_direction"}  # 10 % slow, pairs spread ~1 %
    calibrated = pd.DataFrame(pairs("n1", 270.0, calibrated_cv=0.05, calibrated_source="calibration c1"))
    [unsure] = judge_pairs(calibrated, {})
    assert unsure.reason == "inconclusive" and "calibration c1" in unsure.detail


def test_a_confirmation_beside_a_control_takes_the_machine_drift_out() -> None:
    row = NodeRow("r", "c", "single-node", "n1", "gemm", f"{METRIC}_vs_cluster", Status.FAIL, "straggler")
    limits = {n: Thresholds() for n in ("n1", "n2", "n3", "n4")}
    before = _figures({"n1": 80.0, "n2": 100.0, "n3": 101.0, "n4": 99.0})

    def rounds(*pairs: tuple[float, float]) -> pd.DataFrame:
        return pd.concat(
            [_figures({"n1": s, "n2": c}).assign(round=i) for i, (s, c) in enumerate(pairs)], ignore_index=True
        )

    # the whole machine is 20 % slower now: the suspect's 80 is the control's 80, nothing of its own
    loaded = rounds((80.0, 80.0), (81.0, 80.5))
    healthy = stragglers.confirm([row], before, loaded, gemm.METRICS, limits, beside={"n1": ("n2",)})[0]
    assert (healthy.status, healthy.reason) == (Status.WARN, "straggler_unconfirmed"), healthy.detail
    assert "beside n2: 80, 81 against their median 80, 80.5, 1.003 of theirs" in healthy.detail
    unpaired = stragglers.confirm([row], before, loaded, gemm.METRICS, limits)[0]
    assert unpaired.reason == "straggler"  # without a control the load is taken for the node's own
    # slow on its own: 20 % under the control in both rounds
    paired = {"n1": ("n2",)}
    slow = stragglers.confirm([row], before, rounds((64.0, 80.0), (65.0, 81.0)), gemm.METRICS, limits, paired)[0]
    assert (slow.status, slow.reason) == (Status.FAIL, "straggler") and slow.detail.endswith(": confirmed")
    # an inconclusive row measured again is decided by the paired rounds: a failure now
    unsure = replace(row, status=Status.WARN, reason="inconclusive")
    decided = stragglers.confirm([unsure], before, rounds((64.0, 80.0), (65.0, 81.0)), gemm.METRICS, limits, paired)
    assert (decided[0].status, decided[0].reason) == (Status.FAIL, "straggler")
    assert stragglers.flagged([unsure]) == {"n1": {"gemm"}}


def test_paired_rounds_take_out_drift_in_time_but_never_the_spread_between_healthy_peers() -> None:
    """A node steadily below its control (a shared machine's load falling unevenly on its nodes) among peers that
    sit far apart themselves: the rounds agree with each other, yet the shortfall is inside the peers' spread."""
    unsure = NodeRow("r", "c", "single-node", "n1", "gemm", f"{METRIC}_vs_cluster", Status.WARN, "inconclusive")
    limits = {n: Thresholds() for n in ("n1", "n2", "n3", "n4")}
    before = _figures({"n1": 90.0, "n2": 100.0, "n3": 110.0, "n4": 85.0})  # median 95, spread 11.7 %
    steady = pd.concat(
        [_figures({"n1": s, "n2": 100.0}).assign(round=i) for i, s in enumerate((80.0, 81.0, 80.5))],
        ignore_index=True,
    )
    [row] = stragglers.confirm([unsure], before, steady, gemm.METRICS, limits, beside={"n1": ("n2",)})
    assert (row.status, row.reason) == (Status.WARN, "inconclusive"), row.detail
    assert "0.805 of theirs: 76.48 at the peers' median" in row.detail and "the peers' spread" in row.detail, row.detail
    agreeing = _figures({"n1": 90.0, "n2": 100.0, "n3": 99.0, "n4": 98.0})  # the same rounds among close peers
    [slow] = stragglers.confirm([unsure], agreeing, steady, gemm.METRICS, limits, beside={"n1": ("n2",)})
    assert (slow.status, slow.reason) == (Status.FAIL, "straggler") and slow.detail.endswith(": confirmed")


def _rounds_of(*rounds: dict[str, float]) -> pd.DataFrame:
    return pd.concat([_figures(figures).assign(round=i) for i, figures in enumerate(rounds)], ignore_index=True)


def test_controls_measured_in_the_rounds_say_how_far_healthy_nodes_sit_apart_there() -> None:
    """The stage's healthy peers far apart (measured one after the other while the machine's speed moved): one
    control cannot tell the peers' spread from drift, so a node 2.7 times slower stays inconclusive; three controls
    that agree with each other in the same rounds confirm it. Controls as far apart as the suspect is below them
    leave it inconclusive, the noise named as theirs."""
    unsure = NodeRow("r", "c", "single-node", "n1", "gemm", f"{METRIC}_vs_cluster", Status.WARN, "inconclusive")
    limits = {n: Thresholds() for n in ("n1", "n2", "n3", "n4")}
    before = _figures({"n1": 18.95, "n2": 73.3, "n3": 42.6, "n4": 60.6})  # the peers' spread 31 %
    slow = _rounds_of(
        {"n1": 22.1, "n2": 61.0, "n3": 57.0, "n4": 63.0},
        {"n1": 16.7, "n2": 45.0, "n3": 44.0, "n4": 47.5},
        {"n1": 25.9, "n2": 66.0, "n3": 60.0, "n4": 64.0},
    )
    [alone] = stragglers.confirm([unsure], before, slow, gemm.METRICS, limits, beside={"n1": ("n2",)})
    assert (alone.status, alone.reason) == (Status.WARN, "inconclusive"), alone.detail
    [told] = stragglers.confirm([unsure], before, slow, gemm.METRICS, limits, beside={"n1": ("n2", "n3", "n4")})
    assert (told.status, told.reason) == (Status.FAIL, "straggler") and told.detail.endswith(": confirmed"), told.detail
    assert "beside n2, n3, n4: 22.1, 16.7, 25.9 against their median" in told.detail
    apart = _rounds_of(
        {"n1": 80.0, "n2": 100.0, "n3": 82.0, "n4": 118.0},
        {"n1": 81.0, "n2": 101.0, "n3": 80.0, "n4": 121.0},
        {"n1": 80.5, "n2": 99.0, "n3": 81.0, "n4": 119.0},
    )
    close = _figures({"n1": 80.0, "n2": 100.0, "n3": 99.0, "n4": 98.0})  # the stage's peers agree
    [kept] = stragglers.confirm([unsure], close, apart, gemm.METRICS, limits, beside={"n1": ("n2", "n3", "n4")})
    assert (kept.status, kept.reason) == (Status.WARN, "inconclusive"), kept.detail
    assert "how far n2, n3, n4 sit apart in the same 3 round(s)" in kept.detail, kept.detail


def test_a_node_flagged_only_by_another_check_is_a_control_for_this_one() -> None:
    """The controls of a group of suspects are the nodes whose figures of the checks measured again passed: a node
    flagged by its all-reduce is a control for a GEMM straggler, never one flagged by its GEMM."""
    from cluster_accept.tasks.probe_runs import StageFigures
    from cluster_accept.tasks.probe_stage import control_nodes

    def relative(node: str, check: str, status: Status) -> NodeRow:
        return NodeRow("r", "c", "single-node", node, check, f"{check}_x_vs_cluster", status, "straggler")

    rows = [
        relative("n2", "gemm", Status.WARN),
        relative("n3", "allreduce", Status.WARN),
        relative("n4", "gemm", Status.FAIL),
        relative("n4", "allreduce", Status.WARN),
        relative("n5", "gemm", Status.PASS),
    ]
    figures = StageFigures(rows, [], _figures({n: 50.0 for n in ("n1", "n2", "n3", "n4", "n5", "n6")}))
    assert control_nodes(figures, ["n2"], {"gemm"}) == ("n1", "n3", "n5")
    assert control_nodes(figures, ["n4"], {"gemm", "allreduce"}) == ("n1", "n5", "n6")
    assert control_nodes(figures, ["n3"], {"allreduce"}) == ("n1", "n2", "n5")


def test_suspects_measured_together_stand_beside_each_other() -> None:
    """Every node but one flagged by a stage whose figures drifted (measured one after the other): measured again
    together, the slow one is confirmed against the others' median, and a healthy suspect is not, though the slow
    one is among those it is measured beside (it only widens their spread)."""
    limits = {n: Thresholds() for n in ("n1", "n2", "n3", "n4")}
    before = _figures({"n1": 60.0, "n2": 17.8, "n3": 40.1, "n4": 54.2})
    rows = [
        NodeRow("r", "c", "single-node", n, "gemm", f"{METRIC}_vs_cluster", Status.WARN, "inconclusive")
        for n in ("n2", "n3")
    ]
    again = _rounds_of(
        {"n1": 79.3, "n2": 17.5, "n3": 71.7, "n4": 75.0},
        {"n1": 62.3, "n2": 25.4, "n3": 76.7, "n4": 70.0},
        {"n1": 69.4, "n2": 18.3, "n3": 82.4, "n4": 73.0},
    )
    beside = {"n2": ("n3", "n1", "n4"), "n3": ("n2", "n1", "n4")}
    slow, healthy = stragglers.confirm(rows, before, again, gemm.METRICS, limits, beside)
    assert (slow.status, slow.reason) == (Status.FAIL, "straggler") and slow.detail.endswith(": confirmed"), slow.detail
    assert healthy.reason == "straggler_unconfirmed", healthy.detail


def test_a_node_several_times_slower_is_told_beside_nodes_far_apart() -> None:
    """The others of the rounds 28 % apart (σ of log figures): 3 σ below them is 1 − e^(−0.83) = 56 % below, not
    83 %, so a node at a quarter of them is confirmed; one at 60 % of them is not."""
    unsure = NodeRow("r", "c", "single-node", "n2", "gemm", f"{METRIC}_vs_cluster", Status.WARN, "inconclusive")
    limits = {n: Thresholds() for n in ("n1", "n2", "n3", "n4")}
    before = _figures({"n1": 65.0, "n2": 19.3, "n3": 80.0, "n4": 50.9})
    others = (
        {"n1": 64.75, "n3": 90.0, "n4": 70.0},
        {"n1": 80.0, "n3": 55.0, "n4": 79.4},
        {"n1": 60.0, "n3": 76.75, "n4": 90.0},
    )
    beside = {"n2": ("n1", "n3", "n4")}
    quarter = _rounds_of(*({**o, "n2": 0.25 * statistics.median(o.values())} for o in others))
    [slow] = stragglers.confirm([unsure], before, quarter, gemm.METRICS, limits, beside)
    assert (slow.status, slow.reason) == (Status.FAIL, "straggler"), slow.detail
    assert "σ" in slow.detail and "% of log figures" in slow.detail, slow.detail
    sixty = _rounds_of(*({**o, "n2": 0.6 * statistics.median(o.values())} for o in others))
    [kept] = stragglers.confirm([unsure], before, sixty, gemm.METRICS, limits, beside)
    assert kept.reason == "inconclusive", kept.detail
