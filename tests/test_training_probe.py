"""The training probe's arithmetic (parameters, FLOPs, MFU), its parser on real H200 output and derived faulty
variants, its rows, and its profile settings. Hand-computed figures are written out as their formulas."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest
from pydantic import ValidationError

from cluster_accept.checks.base import Status
from cluster_accept.inventory.model import Node as InventoryNode
from cluster_accept.inventory.model import Profile, SshSettings, TrainingSettings
from cluster_accept.inventory.shapes import PRESETS, ModelShape
from cluster_accept.probes import training
from cluster_accept.probes.training.judge import (
    TrainingPoint,
    flops_per_token,
    loss_check,
    mfu,
    parameters,
    peak_tflops,
    slowest_rank,
    training_scaling,
)

DATA = Path(__file__).resolve().parent / "data" / "training"
H200X2 = (DATA / "h200x2_350m_ddp.txt").read_text()
# GPT-2 medium at sequence 2048: per layer 12 d^2 (linears) + 4 d (LayerNorms), tied V d, positions s d, final 2 d.
PARAMS_350M = 24 * (12 * 1024**2 + 4 * 1024) + 50304 * 1024 + 2048 * 1024 + 2 * 1024
FLOPS_350M = 6 * (PARAMS_350M - 2048 * 1024) + 12 * 24 * 1024 * 2048


def gpu_profile(**thresholds: float) -> Profile:
    return Profile.model_validate({"probes": {"device": "cuda"}, "thresholds": thresholds})


def test_parameter_counts_of_the_presets() -> None:
    assert PARAMS_350M == 355_698_688  # the reference figure: GPT 355.7 M
    assert parameters(PRESETS["350m"]) == (355_698_688, 2_097_152)
    assert parameters(PRESETS["125m"])[0] == 12 * (12 * 768**2 + 4 * 768) + 50304 * 768 + 2048 * 768 + 2 * 768
    assert round(parameters(PRESETS["125m"])[0] / 1e6) == 125
    assert round(parameters(PRESETS["1.3b"])[0] / 1e8) == 13


def test_flops_per_token_and_mfu_against_hand_computed_values() -> None:
    assert flops_per_token(355_698_688, 2_097_152, 24, 1024, 2048) == FLOPS_350M == 2_725_588_992
    # The reference: 143,966 tokens/s on one H200 is MFU 0.40 of 989 TFLOP/s.
    assert mfu(143_966, FLOPS_350M, 989.4) == pytest.approx(143_966 * 2_725_588_992 / 989.4e12)
    assert round(mfu(143_966, FLOPS_350M, 989.4), 2) == 0.40
    with pytest.raises(ValueError, match="positive"):
        mfu(1.0, 1.0, 0.0)


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989.4),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.4),
        ("NVIDIA H200 NVL", 835.0),
        ("NVIDIA GH200 480GB", 989.4),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A10", 125.0),
        ("NVIDIA L40S", 362.05),
        ("NVIDIA B200", 2250.0),
        ("Some Future GPU", None),
    ],
)
def test_dense_bf16_peaks_by_device_name(name: str, peak: float | None) -> None:
    assert peak_tflops(name) == peak


def test_parser_reads_the_h200_run_and_derives_tflops_and_mfu() -> None:
    output = training.parse(H200X2)
    node = {m.metric: m.value for m in output.measurements if m.gpu is None}
    assert node["training_tokens_per_s_per_gpu"] == 143572.3
    assert node["training_tokens_per_s"] == 287144.5
    assert node["training_step_ms"] == 114.117
    assert node["training_tflops_per_gpu"] == round(143572.3 * FLOPS_350M / 1e12, 3) == 391.319
    assert node["training_mfu"] == round(143572.3 * FLOPS_350M / 1e12 / 989.4, 4) == 0.3955
    solo = {m.gpu: m.value for m in output.measurements if m.metric == "training_solo_tokens_per_s"}
    assert solo == {0: 158367.4, 1: 157145.4}
    assert {m.model for m in output.measurements} == {"gpt 355.7M L24 d1024 h16 s2048 mb8 v50304 ddp bf16 eager"}
    assert not output.errors


def test_rows_of_a_healthy_h200_run() -> None:
    rows = {r.item: r for r in training.inspect(training.parse(H200X2), gpu_profile(training_mfu_min=0.35))}
    assert rows["loss"].status is Status.PASS and rows["loss"].observed == "10.28 -> 9.754"
    assert rows["slowest_rank"].status is Status.PASS and rows["slowest_rank"].gpu == 1
    assert rows["mfu"].status is Status.PASS and rows["mfu"].observed == "0.396"
    assert "peak 989.4 TFLOP/s (NVIDIA H200)" in rows["mfu"].detail and "6*N + 12*L*d*s" in rows["mfu"].detail
    low = {r.item: r for r in training.inspect(training.parse(H200X2), gpu_profile(training_mfu_min=0.5))}
    assert low["mfu"].status is Status.FAIL and low["mfu"].reason == "below_threshold"


def _variant(**rank1: object) -> str:
    """The H200 run with rank 1's record changed (a faulty GPU derived from a healthy capture)."""
    lines = []
    for line in H200X2.splitlines():
        if line.startswith('{"info": "training_rank", "rank": 1'):
            record = json.loads(line)
            record.update(rank1)
            line = json.dumps(record)
        lines.append(line)
    return "\n".join(lines)


def test_a_slow_gpu_is_named_as_the_slow_rank() -> None:
    rows = {r.item: r for r in training.inspect(training.parse(_variant(solo_ms_median=150.0)), gpu_profile())}
    slow = rows["slowest_rank"]
    assert (slow.status, slow.reason, slow.gpu) == (Status.FAIL, "slow_rank", 1)
    assert slow.observed == "gpu 1: 150 ms"
    median = (103.45563100000277 + 150.0) / 2
    assert slow.expected == f"<= {median * 1.05:.4g} ms (median {median:.4g} + 5%)"


@pytest.mark.parametrize(
    "change", [{"loss_last": math.nan, "loss_finite": False}, {"loss_last": 10.5}, {"loss_first": math.inf}]
)
def test_a_nan_or_a_loss_that_does_not_fall_is_numerics(change: dict[str, object]) -> None:
    rows = {r.item: r for r in training.inspect(training.parse(_variant(**change)), gpu_profile())}
    assert (rows["loss"].status, rows["loss"].reason) == (Status.FAIL, "numerics")
    assert rows["loss"].detail.startswith("rank 1 (gpu 1)") and "1 of 2 ranks" in rows["loss"].detail


def test_unknown_gpu_skips_mfu_with_why_and_a_profile_peak_is_used() -> None:
    text = H200X2.replace('"device_name": "NVIDIA H200"', '"device_name": "NVIDIA X9"')
    rows = {r.item: r for r in training.inspect(training.parse(text), gpu_profile(training_mfu_min=0.3))}
    assert (rows["mfu"].status, rows["mfu"].reason) == (Status.SKIP, "peak_unknown")
    given = text.replace('"peak_tflops": null', '"peak_tflops": 500.0')
    mfu_figure = [m for m in training.parse(given).measurements if m.metric == "training_mfu"]
    assert mfu_figure[0].value == round(391.319 / 500.0, 4)


def test_a_run_that_printed_no_rank_has_no_rows_of_its_own() -> None:
    head = "\n".join(line for line in H200X2.splitlines() if '"training_rank"' not in line)
    assert training.inspect(training.parse(head), gpu_profile()) == []


def test_loss_and_slowest_rank_rules() -> None:
    assert loss_check(11.0, 10.0, 9.0, True).ok
    assert not loss_check(11.0, 10.0, 10.0, True).ok
    assert not loss_check(11.0, 10.0, 9.0, False).ok
    assert slowest_rank({"gpu 0": 100.0}, 5) is None
    slow = slowest_rank({"gpu 0": 100.0, "gpu 1": 100.0, "gpu 2": 101.0, "gpu 3": 120.0}, 5)
    assert slow is not None and slow.label == "gpu 3" and slow.slow and slow.median_ms == 100.5
    even = slowest_rank({"gpu 0": 100.0, "gpu 1": 104.0}, 5)
    assert even is not None and not even.slow


def test_scaling_efficiency_is_per_gpu_against_one_node() -> None:
    points = [
        TrainingPoint(nodes=1, gpus=8, tokens_per_s_per_gpu=41_480.0),
        TrainingPoint(nodes=2, gpus=16, tokens_per_s_per_gpu=8_561.0, transport="NET/Socket"),
    ]
    rows = training_scaling(points, 0.9)
    assert [r.efficiency for r in rows] == [1.0, 8_561.0 / 41_480.0]
    assert [r.below_min for r in rows] == [False, True]
    assert rows[1].tokens_per_s == 8_561.0 * 16
    assert training_scaling(points[1:], 0.9)[0].efficiency is None


def test_cluster_judgement_names_the_slow_node() -> None:
    frame = pd.DataFrame(
        [
            {"node": f"n{i}", "gpu": None, "metric": training.PER_GPU, "value": v, "unit": "tokens/s", "profile": "p"}
            for i, v in enumerate([150_000.0, 149_000.0, 151_000.0, 75_000.0])
        ]
    )
    profiles = {f"n{i}": gpu_profile(training_tokens_per_s_per_gpu_min=100_000) for i in range(4)}
    rows = training.evaluate(frame, profiles)
    bad = {(n, r.reason) for n, r in rows if r.status is not Status.PASS}
    assert bad == {("n3", "below_threshold"), ("n3", "straggler")}


def test_profile_settings_are_checked_when_loaded() -> None:
    settings = TrainingSettings(preset="1.3b", micro_batch=2)
    assert settings.shape("cuda", False) == ModelShape(24, 2048, 16, 2048, 2)
    assert TrainingSettings().shape("cuda", True) == PRESETS["125m"]
    assert TrainingSettings().shape("cpu", False) == PRESETS["tiny"]
    with pytest.raises(ValidationError, match="width 1000 is not a multiple of heads 16"):
        Profile.model_validate({"training": {"width": 1000}})
    cpu = Profile.model_validate({"probes": {"device": "cpu"}, "training": {"width": 200}})  # tiny: 4 heads
    assert cpu.training.shape("cpu", False).width == 200
    with pytest.raises(ValidationError, match="training_mfu_min need the training probe"):
        Profile.model_validate({"training": {"enabled": False}, "thresholds": {"training_mfu_min": 0.3}})
    with pytest.raises(ValidationError, match="micro_batchs"):
        Profile.model_validate({"training": {"micro_batchs": 4}})


def test_command_runs_the_profiles_model_on_every_gpu() -> None:
    profile = Profile.model_validate({"training": {"preset": "125m", "compile": True, "peak_tflops": 400}})
    node = InventoryNode("n1", SshSettings(), "p", profile)
    line = training.command(node) or ""
    assert "nvidia-smi -L" in line and "--nproc_per_node=$n" in line
    assert "--layers 12 --width 768 --heads 12 --seq-len 2048 --micro-batch 8 --vocab 50304" in line
    assert "--compile" in line and "--peak-tflops 400" in line and "NCCL_DEBUG=INFO" in line
    off = Profile.model_validate({"training": {"enabled": False}})
    assert training.command(InventoryNode("n1", SshSettings(), "p", off)) is None


def test_the_light_suites_model_is_not_held_to_the_full_models_minimum() -> None:
    light = H200X2.replace('"layers": 24, "width": 1024, "heads": 16', '"layers": 12, "width": 768, "heads": 12')
    profile = gpu_profile(training_mfu_min=0.5, training_tokens_per_s_per_gpu_min=200_000)
    rows = {r.item: r for r in training.inspect(training.parse(light), profile)}
    assert (rows["mfu"].status, rows["mfu"].reason) == (Status.SKIP, "other_model")
    assert "L24 d1024 h16 s2048 mb8 v50304" in rows["mfu"].detail
    frame = pd.DataFrame([{**asdict(m), "node": "n1", "profile": "p"} for m in training.parse(light).measurements])
    judged = {r.item: r for _, r in training.evaluate(frame, {"n1": profile})}
    assert judged[training.PER_GPU].reason == "other_model"
    full = pd.DataFrame([{**asdict(m), "node": "n1", "profile": "p"} for m in training.parse(H200X2).measurements])
    assert {r.item: r for _, r in training.evaluate(full, {"n1": profile})}[
        training.PER_GPU
    ].reason == "below_threshold"
