"""The training probe's arithmetic: model presets, parameters, FLOPs per token, GPU peaks and MFU. Pure.

Clusters are accepted by training throughput (tokens/s per GPU, MFU, scaling efficiency); every figure here is
computed from the model's shape and the measured tokens/s, never read from a vendor tool, so the report can
say exactly how it was counted.

FLOPs per token (PaLM, appendix B): ``6 * N + 12 * L * d * s`` for a training step (forward and backward) —
``N`` the parameters that multiply (every parameter but the learned position embedding, a lookup; the tied
token embedding counts once, as the output projection it also is), ``L`` layers, ``d`` width, ``s`` sequence:
the second term is attention's score and value products, counted in full as PaLM does (a causal kernel skips
about half of them; MFU stays comparable with published figures that count them).

MFU = tokens/s per GPU × FLOPs per token ÷ the GPU's dense bf16 peak (no sparsity), from :data:`PEAK_BF16_TFLOPS`
by device name or the profile's ``training.peak_tflops``.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cluster_accept.analysis.noise import NOISE_K, robust_cv
from cluster_accept.analysis.scaling import TrainingScalingRow
from cluster_accept.inventory.shapes import ModelShape
from cluster_accept.probes.contract import Figure


def parameters(shape: ModelShape) -> tuple[int, int]:
    """(all parameters, position-embedding parameters) of the probe's model: per layer 12·d² in its linears
    (QKV 3d², output d², MLP 8d², no biases) and 4·d in its two LayerNorms; the tied token embedding V·d, the
    position embedding s·d and the final LayerNorm's 2·d."""
    d = shape.width
    total = shape.layers * (12 * d * d + 4 * d) + shape.vocab * d + shape.seq_len * d + 2 * d
    return total, shape.seq_len * d


def flops_per_token(params: int, position_params: int, layers: int, width: int, seq_len: int) -> float:
    """Training FLOPs per token: 6·N (N without the position embedding) + 12·L·d·s (attention)."""
    return 6.0 * (params - position_params) + 12.0 * layers * width * seq_len


FLOP_FORMULA = "6*N + 12*L*d*s per token (N: parameters but the position embedding; PaLM, attention counted in full)"

# Dense bf16 tensor-core peaks, TFLOP/s, by a piece of the name torch reports. More specific names first.
PEAK_BF16_TFLOPS: Sequence[tuple[str, float]] = (
    ("GB200", 2500.0),
    ("B200", 2250.0),
    ("B100", 1750.0),
    ("GH200", 989.4),
    ("H200 NVL", 835.0),
    ("H200", 989.4),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.4),  # SXM: "NVIDIA H100 80GB HBM3"
    ("H800", 989.4),
    ("H20", 148.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.05),
    ("L40", 181.05),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("A10", 125.0),
)


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU by the name torch reports; None when it is not known."""
    for piece, peak in PEAK_BF16_TFLOPS:
        if piece.lower() in device_name.lower():
            return peak
    return None


def achieved_tflops(tokens_per_s_per_gpu: float, flops: float) -> float:
    return tokens_per_s_per_gpu * flops / 1e12


def mfu(tokens_per_s_per_gpu: float, flops: float, peak: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over the peak."""
    if peak <= 0:
        raise ValueError(f"a GPU peak must be positive, not {peak}")
    return achieved_tflops(tokens_per_s_per_gpu, flops) / peak


@dataclass(frozen=True)
class LossCheck:
    ok: bool
    observed: str
    detail: str


def loss_check(initial: float, first: float, last: float, finite: bool) -> LossCheck:
    """The loss on the fixed batch must stay finite and fall over the timed steps (a model that memorises one
    batch always does; one that does not computes wrongly)."""
    said = f"{first:.4g} -> {last:.4g}"
    if not finite or not all(math.isfinite(x) for x in (initial, first, last)):
        return LossCheck(False, said, f"a loss was not finite (initial {initial:.4g}): NaN or Inf in training")
    if not last < first:
        return LossCheck(False, said, f"the loss did not fall over the timed steps (initial {initial:.4g})")
    return LossCheck(True, said, f"initial {initial:.4g}")


@dataclass(frozen=True)
class SlowRank:
    label: str  # where it is: "gpu 3" or "node007 gpu 3"
    solo_ms: float
    median_ms: float
    slow: bool  # beyond the margin and the ranks' spread
    margin_pct: float = 0.0  # the overrun that counts: max(straggler_pct, noise_k × the ranks' spread)
    inconclusive: bool = False  # beyond straggler_pct, inside the ranks' spread

    @property
    def over_pct(self) -> float:
        return 100 * (self.solo_ms - self.median_ms) / self.median_ms if self.median_ms > 0 else 0.0


def slowest_rank(solo_ms: dict[str, float], margin_pct: float, noise_k: float = NOISE_K) -> SlowRank | None:
    """The rank whose own forward+backward is slowest, and whether it is more than ``margin_pct`` — and
    ``noise_k`` times the ranks' own spread (three ranks or more) — slower than the ranks' median (every step
    waits for it); an overrun past ``margin_pct`` inside the spread is inconclusive. None with fewer than two
    ranks: nothing to compare."""
    if len(solo_ms) < 2:
        return None
    median = statistics.median(solo_ms.values())
    spread = robust_cv(list(solo_ms.values()), f"the {len(solo_ms)} ranks' spread")
    widened = max(margin_pct, 100 * noise_k * spread.cv) if spread is not None else margin_pct
    label, worst = max(solo_ms.items(), key=lambda item: (item[1], item[0]))
    over = 100 * (worst - median) / median if median > 0 else 0.0
    return SlowRank(label, worst, median, over > widened, widened, margin_pct < over <= widened)


def model_text(info: Mapping[str, Any]) -> str:
    """The model a run trained, in one line: ``gpt 355.7M L24 d1024 h16 s2048 mb8 v50304 ddp bf16 eager``."""
    params = float(info.get("params") or 0)
    size = f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.1f}M"
    mode = "compiled" if info.get("compile") else "eager"
    return (
        f"gpt {size} L{info.get('layers')} d{info.get('width')} h{info.get('heads')} s{info.get('seq_len')} "
        f"mb{info.get('micro_batch')} v{info.get('vocab')} {info.get('parallel')} {info.get('dtype')} {mode}"
    )


_SHAPE = re.compile(r"\bL(\d+) d(\d+) h(\d+) s(\d+) mb(\d+) v(\d+)\b")


def shape_of(model: str) -> ModelShape | None:
    """The dimensions a :func:`model_text` line names (what a figure's ``model`` column holds); None when it
    names none."""
    found = _SHAPE.search(model)
    return ModelShape(*(int(g) for g in found.groups())) if found else None


def shape_flops(shape: ModelShape) -> tuple[int, float]:
    """(parameters, training FLOPs per token) of the probe's model of ``shape``."""
    params, position = parameters(shape)
    return params, flops_per_token(params, position, shape.layers, shape.width, shape.seq_len)


def info_flops(info: Mapping[str, Any]) -> float | None:
    """FLOPs per token of the model an ``info: training`` record describes; None when it lacks a dimension."""
    keys = ("params", "position_params", "layers", "width", "seq_len")
    if not all(isinstance(info.get(k), int) for k in keys):
        return None
    return flops_per_token(*(int(info[k]) for k in keys))


def info_peak(info: Mapping[str, Any]) -> float | None:
    """The peak MFU is taken against: the profile's (echoed by the probe), else the built-in one by name."""
    given = info.get("peak_tflops")
    if isinstance(given, (int, float)) and given > 0:
        return float(given)
    name = info.get("device_name")
    return peak_tflops(name) if isinstance(name, str) and name != "cpu" else None


def _run_figure(info: Mapping[str, Any], metric: str, value: float, unit: str) -> Figure:
    """A figure of the whole run the ``info: training`` record describes (its label and world size, where it
    says them as such)."""
    label, world = info.get("label"), info.get("world_size")
    label, world = label if isinstance(label, str) else None, world if type(world) is int else None
    return Figure(metric, value, probe="training", label=label, world_size=world, unit=unit)


def derived_figures(info: Mapping[str, Any], per_gpu_tokens_per_s: float) -> list[Figure]:
    """Achieved TFLOP/s per GPU, and MFU where the GPU's peak is known, from tokens/s per GPU."""
    flops = info_flops(info)
    if flops is None:
        return []
    tflops = achieved_tflops(per_gpu_tokens_per_s, flops)
    out = [_run_figure(info, "training_tflops_per_gpu", round(tflops, 3), "TFLOP/s")]
    peak = info_peak(info)
    if peak is not None:
        share = mfu(per_gpu_tokens_per_s, flops, peak)
        out.append(_run_figure(info, "training_mfu", round(share, 4), "ratio"))
    return out


def dp_efficiency(together_per_gpu: float, solo: Sequence[float]) -> float | None:
    """A node's data-parallel efficiency: tokens/s per GPU with every GPU training together over the slowest of
    the same GPUs' solo tokens/s (every step waits for the slowest GPU; what is lost beyond it is communication
    and the optimizer). None with fewer than two GPUs (no data parallelism) or no positive solo figure."""
    if len(solo) < 2 or min(solo) <= 0:
        return None
    return together_per_gpu / min(solo)


def dp_efficiency_figure(info: Mapping[str, Any], figures: Sequence[Figure]) -> list[Figure]:
    """``training_dp_efficiency`` of a node's run (tokens/s per GPU and each GPU's solo tokens/s), where it
    trained on two GPUs or more; none for a run across nodes (its efficiency is the scaling sweep's)."""
    if info.get("label") != "intra_node":
        return []
    together = next((m.value for m in figures if m.metric == "training_tokens_per_s_per_gpu"), None)
    solo = [m.value for m in figures if m.metric == "training_solo_tokens_per_s"]
    efficiency = None if together is None else dp_efficiency(together, solo)
    if efficiency is None:
        return []
    return [_run_figure(info, "training_dp_efficiency", round(efficiency, 4), "ratio")]


@dataclass(frozen=True)
class TrainingPoint:
    """One training run across ``nodes`` nodes."""

    nodes: int
    gpus: int
    tokens_per_s_per_gpu: float
    step_ms: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    group: str = ""
    transport: str | None = None
    model: str | None = None


def training_scaling(points: Sequence[TrainingPoint], efficiency_min: float | None) -> list[TrainingScalingRow]:
    """Rows by node count: tokens/s, per GPU, and the efficiency — per-GPU tokens/s at n nodes over one node's
    (None without a one-node run) — flagged under ``efficiency_min``."""
    base = next((p for p in points if p.nodes == 1), None)
    rows = []
    for p in sorted(points, key=lambda p: p.nodes):
        efficiency = p.tokens_per_s_per_gpu / base.tokens_per_s_per_gpu if base and base.tokens_per_s_per_gpu else None
        below = efficiency is not None and efficiency_min is not None and efficiency < efficiency_min - 1e-9
        rows.append(
            TrainingScalingRow(
                nodes=p.nodes,
                gpus=p.gpus,
                group=p.group,
                tokens_per_s=p.tokens_per_s_per_gpu * p.gpus,
                tokens_per_s_per_gpu=p.tokens_per_s_per_gpu,
                step_ms=p.step_ms,
                tflops_per_gpu=p.tflops_per_gpu,
                mfu=p.mfu,
                efficiency=efficiency,
                below_min=below,
                transport=p.transport,
                model=p.model,
            )
        )
    return rows
