"""What ``profile suggest`` writes from the cluster's calibration (``cluster-accept calibrate``), where the history
holds one: per key figure and size tier the noise it was measured with and the margin a run would judge it by, and,
where every key figure's noise puts its margin past the default ``straggler_pct``, the ``straggler_pct`` and
``noise_k`` to judge by instead, with why.

Without that, a profile's ``straggler_pct`` is a guess: on nodes whose figures vary by more than a third of it
between healthy runs, every shortfall past it and inside the noise is an inconclusive warning, and the margin the
run really judges by is not the one the profile says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster_accept.analysis.calibration import NoiseTable
from cluster_accept.analysis.calibration_said import (
    CalibratedThreshold,
    FigureKind,
    SuggestedLimits,
    calibrated_thresholds,
    key_rows,
    suggest_limits,
)
from cluster_accept.analysis.probe_verdicts import MetricRule
from cluster_accept.inventory.model import Thresholds
from cluster_accept.vocabulary.text import visible


@dataclass(frozen=True)
class Calibrated:
    """The cluster's latest calibration as ``profile suggest`` reads it, and the rules that say which figures a
    run judges against their peers (and whether per GPU)."""

    table: NoiseTable
    rules: Mapping[str, MetricRule]


@dataclass(frozen=True)
class ClusterShape:
    """The suggested profile's nodes as the calibration's thresholds are counted for: their GPU model as the
    calibration keys it, GPUs a node and how many nodes."""

    gpu_model: str
    gpus_per_node: int
    nodes: int
    device: str


def calibrated_rows(calibrated: Calibrated, shape: ClusterShape, limits: Thresholds) -> list[CalibratedThreshold]:
    """The calibration's key rows for the profile's GPU model, at the profile's thresholds and the nodes' count."""
    rows = key_rows(calibrated.table.frame, shape.gpu_model, calibrated.rules)
    per_node: dict[FigureKind, float] = {}
    for metric, tier in zip(rows["metric"], rows["size_tier"], strict=True):
        per_gpu = calibrated.rules[str(metric)].per_gpu and shape.device == "cuda"
        per_node[(shape.gpu_model, str(metric), str(tier))] = float(shape.gpus_per_node if per_gpu else 1)
    cluster = {f"node{i}": (shape.gpu_model, limits) for i in range(shape.nodes)}
    return calibrated_thresholds(rows, per_node, cluster)


def write_calibration(out: Any, calibrated: Calibrated, shape: ClusterShape) -> SuggestedLimits | None:
    """The calibration's comments (before ``thresholds``); the limits to write under ``thresholds``, if any."""
    limits = Thresholds()
    rows = calibrated_rows(calibrated, shape, limits)
    said = f"calibration {calibrated.table.calibrated_at} (cluster-accept calibrate)"
    if not rows:
        models = sorted({str(m) for m in calibrated.table.frame["gpu_model"]})
        out.prose(f"{said} measured no key figure of {shape.gpu_model} (it holds {', '.join(models) or 'nothing'})")
        return None
    out.prose(
        f"{said}, {shape.gpu_model}: the noise each key figure was measured with across its A=A runs and the margin "
        f"below the peers' median it is judged by, max(straggler_pct {limits.straggler_pct:g}%, noise_k "
        f"{limits.noise_k:g} × noise p95), with the false rejections to expect a run on {shape.nodes} nodes:"
    )
    for r in rows:
        tier = f" ({r.size_tier})" if r.size_tier else ""
        out.note(
            f"  {r.metric}{tier}: noise p95 {100 * r.cv_p95:.2f}% ({r.figures} figures, {r.runs} runs); margin "
            f"{r.margin_pct:.1f}%; {r.expected_false_rejections:.2g} false rejections a run of {r.comparisons} judged"
        )
    return suggest_limits(rows, limits)


def write_limits(out: Any, limits: SuggestedLimits, calibration_id: str) -> None:
    """``straggler_pct`` and ``noise_k`` under an opened ``thresholds:``, with why (the id, a file's name in the
    history, kept to one line of visible text)."""
    said = " ".join(visible(calibration_id).split())
    out.prose(limits.reason, 1)
    out.raw(f"  straggler_pct: {limits.straggler_pct:g}  # from calibration {said}")
    out.raw(f"  noise_k: {limits.noise_k:g}  # from calibration {said}")
