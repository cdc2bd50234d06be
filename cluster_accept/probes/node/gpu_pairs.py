"""Node-side probe: copy bandwidth for every ordered pair of GPUs in the node (the GPU-pair matrix).

Needs only torch and the standard library; one process sees every GPU. For each ordered pair (i, j) a buffer
on GPU i is copied into one on GPU j (``copy_``: a peer-to-peer copy over NVLink where the pair has it, through
host memory otherwise), back to back after warm-up, wall-clock around the copies with both GPUs synchronised,
median of repeats. One pair at a time, so a weak NVLink or NVSwitch port shows as a weak pair instead of being
averaged into a node-wide all-reduce. Prints one JSON object per pair (``label`` ``GPU0->GPU1``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch


def seconds_per_copy(src: torch.Tensor, dst: torch.Tensor, iters: int, repeats: int) -> float:
    devices = (src.device, dst.device)
    for _ in range(3):
        dst.copy_(src, non_blocking=True)
    for device in devices:
        torch.cuda.synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            dst.copy_(src, non_blocking=True)
        for device in devices:
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) / iters)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--bytes", type=int, default=256 << 20)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.device != "cuda":
        print(json.dumps({"info": "skip", "reason": "probes run on CPU: no GPU pairs"}), flush=True)
        return 0
    count = torch.cuda.device_count()
    print(json.dumps({"info": "probe", "probe": "gpu_pairs", "gpus": count, "torch": torch.__version__}), flush=True)
    if count < 2:
        print(json.dumps({"info": "skip", "reason": f"{count} GPU: no GPU pairs"}), flush=True)
        return 0
    buffers = [torch.empty(args.bytes, dtype=torch.uint8, device=f"cuda:{i}") for i in range(count)]
    targets = [torch.empty(args.bytes, dtype=torch.uint8, device=f"cuda:{i}") for i in range(count)]
    for i in range(count):
        for j in range(count):
            if i == j:
                continue
            try:
                seconds = seconds_per_copy(buffers[i], targets[j], args.iters, args.repeats)
            except RuntimeError as exc:
                print(json.dumps({"error": f"GPU{i}->GPU{j}: {str(exc).splitlines()[0][:300]}", "gpu": i}), flush=True)
                continue
            record = {
                "probe": "gpu_pairs", "metric": "gpu_pair_copy_gbps", "label": f"GPU{i}->GPU{j}", "gpu": i,
                "peer": j, "value": round(args.bytes / seconds / 1e9, 3), "unit": "GB/s", "size": args.bytes,
                "iterations": args.iters * args.repeats, "p2p": torch.cuda.can_device_access_peer(i, j),
            }  # fmt: skip
            print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
