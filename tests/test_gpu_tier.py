"""The gpu tier: the real CLI (local transport) and the probes on a lent GPU machine, asserting what an
operator relies on. Run there in one call by bench/gpu_tier.sh, which keeps the output in bench/results/.

- fidelity: each figure of our probes within 3 % of plain torch timed in the same run (GEMM per dtype, HBM
  copy, all-reduce);
- a co-tenant computing on GPU 1 about a tenth of the time is caught on GPU 1, with its process as the cause;
- ``NCCL_P2P_DISABLE=1`` in the job environment is named as the cause of the all-reduce shortfall;
- five healthy light-suite runs in a row reject nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
INVENTORY = Path(os.environ.get("CA_GPU_INVENTORY", ROOT / "bench" / "inventories" / "h200x2.yaml"))
RESULTS = Path(os.environ.get("OUT", "/tmp/gpu-tier"))


def _gpus() -> int:
    """GPUs on this machine, from nvidia-smi: this process must hold no CUDA context of its own, or the runs
    it starts would rightly find it on every GPU (gpu:busy)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.splitlines())


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_gpus() == 0, reason="the gpu tier needs an NVIDIA GPU (run bench/gpu_tier.sh on one)"),
]


def keep(name: str, value: Any) -> None:
    """Record a figure for bench/results (one JSON file per test)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(value, indent=1, default=str))


def run_cli(out: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, Path, float]:
    began = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cluster_accept.flows.cli",
            "run",
            "--inventory",
            str(INVENTORY),
            "--out",
            str(out),
            *args,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=540,
        check=False,
    )
    runs = sorted(p for p in out.iterdir() if p.is_dir() and p.name[:1].isdigit())
    assert proc.returncode in (0, 1) and runs, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.returncode, runs[-1], time.monotonic() - began


def verdict(run: Path) -> dict[str, Any]:
    frame = pd.read_parquet(run / "verdicts.parquet")
    assert len(frame) == 1
    record = frame.iloc[0].to_dict()
    return {"verdict": record["verdict"], "reasons": list(record["reasons"]), "cause": record["cause"]}


def test_probe_fidelity_against_plain_torch(tmp_path: Path) -> None:
    # In its own process, so that no CUDA context stays behind in this one for the runs that follow.
    figures = tmp_path / "fidelity.json"
    script = ROOT / "bench" / "probe_fidelity.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--json", str(figures)], capture_output=True, text=True, check=False
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ratios = json.loads(figures.read_text())
    keep("fidelity", ratios)
    assert {"gemm_bf16_tflops gpu0", "gemm_fp16_tflops gpu0", "gemm_tf32_tflops gpu0", "hbm_copy_gbps gpu0"} <= set(
        ratios
    )
    if _gpus() >= 2:
        assert "allreduce_busbw_gbps" in ratios
    low = {k: round(v, 3) for k, v in ratios.items() if v < 0.97}
    assert not low, low


@pytest.mark.skipif(_gpus() < 2, reason="a co-tenant on GPU 1 needs two GPUs")
def test_a_co_tenant_on_one_gpu_is_caught_there_with_its_cause(tmp_path: Path) -> None:
    hog = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "cotenant_gemm.py"), "--gpu", "1", "--seconds", "400", "--duty", "0.1"]
    )
    try:
        time.sleep(8)  # its CUDA context is up
        code, run, wall = run_cli(tmp_path, "--stages", "single-node")
    finally:
        hog.kill()
        hog.wait()
    found = verdict(run)
    checks = pd.read_parquet(run / "checks.parquet")
    busy = checks[(checks.check == "gpu") & (checks.reason == "busy")]
    gemm = checks[(checks.check == "gemm") & (checks.status != "pass")]
    said = {
        "busy": busy[["gpu", "observed", "detail"]].to_dict("records"),
        "gemm_findings": gemm[["gpu", "item", "status", "reason", "observed", "detail"]].to_dict("records"),
    }
    keep("cotenant", {**found, "exit": code, "wall_s": wall, **said})
    assert code == 1 and found["verdict"] == "rejected"
    assert set(busy.gpu) == {1}, busy  # on that GPU, and only there
    assert found["reasons"][0] == "gpu:busy"  # the cause first
    if any(o.startswith("pid ") for o in busy.observed):  # where nvidia-smi shows PIDs, it is the co-tenant's
        assert any(o.startswith(f"pid {hog.pid} ") for o in busy.observed), busy.observed
    if not gemm.empty:  # a slowdown it caused is explained by it, never blamed on the GPU
        assert set(gemm.gpu) <= {1} and "gpu:busy" in found["cause"]


@pytest.mark.skipif(_gpus() < 2, reason="P2P needs two GPUs")
def test_p2p_disabled_is_named_as_the_cause_of_the_all_reduce_shortfall(tmp_path: Path) -> None:
    code, run, wall = run_cli(tmp_path, "--stages", "preflight,single-node", env={"NCCL_P2P_DISABLE": "1"})
    found = verdict(run)
    checks = pd.read_parquet(run / "checks.parquet")
    transport = checks[(checks.check == "transport") & (checks["item"] == "intra_node")]
    figures = pd.read_parquet(run / "measurements.parquet")
    largest = figures[figures.metric == "allreduce_busbw_gbps"].sort_values("size").iloc[-1]
    keep("p2p_disabled", {**found, "exit": code, "wall_s": wall, "transport": transport.observed.tolist(),
                          "allreduce_busbw_gbps": float(largest.value), "size": int(largest["size"])})  # fmt: skip
    assert code == 1 and found["verdict"] == "rejected"
    assert found["reasons"][0] == "nccl_harmful:p2p_disabled"
    assert transport.observed.tolist() == ["SHM"]
    assert "allreduce:below_threshold" in found["reasons"]
    assert found["cause"].startswith("allreduce ") and "NCCL_P2P_DISABLE=1" in found["cause"]


def test_five_healthy_reruns_reject_nothing(tmp_path: Path) -> None:
    outcomes = []
    for attempt in range(5):
        code, run, wall = run_cli(tmp_path / str(attempt), "--suite", "light", "--history", str(tmp_path / "history"))
        outcomes.append({**verdict(run), "exit": code, "wall_s": round(wall, 1)})
    keep("healthy_reruns", outcomes)
    assert [o["verdict"] for o in outcomes] == ["accepted"] * 5, outcomes
