"""Regressions against a node's own history: slower than it used to be, or error counters that grew. Pure.

A node can pass its thresholds and sit inside the cluster's spread while running well below what it did
last week (a fan failing, a link retraining): scheduled checks compare each node with itself. A figure
below the node's own median over its last K runs by more than ``straggler_pct`` and ``noise_k`` times its noise
(its own spread over those runs, the cluster's calibration: :mod:`analysis.noise`) is a regression, one in
between is inconclusive; error
counters (NVLink CRC/replay/recovery, remapped rows, ECC) that grew since the previous run are flagged, and so
are those whose growth cannot be told (cleared since, stopped at their maximum, not a count).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

import pandas as pd

from cluster_accept.analysis.noise import Noise, call, floor_of, robust_cv
from cluster_accept.analysis.probe_verdicts import INCONCLUSIVE, MetricRule, relative_status
from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.inventory.model import Thresholds
from cluster_accept.vocabulary.text import quote

MIN_PAST_RUNS = 2  # one earlier run is an anecdote; two make a median worth comparing with


def _fmt(value: float) -> str:
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"


def figure_regressions(
    current: pd.DataFrame,
    past: pd.DataFrame,
    thresholds: Mapping[str, Thresholds],
    rules: Mapping[str, MetricRule],
    last_k: int = 10,
    calibrated: Mapping[tuple[str, str], Noise] | None = None,
) -> list[tuple[str, CheckRow]]:
    """(node, row) per node and judged figure with enough history: pass, ``regression`` beyond the figure's
    noise, ``inconclusive`` inside it.

    ``current``/``past``: key figures (run_id, node, metric, unit, value; ``past`` ordered oldest first),
    as :func:`analysis.history.key_figures` returns them; ``calibrated``: the cluster's calibrated noise by
    (node, metric), where it has one. The node's own spread over its past runs is a noise too.
    """
    out: list[tuple[str, CheckRow]] = []
    if current.empty or past.empty:
        return out
    for record in current.sort_values(["node", "metric"]).to_dict("records"):
        node, metric = str(record["node"]), str(record["metric"])
        rule = rules.get(metric)
        if rule is None:
            continue
        same = (past["node"] == node) & (past["metric"] == metric)
        if "model" in past.columns:  # a training figure is compared with the same model's only
            same &= past["model"] == str(record.get("model") or "")
        mine = [float(v) for v in past[same]["value"].tolist()[-last_k:]]
        if len(mine) < MIN_PAST_RUNS or statistics.median(mine) <= 0:
            continue
        own = robust_cv(mine, f"its own last {len(mine)} runs")
        noises = (own, (calibrated or {}).get((node, metric)))
        out.append((node, _against_history(record, mine, rule, thresholds.get(node, Thresholds()), noises)))
    return out


def _against_history(
    record: Mapping[Any, Any], mine: list[float], rule: MetricRule, limits: Thresholds, noises: tuple[Noise | None, ...]
) -> CheckRow:
    median, value = statistics.median(mine), float(record["value"])
    judged = call(value, median, limits.straggler_pct, noises, limits.noise_k)
    unit = str(record.get("unit") or "")
    detail = (
        f"{_fmt(value)} {unit}, {judged.shortfall_pct:.1f}% below this node's own median {_fmt(median)} over its "
        f"last {len(mine)} runs ({', '.join(_fmt(v) for v in mine)})"
    )
    expected = f">= {_fmt(floor_of(median, judged.margin_pct))} {unit} (own median - {judged.margin_said()})"
    item = f"{record['metric']}_vs_history"
    if judged.outcome == "below":
        return CheckRow(rule.check, item, relative_status(rule, limits), "regression", _fmt(value), expected, detail)
    if judged.outcome == "inconclusive":
        said = f"{detail}: {judged.inconclusive_said()}"
        return CheckRow(rule.check, item, Status.WARN, INCONCLUSIVE, _fmt(value), expected, said)
    return CheckRow(rule.check, item, Status.PASS, "ok", _fmt(value), expected, detail)


# Where a 32- or 64-bit counter stops: a count there at both reads may have stopped, not stayed. Narrower
# counters (InfiniBand's 4-, 8- and 16-bit ones) are judged at their maximum by the check that knows them.
COUNTER_CEILINGS = {2**32 - 1: 32, 2**64 - 1: 64}
_SHOWN_CHARS = 40  # an unreadable counter value is quoted this far


def _count(text: str) -> int | None:
    """``text`` as a count a counter can hold (0 to 2**64 - 1), else None."""
    text = text.strip()
    return int(text) if text.isdecimal() and len(text) <= 20 and int(text) < 2**64 else None


def counter_change(check: str, key: str, then_text: str, now_text: str) -> CheckRow | None:
    """The row for one counter read at the node's previous run (``then_text``) and now, or None when it stayed.

    Grown: ``counter_grew``. Gone down: it was cleared since (a reboot, a driver reload, a counter reset), so
    whether it grew before the clear cannot be told (``counter_reset``). Held at a 32- or 64-bit ceiling: it may
    have stopped counting (``counter_saturated``). A value no counter holds (not a number, negative, past 64
    bits), from the node or the history: ``counter_impossible``. None of them is read as "no growth"."""
    counter = key.removeprefix("counter:")
    now, then = _count(now_text), _count(then_text)
    if now is None or then is None:
        then_shown, now_shown = quote(then_text, _SHOWN_CHARS), quote(now_text, _SHOWN_CHARS)
        detail = (
            f"{counter} read {then_shown} at the previous run and {now_shown} now: not both counts a counter holds "
            "(0 to 2**64 - 1), so whether it grew cannot be told"
        )
        return CheckRow(check, key, Status.WARN, "counter_impossible", now_shown, "a count", detail)
    if now > then:
        detail = f"{counter} went from {then} to {now} since the previous run"
        return CheckRow(check, key, Status.WARN, "counter_grew", str(now), f"<= {then}", detail)
    if now < then:
        detail = (
            f"{counter} went down from {then} to {now} since the previous run: it was cleared since (a reboot, a "
            f"driver reload, a counter reset), so whether it grew before the clear cannot be told"
        )
        return CheckRow(check, key, Status.WARN, "counter_reset", str(now), f">= {then}", detail)
    if now in COUNTER_CEILINGS:
        detail = (
            f"{counter} reads {now} at both runs, the most a {COUNTER_CEILINGS[now]}-bit counter holds: it stopped "
            "counting there, so whether it grew cannot be told until it is cleared"
        )
        return CheckRow(check, key, Status.WARN, "counter_saturated", str(now), f"< {now}", detail)
    return None


def counter_growth(
    current: Mapping[str, Mapping[str, str]], previous: Mapping[str, Mapping[str, str]]
) -> list[tuple[str, CheckRow]]:
    """(node, row) for every counter that changed since the node's previous run, or whose change cannot be told
    (:func:`counter_change`).

    ``current``/``previous``: node -> {``check.counter``: value}; counters are the ``counter:`` keys of
    ``node_values`` (e.g. ``nvlink.counter:gpu0.link3.crc``). A counter that went down was cleared: the new value
    is the base for the next run, and this run says it cannot tell, never that nothing grew.
    """
    out: list[tuple[str, CheckRow]] = []
    for node in sorted(current):
        before = previous.get(node)
        if not before:
            continue
        for key in sorted(current[node]):
            if key not in before:
                continue
            check, _, counter = key.partition(".")
            row = counter_change(check, counter, before[key], current[node][key])
            if row is not None:
                out.append((node, row))
    return out
