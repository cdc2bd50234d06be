"""Regressions against a node's own history: slower than it used to be, or error counters that grew. Pure.

A node can pass its thresholds and sit inside the cluster's spread while running well below what it did
last week (a fan failing, a link retraining): scheduled checks compare each node with itself. A figure
more than ``straggler_pct`` below the node's own median over its last K runs is a regression; error
counters (NVLink CRC/replay/recovery, remapped rows, ECC) that grew since the previous run are flagged, and so
are those whose growth cannot be told (cleared since, stopped at their maximum, not a count).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

import pandas as pd

from cluster_accept.analysis.probe_verdicts import MetricRule, relative_status
from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.inventory.model import Thresholds
from cluster_accept.vocabulary.secrets import masked_quote

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
        then_shown, now_shown = masked_quote(then_text, _SHOWN_CHARS), masked_quote(now_text, _SHOWN_CHARS)
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
