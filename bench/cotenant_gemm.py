"""A co-tenant: a bf16 GEMM loop on one GPU, started in the background to plant a straggler on real GPUs.

python3 bench/cotenant_gemm.py --gpu 0 --seconds 300 [--duty 0.1]

``--duty``: the share of each second spent computing (a co-tenant that loads the GPU now and then); the
process keeps its CUDA context, so it shows in nvidia-smi's compute processes throughout.
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--duty", type=float, default=1.0, help="share of each second spent computing")
    args = parser.parse_args()
    device = torch.device("cuda", args.gpu)
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        second = time.monotonic()
        while time.monotonic() - second < args.duty:
            for _ in range(5):
                torch.matmul(a, b)
            torch.cuda.synchronize(device)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - second)))


if __name__ == "__main__":
    main()
