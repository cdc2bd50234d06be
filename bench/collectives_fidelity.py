"""Collective and GPU-pair fidelity: do our probes report what the hardware does? Run on a multi-GPU machine.

In one run on the same GPUs: our collectives sweep (probes/node/allreduce.py ``--ops``) against a plain
``torch.distributed`` loop of each collective at the same size, both under torchrun on every GPU, timed the same
way (CUDA events, nccl-tests' bus bandwidth). Prints both figures and the ratio (ours / plain; target within 3 %),
then the GPU-pair matrix (probes/node/gpu_pairs.py): every ordered pair's copy bandwidth and its ratio to the
node's median pair.

    python3 bench/collectives_fidelity.py [--bytes 1073741824] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")

PLAIN = """
import os, torch, torch.distributed as dist
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
numel = int(os.environ["CA_BYTES"]) // 4 // world * world
factor = {"all_reduce": 2 * (world - 1) / world}
for op in os.environ["CA_OPS"].split(","):
    a = torch.randn(numel, device="cuda")
    b = torch.empty(numel, device="cuda")
    s = torch.empty(numel // world, device="cuda")
    call = {
        "all_reduce": lambda: dist.all_reduce(a),
        "all_gather": lambda: dist.all_gather_into_tensor(b, s),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(s, a),
        "all_to_all": lambda: dist.all_to_all_single(b, a),
    }[op]
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000 / 20)
    t = torch.tensor([sorted(times)[2]], device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        print("PLAIN", op, numel * 4 / t.item() / 1e9 * factor.get(op, (world - 1) / world), flush=True)
dist.destroy_process_group()
"""


def torchrun(args: list[str], env: dict[str, str], gpus: int) -> str:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}", *args],
        capture_output=True, text=True, check=True, env={**os.environ, **env},
    ).stdout  # fmt: skip


def ours(nbytes: int, gpus: int) -> dict[str, float]:
    script = str(ROOT / "cluster_accept" / "probes" / "node" / "allreduce.py")
    out = torchrun([script, "--ops", ",".join(OPS), "--min-bytes", str(nbytes), "--max-bytes", str(nbytes)], {}, gpus)
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {str(r["collective"]): float(r["value"]) for r in records if "metric" in r}


def plain(nbytes: int, gpus: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "plain.py"
        script.write_text(PLAIN)
        out = torchrun([str(script)], {"CA_BYTES": str(nbytes), "CA_OPS": ",".join(OPS)}, gpus)
    return {line.split()[1]: float(line.split()[2]) for line in out.splitlines() if line.startswith("PLAIN")}


def pairs() -> list[dict[str, object]]:
    out = subprocess.run(
        [sys.executable, str(ROOT / "cluster_accept" / "probes" / "node" / "gpu_pairs.py")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [r for r in (json.loads(line) for line in out.splitlines() if line.startswith("{")) if "metric" in r]


def measure(nbytes: int) -> dict[str, object]:
    import torch

    gpus = torch.cuda.device_count()
    if gpus < 2:
        raise SystemExit(f"{gpus} GPU: collectives and GPU pairs need at least two")
    print(f"GPUs: {gpus} x {torch.cuda.get_device_name(0)}; torch {torch.__version__}; {nbytes} B")
    mine, reference = ours(nbytes, gpus), plain(nbytes, gpus)
    ratios = {}
    for op in OPS:
        ratios[op] = mine[op] / reference[op]
        print(f"{op}: ours {mine[op]:.1f} GB/s, plain loop {reference[op]:.1f} GB/s, ratio {ratios[op]:.3f}")
    matrix = pairs()
    median = statistics.median(float(str(r["value"])) for r in matrix)
    for r in matrix:
        value = float(str(r["value"]))
        print(f"{r['label']}: {value:.1f} GB/s ({value / median:.3f} of the median), p2p {r['p2p']}")
    print(f"pairs: {len(matrix)} of {gpus * (gpus - 1)}; worst collective ratio {min(ratios.values()):.3f}")
    return {"gpus": gpus, "bytes": nbytes, "ours": mine, "plain": reference, "ratios": ratios, "pairs": matrix}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=1 << 30)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    result = measure(args.bytes)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
