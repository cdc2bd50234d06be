"""A co-tenant: a bf16 GEMM loop on one GPU, started in the background to plant a straggler on real GPUs.

python3 bench/cotenant_gemm.py --gpu 0 --seconds 300
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=300)
    args = parser.parse_args()
    device = torch.device("cuda", args.gpu)
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        for _ in range(50):
            torch.matmul(a, b)
        torch.cuda.synchronize(device)


if __name__ == "__main__":
    main()
