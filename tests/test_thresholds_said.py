"""Beside each relative threshold, the noise it rests on and the false rejections to expect per run: exact numbers
on synthetic runs, as the judgement takes them (peers of one profile and metric, a collective at its largest size,
the calibration of the figures' GPU model and size tier where it measured them)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from cluster_accept.analysis.calibration import NOISE_COLUMNS, NoiseTable
from cluster_accept.analysis.probe_verdicts import MetricRule
from cluster_accept.analysis.thresholds_said import ThresholdSaid, run_thresholds
from cluster_accept.inventory.model import Profile
from cluster_accept.reports.thresholds import thresholds_section


def tail(z: float, peers: int) -> float:
    """P(Z > z) for the difference of a figure and its peers' median: the median of ``peers`` figures varies
    by σ √(π / 2n) too."""
    return 0.5 * math.erfc(z / math.sqrt(1 + math.pi / (2 * peers)) / math.sqrt(2))


H100 = "NVIDIA H100 80GB HBM3"
RULES = {
    "gemm_bf16_tflops": MetricRule("gemm", "gemm_bf16_tflops_min", True),
    "allreduce_busbw_gbps": MetricRule("allreduce", "allreduce_intra_busbw_gbps_min", False),
}
GPU = Profile.model_validate({"gpu": {"model": H100, "count": 1}})
CALIBRATION = NoiseTable(  # all-reduce on H100s at large sizes varies by 4 %: a margin of 12 %
    pd.DataFrame([[H100, "allreduce_busbw_gbps", "large", 5, 20, 0.01, 0.04]], columns=NOISE_COLUMNS),
    "20260101T000000Z-abcdef",
)


def figure(node: str, metric: str, value: float, **more: object) -> dict[str, object]:
    return {"run_id": "r", "stage": "single-node", "node": node, "profile": "gpu", "metric": metric, "value": value,
            "gpu": None, "size": None, **more}  # fmt: skip


def run(calibration: NoiseTable | None) -> list[ThresholdSaid]:
    values = [100.0, 98.0, 102.0, 101.0, 99.0]  # median 100, MAD 1: robust CV 1.4826 %
    rows = [figure(f"n{i}", "gemm_bf16_tflops", v, gpu=0, size=8192) for i, v in enumerate(values)]
    for i, v in enumerate(values):  # swept: judged at its largest size only; the small sizes vary far more
        rows += [figure(f"n{i}", "allreduce_busbw_gbps", v, size=1 << 30)]
        rows += [figure(f"n{i}", "allreduce_busbw_gbps", v / (1 + i), size=1 << 10)]
    rows += [figure("n0", "gemm_bf16_tflops", 10.0, gpu=0, size=8192, stage="single-node:without-suspects")]
    rows += [figure("n0", "allreduce_busbw_gbps", 1.0, size=1 << 30, stage="multi-node")]
    rows += [figure("lone", "gemm_bf16_tflops", 10.0, gpu=0, size=8192, profile="other")]  # no peer: no row
    profiles = {f"n{i}": GPU for i in range(5)} | {"lone": GPU}
    return run_thresholds(pd.DataFrame(rows), RULES, profiles, calibration)


def test_the_peers_spread_sets_the_noise_where_no_calibration_measured_it() -> None:
    rows = run(None)
    assert [(r.metric, r.size_tier, r.comparisons) for r in rows] == [
        ("allreduce_busbw_gbps", "large", 5),
        ("gemm_bf16_tflops", "", 5),
    ]
    gemm = rows[1]
    assert (gemm.stage, gemm.profile, gemm.gpu_model, gemm.straggler_pct, gemm.noise_k) == (
        "single-node", "gpu", H100, 5.0, 3.0,
    )  # fmt: skip
    assert gemm.noise_pct == pytest.approx(1.4826)
    assert gemm.noise_source == "this run's peers' spread (robust CV of 5 figures)"
    assert gemm.margin_pct == 5.0  # 3 × 1.4826 % = 4.45 %: straggler_pct decides
    # 5 figures × P(Z > 5 / 1.4826 = 3.3725, their median moving too)
    assert gemm.expected_false_rejections == pytest.approx(5 * tail(5 / 1.4826, 5), rel=1e-6)


def test_the_calibration_widens_the_margin_of_the_figures_it_measured() -> None:
    rows = run(CALIBRATION)
    allreduce, gemm = rows
    assert allreduce.noise_pct == pytest.approx(4.0)
    assert allreduce.noise_source == "calibration 20260101T000000Z-abcdef: p95 of 20 figures over 5 runs"
    assert allreduce.margin_pct == pytest.approx(12.0)
    assert allreduce.expected_false_rejections == pytest.approx(5 * tail(3, 5))
    assert gemm.noise_source.startswith("this run's peers' spread")  # the calibration did not measure it


def test_two_peers_have_no_noise_known_and_the_margin_is_straggler_pct() -> None:
    rows = [figure("n1", "gemm_bf16_tflops", 100.0, gpu=0), figure("n2", "gemm_bf16_tflops", 90.0, gpu=0)]
    (said,) = run_thresholds(pd.DataFrame(rows), RULES, {"n1": GPU, "n2": GPU})
    assert (said.noise_pct, said.margin_pct, said.comparisons, said.expected_false_rejections) == (None, 5.0, 2, None)
    assert said.size_tier == ""


def test_the_report_table_says_each_threshold_with_its_noise_and_false_rejections() -> None:
    section = thresholds_section(run(CALIBRATION))
    assert section is not None and section.table is not None
    assert section.table.table_id == "thresholds-table"
    assert section.table.rows[0] == (
        "allreduce_busbw_gbps", "single-node", "gpu", "large", "5%", "3", "4.00%",
        "calibration 20260101T000000Z-abcdef: p95 of 20 figures over 5 runs", "12.0%", "5", "0.022",
    )  # fmt: skip
    assert thresholds_section([]) is None
