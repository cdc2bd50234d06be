"""Stragglers confirmed before rejection: a GPU or node far below its peers is measured again, alone, and its
row says whether the shortfall persisted. Pure: the stage runs the re-measurement, this judges it.

The re-measured figure is compared with the median the stage used (the peers' of the same profile), beyond the
larger of ``straggler_pct`` and the figure's noise (:mod:`analysis.noise`): the peers' spread (four healthy
nodes measuring 1,713 to 63,180 leave nothing to call), the calibration's, its repeats'. A shortfall that
persists beyond the noise stays the finding it was ("confirmed"); one inside the noise becomes ``inconclusive``;
one that vanished becomes ``straggler_unconfirmed``, a warning: something transient (a co-tenant, a throttle
event) slowed the GPU, and the other findings on the node say what.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from cluster_accept.analysis.noise import Call, Noise, call, floor_of, robust_cv
from cluster_accept.analysis.probe_verdicts import (
    INCONCLUSIVE,
    MetricRule,
    figure_noises,
    judged_figures,
    typical_repeats,
)
from cluster_accept.checks.base import NodeRow, Status
from cluster_accept.inventory.model import Thresholds

STRAGGLER = "straggler"
_SUFFIX = "_vs_cluster"


def flagged(rows: Sequence[NodeRow]) -> dict[str, set[str]]:
    """Nodes with a straggler row, and the checks that flagged them: what to measure again."""
    found: dict[str, set[str]] = {}
    for row in rows:
        if row.reason == STRAGGLER:
            found.setdefault(row.node, set()).add(row.check)
    return found


@dataclass(frozen=True)
class _Reference:
    """What a straggler was judged against: its peers' median (same profile) and their spread."""

    median: float
    spread: Noise | None
    typical: float | None  # the peers' median repeat spread (probe_verdicts.typical_repeats)


def _references(before: pd.DataFrame, rules: Mapping[str, MetricRule]) -> Callable[[str, str], _Reference | None]:
    """``reference(node, metric)``: the median of the node's peers (same profile) and their spread, as the
    stage's judgement took them.

    Each median is taken once: one pass over every figure per straggler row made confirming cost rows × N."""
    if before.empty:
        return lambda node, metric: None
    if "profile" not in before.columns:
        before = before.assign(profile="")  # one profile: every figure a peer, as probe_verdicts.judge reads them
    references = {}
    for (metric, profile), group in before.groupby(["metric", "profile"], sort=False, dropna=False):
        values = [float(v) for v in group["value"]]
        rule = rules.get(str(metric))
        what = f"{len(values)} {'GPUs' if rule is not None and rule.per_gpu else 'nodes'}"
        references[(metric, profile)] = _Reference(
            statistics.median(values), robust_cv(values, f"the peers' spread, {what}"), typical_repeats(group)
        )
    profile_of = before.drop_duplicates("node").set_index("node")["profile"].to_dict()
    measured = set(zip(before["node"], before["metric"], strict=True))

    def reference(node: str, metric: str) -> _Reference | None:
        if (node, metric) not in measured:
            return None
        return references[(metric, profile_of[node])]

    return reference


def _record(figures: pd.DataFrame, node: str, metric: str, gpu: int | None) -> dict[Any, Any] | None:
    """The figure's row (node, metric, GPU) of a stage's figures, or None."""
    if figures.empty:
        return None
    hit = figures[(figures["node"] == node) & (figures["metric"] == metric)]
    if gpu is not None and "gpu" in hit.columns:
        hit = hit[hit["gpu"] == gpu]
    return hit.iloc[0].to_dict() if not hit.empty else None


def _said(row: NodeRow, again: str) -> str:
    return f"{row.detail}; {again}" if row.detail else again


def confirm(
    rows: Sequence[NodeRow],
    before: pd.DataFrame,
    after: pd.DataFrame,
    rules: Mapping[str, MetricRule],
    thresholds: Mapping[str, Thresholds],
) -> list[NodeRow]:
    """``rows`` with each straggler row re-judged on its re-measured figure (``after``: the figures of the
    nodes measured again, alone); other rows unchanged. The noises are those the stage's judgement read: the
    peers' spread, the calibration, the figure's repeats (:func:`probe_verdicts.figure_noises`); the gap between
    the two measurements is not one of them (a GPU that measures 1,713 then 3,884 among peers at 5,500 is slow
    both times, however much it wobbles)."""
    first, second = judged_figures(before, rules), judged_figures(after, rules) if not after.empty else after
    reference_of = _references(first, rules)
    out = []
    for row in rows:
        if row.reason != STRAGGLER or not row.item.endswith(_SUFFIX):
            out.append(row)
            continue
        metric = row.item[: -len(_SUFFIX)]
        reference = reference_of(row.node, metric)
        again = _record(second, row.node, metric, row.gpu)
        if reference is None or again is None:
            out.append(replace(row, detail=_said(row, "measured again alone: no figure (not confirmed)")))
            continue
        limits = thresholds.get(row.node, Thresholds())
        value, was = float(again["value"]), _record(first, row.node, metric, row.gpu) or {}
        calibration = {key: was.get(key) for key in ("calibrated_cv", "calibrated_source")}
        noises = [reference.spread, *figure_noises({**again, **calibration}, reference.typical)]
        judged = call(value, reference.median, limits.straggler_pct, noises, limits.noise_k)
        out.append(_rejudged(row, value, reference.median, judged))
    return out


def _rejudged(row: NodeRow, value: float, median: float, judged: Call) -> NodeRow:
    """The straggler row after its figure was measured again: confirmed beyond the noise, inconclusive inside
    it (a warning), unconfirmed when it came back within ``straggler_pct``."""
    floor = floor_of(median, judged.margin_pct)
    if judged.outcome == "below":
        margin = f" (median less {judged.margin_said()})" if judged.widened else ""
        return replace(
            row, detail=_said(row, f"measured again alone: {value:.4g}, still below {floor:.4g}{margin}: confirmed")
        )
    if judged.outcome == "inconclusive":
        said = _said(row, f"measured again alone: {value:.4g}; {judged.inconclusive_said()}: not confirmed")
        return replace(row, status=Status.WARN, reason=INCONCLUSIVE, detail=said)
    said = _said(
        row,
        f"measured again alone: {value:.4g}, at or above {floor_of(median, judged.straggler_pct):.4g}: not confirmed",
    )
    return replace(row, status=Status.WARN, reason="straggler_unconfirmed", detail=said)
