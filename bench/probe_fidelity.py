"""Probe fidelity: do our probes report what the hardware does? Run on a GPU machine.

In one run on the same GPU(s): our GEMM figure (probes/node/gpu_bench.py, every GPU loaded at once) against a
plain ``torch.matmul`` timed with ``triton.testing.do_bench`` (median) at the same size and dtype, one GPU
at a time; and our all-reduce bus bandwidth (probes/node/allreduce.py under torchrun) against a plain
``torch.distributed.all_reduce`` loop at the same size. Prints both figures and the ratios (ours / plain);
target >= 0.97 for both.

    python3 bench/probe_fidelity.py [--size 8192] [--allreduce-bytes 1073741824]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ours_gemm(size: int) -> dict[int, float]:
    out = subprocess.run(
        [sys.executable, str(ROOT / "probes" / "node" / "gpu_bench.py"), "--dtypes", "bf16", "--gemm-size", str(size)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    figures = {}
    for line in out.splitlines():
        record = json.loads(line)
        if record.get("metric") == "gemm_bf16_tflops":
            figures[int(record["gpu"])] = float(record["value"])
    return figures


def plain_gemm(size: int) -> dict[int, float]:
    import torch
    import triton.testing

    figures = {}
    for gpu in range(torch.cuda.device_count()):
        with torch.cuda.device(gpu):
            a = torch.randn(size, size, device=f"cuda:{gpu}", dtype=torch.bfloat16)
            b = torch.randn(size, size, device=f"cuda:{gpu}", dtype=torch.bfloat16)
            ms = triton.testing.do_bench(
                lambda a=a, b=b: torch.matmul(a, b), warmup=100, rep=1000, return_mode="median"
            )
            figures[gpu] = 2 * size**3 / (ms / 1000) / 1e12
    return figures


PLAIN_ALLREDUCE = """
import os, time, torch, torch.distributed as dist
rank, local, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
nbytes = int(os.environ["CA_BYTES"])
x = torch.randn(nbytes // 4, device="cuda")
for _ in range(5):
    dist.all_reduce(x)
torch.cuda.synchronize()
times = []
for _ in range(5):
    dist.barrier(); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    times.append((time.perf_counter() - t0) / 20)
times.sort()
if rank == 0:
    algbw = nbytes / times[len(times) // 2] / 1e9
    print("PLAIN_BUSBW", algbw * 2 * (world - 1) / world, flush=True)
dist.destroy_process_group()
"""


def torchrun(args: list[str], env: dict[str, str]) -> str:
    import torch

    n = torch.cuda.device_count()
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    ).stdout


def ours_allreduce(nbytes: int) -> float:
    out = torchrun(
        [str(ROOT / "probes" / "node" / "allreduce.py"), "--min-bytes", str(nbytes), "--max-bytes", str(nbytes)], {}
    )
    for line in out.splitlines():
        if line.startswith("{") and '"allreduce_busbw_gbps"' in line:
            return float(json.loads(line)["value"])
    raise SystemExit("no all-reduce figure from probes/node/allreduce.py:\n" + out[-2000:])


def plain_allreduce(nbytes: int, tmp: Path) -> float:
    script = tmp / "plain_allreduce.py"
    script.write_text(PLAIN_ALLREDUCE)
    out = torchrun([str(script)], {"CA_BYTES": str(nbytes)})
    return float(next(line.split()[1] for line in out.splitlines() if line.startswith("PLAIN_BUSBW")))


def main() -> None:
    import tempfile

    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--allreduce-bytes", type=int, default=1 << 30)
    args = parser.parse_args()
    print(f"GPUs: {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    ours, plain = ours_gemm(args.size), plain_gemm(args.size)
    ratios = []
    for gpu in sorted(ours):
        ratio = ours[gpu] / plain[gpu]
        ratios.append(ratio)
        print(
            f"gemm bf16 {args.size}^3 gpu{gpu}: ours {ours[gpu]:.1f} TFLOP/s, do_bench {plain[gpu]:.1f} TFLOP/s, "
            f"ratio {ratio:.3f}"
        )
    print(f"GEMM ratio (median over GPUs): {statistics.median(ratios):.3f}; min {min(ratios):.3f}")
    if torch.cuda.device_count() >= 2:
        with tempfile.TemporaryDirectory() as tmp:
            o, p = ours_allreduce(args.allreduce_bytes), plain_allreduce(args.allreduce_bytes, Path(tmp))
        print(
            f"all-reduce busbw at {args.allreduce_bytes} B: ours {o:.1f} GB/s, plain loop {p:.1f} GB/s, "
            f"ratio {o / p:.3f}"
        )
    else:
        print("all-reduce ratio: not measured (one GPU)")


if __name__ == "__main__":
    main()
