"""Independent plain-PyTorch GPT-2-style training loop (nanoGPT-like).

Why it exists: the project's training-step probe reports tokens/s for a GPT-2-style decoder. This script is
an independent reference, written with nothing but torch and the standard library (no project imports), so a
benchmark can run both on the same hardware and compare the probe's tokens/s against a loop a user would write.

Single process:  python3 bench/train_reference.py [--compile]
Data parallel:   torchrun --standalone --nproc_per_node=8 bench/train_reference.py
Rank 0 prints one JSON line with the median step time and tokens/s.
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width, bias=False)
        self.fc_out = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers: int, width: int, heads: int, seq_len: int, vocab: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = p.parse_args()

    cuda = args.device == "cuda"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    distributed = world > 1
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if distributed:
        dist.init_process_group(backend="nccl" if cuda else "gloo")

    seed = 1337
    torch.manual_seed(seed)  # same init on every rank (DDP also broadcasts rank 0's weights)
    model = GPT(args.layers, args.width, args.heads, args.seq_len, args.vocab).to(device)
    params = sum(p.numel() for p in model.parameters())  # tied weight counted once
    if rank == 0:
        print(f"params: {params:,}", flush=True)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    if args.compile:
        model = torch.compile(model)
    opt_kw = {"fused": True} if cuda else {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, betas=(0.9, 0.95), **opt_kw)

    gen = torch.Generator().manual_seed(seed + rank)
    shape = (args.micro_batch, args.seq_len)
    x = torch.randint(0, args.vocab, shape, generator=gen).to(device)
    y = torch.randint(0, args.vocab, shape, generator=gen).to(device)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def step() -> float:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    losses, times = [], []
    for _ in range(args.warmup_steps):
        losses.append(step())
    for _ in range(args.steps):
        sync()
        t0 = time.perf_counter()
        losses.append(step())
        sync()
        times.append(time.perf_counter() - t0)

    median_s = statistics.median(times)
    if distributed:
        t = torch.tensor([median_s], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        median_s = t.item()
    per_gpu = args.micro_batch * args.seq_len / median_s
    if rank == 0:
        result = {
            "reference": "plain_loop",
            "params": params,
            "world_size": world,
            "step_ms_median": round(median_s * 1e3, 3),
            "tokens_per_s_per_gpu": round(per_gpu, 1),
            "tokens_per_s": round(per_gpu * world, 1),
            "loss_first": losses[0],
            "loss_last": losses[-1],
        }
        print(json.dumps(result), flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
