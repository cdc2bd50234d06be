"""Node-side probe: all-reduce bus bandwidth over a size sweep, one process per GPU under ``torchrun``.

Needs only torch and the standard library. Started as
``python -m torch.distributed.run --standalone --nproc_per_node=N allreduce.py`` within a node, and by the
multi-node stage across nodes. Timing: CUDA events around back-to-back ``all_reduce`` calls after warm-up,
median of repeats; algbw = bytes / time, busbw = algbw * 2(n-1)/n (the nccl-tests convention, so figures
compare with ``all_reduce_perf``). Rank 0 prints one JSON object per size. Run with ``NCCL_DEBUG=INFO`` so the
transport NCCL picked for each channel (``via P2P/CUMEM``, ``via SHM``, ``via NET/Socket``...) is in the log.
``--device cpu`` uses gloo, for test-beds without GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= 4
    if out[-1] != max_bytes:
        out.append(max_bytes)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--min-bytes", type=int, default=1 << 20)
    parser.add_argument("--max-bytes", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--label", default="intra_node")
    parser.add_argument("--tag", default="", help="run tag, so the controller can find and stop this run")
    parser.add_argument(
        "--init-timeout-s", type=float, default=120.0, help="give up on the process group after this long"
    )
    args = parser.parse_args()
    cuda = args.device == "cuda"
    max_bytes = args.max_bytes or ((1 << 30) if cuda else (16 << 20))
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if cuda:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device, timeout=timedelta(seconds=args.init_timeout_s))
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timedelta(seconds=args.init_timeout_s))
    if rank == 0:
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda else None
        print(
            json.dumps(
                {
                    "info": "probe",
                    "probe": "allreduce",
                    "world_size": world,
                    "torch": torch.__version__,
                    "nccl_version": nccl,
                    "backend": dist.get_backend(),
                }
            ),
            flush=True,
        )
    for nbytes in sizes(args.min_bytes, max_bytes):
        numel = nbytes // 4
        tensor = torch.randn(numel, device=device)
        iters = max(3, min(50, (256 << 20) // nbytes * 5)) if cuda else max(2, min(20, (4 << 20) // nbytes * 4))
        for _ in range(3):
            dist.all_reduce(tensor)
        if cuda:
            torch.cuda.synchronize()
        times = []
        for _ in range(args.repeats):
            dist.barrier()
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(iters):
                    dist.all_reduce(tensor)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1000 / iters)
            else:
                t0 = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(tensor)
                times.append((time.perf_counter() - t0) / iters)
        # The slowest rank decides what a job sees.
        seconds = torch.tensor([statistics.median(times)], device=device, dtype=torch.float64)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        algbw = numel * 4 / seconds.item() / 1e9
        if rank == 0:
            print(
                json.dumps(
                    {
                        "probe": "allreduce",
                        "metric": "allreduce_busbw_gbps",
                        "label": args.label,
                        "value": round(algbw * 2 * (world - 1) / world, 4),
                        "unit": "GB/s",
                        "algbw_gbps": round(algbw, 4),
                        "size": numel * 4,
                        "dtype": "fp32",
                        "iterations": iters * args.repeats,
                        "world_size": world,
                        "gpu": None,
                    }
                ),
                flush=True,
            )
        del tensor
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
