"""The page of a watched job (``cluster-accept watch``) and its Prometheus text: which node is behind a dead
rank, a hang or a straggler, the evidence drawn, and what each node could tell. Pure functions; the caller
writes the files (the Prometheus text, by ``prometheus_client``, atomically: node_exporter must never read half a
file).

A straggler is seen by *arrival order*: in every collective (a communicator's sequence number) each rank's
*arrival lag* is how much later than the median rank it arrived. The page's chart and the lag gauge draw the lags
the judgement read (:mod:`watch.judge.lag`: the same rows, clocks, window and rule, on the device where the ranks
timed their collectives): the rank the others wait for arrives last, collective after collective, and its line
stands above the rest. Only the chart's lines are thinned (:data:`MAX_POINTS` a line, each keeping the highest
point of its stretch of time, so a spike is never thinned away).

Like the acceptance report, the HTML is one self-contained file under a Content-Security-Policy that loads and
runs nothing, autoescaped, with control characters in node text shown as escapes (:mod:`reports.render`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any, cast

import numpy as np
import pandas as pd
from jinja2 import Environment
from markupsafe import Markup, escape

from cluster_accept.inventory.hostlist import fold
from cluster_accept.reports.charts import (
    BOTTOM,
    COLOURS,
    HEIGHT,
    LEFT,
    RIGHT,
    TOP,
    WIDTH,
    Series,
    _frame,
    _nice_top,
    fmt,
    plotted,
)
from cluster_accept.reports.render import environments, number_or_text
from cluster_accept.vocabulary.status import BAD_STATUSES, Status
from cluster_accept.watch.judge.lag import job_lags
from cluster_accept.watch.words import CollectiveSeen, RankSeen, RankState, SignalCoverage, WatchFinding

__all__ = ["MAX_POINTS", "watch_context", "watch_page", "watch_prometheus"]

MAX_POINTS = 600  # a chart line's most points: 8 ranks x 600 dots stay a page a browser opens at once
X_TICKS = 6
LEGEND_ENTRIES, LEGEND_STEP = 6, 270  # names under a chart: two rows of three
SUSPECT = "suspect"
SUSPECT_HELP = (
    "1 while the watcher names the node (rank, GPU) as behind a dead rank, a hang or a straggler; 0 once cleared."
)
LAG_HELP = "The rank's median arrival lag over the window: ms behind the median rank of each collective."
_LAG_COLUMNS = ["rank", "node", "gpu", "communicator", "seq", "t_s", "lag_ms", "exec_ms"]


def _status_order(status: Status) -> int:
    """Failed (and errored) findings first, then warnings, then the rest (cleared, skipped)."""
    if status in BAD_STATUSES:
        return 0
    return 1 if status == Status.WARN else 2


def _named(status: Status) -> bool:
    """Whether a finding still names its node: failed or warned, not cleared."""
    return _status_order(status) < 2


def _arrival_lags(
    job: str,
    ranks: Sequence[RankSeen],
    collectives: Sequence[CollectiveSeen],
    window_ns: tuple[int, int] | None = None,
    judged: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Each rank's arrival lag in each collective, as the judgement read it: ``judged``, the judgement's own
    (:attr:`judge.Judgement.lags` of the job), else read from the rows by the same function
    (:func:`judge.lag.job_lags`: the same rows, clocks and rule; from ``window_ns[0]`` on, the judgement's window).
    ms behind the median rank, positive is late, on the device where every rank timed the collective, else by
    enqueue on the watcher's clock.

    Columns rank, node, gpu, communicator, seq, t_s, lag_ms, exec_ms. ``t_s`` is the collective's median arrival
    in seconds since the window's start (without a window: the first collective), the same for every rank of the
    collective so that their lines share their x."""
    since_ns = None if window_ns is None else window_ns[0]
    lags = judged if judged is not None else job_lags(job, ranks, collectives, since_ns)
    if lags.empty:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in _LAG_COLUMNS})
    origin_ns = float(since_ns) if since_ns is not None else float(lags["median_ns"].min())
    lags = lags.assign(t_s=(lags["median_ns"] - origin_ns) / 1e9)
    return lags[_LAG_COLUMNS].sort_values(["t_s", "communicator", "seq", "rank"]).reset_index(drop=True)


def _thinned(points: pd.DataFrame, column: str, span_s: float, max_points: int = MAX_POINTS) -> tuple[Any, ...]:
    """One line's (t_s, value) points, at most ``max_points``: past that, the window cut into ``max_points``
    equal stretches and each stretch drawn by its highest value at the stretch's middle (every line's stretches
    are the same, so lines keep sharing their x). The peak of the line is always kept."""
    ordered = points.sort_values("t_s")
    if len(ordered) <= max_points:
        return tuple(zip(ordered["t_s"].astype(float), ordered[column].astype(float), strict=True))
    width = (span_s or 1.0) / max_points
    stretch = np.clip((ordered["t_s"].to_numpy(float) / width).astype(int), 0, max_points - 1)
    highest = pd.Series(ordered[column].to_numpy(float)).groupby(stretch).max()
    return tuple(((i + 0.5) * width, float(v)) for i, v in zip(highest.index.astype(int), highest, strict=True))


def _per_rank(frame: pd.DataFrame) -> list[tuple[int, pd.DataFrame]]:
    """The frame's rows rank by rank, in rank order."""
    return [(int(cast(int, rank)), rows) for rank, rows in frame.groupby("rank", sort=True)]


def _places(ranks: Sequence[RankSeen], collectives: Sequence[CollectiveSeen]) -> dict[int, tuple[str, int | None]]:
    """Each rank's node and GPU, from its process reads first (they know the GPU), else its collectives."""
    places: dict[int, tuple[str, int | None]] = {}
    for c in collectives:
        node, gpu = places.get(c.rank, (c.node, None))
        places[c.rank] = (node, gpu if gpu is not None else c.gpu)
    for r in ranks:
        places[r.rank] = (r.node, r.gpu if r.gpu is not None else places.get(r.rank, ("", None))[1])
    return places


def rank_label(rank: int, node: str, gpu: int | None) -> str:
    """'rank 3 (node02 GPU 1)': how a rank is named on the page."""
    return f"rank {rank} ({node}{f' GPU {gpu}' if gpu is not None else ''})"


def _suspect_ranks(findings: Sequence[WatchFinding], places: Mapping[int, tuple[str, int | None]]) -> set[int]:
    """The ranks the named findings point at: the finding's rank, or every rank of its node when it names
    only the node."""
    suspects: set[int] = set()
    for f in findings:
        if not _named(f.status):
            continue
        if f.rank is not None:
            suspects.add(f.rank)
        else:
            suspects |= {rank for rank, (node, _) in places.items() if node == f.node}
    return suspects


def _legend(shown: Sequence[Series]) -> list[str]:
    """The suspects' names (or the first lines' when none), three a row in two rows under the plot: a rank's
    name with its node and GPU is too long for the five a row of :func:`charts.line_chart`."""
    named = [s for s in shown if s.bad] or list(shown)
    parts = [
        f'<text x="{LEFT + 10 + LEGEND_STEP * (i % 3)}" y="{HEIGHT - 30 + 14 * (i // 3)}" font-size="11" '
        f'class="legend{" bad" if s.bad else ""}" fill="{COLOURS["bad" if s.bad else "ok"]}">— {escape(s.name)}</text>'
        for i, s in enumerate(named[:LEGEND_ENTRIES])
    ]
    if len(named) > LEGEND_ENTRIES:
        parts[-1] = (
            f'<text x="{LEFT + 10 + LEGEND_STEP * 2}" y="{HEIGHT - 16}" font-size="11" class="legend">'
            f"… and {len(named) - LEGEND_ENTRIES + 1:,} more</text>"
        )
    return parts


def _time_chart(chart_id: str, title: str, series: Sequence[Series], unit: str, span_s: float) -> Markup:
    """Lines over seconds since the window's start, the named (suspect) lines drawn on top and in the legend.
    Unlike :func:`charts.line_chart`, whose x labels are its points' (message sizes, node counts), the time
    axis is labelled at :data:`X_TICKS` even steps, however many points the lines have. Values below zero are
    drawn at zero."""
    top = _nice_top(max([y for s in series for _, y in s.points] + [0.0]) * 1.05)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    span = span_s or 1.0

    def pos(x: float) -> float:
        return LEFT + plot_w * min(max(x, 0.0), span) / span

    def ypos(y: float) -> float:
        return TOP + plot_h - plot_h * min(max(y, 0.0), top) / top

    body = []
    for i in range(X_TICKS):
        x = span * i / (X_TICKS - 1)
        body.append(
            f'<text x="{pos(x):.1f}" y="{TOP + plot_h + 16}" font-size="10" text-anchor="middle">{fmt(x)}</text>'
        )
    body.append(
        f'<text x="{LEFT + plot_w / 2}" y="{TOP + plot_h + 34}" font-size="11" text-anchor="middle">'
        "seconds since the window's start</text>"
    )
    body += plotted(series, unit, pos, ypos, _legend, noun="ranks")  # suspects drawn last, on top
    return _frame(chart_id, title, unit, top, body)


def _rank_series(
    frame: pd.DataFrame,
    column: str,
    places: Mapping[int, tuple[str, int | None]],
    suspects: set[int],
    span_s: float,
) -> list[Series]:
    """One line per rank of ``column`` over time, named 'rank 3 (node02 GPU 1)', a suspect's marked."""
    lines = []
    for rank, rows in _per_rank(frame):
        node, gpu = places.get(rank, (str(rows["node"].iloc[0]), None))
        name = rank_label(rank, node, gpu) + (f", {SUSPECT}" if rank in suspects else "")
        lines.append(Series(name, _thinned(rows, column, span_s), bad=rank in suspects))
    return lines


def _charts(
    lags: pd.DataFrame, places: Mapping[int, tuple[str, int | None]], suspects: set[int], span_s: float
) -> dict[str, Markup]:
    """The arrival lag chart and, where ranks timed their collectives, the execution time chart."""
    charts: dict[str, Markup] = {}
    if lags.empty:
        return charts
    lag_lines = _rank_series(lags, "lag_ms", places, suspects, span_s)
    title = "Arrival lag per rank: ms behind the median rank in each collective (early arrivals drawn at 0)"
    charts["arrival"] = _time_chart("arrival-lag", title, lag_lines, "ms", span_s)
    timed = lags.dropna(subset=["exec_ms"])
    if not timed.empty:
        exec_lines = _rank_series(timed, "exec_ms", places, suspects, span_s)
        title = "Execution time per rank: each collective's own time on the rank's GPU"
        charts["exec"] = _time_chart("exec-time", title, exec_lines, "ms", span_s)
    return charts


def _retest(f: WatchFinding) -> str:
    said = {True: "confirmed", False: "not confirmed", None: "not run"}[f.confirmed]
    return f"{said}: {f.retest}" if f.retest else said


def _finding_rows(findings: Sequence[WatchFinding]) -> list[dict[str, Any]]:
    """The findings as the tables show them, failed first, then warned, then cleared; within each, the
    earliest named first."""
    ordered = sorted(findings, key=lambda f: (_status_order(f.status), f.named_ns, f.node, f.rank or 0, f.kind))
    return [
        {
            "node": f.node, "rank": "" if f.rank is None else f.rank, "gpu": "" if f.gpu is None else f.gpu,
            "kind": f.kind, "status": f.status.value, "reason": f.reason, "observed": f.observed,
            "expected": f.expected, "persistence": f.persistence, "retest": _retest(f), "action": f.action,
            "owner_line": f.owner_line, "evidence": f.evidence,
        }
        for f in ordered
    ]  # fmt: skip


def _coverage(coverage: Sequence[SignalCoverage]) -> tuple[list[str], list[dict[str, Any]]]:
    """(lines, table rows) of which signal each node gave, nodes folded: 'flight_recorder available on
    node[01-04]'; 'inspector unavailable on node[01-04]: NCCL 2.21 has no Inspector'. A node read more than
    once counts by its last row. Unavailable first: what the watcher could not see is what a reader must know."""
    last = {(c.node, c.signal): c for c in coverage}
    by_line: dict[tuple[bool, str, str], list[str]] = {}
    by_row: dict[tuple[bool, str, str], list[str]] = {}
    for c in last.values():
        by_line.setdefault((c.available, c.signal, "" if c.available else c.detail), []).append(c.node)
        by_row.setdefault((c.available, c.signal, c.detail), []).append(c.node)
    lines = [
        f"{signal} {'available' if available else 'unavailable'} on {fold(nodes)}{f': {detail}' if detail else ''}"
        for (available, signal, detail), nodes in sorted(by_line.items())
    ]
    rows = [
        {"signal": signal, "available": "yes" if available else "no", "nodes": fold(nodes), "count": len(nodes),
         "detail": detail}
        for (available, signal, detail), nodes in sorted(by_row.items())
    ]  # fmt: skip
    return lines, rows


def _last_reads(ranks: Sequence[RankSeen]) -> list[RankSeen]:
    """Each rank's latest read (on the watcher's clock), by rank."""
    last: dict[int, RankSeen] = {}
    for r in ranks:
        kept = last.get(r.rank)
        if kept is None or r.read_ns - r.clock_offset_ns >= kept.read_ns - kept.clock_offset_ns:
            last[r.rank] = r
    return [last[rank] for rank in sorted(last)]


def _last_collective(r: RankSeen, entered: Mapping[int, CollectiveSeen]) -> str:
    """The last collective the rank entered: from its records when there are some, else its read's seqs."""
    c = entered.get(r.rank)
    if c is not None:
        return f"{c.op} #{c.seq} on {c.communicator} ({'completed' if c.completed else 'not completed'})"
    if r.last_enqueued_seq is None:
        return ""
    done = "" if r.last_completed_seq is None else f", #{r.last_completed_seq} completed"
    return f"#{r.last_enqueued_seq} entered{done}"


def _rank_rows(ranks: Sequence[RankSeen], collectives: Sequence[CollectiveSeen]) -> list[dict[str, Any]]:
    """Each rank's last state: rank, node, GPU, pid, state, the last collective it entered, and what the read
    said beside."""
    entered: dict[int, CollectiveSeen] = {}
    for c in collectives:
        kept = entered.get(c.rank)
        if kept is None or c.enqueue_ns >= kept.enqueue_ns:
            entered[c.rank] = c
    return [
        {"rank": r.rank, "node": r.node, "gpu": "" if r.gpu is None else r.gpu, "pid": r.pid, "state": r.state.value,
         "last": _last_collective(r, entered), "detail": r.detail}
        for r in _last_reads(ranks)
    ]  # fmt: skip


def _lag_summary(
    lags: pd.DataFrame, places: Mapping[int, tuple[str, int | None]], suspects: set[int]
) -> list[dict[str, Any]]:
    """Per rank over the window: collectives, median and highest lag, and the share of its collectives it
    arrived last in; latest arrivers first."""
    if lags.empty:
        return []
    last_rank = lags.loc[lags.groupby(["communicator", "seq"])["lag_ms"].idxmax(), "rank"]
    last_counts = last_rank.value_counts()
    rows = []
    for rank, rows_of in _per_rank(lags):
        node, gpu = places.get(rank, (str(rows_of["node"].iloc[0]), None))
        count = len(rows_of)
        rows.append(
            {"rank": rank, "label": rank_label(rank, node, gpu), "suspect": rank in suspects,
             "collectives": count, "median_lag_ms": float(rows_of["lag_ms"].median()),
             "max_lag_ms": float(rows_of["lag_ms"].max()), "last_pct": 100.0 * last_counts.get(rank, 0) / count}
        )  # fmt: skip
    return sorted(rows, key=lambda r: (-r["median_lag_ms"], r["rank"]))


def _span_s(lags: pd.DataFrame, window_ns: tuple[int, int] | None) -> float:
    """The window's length in s (without a window: the collectives' span)."""
    if window_ns is None:
        return float(lags["t_s"].max()) if len(lags) else 0.0
    return (window_ns[1] - window_ns[0]) / 1e9


def _utc(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.timezone.utc).isoformat(timespec="seconds")


def _headline(findings: Sequence[WatchFinding], rank_rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The page's first line: the nodes named, and the ranks by state."""
    named = [f for f in findings if _named(f.status)]
    states: dict[str, int] = {}
    for r in rank_rows:
        states[str(r["state"])] = states.get(str(r["state"]), 0) + 1
    nodes = {str(r["node"]) for r in rank_rows}
    said = ", ".join(f"{count} {state}" for state, count in sorted(states.items(), key=lambda kv: -kv[1]))
    return {
        "named": fold(sorted({f.node for f in named})),
        "failed": any(f.status in BAD_STATUSES for f in named),
        "ranks": f"{len(rank_rows):,} ranks on {len(nodes):,} nodes" + (f": {said}" if said else ""),
    }


def watch_context(
    job: str,
    findings: Sequence[WatchFinding],
    ranks: Sequence[RankSeen],
    collectives: Sequence[CollectiveSeen],
    coverage: Sequence[SignalCoverage],
    window_ns: tuple[int, int] | None = None,
    lags: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """What both formats of the page show: one pure function, so the HTML and the Markdown say the same.
    ``lags``: the judgement's (:func:`_arrival_lags`)."""
    places = _places(ranks, collectives)
    suspects = _suspect_ranks(findings, places)
    lags = _arrival_lags(job, ranks, collectives, window_ns, lags)
    span_s = _span_s(lags, window_ns)
    coverage_lines, coverage_rows = _coverage(coverage)
    rank_rows = _rank_rows(ranks, collectives)
    return {
        "job": job,
        "headline": _headline(findings, rank_rows),
        "window": None if window_ns is None else (_utc(window_ns[0]), _utc(window_ns[1])),
        "span_s": span_s,
        "findings": _finding_rows(findings),
        "charts": _charts(lags, places, suspects, span_s),
        "lag_summary": _lag_summary(lags, places, suspects),
        "collectives_seen": int(lags.groupby(["communicator", "seq"]).ngroups) if len(lags) else 0,
        "coverage_lines": coverage_lines,
        "coverage_rows": coverage_rows,
        "rank_rows": rank_rows,
    }


@cache
def _environments() -> tuple[Environment, Environment]:
    """(HTML, Markdown) environments of the report, with the page's number filter (built once)."""
    html_env, md_env = environments()
    for env in (html_env, md_env):
        env.filters["num"] = number_or_text
    return html_env, md_env


def watch_page(
    job: str,
    findings: Sequence[WatchFinding],
    ranks: Sequence[RankSeen],
    collectives: Sequence[CollectiveSeen],
    coverage: Sequence[SignalCoverage],
    window_ns: tuple[int, int] | None = None,
    lags: pd.DataFrame | None = None,
) -> tuple[str, str]:
    """(HTML, Markdown) of the job's page: findings cause first, the arrival lag and execution time charts,
    which signal each node gave, and each rank's last state. ``window_ns``: (start, end) on the watcher's
    clock, the judgement's window (:func:`judge.window.span_ns`); the charts show the lags it judged, those of the
    collectives entered since its start (:func:`_arrival_lags`; ``lags``: the judgement's own)."""
    context = watch_context(job, findings, ranks, collectives, coverage, window_ns, lags)
    html_env, md_env = _environments()
    return (
        html_env.get_template("watch.html.j2").render(**context),
        md_env.get_template("watch.md.j2").render(**context),
    )


def _suspect_samples(
    cluster: str, job: str, findings: Sequence[WatchFinding]
) -> list[tuple[tuple[object, ...], float]]:
    """One series per (node, rank, GPU, kind, reason): 1 while a finding with those labels names it, 0 once
    every such finding is cleared. Two findings with the same labels make one series (a text file with a series
    twice is refused whole)."""
    value: dict[tuple[str, int, int, str, str], int] = {}  # (node, rank, GPU, kind, reason); -1: none named
    for f in findings:
        key = (f.node, -1 if f.rank is None else f.rank, -1 if f.gpu is None else f.gpu, f.kind, f.reason)
        value[key] = max(value.get(key, 0), int(_named(f.status)))
    return [
        ((cluster, job, node, _or_empty(rank), _or_empty(gpu), kind, reason), float(v))
        for (node, rank, gpu, kind, reason), v in sorted(value.items())
    ]


def _or_empty(number: int) -> str:
    return "" if number < 0 else str(number)


def watch_prometheus(
    job: str,
    cluster: str,
    findings: Sequence[WatchFinding],
    ranks: Sequence[RankSeen],
    collectives: Sequence[CollectiveSeen] = (),
    window_ns: tuple[int, int] | None = None,
    lags: pd.DataFrame | None = None,
) -> str:
    """The job's gauges in the text exposition format (node_exporter's textfile collector), written by
    ``prometheus_client``: the nodes named (``cluster_accept_watch_suspect``, and how many), each rank's process
    up or not at its last read, and, given the collectives, each rank's median arrival lag over the window, as the
    judgement read it (:func:`_arrival_lags`; ``lags``: the judgement's own). Series in a stable order: by node,
    then rank, so two writes of the same rows are the same bytes."""
    from cluster_accept.reports.gauges import gauge, gauges_text  # prometheus_client: only where the file is made

    named = {f.node for f in findings if _named(f.status)}
    last = sorted(_last_reads(ranks), key=lambda r: (r.node, r.rank))
    per_collective = _arrival_lags(job, ranks, collectives, window_ns, lags)
    medians = per_collective.groupby(["node", "rank"], as_index=False)["lag_ms"].median()
    per_rank = zip(medians["node"], medians["rank"], medians["lag_ms"], strict=True)
    where = ("cluster", "job", "node", "rank")
    families = [
        gauge("cluster_accept_watch_suspect", SUSPECT_HELP, (*where, "gpu", "kind", "reason"),
              _suspect_samples(cluster, job, findings)),
        gauge("cluster_accept_watch_suspect_nodes", "Nodes of the job the watcher names now.", where[:2],
              [((cluster, job), len(named))]),
        gauge("cluster_accept_watch_rank_up", "1 while the rank's process runs; 0 stopped, dead, exited or a zombie.",
              where, [((cluster, job, r.node, r.rank), float(r.state == RankState.RUNNING)) for r in last]),
        gauge("cluster_accept_watch_arrival_lag_ms", LAG_HELP, where,
              [((cluster, job, node, int(rank)), float(v)) for node, rank, v in per_rank]),
    ]  # fmt: skip
    return gauges_text(family for family in families if family.samples)  # a family without a series is left out
