"""Regressions against a node's own history: slower than it used to be, or error counters that grew. Pure.

A node can pass its thresholds and sit inside the cluster's spread while running well below what it did last week (a
fan failing, a link retraining): scheduled checks compare each node with itself. But a node's own runs are few and
as noisy as the machine: two earlier runs of a CPU GEMM 21 % apart say nothing of a third 6 % below their median. So
a figure is a ``regression`` only when it is below the node's own median over its last K runs by more than
``straggler_pct``, ``noise_k`` times its calibrated noise, and the small-sample bound of its own runs: a new run of
a figure whose n past runs have median m and standard deviation s is held to m − t(n−1) · s · √(1 + 1/n), the bound
a normal figure falls under with the chance it has of falling ``noise_k`` σ short (t(n−1): Student's t quantile at n
− 1 degrees of freedom, 19.2 at three runs and ``noise_k`` 3, 4.09 at ten). Under :data:`MIN_PAST_RUNS` earlier runs
a shortfall is ``inconclusive``, whatever its size. Then (the stage measures again) a regression is confirmed like a
straggler, measured once more beside a control node whose own figure did not move (:func:`confirmed_again`), and
when most nodes of a figure fell together it is the cluster's (or the machine's) movement, one finding with its
candidates, not a rejection of every node (:func:`moved_together`). Error counters (NVLink CRC/replay/recovery,
remapped rows, ECC) that grew since the previous run are flagged, and so are those whose growth cannot be told
(cleared since, stopped at their maximum, not a count).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from cluster_accept.analysis.noise import Noise, call, floor_of
from cluster_accept.analysis.probe_verdicts import INCONCLUSIVE, MetricRule, relative_status
from cluster_accept.analysis.suspects import stated_minimum
from cluster_accept.checks.base import CheckRow, NodeRow, Status
from cluster_accept.inventory.model import Thresholds
from cluster_accept.vocabulary.text import quote

HISTORY_SUFFIX = "_vs_history"  # a figure's row against the node's own history: ``<metric>_vs_history``
MIN_PAST_RUNS = 3  # fewer earlier runs than this: a shortfall against them is inconclusive, never a regression
MOVED = "moved_with_cluster"  # the reason of a node's row when most nodes' same figure fell together
REGRESSION = "regression"


def _fmt(value: float) -> str:
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"


def student_t_cdf(t: float, dof: int) -> float:
    """P(T ≤ t) for Student's t with ``dof`` (≥ 1) degrees of freedom, in closed form for an integer ``dof``
    (Abramowitz & Stegun 26.7.3–4): no numerical library on the controller."""
    theta = math.atan(abs(t) / math.sqrt(dof))
    cos2, term, total = math.cos(theta) ** 2, 1.0, 1.0
    for k in range(3 if dof % 2 else 2, dof - 1, 2):  # the series of cos² terms, odd and even dof alike
        term *= (k - 1) / k * cos2
        total += term
    if dof % 2:
        inside = (2 / math.pi) * (theta + (math.sin(theta) * math.cos(theta) * total if dof > 1 else 0.0))
    else:
        inside = math.sin(theta) * total
    return 0.5 + math.copysign(inside / 2, t)


def student_t_quantile(p: float, dof: int) -> float:
    """The t with P(T ≤ t) = ``p`` (0.5 < p < 1), by bisection over :func:`student_t_cdf`."""
    low, high = 0.0, 1.0
    while student_t_cdf(high, dof) < p:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if student_t_cdf(middle, dof) < p else (low, middle)
    return (low + high) / 2


def own_noise(past: Sequence[float], k: float) -> Noise | None:
    """The node's own runs as the noise a :func:`analysis.noise.call` at ``k`` reads: the small-sample bound
    t(n−1) · s · √(1 + 1/n) over its median, expressed as a σ ``k`` of which reach it; None under two runs."""
    n = len(past)
    median = statistics.median(past) if past else 0.0
    if n < 2 or median <= 0:
        return None
    tail = max(0.5 * math.erfc(k / math.sqrt(2)), 1e-9)  # the chance a normal figure falls k σ short
    t = student_t_quantile(1 - tail, n - 1)
    bound = t * statistics.stdev(past) * math.sqrt(1 + 1 / n) / median
    source = f"its own last {n} runs: s {100 * statistics.stdev(past) / median:.1f}%, t({n - 1}) {t:.1f}"
    return Noise(bound / k, source)


def figure_regressions(
    current: pd.DataFrame,
    past: pd.DataFrame,
    thresholds: Mapping[str, Thresholds],
    rules: Mapping[str, MetricRule],
    last_k: int = 10,
    calibrated: Mapping[tuple[str, str], Noise] | None = None,
) -> list[tuple[str, CheckRow]]:
    """(node, row) per node and judged figure with an earlier run: pass, ``regression`` beyond the figure's
    noise and its own runs' small-sample bound, ``inconclusive`` inside them or under :data:`MIN_PAST_RUNS`.

    ``current``/``past``: key figures (run_id, node, metric, unit, value; ``past`` ordered oldest first),
    as :func:`analysis.history.key_figures` returns them; ``calibrated``: the cluster's calibrated noise by
    (node, metric), where it has one.
    """
    out: list[tuple[str, CheckRow]] = []
    if current.empty or past.empty:
        return out
    for record in current.sort_values(["node", "metric"]).to_dict("records"):
        node, metric = str(record["node"]), str(record["metric"])
        rule = rules.get(metric)
        if rule is None:
            continue
        mine = own_past(past, node, metric, str(record.get("model") or ""), last_k)
        if not mine or statistics.median(mine) <= 0:
            continue
        limits = thresholds.get(node, Thresholds())
        noises = (own_noise(mine, limits.noise_k), (calibrated or {}).get((node, metric)))
        out.append((node, _against_history(record, mine, rule, limits, noises)))
    return out


def own_past(past: pd.DataFrame, node: str, metric: str, model: str = "", last_k: int = 10) -> list[float]:
    """The node's last ``last_k`` figures of ``metric`` in ``past`` (key figures, oldest first); a training figure
    the same model's only."""
    if past.empty:
        return []
    same = (past["node"] == node) & (past["metric"] == metric)
    if "model" in past.columns:
        same &= past["model"] == model
    return [float(v) for v in past[same]["value"].tolist()[-last_k:]]


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
    item = f"{record['metric']}{HISTORY_SUFFIX}"
    if judged.outcome == "ok":
        return CheckRow(rule.check, item, Status.PASS, "ok", _fmt(value), expected, detail)
    if len(mine) < MIN_PAST_RUNS:
        said = (
            f"{detail}: only {len(mine)} earlier run(s), under the {MIN_PAST_RUNS} a judgement against its past needs"
        )
        return CheckRow(rule.check, item, Status.WARN, INCONCLUSIVE, _fmt(value), expected, said)
    if judged.outcome == "below":
        return CheckRow(rule.check, item, relative_status(rule, limits), REGRESSION, _fmt(value), expected, detail)
    said = f"{detail}: {judged.inconclusive_said()}"
    return CheckRow(rule.check, item, Status.WARN, INCONCLUSIVE, _fmt(value), expected, said)


def _shortfall(row: NodeRow) -> bool:
    """Whether a row against history fell past ``straggler_pct`` (a regression, or inconclusive)."""
    return row.item.endswith(HISTORY_SUFFIX) and row.reason in (REGRESSION, INCONCLUSIVE)


def moved_together(rows: Sequence[NodeRow], candidates: Callable[[], str] = lambda: "") -> list[NodeRow]:
    """``rows`` with each figure that fell against history on most of the nodes judged (at least two, and more than
    half) turned into one cluster-level finding: those nodes' rows ``moved_with_cluster`` (a warning naming how
    many nodes moved, by how much, and what changed between the runs: ``candidates``, asked only when a figure
    moved, since finding them reads the history), never a rejection of each."""
    by_item: dict[str, list[NodeRow]] = {}
    for row in rows:
        if row.item.endswith(HISTORY_SUFFIX):
            by_item.setdefault(row.item, []).append(row)
    moved: dict[str, str] = {}
    said: str | None = None
    for item, judged in by_item.items():
        fell = [r for r in judged if _shortfall(r)]
        if len(fell) >= 2 and 2 * len(fell) > len(judged):
            said = candidates() if said is None else said
            changed = f"; what changed between the runs: {said}" if said else ""
            moved[item] = (
                f"{len(fell)} of the {len(judged)} nodes judged fell below their own history together: the cluster "
                f"or the machine moved, not this node{changed}"
            )
    return [
        replace(r, status=Status.WARN, reason=MOVED, detail=f"{r.detail}; {moved[r.item]}")
        if r.item in moved and _shortfall(r)
        else r
        for r in rows
    ]


@dataclass(frozen=True)
class Control:
    """The node measured again beside a regression: its name, its figure again (None: none came back), its own
    floor against its history and its own median there (None: unknown)."""

    node: str
    again: float | None
    floor: float | None
    median: float | None = None

    @property
    def moved(self) -> bool:
        return self.again is not None and self.floor is not None and self.again < self.floor

    @property
    def fall(self) -> float | None:
        """Its figure again over its own median where that is below 1 (the machine slower now than in its runs),
        else None: the share the suspect's figure again is divided by before it is held to its floor."""
        if self.again is None or not self.median or self.median <= 0 or self.again >= self.median:
            return None
        return self.again / self.median


def _unconfirmed(row: NodeRow, why: str) -> NodeRow:
    return replace(row, status=Status.WARN, reason=INCONCLUSIVE, detail=f"{row.detail}; {why}")


def confirmed_again(
    row: NodeRow,
    again: float | None,
    control: Control | None,
    rounds: Sequence[float] = (),
    levels: Sequence[float] = (),
) -> NodeRow:
    """A ``regression`` row once its node was measured again (``again``; None: no figure came back) beside a
    ``control`` (None: no node to control with): it stays a regression only when it is still under its floor
    while the control is not under its own, and still under it once the control's own fall is taken out (the
    figure again divided by the control's again over its median): a node with a tight history 5 % down beside a
    control 12 % down inside its wider one is the machine, not the node; else ``inconclusive``, saying why.
    ``rounds``: the figure as the run's straggler rounds measured it again beside its peers: where the median of
    every measurement again is back within its own history, one low measurement proves nothing (a busy machine
    gave a node 43.9 once and 98.9, 98.3, 98.6 in the rounds, over a floor of 69.7). ``levels``: the peers'
    median in each round: a round in which every node was slow (a busy machine) counts at the peers' usual
    level, as the control's fall is taken out of ``again``; and most measurements again must be under the floor."""
    floor = stated_minimum(row.expected)
    said = f"measured again: {_fmt(again) if again is not None else 'no figure'}"
    if rounds:
        said += f"; in the straggler rounds beside its peers: {', '.join(_fmt(v) for v in rounds)}"
        rounds, said = _at_peers_level(rounds, levels, said)
    every = [*([again] if again is not None else []), *rounds]
    if again is None and rounds:
        again = statistics.median(rounds)  # the rounds are the measurements again
    if again is None or floor is None:
        return _unconfirmed(row, "measured again: no figure")
    if rounds:
        middle, under = statistics.median(every), sum(v < floor for v in every)
        if middle >= floor:
            back = f"the median of the {len(every)} measurements again, {_fmt(middle)}, is back within its own history"
            return _unconfirmed(row, f"{said}: {back}: not confirmed")
        if 2 * under <= len(every):
            split = f"only {under} of the {len(every)} measurements again are under its floor {_fmt(floor)}"
            return _unconfirmed(row, f"{said}: {split}: not confirmed")
    if again >= floor:
        return _unconfirmed(row, f"{said}, back within its own history: not confirmed")
    if control is not None and control.moved:
        fell = f"which fell under its own history too ({_fmt(control.again or 0.0)})"
        return _unconfirmed(row, f"{said} beside {control.node}, {fell}: the machine moved, not confirmed")
    fall = control.fall if control is not None else None
    if control is not None and fall is not None and again / fall >= floor:
        fell = f"{_fmt(control.again or 0.0)}, {100 * (1 - fall):.1f}% below its own median {_fmt(control.median or 0)}"
        held = f"{_fmt(again / fall)} with that fall taken out, within its own history"
        return _unconfirmed(row, f"{said} beside {control.node} ({fell}): {held}: the machine moved, not confirmed")
    beside = ""
    if control is not None and control.again is not None:
        beside = f" beside {control.node} ({_fmt(control.again)}, within its own history)"
    elif control is not None:
        beside = f" beside {control.node}, which gave no figure to control with"
    return replace(row, detail=f"{row.detail}; {said}{beside}: confirmed")


def peers_levels(in_rounds: Mapping[tuple[str, str], Sequence[float]], node: str, metric: str, n: int) -> list[float]:
    """The median of the other nodes' figure of ``metric`` in each of the ``n`` straggler rounds (the nodes one
    probe's rounds measured: the same rounds); [] where a round has no other node's figure."""
    peers = [values for (other, m), values in in_rounds.items() if m == metric and other != node and len(values) == n]
    levels = [statistics.median(values[i] for values in peers) for i in range(n)] if peers else []
    return levels if len(levels) == n else []


def _at_peers_level(rounds: Sequence[float], levels: Sequence[float], said: str) -> tuple[list[float], str]:
    """Each round's figure at the peers' usual level (their median over the rounds): a round in which the peers
    measured low too was the machine's; unchanged without a level for every round."""
    if not rounds or len(levels) != len(rounds) or not all(level > 0 for level in levels):
        return list(rounds), said
    usual = statistics.median(levels)
    scaled = [value * usual / level for value, level in zip(rounds, levels, strict=True)]
    if any(abs(level / usual - 1) > 0.001 for level in levels):
        peers = ", ".join(_fmt(level) for level in levels)
        said += f" (its peers' median {peers}: at their usual level {', '.join(_fmt(v) for v in scaled)})"
    return scaled, said


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
