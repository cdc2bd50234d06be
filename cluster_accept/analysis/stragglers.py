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

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from cluster_accept.analysis.noise import MAD_TO_SIGMA, Call, Noise, call, floor_of, robust_cv
from cluster_accept.analysis.probe_verdicts import (
    INCONCLUSIVE,
    MetricRule,
    figure_noises,
    judged_figures,
    relative_status,
    typical_repeats,
)
from cluster_accept.checks.base import NodeRow, Status
from cluster_accept.inventory.model import Thresholds

STRAGGLER = "straggler"
_SUFFIX = "_vs_cluster"


AGAIN = frozenset({STRAGGLER, INCONCLUSIVE})  # the rows against peers a second measurement decides
ROUNDS = 3  # paired rounds: the suspects and the controls measured again, back to back, this many times
CONTROLS = 3  # healthy nodes measured in each round: two or more tell how far healthy nodes sit apart in them


def flagged(rows: Sequence[NodeRow]) -> dict[str, set[str]]:
    """Nodes with a straggler or inconclusive row against their peers, and the checks that flagged them: what to
    measure again."""
    found: dict[str, set[str]] = {}
    for row in rows:
        if row.reason in AGAIN and row.item.endswith(_SUFFIX):
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
    beside: Mapping[str, Sequence[str]] | None = None,
) -> list[NodeRow]:
    """``rows`` with each straggler or inconclusive row against its peers re-judged on its figure measured again
    (``after``: the flagged nodes' figures and those of the nodes measured with them, ``beside`` each suspect —
    the other suspects of its group and the controls —, in ``round`` 0, 1, …); other rows unchanged.

    Beside other nodes, each round's figure is taken against the median of theirs in the same round: a load or
    throttle that came and went is seen on them too, so what is left is the node's own. The noise is then the
    standard error of the rounds' mean (their spread over √rounds), the calibration's, the repeats' and how far
    healthy nodes sit apart: beside two nodes or more, how far those sit apart from each other in the same rounds
    (the stage's spread holds the drift in time the rounds take out; a slow one among them is one far figure); beside
    one, the peers' spread of the stage, since no re-measurement of one node beside one other can tell a node
    persistently a little slower (a shared machine's load falling unevenly) from a straggler. Measured again
    alone, the first round's figure is compared with the median as it was, with the same noises but the
    rounds'."""
    first, second = judged_figures(before, rules), judged_figures(after, rules) if not after.empty else after
    reference_of = _references(first, rules)
    out = []
    for row in rows:
        metric = row.item.removesuffix(_SUFFIX)
        if row.reason not in AGAIN or not row.item.endswith(_SUFFIX):
            out.append(row)
            continue
        reference = reference_of(row.node, metric)
        rounds = _rounds(second, row.node, metric, row.gpu)
        if reference is None or not rounds:
            out.append(replace(row, detail=_said(row, "measured again alone: no figure (not confirmed)")))
            continue
        limits = thresholds.get(row.node, Thresholds())
        was = _record(first, row.node, metric, row.gpu) or {}
        calibration = {key: was.get(key) for key in ("calibrated_cv", "calibrated_source")}
        noises = [*figure_noises({**rounds[0], **calibration}, reference.typical)]
        others = (beside or {}).get(row.node, ())
        paired = _paired(second, others, metric, rounds, reference.median) if others else None
        if paired is None:
            value, said = float(rounds[0]["value"]), f"measured again alone: {float(rounds[0]['value']):.4g}"
            noises.append(reference.spread)
        else:
            value, said = paired.value, paired.said
            apart = _below(paired.apart, limits.noise_k) if paired.apart is not None else reference.spread
            noises += [paired.rounds, apart]
        judged = call(value, reference.median, limits.straggler_pct, noises, limits.noise_k)
        rule = rules.get(metric)
        below = relative_status(rule, limits) if rule is not None else Status.FAIL
        out.append(_rejudged(row, said, reference.median, judged, below))
    return out


def _rounds(figures: pd.DataFrame, node: str, metric: str, gpu: int | None) -> list[dict[Any, Any]]:
    """The figure's rows measured again, one per round, in round order."""
    if figures.empty:
        return []
    if "round" not in figures.columns:
        found = _record(figures, node, metric, gpu)
        return [found] if found is not None else []
    return [
        found
        for _, group in figures.groupby("round", sort=True)
        if (found := _record(group, node, metric, gpu)) is not None
    ]


def _node_figure(figures: pd.DataFrame, node: str, metric: str) -> float | None:
    """A node's figure of ``metric``: the median over its GPUs."""
    hit = figures[(figures["node"] == node) & (figures["metric"] == metric)] if not figures.empty else figures
    return float(statistics.median(float(v) for v in hit["value"])) if not hit.empty else None


@dataclass(frozen=True)
class _Paired:
    """A suspect's paired rounds: its figure against the others' of the same rounds, at the peers' median."""

    value: float
    rounds: Noise | None  # the standard error of the rounds' mean
    apart: Noise | None  # how far the others sit apart in the same rounds (two others or more)
    said: str


def _beside_by_round(
    second: pd.DataFrame, beside: Sequence[str], metric: str, rounds: list[dict[Any, Any]]
) -> tuple[list[str], list[list[float]]]:
    """The nodes of ``beside`` with a positive figure in every round the suspect has, and their figures round by
    round (in that order)."""
    same = [second[second["round"] == suspect["round"]] for suspect in rounds]
    figures = {node: [_node_figure(frame, node, metric) for frame in same] for node in beside}
    kept = [node for node, values in figures.items() if all(v is not None and v > 0 for v in values)]
    return kept, [[float(figures[node][i] or 0.0) for node in kept] for i in range(len(rounds))]


def _paired(
    second: pd.DataFrame, beside: Sequence[str], metric: str, rounds: list[dict[Any, Any]], median: float
) -> _Paired | None:
    """The suspect's rounds against the figures of the nodes measured with it (``beside``: the other suspects and
    the controls) in the same rounds, their median each round, as a figure at the peers' ``median``; None where no
    other node has a figure in each of its rounds."""
    if "round" not in second.columns:
        return None
    others, by_round = _beside_by_round(second, beside, metric, rounds)
    if not others:
        return None
    medians = [statistics.median(c) for c in by_round]
    ratios = [float(r["value"]) / m for r, m in zip(rounds, medians, strict=True)]
    mean = statistics.fmean(ratios)
    noise = None
    if len(ratios) >= 2 and mean > 0:  # the noise of their mean: the rounds' spread over √rounds
        error = statistics.stdev(ratios) / mean / math.sqrt(len(ratios))
        noise = Noise(error, f"the mean of its {len(ratios)} paired rounds (their spread / √{len(ratios)})")
    values = ", ".join(f"{float(r['value']):.4g}" for r in rounds)
    theirs = ", ".join(f"{m:.4g}" for m in medians)
    said = (
        f"measured again {len(rounds)} time(s) beside {', '.join(others)}: {values} against their median {theirs}, "
        f"{mean:.3f} of theirs: {median * mean:.4g} at the peers' median"
    )
    return _Paired(median * mean, noise, _apart(by_round, others), said)


def _apart(by_round: list[list[float]], others: Sequence[str]) -> Noise | None:
    """How far healthy nodes sit apart under the rounds' own conditions: each other node's figure against the
    median of the rest in its round (log), robustly over every round (1.4826 × the median distance), so that one
    slow node among them is one far figure and not the spread; None under two others. Against the rest rather
    than all of them, a node is never compared with itself: two of three agreeing by chance leave the third's
    distance in the figure."""
    if len(others) < 2 or not by_round:
        return None
    distances = [
        abs(math.log(figure / statistics.median(figures[:i] + figures[i + 1 :])))
        for figures in by_round
        for i, figure in enumerate(figures)
    ]
    source = f"how far {', '.join(others)} sit apart in the same {len(by_round)} round(s)"
    return Noise(MAD_TO_SIGMA * statistics.median(distances), source)


def _below(spread: Noise, k: float) -> Noise:
    """A spread of log figures (σ) as the relative noise whose ``k``-fold margin reaches as far below: ``k`` σ in
    log figures is ``1 − e^(−k σ)`` below (a node at half its peers is as far from them as one at double), so a
    wide spread still leaves a node several times slower told, where ``k`` σ read as a share would pass 100 %."""
    return Noise((1 - math.exp(-k * spread.cv)) / k, f"{spread.source}: σ {100 * spread.cv:.1f}% of log figures")


def _rejudged(row: NodeRow, said: str, median: float, judged: Call, below: Status) -> NodeRow:
    """The row after its figure was measured again (``said``): a straggler (status ``below``) beyond the noise,
    inconclusive inside it (a warning), unconfirmed when it came back within ``straggler_pct``."""
    floor = floor_of(median, judged.margin_pct)
    if judged.outcome == "below":
        margin = f" (median less {judged.margin_said()})" if judged.widened else ""
        detail = _said(row, f"{said}, still below {floor:.4g}{margin}: confirmed")
        return replace(row, status=below, reason=STRAGGLER, detail=detail)
    if judged.outcome == "inconclusive":
        detail = _said(row, f"{said}; {judged.inconclusive_said()}: not confirmed")
        return replace(row, status=Status.WARN, reason=INCONCLUSIVE, detail=detail)
    detail = _said(row, f"{said}, at or above {floor_of(median, judged.straggler_pct):.4g}: not confirmed")
    return replace(row, status=Status.WARN, reason="straggler_unconfirmed", detail=detail)
