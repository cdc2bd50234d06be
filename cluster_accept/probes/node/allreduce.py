"""Node-side probe: collective bus bandwidth over a size sweep, one process per GPU under ``torchrun``.

Needs only torch and the standard library. Started as
``python -m torch.distributed.run --standalone --nproc_per_node=N allreduce.py`` within a node, and by the
multi-node stage across nodes. ``--ops`` picks the collectives: ``all_reduce`` (data parallelism),
``all_gather`` and ``reduce_scatter`` (FSDP/ZeRO-3), ``all_to_all`` (mixture-of-experts) and ``send_recv``
(pipeline parallelism: every rank sends to the next and receives from the previous, all at once).

Timing: CUDA events around back-to-back calls after warm-up, median of repeats, the slowest rank's time.
Sizes and bus bandwidth as nccl-tests defines them, so figures compare with its ``*_perf`` binaries: the size
is the largest buffer a rank touches (all-gather's output, reduce-scatter's input), algbw = size / time, and
busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather, reduce-scatter and all-to-all, x 1 for
send/recv. Rank 0 prints one JSON object per (collective, size); a collective the backend lacks (gloo has no
reduce-scatter) is one ``skip`` line naming it. Run with ``NCCL_DEBUG=INFO`` so the transport NCCL picked for
each channel (``via P2P/CUMEM``, ``via SHM``, ``via NET/Socket``...) is in the log. ``--device cpu`` uses
gloo, for test-beds without GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# torch 2.9+ renamed the tensor collectives (all_gather_single …); the old names work on every version in use.
warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
# The metric each collective's figure is reported under (all-reduce keeps its historical name).
METRIC = {op: op.replace("_", "") + "_busbw_gbps" for op in OPS}


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= 4
    if out[-1] != max_bytes:
        out.append(max_bytes)
    return out


def busbw_factor(op: str, world: int) -> float:
    if op == "all_reduce":
        return 2 * (world - 1) / world
    if op == "send_recv":
        return 1.0
    return (world - 1) / world


def collective(op: str, nbytes: int, world: int, rank: int, device: torch.device) -> tuple[Callable[[], None], int]:
    """The call to time and the size it moves (bytes, nccl-tests' convention); buffers made once."""
    numel = max(world, nbytes // 4 // world * world)  # divisible by the world for the sharded collectives
    if op == "all_reduce":
        tensor = torch.randn(numel, device=device)
        return lambda: dist.all_reduce(tensor), numel * 4
    if op == "all_gather":
        shard, full = torch.randn(numel // world, device=device), torch.empty(numel, device=device)
        return lambda: dist.all_gather_into_tensor(full, shard), numel * 4
    if op == "reduce_scatter":
        full, shard = torch.randn(numel, device=device), torch.empty(numel // world, device=device)
        return lambda: dist.reduce_scatter_tensor(shard, full), numel * 4
    if op == "all_to_all":
        source, target = torch.randn(numel, device=device), torch.empty(numel, device=device)
        return lambda: dist.all_to_all_single(target, source), numel * 4
    send, recv = torch.randn(numel, device=device), torch.empty(numel, device=device)
    ring = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]

    def exchange() -> None:
        for request in dist.batch_isend_irecv(ring):
            request.wait()

    return exchange, numel * 4


def seconds_per_call(call: Callable[[], None], iters: int, repeats: int, cuda: bool) -> float:
    for _ in range(3):
        call()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        dist.barrier()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000 / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            times.append((time.perf_counter() - t0) / iters)
    return statistics.median(times)


def supported(op: str, world: int, device: torch.device) -> str | None:
    """Why ``op`` cannot run here, or None: tried once on a tiny buffer (backends differ by version)."""
    try:
        call, _ = collective(op, 4 * world, world, dist.get_rank(), device)
        call()
    except (RuntimeError, ValueError, NotImplementedError) as exc:
        return f"{op} is not supported by {dist.get_backend()}: {str(exc).splitlines()[0][:200]}"
    return None


def sweep(op: str, args: argparse.Namespace, world: int, rank: int, device: torch.device) -> None:
    cuda = device.type == "cuda"
    max_bytes = args.max_bytes or ((1 << 30) if cuda else (16 << 20))
    for nbytes in sizes(args.min_bytes, max_bytes):
        call, size = collective(op, nbytes, world, rank, device)
        iters = max(3, min(50, (256 << 20) // nbytes * 5)) if cuda else max(2, min(20, (4 << 20) // nbytes * 4))
        seconds = torch.tensor([seconds_per_call(call, iters, args.repeats, cuda)], device=device, dtype=torch.float64)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest rank decides what a job sees
        algbw = size / seconds.item() / 1e9
        if rank == 0:
            record = {
                "probe": "allreduce", "metric": METRIC[op], "collective": op, "label": args.label,
                "value": round(algbw * busbw_factor(op, world), 4), "unit": "GB/s", "algbw_gbps": round(algbw, 4),
                "size": size, "dtype": "fp32", "iterations": iters * args.repeats, "world_size": world, "gpu": None,
            }  # fmt: skip
            print(json.dumps(record), flush=True)
        del call


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--ops", default="all_reduce", help=f"comma-separated, of {', '.join(OPS)}")
    parser.add_argument("--min-bytes", type=int, default=1 << 20)
    parser.add_argument("--max-bytes", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--label", default="intra_node")
    parser.add_argument("--tag", default="", help="run tag, so the controller can find and stop this run")
    parser.add_argument(
        "--init-timeout-s", type=float, default=120.0, help="give up on the process group after this long"
    )
    args = parser.parse_args()
    ops = [op.strip() for op in args.ops.split(",") if op.strip()]
    unknown = [op for op in ops if op not in OPS]
    if unknown or not ops:
        parser.error(f"--ops: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(OPS)}")
    cuda = args.device == "cuda"
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
        info = {
            "info": "probe", "probe": "allreduce", "world_size": world, "torch": torch.__version__,
            "nccl_version": nccl, "backend": dist.get_backend(), "ops": ops,
        }  # fmt: skip
        print(json.dumps(info), flush=True)
    for op in ops:
        why = supported(op, world, device)
        if why is not None:
            if rank == 0:
                print(json.dumps({"info": "skip", "collective": op, "reason": why}), flush=True)
            continue
        sweep(op, args, world, rank, device)
    dist.barrier()
    finish()
    return 0


def emit(record: dict[str, Any]) -> None:
    """One JSON line from any rank. The ranks of a node share one stdout, and print() may write a line and its
    newline apart, so two ranks' lines ran together (``{…}{…}``): one write of the whole line (under PIPE_BUF,
    so atomic on a pipe) keeps every line whole."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (json.dumps(record) + "\n").encode())


def finish() -> None:
    """Every rank says it is done, then leaves at once. The ``rank_done`` line is this rank's own proof that the
    run completed here, whatever its exit status says next: the interpreter's teardown of a process group's
    threads can abort (``terminate called without an active exception``) after the work is done, and rank 0's
    agent, which hosts the rendezvous store, then leaves while other agents still talk to it. ``os._exit``
    skips that teardown; the final barrier before it means no rank still needs another."""
    local, local_world = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    emit({"info": "rank_done", "rank": dist.get_rank(), "local_rank": local, "local_world_size": local_world})
    try:
        dist.destroy_process_group()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
