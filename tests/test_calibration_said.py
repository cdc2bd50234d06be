"""A calibration as the operator reads it: the runs' figures as the noise table reads them, each row's margin and
the false rejections it costs per run at the cluster's size, the GPU model of ``profile: auto`` nodes as the runs
resolved it, and the ``straggler_pct``/``noise_k`` a profile could take from it."""

from __future__ import annotations

import pandas as pd
import pytest

from cluster_accept.analysis.calibration import NOISE_COLUMNS, model_key, noise_table
from cluster_accept.analysis.calibration_said import (
    CalibratedThreshold,
    calibrated_thresholds,
    calibration_figures,
    figures_per_node,
    key_rows,
    resolved_profiles,
    suggest_limits,
)
from cluster_accept.inventory.builtin import resolve_auto
from cluster_accept.inventory.model import Node, Profile, SshSettings, Thresholds
from tests.test_thresholds_said import H100, RULES, tail


def figure(run: str, node: str, metric: str, value: float, **more: object) -> dict[str, object]:
    return {"run_id": run, "stage": "single-node", "node": node, "metric": metric, "value": value, **more}


def test_the_runs_figures_are_one_per_run_each_without_remeasurements_groups_told_apart() -> None:
    run1 = pd.DataFrame(
        [
            figure("r1", "n1", "gemm_bf16_tflops", 100.0, gpu=0, size=8192),
            figure("r1", "n1", "gemm_bf16_tflops", 60.0, gpu=0, size=8192, stage="single-node:without-suspects"),
            figure("r1", "n1", "allreduce_busbw_gbps", 40.0, size=1 << 30, label="inter_node", group="n[1-2]"),
            figure("r1", "n1", "allreduce_busbw_gbps", 30.0, size=1 << 30, label="inter_node", group="n[1-4]"),
        ]
    )
    run2 = pd.DataFrame([figure("r2", "n1", "gemm_bf16_tflops", 102.0, gpu=0, size=8192)])
    found = calibration_figures([run1, run2, pd.DataFrame()])
    assert sorted(zip(found["run_id"], found["metric"], found["label"], found["value"], strict=True)) == [
        ("r1", "allreduce_busbw_gbps", "inter_node n[1-2]", 40.0),
        ("r1", "allreduce_busbw_gbps", "inter_node n[1-4]", 30.0),
        ("r1", "gemm_bf16_tflops", "", 100.0),
        ("r2", "gemm_bf16_tflops", "", 102.0),
    ]


def test_a_node_that_failed_in_one_run_loses_only_its_own_figures() -> None:
    """n2 measured nothing in r2 and n3 measured only in r3: n1 and n2's figures measured twice still count."""
    rows = [
        figure("r1", "n1", "gemm_bf16_tflops", 100.0, gpu=0),
        figure("r2", "n1", "gemm_bf16_tflops", 102.0, gpu=0),
        figure("r3", "n1", "gemm_bf16_tflops", 98.0, gpu=0),
        figure("r1", "n2", "gemm_bf16_tflops", 100.0, gpu=0),
        figure("r3", "n2", "gemm_bf16_tflops", 104.0, gpu=0),
        figure("r3", "n3", "gemm_bf16_tflops", 50.0, gpu=0),
    ]
    table = noise_table(calibration_figures([pd.DataFrame(rows)]), {"n1": H100, "n2": H100, "n3": H100})
    assert table.to_dict("records") == [
        {
            "gpu_model": H100,
            "metric": "gemm_bf16_tflops",
            "size_tier": "",
            "runs": 3,
            "figures": 2,
            "cv_median": pytest.approx((0.02 + 0.04 / 2**0.5 / 1.02) / 2),
            "cv_p95": pytest.approx(0.02 + 0.95 * (0.04 / 2**0.5 / 1.02 - 0.02)),
        }
    ]


def test_a_node_judges_its_gpus_figures_and_a_collective_at_its_largest_size_only() -> None:
    rows = [
        figure(run, node, "gemm_bf16_tflops", 100.0, gpu=gpu, size=8192)
        for run in ("r1", "r2")
        for node in ("n1", "n2")
        for gpu in range(8)
    ]
    rows += [
        figure(run, "n1", "allreduce_busbw_gbps", 10.0 * size, size=size << 20)
        for run in ("r1", "r2")
        for size in (1, 256)
    ]
    rows += [figure("r1", "n1", "gemm_bf16_tflops", 1.0, gpu=0, size=8192, stage="multi-node")]
    per_node = figures_per_node(pd.DataFrame(rows), RULES, {"n1": H100, "n2": H100})
    assert per_node == {(H100, "gemm_bf16_tflops", ""): 8.0, (H100, "allreduce_busbw_gbps", "large"): 1.0}


def _table(*rows: tuple[str, str, str, float]) -> pd.DataFrame:
    return pd.DataFrame(
        [{"gpu_model": m, "metric": k, "size_tier": t, "runs": 5, "figures": 40, "cv_median": cv / 2, "cv_p95": cv}
         for m, k, t, cv in rows],
        columns=NOISE_COLUMNS,
    )  # fmt: skip


def test_each_row_gives_its_margin_and_false_rejections_at_the_cluster_size_per_set_of_thresholds() -> None:
    table = _table((H100, "gemm_bf16_tflops", "", 0.02), (H100, "allreduce_busbw_gbps", "large", 0.01))
    loose = Thresholds(straggler_pct=10)
    cluster = {f"n{i}": (H100, Thresholds()) for i in range(10)} | {"m1": (H100, loose), "c1": ("cpu", loose)}
    per_node = {(H100, "gemm_bf16_tflops", ""): 8.0, (H100, "allreduce_busbw_gbps", "large"): 1.0}
    rows = calibrated_thresholds(table, per_node, cluster)
    said = [(r.metric, r.straggler_pct, r.margin_pct, r.nodes, r.comparisons) for r in rows]
    assert said == [
        ("gemm_bf16_tflops", 5.0, pytest.approx(6.0), 10, 80),  # 3 × 2 % over straggler_pct 5 %
        ("gemm_bf16_tflops", 10.0, 10.0, 1, 8),
        ("allreduce_busbw_gbps", 5.0, 5.0, 10, 10),
        ("allreduce_busbw_gbps", 10.0, 10.0, 1, 1),
    ]
    assert rows[0].expected_false_rejections == pytest.approx(80 * tail(3, 80))  # the margin is 3 σ: P(Z > 3) each
    assert rows[1].expected_false_rejections == pytest.approx(8 * tail(5, 8), rel=1e-9)  # 10 % is 5 σ of 2 %
    assert rows[2].expected_false_rejections == pytest.approx(10 * tail(5, 10), rel=1e-9)  # 5 % is 5 σ of 1 %


def _node(name: str, profile_name: str, profile: Profile) -> Node:
    return Node(name=name, ssh=SshSettings(), profile_name=profile_name, profile=profile)


def test_auto_nodes_take_the_gpu_model_their_preflight_read_and_others_their_own() -> None:
    auto = Profile.model_validate({"base": "auto"})
    cpu = Profile.model_validate({"probes": {"device": "cpu"}})
    nodes = [_node("a1", "auto", auto), _node("a2", "auto", auto), _node("a3", "auto", auto), _node("c1", "cpu", cpu)]
    checks = pd.DataFrame(
        [
            {"node": "a1", "check": "profile", "item": "auto", "status": "pass", "observed": H100},
            {"node": "a2", "check": "profile", "item": "auto", "status": "fail", "observed": "NVIDIA Mystery"},
            {"node": "a1", "check": "gpu_count", "item": "auto", "status": "pass", "observed": "NVIDIA A100"},
        ]
    )
    models = {node: model_key(profile) for node, profile in resolved_profiles(nodes, checks).items()}
    # a2's auto failed and a3 was not calibrated: both are judged as their profile name's nodes resolve
    assert models == {"a1": H100, "a2": H100, "a3": H100, "c1": "cpu"}
    assert resolved_profiles(nodes, checks)["a1"] == resolve_auto(auto, [H100]).profile
    alone = {node: model_key(p) for node, p in resolved_profiles(nodes, pd.DataFrame()).items()}
    assert alone == {"a1": "unknown GPU", "a2": "unknown GPU", "a3": "unknown GPU", "c1": "cpu"}


def test_key_rows_are_judged_metrics_a_swept_collective_at_its_largest_tier() -> None:
    table = _table(
        (H100, "gemm_bf16_tflops", "", 0.02),
        (H100, "allreduce_busbw_gbps", "small", 0.3),
        (H100, "allreduce_busbw_gbps", "large", 0.01),
        (H100, "training_step_ms", "", 0.05),
        ("cpu", "gemm_bf16_tflops", "", 0.2),
    )
    found = key_rows(table, H100, RULES)
    assert sorted(zip(found["metric"], found["size_tier"], strict=True)) == [
        ("allreduce_busbw_gbps", "large"),
        ("gemm_bf16_tflops", ""),
    ]


def _rows(comparisons: int, *cvs: float) -> list[CalibratedThreshold]:
    table = _table(*((H100, f"m{i}", "", cv) for i, cv in enumerate(cvs)))
    per_node = {(H100, f"m{i}", ""): float(comparisons) for i in range(len(cvs))}
    return calibrated_thresholds(table, per_node, {"n1": (H100, Thresholds())})


def test_limits_are_suggested_only_where_every_key_margin_exceeds_straggler_pct() -> None:
    assert suggest_limits(_rows(8, 0.02, 0.01), Thresholds()) is None  # 3 × 1 % = 3 % is under 5 %: 5 % decides
    small = suggest_limits(_rows(8, 0.02, 0.03), Thresholds())
    assert small is not None
    assert (small.straggler_pct, small.noise_k) == (6.0, 3.0)  # 16 × P(Z > 3) = 0.022 a run: within 0.1
    assert "straggler_pct 6 passes it instead" in small.reason and "16 figures judged a run" in small.reason
    large = suggest_limits(_rows(400, 0.02, 0.03), Thresholds())
    assert large is not None
    # 800 × P(Z > 3) = 1.08 and 800 × P(Z > 3.5) = 0.186 a run are over 0.1; 800 × P(Z > 4) = 0.025
    assert (large.straggler_pct, large.noise_k) == (8.0, 4.0)
    assert "to 0.025 a run" in large.reason
