"""The training probe's default expectations on ``profile: auto`` (no threshold written): tokens/s per GPU and each
GPU's solo tokens/s against an MFU floor of the GPU's dense bf16 peak, and the node's data-parallel efficiency
(together over solo). Runs are derived from the real 2 x H200 capture; the 4 x H200 figures are the measured
ones (healthy 139,715 tokens/s per GPU against 154,600 solo; 100,222 with one NCCL setting left in
/etc/nccl.conf)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest

from cluster_accept.analysis.coverage import missing
from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.inventory.model import Profile
from cluster_accept.probes import training
from cluster_accept.tasks.rows import node_row

H200X2 = (Path(__file__).resolve().parent / "data" / "training" / "h200x2_350m_ddp.txt").read_text()
FLOPS_350M = 6 * (355_698_688 - 2048 * 1024) + 12 * 24 * 1024 * 2048  # 2,725,588,992 per token
H200_PEAK_TFLOPS = 989.4  # the H200 datasheet's dense bf16 peak (inventory.gpus)
FLOOR_TOKENS = 0.25 * H200_PEAK_TFLOPS * 1e12 / FLOPS_350M  # 90,751.5 tokens/s per GPU


def auto_h200(**thresholds: float) -> Profile:
    """What ``profile: auto`` makes of an H200 node for the training probe: its GPU model, no training key."""
    return Profile.model_validate(
        {"gpu": {"model": "NVIDIA H200"}, "probes": {"device": "cuda"}, "thresholds": thresholds}
    )


def run_of(per_gpu: float, solo: list[float], capture: str = H200X2) -> str:
    """The capture as a run on ``len(solo)`` GPUs: tokens/s per GPU ``per_gpu`` with every GPU together, and each
    GPU's solo tokens/s; rank and figure lines of GPUs 2, 3 … copied from GPU 1's."""
    lines = []
    for line in capture.splitlines():
        if not line.startswith("{"):
            lines.append(line)
            continue
        record = {**json.loads(line), **({"world_size": len(solo)} if "world_size" in line else {})}
        if record.get("metric") == "training_tokens_per_s_per_gpu":
            record["value"] = per_gpu
        gpu = record.get("gpu", record.get("local_rank"))
        copies = range(1, len(solo)) if gpu == 1 else [gpu]
        for g in copies:
            copy = {**record, **({"gpu": g} if "gpu" in record else {"rank": g, "local_rank": g})}
            if copy.get("metric") == "training_solo_tokens_per_s":
                copy["value"] = solo[g]
            lines.append(json.dumps(copy))
    return "\n".join(lines)


def rows_of(text: str, profile: Profile) -> dict[tuple[str, int | None], CheckRow]:
    """One node's rows of a run: its own (``inspect``) and its figures judged as the stage judges them."""
    output = training.parse(text)
    figures = pd.DataFrame([{**asdict(m), "node": "n1", "profile": "p"} for m in output.measurements])
    judged = training.evaluate(figures[figures["metric"].isin(list(training.METRICS))], {"n1": profile})
    rows = training.inspect(output, profile) + [row for _, row in judged]
    return {(r.item, r.gpu): r for r in rows}


def test_a_healthy_4xh200_node_keeps_090_of_its_solo_speed_and_passes() -> None:
    output = training.parse(run_of(139_715.0, [154_600.0] * 4))
    figure = [m for m in output.measurements if m.metric == "training_dp_efficiency"]
    assert [(f.value, f.unit, f.gpu) for f in figure] == [(round(139_715 / 154_600, 4), "ratio", None)]
    rows = rows_of(run_of(139_715.0, [154_600.0] * 4), auto_h200())
    efficiency = rows[("training_dp_efficiency", None)]
    assert (efficiency.status, efficiency.reason) == (Status.PASS, "ok")
    assert efficiency.observed == "0.904 (139,715 together / 154,600 solo tokens/s per GPU)"
    assert efficiency.expected is not None and efficiency.expected.startswith(">= 0.80 of the node's slowest GPU's")
    assert "default: 4 x H200 healthy 0.90" in efficiency.expected
    assert "write training_dp_efficiency_min" in efficiency.expected


def test_an_nccl_setting_that_slows_the_gpus_together_fails_the_efficiency_with_both_numbers() -> None:
    rows = rows_of(run_of(100_222.0, [154_600.0] * 4), auto_h200())
    efficiency = rows[("training_dp_efficiency", None)]
    assert (efficiency.status, efficiency.reason) == (Status.FAIL, "dp_efficiency_low")
    assert efficiency.observed == "0.648 (100,222 together / 154,600 solo tokens/s per GPU)"
    assert "4 GPUs training together keep 64.8% of their slowest GPU's own speed" in efficiency.detail
    # each GPU alone, and even together, stays above the MFU floor: only the efficiency says what is lost
    per_gpu = rows[("training_tokens_per_s_per_gpu", None)]
    assert (per_gpu.status, per_gpu.observed) == (
        Status.PASS,
        f"100,222 tokens/s (MFU {100_222 * FLOPS_350M / 989.4e12:.3f})",
    )
    assert all(rows[("training_solo_tokens_per_s", g)].status is Status.PASS for g in range(4))
    # written, the profile's own minimum wins and the row says so
    lenient = rows_of(run_of(100_222.0, [154_600.0] * 4), auto_h200(training_dp_efficiency_min=0.6))
    written = lenient[("training_dp_efficiency", None)]
    assert written.status is Status.PASS
    assert written.expected == ">= 0.60 of the node's slowest GPU's solo tokens/s (training_dp_efficiency_min)"


def test_the_efficiency_is_taken_against_the_slowest_gpu_alone_and_skipped_on_one_gpu() -> None:
    slow = rows_of(run_of(139_715.0, [154_600.0, 154_600.0, 150_000.0, 154_600.0]), auto_h200())
    assert slow[("training_dp_efficiency", None)].observed == "0.931 (139,715 together / 150,000 solo tokens/s per GPU)"
    assert "(gpu 2)" in slow[("training_dp_efficiency", None)].detail
    single = rows_of(run_of(149_318.3, [155_908.3]), auto_h200())
    alone = single[("training_dp_efficiency", None)]
    assert (alone.status, alone.reason, alone.observed) == (Status.SKIP, "single_rank", None)


def test_tokens_per_s_below_the_mfu_floor_fails_naming_the_gpu_peak() -> None:
    rows = rows_of(run_of(80_000.0, [154_600.0, 80_000.0]), auto_h200())
    per_gpu = rows[("training_tokens_per_s_per_gpu", None)]
    assert (per_gpu.status, per_gpu.reason) == (Status.FAIL, "below_threshold")
    assert (
        per_gpu.observed
        == f"80,000 tokens/s (MFU {80_000 * FLOPS_350M / 989.4e12:.3f})"
        == "80,000 tokens/s (MFU 0.220)"
    )
    assert per_gpu.expected is not None
    assert per_gpu.expected.startswith(f">= {FLOOR_TOKENS:,.0f} tokens/s: MFU >= 0.25 of 989.4 TFLOP/s (NVIDIA H200")
    assert f"{FLOOR_TOKENS:,.0f}" == "90,751"
    assert "default of training_mfu_min" in per_gpu.expected
    assert "write training_tokens_per_s_per_gpu_min or training_mfu_min" in per_gpu.expected
    # the solo figure is held to the same floor, per GPU: the slow one fails, naming its GPU
    solo = rows[("training_solo_tokens_per_s", 1)], rows[("training_solo_tokens_per_s", 0)]
    assert [(r.status, r.gpu) for r in solo] == [(Status.FAIL, 1), (Status.PASS, 0)]
    # just above the floor passes
    assert rows_of(run_of(90_752.0, [154_600.0] * 2), auto_h200())[(training.PER_GPU, None)].status is Status.PASS


def test_the_peak_is_the_profiles_own_else_its_gpu_models_datasheet() -> None:
    own_peak = Profile.model_validate(
        {"gpu": {"model": "NVIDIA H200"}, "probes": {"device": "cuda"}, "training": {"peak_tflops": 400.0}}
    )
    row = rows_of(H200X2, own_peak)[(training.PER_GPU, None)]
    assert "MFU >= 0.25 of 400 TFLOP/s (training.peak_tflops)" in (row.expected or "")
    assert (row.status, row.observed) == (Status.PASS, "143,572 tokens/s (MFU 0.978)")
    h100 = Profile.model_validate({"gpu": {"model": "NVIDIA H100 80GB HBM3"}, "probes": {"device": "cuda"}})
    one = rows_of(run_of(136_024.5, [143_238.8]), h100)  # bench/results/h100x1-builtin
    assert one[(training.PER_GPU, None)].observed == "136,024 tokens/s (MFU 0.375)"
    assert "(NVIDIA H100 80GB HBM3 dense bf16 peak, H100 datasheet (SXM))" in (
        one[(training.PER_GPU, None)].expected or ""
    )


def test_where_no_floor_derives_the_figure_is_not_judged_saying_why() -> None:
    nameless = rows_of(H200X2, Profile.model_validate({"probes": {"device": "cuda"}}))[(training.PER_GPU, None)]
    assert (nameless.status, nameless.reason) == (Status.NOT_JUDGED, "no_expectation")
    assert "the profile names no GPU model (gpu.model): set training.peak_tflops" in nameless.detail
    assert nameless.expected == "none: set thresholds.training_tokens_per_s_per_gpu_min"
    alone = rows_of(run_of(149_318.3, [155_908.3]), Profile.model_validate({"probes": {"device": "cuda"}}))
    solo = alone[(training.SOLO, 0)]
    assert (solo.status, solo.observed) == (Status.NOT_JUDGED, "155908.3")
    assert solo.expected == "none: an MFU floor needs thresholds.training_mfu_min or its default, and a GPU peak"
    cpu = rows_of(H200X2, Profile.model_validate({"gpu": {"model": "NVIDIA H200"}, "probes": {"device": "cpu"}}))
    assert cpu[(training.PER_GPU, None)].status is Status.NOT_JUDGED
    assert "the probes run on CPU" in cpu[(training.PER_GPU, None)].detail
    assert cpu[(f"{training.SOLO}_vs_cluster", 0)].reason == "ok"  # each GPU alone still judged by the other
    tiny = H200X2.replace('"layers": 24, "width": 1024, "heads": 16', '"layers": 2, "width": 64, "heads": 4')
    small = rows_of(tiny, auto_h200())[(training.PER_GPU, None)]
    assert (small.status, small.reason) == (Status.NOT_JUDGED, "no_expectation")
    assert "100 M parameters and more" in small.detail
    assert "write training_tokens_per_s_per_gpu_min or training_mfu_min" in small.detail


def test_written_minimums_take_over_from_the_floor() -> None:
    own = rows_of(H200X2, auto_h200(training_tokens_per_s_per_gpu_min=150_000))
    written = own[(training.PER_GPU, None)]
    assert (written.status, written.expected) == (Status.FAIL, ">= 150000.0 tokens/s")  # the profile's, as written
    assert "write training_mfu_min" in (own[(training.SOLO, 0)].expected or "")
    mfu = rows_of(H200X2, auto_h200(training_mfu_min=0.45))
    assert mfu[("mfu", None)].status is Status.FAIL  # 0.396 < 0.45
    assert mfu[(training.PER_GPU, None)].status is Status.FAIL
    assert (mfu[(training.PER_GPU, None)].expected or "").endswith("; training_mfu_min")
    assert mfu[(training.SOLO, 1)].status is Status.FAIL  # 157,145 solo is MFU 0.433 < 0.45
    assert mfu[(training.SOLO, 1)].expected == (
        f">= {0.45 * 989.4e12 / FLOPS_350M:,.0f} tokens/s: MFU >= 0.45 of 989.4 TFLOP/s "
        "(NVIDIA H200 dense bf16 peak, H200 datasheet (SXM)); training_mfu_min"
    )


def test_every_training_figure_of_the_default_path_has_a_row() -> None:
    profile = auto_h200()
    rows = [node_row("r", "c", "single-node", "n1", r) for r in rows_of(H200X2, profile).values()]
    assert missing("single-node", {"n1": profile}, rows, training.PROBE.expectations) == []
    named = {e.name for e in training.PROBE.expectations if e.stated(profile)}
    assert {"training_tokens_per_s_per_gpu_min", "training_solo_tokens_per_s", "training_dp_efficiency_min"} <= named
    without = [r for r in rows if r.item != "training_dp_efficiency"]
    assert [e.name for _, e in missing("single-node", {"n1": profile}, without, training.PROBE.expectations)] == [
        "training_dp_efficiency_min"
    ]


def test_the_efficiency_minimum_is_a_fraction_checked_when_loaded() -> None:
    assert auto_h200(training_dp_efficiency_min=0.5).thresholds.training_dp_efficiency_min == 0.5
    with pytest.raises(ValueError, match="less than or equal to 1"):
        auto_h200(training_dp_efficiency_min=1.5)
