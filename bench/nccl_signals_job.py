"""A small data-parallel job over NCCL for the signal captures (bench/nccl_signals_capture.sh): DDP over a stack of
linear layers, its all-reduce overlapping the backward pass, run for ``--seconds``. Each rank writes its pid to
``<--pid-dir>/rank<RANK>.pid`` once its process group is up (so the bench can stop or kill one rank's process)
and prints its median step time every ``--report-every`` steps. Needs only torch."""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--pid-dir", default="/tmp/job")
    parser.add_argument("--report-every", type=int, default=50)
    args = parser.parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    layers = [torch.nn.Linear(args.width, args.width) for _ in range(args.layers)]
    model = DistributedDataParallel(torch.nn.Sequential(*layers).cuda(), device_ids=[local])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    data = torch.randn(args.batch, args.width, device="cuda")
    with open(os.path.join(args.pid_dir, f"rank{rank}.pid"), "w") as handle:
        handle.write(str(os.getpid()))
    steps: list[float] = []
    ends = time.monotonic() + args.seconds
    while time.monotonic() < ends:
        began = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        model(data).square().mean().backward()
        optimizer.step()
        torch.cuda.synchronize()
        steps.append((time.perf_counter() - began) * 1000)
        if len(steps) % args.report_every == 0:
            recent = steps[-args.report_every :]
            print(f"rank {rank} step {len(steps)} median {statistics.median(recent):.2f} ms", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
