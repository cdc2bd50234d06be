"""A calibration as the operator reads it: each noise of the table (:mod:`analysis.calibration`) with the relative
threshold it gives and the false rejections to expect from it per run at the cluster's size, and the
``straggler_pct``/``noise_k`` a profile could take from it. Pure.

The noise table says how much each figure varies between healthy runs; what an operator decides on is what that
does to the verdicts: a margin of ``max(straggler_pct, noise_k × cv_p95)`` below the peers' median, crossed by a
healthy figure with the normal tail's probability, times the figures of that kind a run of the whole cluster
judges (each node's GPUs for a per-GPU figure).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cluster_accept.analysis.calibration import model_key, size_tier
from cluster_accept.analysis.noise import expected_false_rejections, false_rejection_rate
from cluster_accept.analysis.probe_verdicts import MetricRule, judged_figures
from cluster_accept.analysis.thresholds_said import JUDGED_STAGES
from cluster_accept.inventory.builtin import is_auto, resolve_auto
from cluster_accept.inventory.model import Node, Profile, Thresholds
from cluster_accept.vocabulary.lazy import pandas as pd

FigureKind = tuple[str, str, str]  # (GPU model, metric, size tier): what the noise table is keyed by
_TIERS = ("", "small", "medium", "large")
FALSE_REJECTIONS_TARGET = 0.1  # per run: a healthy node rejected once in ten runs of the whole cluster at most


@dataclass(frozen=True)
class CalibratedThreshold:
    """One row of the noise table with the relative threshold it gives the nodes of one GPU model (and one
    ``straggler_pct``/``noise_k``) and what it costs per run at the cluster's size."""

    gpu_model: str
    metric: str
    size_tier: str
    runs: int
    figures: int
    cv_median: float
    cv_p95: float
    straggler_pct: float
    noise_k: float
    margin_pct: float  # max(straggler_pct, noise_k × cv_p95 in percent)
    nodes: int  # the cluster's nodes of this GPU model and these thresholds
    comparisons: int  # figures of this kind the whole cluster's run judges against their peers
    expected_false_rejections: float  # per run, healthy figures of noise cv_p95 crossing the margin

    def record(self) -> dict[str, Any]:
        return asdict(self)


def calibration_figures(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """The A=A runs' measurements as the noise table reads them: one figure per run each, measured as the run
    measured it. A figure measured once more without suspected settings (a stage ``…:without-suspects``) is a
    different measurement and left out; a multi-node figure (its ``node`` the group's first) is told apart by its
    group, a training figure by its model, both folded into ``label``."""
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=["run_id", "node", "gpu", "metric", "size", "label", "value"])
    df = pd.concat(frames, ignore_index=True)
    if "stage" in df.columns:
        df = df[~df["stage"].astype(str).str.contains(":", regex=False)]
    parts = [df[c].fillna("").astype(str) if c in df.columns else "" for c in ("label", "group", "model")]
    df = df.assign(label=parts[0] + " " + parts[1] + " " + parts[2])
    df = df.assign(label=df["label"].str.strip())
    key = [c for c in ("run_id", "node", "gpu", "metric", "size", "label") if c in df.columns]
    return df.drop_duplicates(subset=key, keep="first").reset_index(drop=True)


def figures_per_node(
    figures: pd.DataFrame, rules: Mapping[str, MetricRule], model_of: Mapping[str, str]
) -> dict[FigureKind, float]:
    """How many figures of each kind one node has judged against its peers in one run (its GPUs for a per-GPU
    figure; a collective at its largest size only), the mean over the runs and nodes that measured it."""
    counts: Counter[tuple[FigureKind, str, str]] = Counter()
    if figures.empty or "stage" not in figures.columns:
        return {}
    judged_stages = figures[figures["stage"].isin(JUDGED_STAGES)]
    for _, group in judged_stages.groupby(["run_id", "stage"], sort=True):
        judged = judged_figures(group, rules)
        sizes = judged["size"] if "size" in judged.columns else [None] * len(judged)
        for run, node, metric, size in zip(judged["run_id"], judged["node"], judged["metric"], sizes, strict=True):
            kind = (model_of.get(str(node), ""), str(metric), size_tier(None if pd.isna(size) else size, str(metric)))
            counts[(kind, str(run), str(node))] += 1
    per_kind: dict[FigureKind, list[int]] = {}
    for (kind, _, _), count in counts.items():
        per_kind.setdefault(kind, []).append(count)
    return {kind: sum(found) / len(found) for kind, found in per_kind.items()}


def calibrated_thresholds(
    table: pd.DataFrame, per_node: Mapping[FigureKind, float], cluster: Mapping[str, tuple[str, Thresholds]]
) -> list[CalibratedThreshold]:
    """Each row of the noise table with its threshold, per set of thresholds its GPU model's nodes have.
    ``per_node``: figures of each kind one node judges a run (:func:`figures_per_node`); ``cluster``: each of the
    cluster's nodes (the inventory's tested nodes, not only the calibrated ones) with its GPU model and
    thresholds."""
    found = []
    for row in table.to_dict("records"):
        model, cv = str(row["gpu_model"]), float(row["cv_p95"])
        limits = Counter((t.straggler_pct, t.noise_k) for m, t in cluster.values() if m == model)
        kind = (model, str(row["metric"]), str(row["size_tier"]))
        for (straggler_pct, k), nodes in sorted(limits.items()) or [((Thresholds().straggler_pct, 3.0), 0)]:
            margin = max(straggler_pct, 100 * k * cv)
            comparisons = round(nodes * per_node.get(kind, 0.0))
            found.append(
                CalibratedThreshold(
                    gpu_model=model,
                    metric=kind[1],
                    size_tier=kind[2],
                    runs=int(row["runs"]),
                    figures=int(row["figures"]),
                    cv_median=float(row["cv_median"]),
                    cv_p95=cv,
                    straggler_pct=straggler_pct,
                    noise_k=k,
                    margin_pct=margin,
                    nodes=nodes,
                    comparisons=comparisons,
                    expected_false_rejections=expected_false_rejections(margin, cv, comparisons),
                )
            )
    return found


def resolved_profiles(nodes: Sequence[Node], checks: pd.DataFrame) -> dict[str, Profile]:
    """Each node's profile as a run judged it. A ``profile: auto`` node's is the built-in profile of the GPU model
    its preflight read (the ``profile``/``auto`` row that passed names that one model in ``observed``), resolved
    again the run's way (:func:`inventory.builtin.resolve_auto`; the fabric it also lays under a profile changes
    neither its GPU nor its thresholds); an ``auto`` node no run resolved takes the profile most nodes of its
    profile name resolved to, else keeps its own. Any other node's profile is the inventory's."""
    read: dict[str, str] = {}
    if not checks.empty:
        picked = checks[(checks["check"] == "profile") & (checks["item"] == "auto") & (checks["status"] == "pass")]
        read = {str(n): str(o) for n, o in zip(picked["node"], picked["observed"], strict=True) if o}
    found: dict[str, Profile] = {}
    by_name: dict[str, list[Profile]] = {}
    for node in nodes:
        if is_auto(node.profile) and node.name in read:
            choice = resolve_auto(node.profile, [read[node.name]])
            if choice.problem is None:
                found[node.name] = choice.profile
                by_name.setdefault(node.profile_name, []).append(choice.profile)
    for node in nodes:
        if node.name not in found:
            peers = by_name.get(node.profile_name) if is_auto(node.profile) else None
            found[node.name] = _most_common(peers) if peers else node.profile
    return found


def _most_common(profiles: list[Profile]) -> Profile:
    keys = Counter(model_key(p) for p in profiles)
    top = keys.most_common(1)[0][0]
    return next(p for p in profiles if model_key(p) == top)


def key_rows(table: pd.DataFrame, gpu_model: str, rules: Mapping[str, MetricRule]) -> pd.DataFrame:
    """The noise table's rows a profile for ``gpu_model`` judges relatively: metrics a probe judges, a swept
    collective at its largest size tier only (where it is judged)."""
    if table.empty:
        return table
    df = table[(table["gpu_model"] == gpu_model) & table["metric"].isin(list(rules))]
    swept = df["metric"].astype(str).str.endswith("_busbw_gbps")
    rank = df["size_tier"].map(lambda tier: _TIERS.index(str(tier)) if str(tier) in _TIERS else 0)
    largest = rank.groupby(df["metric"]).transform("max")
    return df[~swept | (rank == largest)]


@dataclass(frozen=True)
class SuggestedLimits:
    """A profile's ``straggler_pct`` and ``noise_k`` read off a calibration, and why."""

    straggler_pct: float
    noise_k: float
    reason: str


def suggest_limits(
    rows: Sequence[CalibratedThreshold], default: Thresholds, target: float = FALSE_REJECTIONS_TARGET
) -> SuggestedLimits | None:
    """Where every key figure's calibrated margin exceeds ``default.straggler_pct`` (a shortfall past it can only
    be inconclusive, a warning, on every one of them): ``noise_k``, the smallest (in steps of 0.5 from the
    default) that keeps the false rejections to expect per run at the cluster's size within ``target``, and
    ``straggler_pct``, the smallest margin at that ``noise_k`` (rounded down to 0.1), so that a shortfall inside
    every figure's noise passes. None where some key figure's margin is ``straggler_pct`` itself."""
    if not rows or any(100 * r.noise_k * r.cv_p95 <= default.straggler_pct for r in rows):
        return None
    comparisons = sum(r.comparisons for r in rows)
    k = default.noise_k
    while k < 10 and comparisons * false_rejection_rate(100 * k, 1.0) > target:
        k = min(10.0, k + 0.5)
    smallest = min(rows, key=lambda r: r.cv_p95)
    straggler = min(100.0, math.floor(1000 * k * smallest.cv_p95) / 10)
    expected = comparisons * false_rejection_rate(100 * k, 1.0)
    reason = (
        f"every key figure's calibrated margin exceeds straggler_pct {default.straggler_pct:g}% (the smallest: "
        f"{smallest.metric}{f' ({smallest.size_tier})' if smallest.size_tier else ''}, {k:g} × noise p95 "
        f"{100 * smallest.cv_p95:.1f}%), so a shortfall under {straggler:g}% could only be called inconclusive: "
        f"straggler_pct {straggler:g} passes it instead; noise_k {k:g} keeps the false rejections to expect at "
        f"{comparisons} figures judged a run to {expected:.2g} a run (at most {target:g})"
    )
    return SuggestedLimits(straggler, k, reason)
