"""What each relative threshold of a run rests on: the margin a figure must fall below its peers' median by, the
noise that set it and the false rejections to expect from it per run. Pure.

A margin of "5 % below the median" says nothing of its error rate: that depends on how much the figure varies
between healthy runs and on how many figures are judged against it. Beside each relative threshold the report
states the noise it rests on (the cluster's calibration, ``cluster-accept calibrate``, or, where none measured
the figure, this run's peers' own spread) and the expected false rejections per run, the figures judged times
the normal tail beyond the margin (:mod:`analysis.noise`), so that a reader can tell a threshold that rejects a
healthy node every other run from one that does so once in a thousand.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from cluster_accept.analysis.calibration import NoiseTable, model_key, size_tier
from cluster_accept.analysis.noise import call, expected_false_rejections, robust_cv
from cluster_accept.analysis.probe_verdicts import MetricRule, judged_figures
from cluster_accept.inventory.model import Profile, Thresholds
from cluster_accept.vocabulary.lazy import pandas as pd

# The stages whose figures are judged against their peers' median (the multi-node stage judges groups its own way;
# a figure measured again without suspected settings is judged against its first measurement, not its peers).
JUDGED_STAGES = ("single-node", "burn")


@dataclass(frozen=True)
class ThresholdSaid:
    """One relative threshold of a run: the figures of one metric, stage, profile and size tier judged against
    their peers' median, the margin they were judged by and what it rests on."""

    stage: str
    metric: str
    profile: str
    gpu_model: str  # what the calibration is keyed by (:func:`analysis.calibration.model_key`)
    size_tier: str
    straggler_pct: float
    noise_k: float
    noise_pct: float | None  # the largest noise known for these figures, as a percentage; None: none known
    noise_source: str
    margin_pct: float  # max(straggler_pct, noise_k × noise_pct): the shortfall that is called below
    comparisons: int  # figures judged against this margin in this run
    expected_false_rejections: float | None  # per run, for healthy figures of that noise; None: no noise known

    def record(self) -> dict[str, Any]:
        return asdict(self)


def peers_source(count: int) -> str:
    return f"this run's peers' spread (robust CV of {count} figures)"


def run_thresholds(
    measurements: pd.DataFrame,
    rules: Mapping[str, MetricRule],
    profiles: Mapping[str, Profile],
    table: NoiseTable | None = None,
) -> list[ThresholdSaid]:
    """The relative thresholds of a run's figures (``measurements``: the measurements table's columns), as the
    judgement takes them (:func:`analysis.probe_verdicts.judge`): per stage, peers of one profile and metric,
    each figure's margin from the largest of their spread and the calibration's noise of its size tier."""
    found: list[ThresholdSaid] = []
    if measurements.empty:
        return found
    for stage in JUDGED_STAGES:
        figures = judged_figures(measurements[measurements["stage"] == stage], rules)
        if figures.empty:
            continue
        if "profile" not in figures.columns:
            figures = figures.assign(profile="")
        for (profile, metric), group in figures.groupby(["profile", "metric"], sort=True):
            found += _peer_group(stage, str(profile), str(metric), group, profiles, table)
    return found


def _peer_group(
    stage: str,
    profile_name: str,
    metric: str,
    group: pd.DataFrame,
    profiles: Mapping[str, Profile],
    table: NoiseTable | None,
) -> list[ThresholdSaid]:
    """One peer group's thresholds, one per size tier; none where the figures have no peer to compare with (one
    figure, or a median of zero: the judgement then compares nothing)."""
    values = [float(v) for v in group["value"]]
    if len(values) < 2 or statistics.median(values) <= 0:
        return []
    peers = robust_cv(values, peers_source(len(values)))
    profile = profiles.get(str(group["node"].iloc[0]))
    limits = profile.thresholds if profile is not None else Thresholds()
    model = model_key(profile) if profile is not None else ""
    sizes = [None if pd.isna(s) else s for s in group["size"]] if "size" in group.columns else [None] * len(values)
    tiers = [size_tier(s, str(group["metric"].iloc[0])) for s in sizes]
    out = []
    for tier in sorted(set(tiers)):
        size = sizes[tiers.index(tier)]
        calibrated = table.noise(model, metric, size) if table is not None and profile is not None else None
        margin = call(1.0, 1.0, limits.straggler_pct, (peers, calibrated), limits.noise_k)
        noise, count = margin.noise, tiers.count(tier)
        out.append(
            ThresholdSaid(
                stage=stage,
                metric=metric,
                profile=profile_name,
                gpu_model=model,
                size_tier=tier,
                straggler_pct=limits.straggler_pct,
                noise_k=limits.noise_k,
                noise_pct=margin.noise_pct if noise is not None else None,
                noise_source=noise.source if noise is not None else "none known: under three peers, no calibration",
                margin_pct=margin.margin_pct,
                comparisons=count,
                expected_false_rejections=(
                    expected_false_rejections(margin.margin_pct, noise.cv, count) if noise is not None else None
                ),
            )
        )
    return out
