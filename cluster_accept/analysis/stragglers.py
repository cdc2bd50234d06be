"""Stragglers confirmed before rejection: a GPU or node far below its peers is measured again, alone, and its
row says whether the shortfall persisted. Pure: the stage runs the re-measurement, this judges it.

The straggler floor is the one the stage used (the peers' median of the same profile, less
``straggler_pct``); the re-measured figure is compared with it. A shortfall that persists stays the finding
it was ("confirmed"); one that vanished becomes ``straggler_unconfirmed``, a warning: something transient
(a co-tenant, a throttle event) slowed the GPU, and the other findings on the node say what.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import pandas as pd

from cluster_accept.analysis.probe_verdicts import MetricRule, judged_figures
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


def _floors(before: pd.DataFrame) -> Callable[[str, str, Thresholds], float | None]:
    """``floor(node, metric, limits)``: the median of the node's peers (same profile) less ``straggler_pct``.

    Each median is taken once: one pass over every figure per straggler row made confirming cost rows × N."""
    if before.empty:
        return lambda node, metric, limits: None
    if "profile" not in before.columns:
        before = before.assign(profile="")  # one profile: every figure a peer, as probe_verdicts.judge reads them
    medians = {
        key: statistics.median(float(v) for v in group["value"])
        for key, group in before.groupby(["metric", "profile"], sort=False, dropna=False)
    }
    profile_of = before.drop_duplicates("node").set_index("node")["profile"].to_dict()
    measured = set(zip(before["node"], before["metric"], strict=True))

    def floor(node: str, metric: str, limits: Thresholds) -> float | None:
        if (node, metric) not in measured:
            return None
        return medians[(metric, profile_of[node])] * (1 - limits.straggler_pct / 100)

    return floor


def _again(after: pd.DataFrame, node: str, metric: str, gpu: int | None) -> float | None:
    if after.empty:
        return None
    hit = after[(after["node"] == node) & (after["metric"] == metric)]
    if gpu is not None and "gpu" in hit.columns:
        hit = hit[hit["gpu"] == gpu]
    return float(hit["value"].iloc[0]) if not hit.empty else None


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
    nodes measured again, alone); other rows unchanged."""
    first, second = judged_figures(before, rules), judged_figures(after, rules) if not after.empty else after
    floor_of = _floors(first)
    out = []
    for row in rows:
        if row.reason != STRAGGLER or not row.item.endswith(_SUFFIX):
            out.append(row)
            continue
        metric = row.item[: -len(_SUFFIX)]
        floor = floor_of(row.node, metric, thresholds.get(row.node, Thresholds()))
        value = _again(second, row.node, metric, row.gpu)
        if floor is None or value is None:
            out.append(replace(row, detail=_said(row, "measured again alone: no figure (not confirmed)")))
        elif value < floor:
            said = _said(row, f"measured again alone: {value:.4g}, still below {floor:.4g}: confirmed")
            out.append(replace(row, detail=said))
        else:
            said = _said(row, f"measured again alone: {value:.4g}, at or above {floor:.4g}: not confirmed")
            out.append(replace(row, status=Status.WARN, reason="straggler_unconfirmed", detail=said))
    return out
