"""``profile suggest`` with a calibration of the cluster in the history: each key figure's noise and margin as
comments, and where every key margin exceeds the default ``straggler_pct``, the ``straggler_pct``/``noise_k`` to
judge by, with why; the profile still loads."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from cluster_accept.analysis.calibration import NOISE_COLUMNS, NoiseTable, write_table
from cluster_accept.analysis.suggest import suggest_profile
from cluster_accept.analysis.suggest_calibration import Calibrated
from cluster_accept.inventory.builtin import with_base
from cluster_accept.probes.base import discover
from tests.processes import run_cli
from tests.test_profile_suggest import loaded, outputs, parsed

H200 = "NVIDIA H200"
RULES = {metric: rule for probe in discover() for metric, rule in probe.metrics.items()}


def calibrated(gemm_cv: float, model: str = H200) -> Calibrated:
    rows = [
        [model, "gemm_bf16_tflops", "", 5, 20, gemm_cv / 2, gemm_cv],
        [model, "hbm_copy_gbps", "large", 5, 20, 0.01, 0.03],
        [model, "allreduce_busbw_gbps", "small", 5, 5, 0.1, 0.3],  # latency-bound: not where it is judged
        [model, "allreduce_busbw_gbps", "large", 5, 5, 0.01, 0.025],
        [model, "training_step_ms", "", 5, 5, 0.01, 0.2],  # judged by no peer comparison
        ["cpu", "gemm_fp32_gflops", "", 5, 2, 0.1, 0.2],
    ]
    return Calibrated(NoiseTable(pd.DataFrame(rows, columns=NOISE_COLUMNS), "C1"), RULES)


def nodes() -> dict[str, dict[str, object]]:
    return {f"node0{i}": parsed(outputs()) for i in range(1, 5)}  # four H200 nodes of four GPUs


def test_noisy_key_figures_suggest_the_straggler_pct_and_noise_k_to_judge_by() -> None:
    text = suggest_profile(nodes(), {}, None, "h200", calibrated(0.02))
    lines = text.splitlines()
    # 16 GPUs judge gemm and hbm, 4 nodes the all-reduce at its largest size: each line its own false rejections
    said = [
        "# gemm_bf16_tflops: noise p95 2.00% (20 figures, 5 runs); margin 6.0%; 0.034 false rejections a run "
        "of 16 judged",
        "# hbm_copy_gbps (large): noise p95 3.00% (20 figures, 5 runs); margin 9.0%; 0.034 false rejections a run of "
        "16 judged",
        "# allreduce_busbw_gbps (large): noise p95 2.50% (5 figures, 5 runs); margin 7.5%; 0.022 false rejections a "
        "run of 4 judged",
    ]
    assert [line for line in lines if ": noise p95" in line] == said
    assert not any("(small)" in line and "allreduce" in line or "training_step_ms" in line for line in lines)
    i = lines.index("thresholds:")
    assert lines[i + 1].startswith("  # every key figure's calibrated margin exceeds straggler_pct 5%")
    assert "  straggler_pct: 6  # from calibration C1" in lines and "  noise_k: 3  # from calibration C1" in lines
    assert "36 figures judged a run to 0.049 a run" in " ".join(lines)
    profile = loaded(text)
    assert (profile.thresholds.straggler_pct, profile.thresholds.noise_k) == (6.0, 3.0)
    assert with_base(profile).thresholds.gemm_bf16_tflops_min == 594.0  # the base's minimums stay


def test_a_key_figure_quieter_than_straggler_pct_keeps_the_defaults_and_the_comments() -> None:
    text = suggest_profile(nodes(), {}, None, "h200", calibrated(0.01))
    assert "# gemm_bf16_tflops: noise p95 1.00% (20 figures, 5 runs); margin 5.0%" in text
    assert "straggler_pct:" not in text and "thresholds:" not in text.splitlines()
    assert loaded(text).thresholds.straggler_pct == 5.0


def test_a_calibration_of_other_gpus_says_so() -> None:
    text = suggest_profile(nodes(), {}, None, "h200", calibrated(0.02, model="NVIDIA A100"))
    said = (
        "# calibration C1 (cluster-accept calibrate) measured no key figure of NVIDIA H200 (it holds NVIDIA A100, cpu)"
    )
    assert said in text.splitlines()
    assert "straggler_pct:" not in text


def test_cpu_nodes_get_the_limits_under_their_own_thresholds() -> None:
    cpu_torch = {"torch": "2.13.0+cpu", "cuda_build": None}
    models = {f"node0{i}": parsed(outputs(torch=cpu_torch)) for i in (1, 2)}
    text = suggest_profile(models, {}, "cpu", "testbed", calibrated(0.02))
    assert "# gemm_fp32_gflops: noise p95 20.00% (2 figures, 5 runs); margin 60.0%" in text
    profile = loaded(text)
    assert (profile.thresholds.relative_verdict, profile.thresholds.straggler_pct) == ("warn", 60.0)


@pytest.mark.integration
def test_profile_suggest_reads_the_cluster_calibration_from_the_history(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "cluster: cal\ndefaults: {profile: p}\nnodes: [{hosts: local1, address: local}]\nprofiles: {p: {}}\n"
    )
    history = tmp_path / "history"
    write_table(history, "cal", "20260102T000000Z-c2", calibrated(0.02).table.frame)
    write_table(history, "other", "20260103T000000Z-c3", calibrated(0.02).table.frame)
    proc = run_cli("profile", "suggest", "-i", str(inventory), "--device", "cpu", "--history", str(history))
    assert proc.returncode == 0, proc.stderr
    assert f"calibration 20260102T000000Z-c2 of cluster cal read from {history}" in proc.stderr
    assert "  straggler_pct: 60  # from calibration 20260102T000000Z-c2" in proc.stdout.splitlines()
    missing = run_cli("profile", "suggest", "-i", str(inventory), "--history", str(tmp_path / "none"))
    assert missing.returncode == 2 and "is not a directory" in missing.stderr
