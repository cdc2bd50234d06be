"""Probe fidelity: do our probes report what the hardware does? Run on a GPU machine.

In one run on the same GPU(s): our GEMM figures per dtype (bf16, fp16, tf32) and HBM copy bandwidth
(probes/node/gpu_bench.py, one GPU at a time like the reference) against plain ``torch.matmul`` / ``Tensor.copy_`` timed
with ``triton.testing.do_bench`` (median) at the same size and dtype, one GPU at a time; and our all-reduce
bus bandwidth (probes/node/allreduce.py under torchrun) against a plain ``torch.distributed.all_reduce`` loop
at the same size. Prints both figures and the ratios (ours / plain); target >= 0.97 for each.

    python3 bench/probe_fidelity.py [--size 8192] [--copy-bytes 2147483648] [--allreduce-bytes 1073741824]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE = ROOT / "cluster_accept" / "probes" / "node"  # the node-side scripts


DTYPES = ("bf16", "fp16", "tf32")


def ours_bench(size: int, copy_bytes: int, gpus: int) -> dict[tuple[str, int], float]:
    """Our GPU bench's figures, (metric, gpu) -> value, one GPU at a time as the plain reference runs (the
    stage loads every GPU at once; on a machine where that costs a GPU a few percent of power headroom, the
    difference is the machine's, not the probe's)."""
    figures = {}
    for gpu in range(gpus):
        out = subprocess.run(
            [sys.executable, str(NODE / "gpu_bench.py"), "--dtypes", ",".join(DTYPES),
             "--gemm-size", str(size), "--copy-bytes", str(copy_bytes)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)},
        ).stdout  # fmt: skip
        for line in out.splitlines():
            record = json.loads(line)
            if "metric" in record and record.get("gpu") is not None:
                figures[(str(record["metric"]), gpu)] = float(record["value"])
    return figures


def plain_bench(size: int, copy_bytes: int) -> dict[tuple[str, int], float]:
    """The same figures from plain torch timed with ``triton.testing.do_bench`` (median), one GPU at a time."""
    import torch
    import triton.testing

    torch_dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32}
    figures = {}
    for gpu in range(torch.cuda.device_count()):
        with torch.cuda.device(gpu):
            for name in DTYPES:
                torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
                a = torch.randn(size, size, device=f"cuda:{gpu}", dtype=torch_dtypes[name])
                b = torch.randn(size, size, device=f"cuda:{gpu}", dtype=torch_dtypes[name])
                ms = triton.testing.do_bench(
                    lambda a=a, b=b: torch.matmul(a, b), warmup=100, rep=1000, return_mode="median"
                )
                figures[(f"gemm_{name}_tflops", gpu)] = 2 * size**3 / (ms / 1000) / 1e12
            src = torch.randn(copy_bytes // 4, device=f"cuda:{gpu}")
            dst = torch.empty_like(src)
            ms = triton.testing.do_bench(lambda s=src, d=dst: d.copy_(s), warmup=25, rep=500, return_mode="median")
            figures[("hbm_copy_gbps", gpu)] = 2 * copy_bytes / (ms / 1000) / 1e9  # read + write
            del a, b, src, dst
            torch.cuda.empty_cache()
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
        [
            str(NODE / "allreduce.py"),
            "--min-bytes",
            str(nbytes),
            "--max-bytes",
            str(nbytes),
        ],
        {},
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


def measure(size: int = 8192, copy_bytes: int = 2 << 30, allreduce_bytes: int = 1 << 30) -> dict[str, float]:
    """``ours / plain`` per figure (``gemm_bf16_tflops gpu0`` …, ``allreduce_busbw_gbps``), printed as it goes."""
    import tempfile

    import torch

    print(f"GPUs: {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    ours, plain = ours_bench(size, copy_bytes, torch.cuda.device_count()), plain_bench(size, copy_bytes)
    ratios = {}
    for key in sorted(plain):
        metric, gpu = key
        if key in ours:
            ratios[f"{metric} gpu{gpu}"] = ours[key] / plain[key]
            print(
                f"{metric} gpu{gpu}: ours {ours[key]:.1f}, plain {plain[key]:.1f}, ratio {ours[key] / plain[key]:.3f}"
            )
    if torch.cuda.device_count() >= 2:
        with tempfile.TemporaryDirectory() as tmp:
            o, p = ours_allreduce(allreduce_bytes), plain_allreduce(allreduce_bytes, Path(tmp))
        ratios["allreduce_busbw_gbps"] = o / p
        print(f"all-reduce busbw at {allreduce_bytes} B: ours {o:.1f} GB/s, plain loop {p:.1f} GB/s, ratio {o / p:.3f}")
    print(f"lowest ratio: {min(ratios.values()):.3f} ({min(ratios, key=ratios.__getitem__)})")
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--copy-bytes", type=int, default=2 << 30)
    parser.add_argument("--allreduce-bytes", type=int, default=1 << 30)
    parser.add_argument("--json", default=None, help="also write the ratios to this file")
    args = parser.parse_args()
    ratios = measure(args.size, args.copy_bytes, args.allreduce_bytes)
    if args.json:
        Path(args.json).write_text(json.dumps(ratios, indent=1))


if __name__ == "__main__":
    main()
