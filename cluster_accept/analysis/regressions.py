"""Regressions against a node's own history: slower than it used to be, or error counters that grew. Pure.

A node can pass its thresholds and sit inside the cluster's spread while running well below what it did
last week (a fan failing, a link retraining): scheduled checks compare each node with itself. A figure
more than ``straggler_pct`` below the node's own median over its last K runs is a regression; error
counters (NVLink CRC/replay/recovery, remapped rows, ECC) that grew since the previous run are flagged.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

import pandas as pd

from cluster_accept.analysis.probe_verdicts import MetricRule, relative_status
from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.inventory.model import Thresholds

MIN_PAST_RUNS = 2  # one earlier run is an anecdote; two make a median worth comparing with


def _fmt(value: float) -> str:
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"


def figure_regressions(
    current: pd.DataFrame,
    past: pd.DataFrame,
    thresholds: Mapping[str, Thresholds],
    rules: Mapping[str, MetricRule],
    last_k: int = 10,
) -> list[tuple[str, CheckRow]]:
    """(node, row) per node and judged figure with enough history: pass, or ``regression``.

    ``current``/``past``: key figures (run_id, node, metric, unit, value; ``past`` ordered oldest first),
    as :func:`analysis.history.key_figures` returns them.
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
        mine = past[same]["value"].tolist()[-last_k:]
        if len(mine) < MIN_PAST_RUNS:
            continue
        median = statistics.median(float(v) for v in mine)
        if median <= 0:
            continue
        limits = thresholds.get(node, Thresholds())
        pct = limits.straggler_pct
        floor = median * (1 - pct / 100)
        value = float(record["value"])
        unit = str(record.get("unit") or "")
        below = 100 * (median - value) / median
        detail = (
            f"{_fmt(value)} {unit}, {below:.1f}% below this node's own median {_fmt(median)} over its last "
            f"{len(mine)} runs ({', '.join(_fmt(float(v)) for v in mine)})"
        )
        expected = f">= {_fmt(floor)} {unit} (own median - {pct:g}%)"
        item = f"{metric}_vs_history"
        if value < floor:
            status = relative_status(rule, limits)
            out.append((node, CheckRow(rule.check, item, status, "regression", _fmt(value), expected, detail)))
        else:
            out.append((node, CheckRow(rule.check, item, Status.PASS, "ok", _fmt(value), expected, detail)))
    return out


def counter_growth(
    current: Mapping[str, Mapping[str, str]], previous: Mapping[str, Mapping[str, str]]
) -> list[tuple[str, CheckRow]]:
    """(node, row) for every counter that grew since the node's previous run.

    ``current``/``previous``: node -> {``check.counter``: value}; counters are the ``counter:`` keys of
    ``node_values`` (e.g. ``nvlink.counter:gpu0.link3.crc``). A counter that went down was reset (a reboot
    or a driver reload clears them): not a regression, and the new value is the base for the next run.
    """
    out: list[tuple[str, CheckRow]] = []
    for node in sorted(current):
        before = previous.get(node)
        if not before:
            continue
        for key in sorted(current[node]):
            if key not in before:
                continue
            try:
                now, then = int(current[node][key]), int(before[key])
            except ValueError:
                continue
            if now > then:
                check, _, counter = key.partition(".")
                detail = f"{counter.removeprefix('counter:')} went from {then} to {now} since the previous run"
                out.append(
                    (node, CheckRow(check, counter, Status.WARN, "counter_grew", str(now), f"<= {then}", detail))
                )
    return out
