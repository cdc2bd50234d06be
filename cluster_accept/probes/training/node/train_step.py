"""Node-side probe: real training steps of a GPT-style decoder, one process per GPU under ``torchrun``.

Needs only torch and the standard library; nothing is downloaded. The model is GPT-2's shape in plain torch
(tied token embedding, learned positions, pre-LayerNorm blocks, bias-free linears, fused QKV), attention through
``scaled_dot_product_attention`` (flash or memory-efficient kernels where the GPU has them), bf16 autocast and
fused AdamW on CUDA; float32 and gloo on CPU (the test-bed). Tokens are synthetic from a fixed seed, one fixed
batch per rank, so the loss must fall: a NaN, or a loss that does not fall, is a numerics fault of the node.

Two timings per rank:

- *solo*: forward and backward on the rank's own copy of the model, no communication, every GPU at once. Under
  data parallelism every rank waits for the slowest one at each step, so step times cannot name a slow GPU;
  solo times can.
- *step*: the whole training step (forward, backward with its gradient all-reduce or, fully sharded, its
  all-gathers and reduce-scatters, optimizer) after warm-up, synchronised and timed per step; median and spread.

Rank 0 prints JSON lines: one ``info: training`` record (the model and how it ran), one ``info: training_rank``
record per rank, and the figures (``metric``/``value``). FLOPs and MFU are computed by the controller from the
model's shape (``probes.training.judge``), so the formula lives in one place.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from allreduce import emit, finish  # shipped beside this script: every multi-rank probe ends alike
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.ln_2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width, bias=False)
        self.fc_out = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(d, dim=2)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, s, d))
        return x + self.fc_out(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers: int, width: int, heads: int, seq_len: int, vocab: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as GPT-2
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def _timed_steps(text: str) -> int:
    """A count of timed steps: at least one, since a median over none is no figure."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: give at least 1")
    return value


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--parallel", choices=["ddp", "fsdp"], default="ddp")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--steps", type=_timed_steps, default=20)
    parser.add_argument("--solo-steps", type=_timed_steps, default=5)
    parser.add_argument("--lr", type=float, default=6e-4)
    parser.add_argument("--label", default="intra_node")
    parser.add_argument("--tag", default="", help="run tag, so the controller can find and stop this run")
    parser.add_argument("--init-timeout-s", type=float, default=120.0)
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak, for MFU")
    return parser.parse_args()


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def _train_step(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor, cuda: bool) -> torch.Tensor:
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
        loss = model(tokens, targets)
    loss.backward()
    return loss


def solo_ms(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor, steps: int, cuda: bool) -> float:
    """Median forward+backward time of this rank alone (no communication); gradients are dropped after."""
    times = []
    for i in range(steps + 1):
        _sync(cuda)
        start = time.perf_counter()
        _train_step(model, tokens, targets, cuda)
        _sync(cuda)
        if i:  # the first one warms up kernels and allocator
            times.append((time.perf_counter() - start) * 1000)
        model.zero_grad(set_to_none=True)
    return statistics.median(times)


def _wrap(model: nn.Module, args: argparse.Namespace, device: torch.device, cuda: bool) -> nn.Module:
    if args.parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        if cuda:
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        else:
            policy = MixedPrecisionPolicy()
        for block in model.blocks:  # type: ignore[union-attr]
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        wrapped = model
    else:
        wrapped = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    return torch.compile(wrapped) if args.compile else wrapped  # type: ignore[return-value]


def train(
    model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor, args: argparse.Namespace, cuda: bool
) -> tuple[list[float], list[float]]:
    """(step times in ms of the timed steps, loss of every step) with warm-up steps first."""
    fused = {"fused": True} if cuda else {"foreach": True}
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, **fused)
    times, losses = [], []
    for step in range(args.warmup_steps + args.steps):
        _sync(cuda)
        start = time.perf_counter()
        loss = _train_step(model, tokens, targets, cuda)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach().item()))  # waits for the step
        _sync(cuda)
        if step >= args.warmup_steps:
            times.append((time.perf_counter() - start) * 1000)
    return times, losses


def _rank_record(
    args: argparse.Namespace, times: list[float], losses: list[float], solo: float, cuda: bool
) -> dict[str, Any]:
    timed = losses[args.warmup_steps :]
    return {
        "info": "training_rank",
        "rank": dist.get_rank(),
        "node_rank": int(os.environ.get("GROUP_RANK", "0")),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "hostname": socket.gethostname(),
        "device_name": torch.cuda.get_device_name() if cuda else "cpu",
        "step_ms_median": statistics.median(times),
        "step_ms_mean": statistics.fmean(times),  # what the job's throughput sees, a rare slow step included
        "step_ms_min": min(times),
        "step_ms_max": max(times),
        "solo_ms_median": solo,
        "loss_initial": losses[0],
        "loss_first": timed[0],
        "loss_last": timed[-1],
        "loss_finite": all(math.isfinite(x) for x in losses),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }


def _figures(args: argparse.Namespace, ranks: list[dict[str, Any]], world: int) -> list[dict[str, Any]]:
    tokens = args.micro_batch * args.seq_len
    step_ms = max(r["step_ms_median"] for r in ranks)  # every rank waits for the slowest
    common = {"probe": "training", "label": args.label, "world_size": world, "iterations": args.steps}
    out = [
        {**common, "metric": "training_step_ms", "value": round(step_ms, 3), "unit": "ms", "gpu": None},
        {**common, "metric": "training_tokens_per_s_per_gpu", "value": round(tokens / step_ms * 1000, 1),
         "unit": "tokens/s", "gpu": None},
        {**common, "metric": "training_tokens_per_s", "value": round(tokens / step_ms * 1000 * world, 1),
         "unit": "tokens/s", "gpu": None},
    ]  # fmt: skip
    for r in ranks:
        where = {"gpu": r["local_rank"], "node_rank": r["node_rank"], "hostname": r["hostname"]}
        out.append({**common, **where, "metric": "training_solo_tokens_per_s",
                    "value": round(tokens / r["solo_ms_median"] * 1000, 1), "unit": "tokens/s"})  # fmt: skip
        if r["peak_memory_gib"] is not None:
            out.append({**common, **where, "metric": "training_peak_memory_gib",
                        "value": round(r["peak_memory_gib"], 3), "unit": "GiB"})  # fmt: skip
    return out


def _model_record(args: argparse.Namespace, model: GPT, world: int, cuda: bool) -> dict[str, Any]:
    params = sum(p.numel() for p in model.parameters())
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda else None
    return {
        "info": "training", "probe": "training", "label": args.label, "layers": args.layers, "width": args.width,
        "heads": args.heads, "seq_len": args.seq_len, "micro_batch": args.micro_batch, "vocab": args.vocab,
        "params": params, "position_params": model.wpe.weight.numel(), "parallel": args.parallel,
        "compile": args.compile, "dtype": "bf16" if cuda else "fp32", "attention": "sdpa",
        "optimizer": "adamw fused" if cuda else "adamw foreach", "warmup_steps": args.warmup_steps,
        "steps": args.steps, "world_size": world, "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        "torch": torch.__version__, "nccl_version": nccl, "backend": dist.get_backend(),
        "device_name": torch.cuda.get_device_name() if cuda else "cpu", "peak_tflops": args.peak_tflops,
    }  # fmt: skip


def main() -> int:
    args = _arguments()
    cuda = args.device == "cuda"
    world, local = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    wait = timedelta(seconds=args.init_timeout_s)
    if cuda:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device, timeout=wait)
        torch.backends.cuda.matmul.allow_tf32 = True
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=wait)
    torch.manual_seed(1234)  # the same initial weights on every rank
    model = GPT(args.layers, args.width, args.heads, args.seq_len, args.vocab).to(device)
    batch = torch.Generator(device="cpu").manual_seed(1234 + dist.get_rank())
    shape = (args.micro_batch, args.seq_len)
    tokens = torch.randint(0, args.vocab, shape, generator=batch).to(device)
    targets = torch.randint(0, args.vocab, shape, generator=batch).to(device)
    if dist.get_rank() == 0:
        print(json.dumps(_model_record(args, model, world, cuda)), flush=True)
    dist.barrier()
    try:
        solo = solo_ms(model, tokens, targets, args.solo_steps, cuda)
        dist.barrier()
        times, losses = train(_wrap(model, args, device, cuda), tokens, targets, args, cuda)
    except torch.cuda.OutOfMemoryError as exc:
        said = f"out of memory at micro-batch {args.micro_batch} (lower training.micro_batch): {exc}"[:500]
        emit({"gpu": local, "error": said})
        return 1
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, _rank_record(args, times, losses, solo, cuda))
    if dist.get_rank() == 0:
        for record in [*gathered, *_figures(args, gathered, world)]:
            print(json.dumps(record), flush=True)
    dist.barrier()
    finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
