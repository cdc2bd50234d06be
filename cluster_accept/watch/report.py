"""The page of a watched job (``cluster-accept watch``) and its Prometheus text: which node is behind a dead
rank, a hang or a straggler, the evidence drawn, and what each node could tell. Pure functions; the caller
writes the files (the Prometheus file atomically: node_exporter must never read half a file).

A straggler is seen by *arrival order*: in every collective (a communicator's sequence number) each rank's
enqueue time minus the median enqueue time of the ranks that recorded it is its *arrival lag*. The rank the
others wait for arrives last, collective after collective: its line stands above the rest on the lag chart.
Lags are computed from every row; only the chart's lines are thinned (:data:`MAX_POINTS` a line, each keeping
the highest point of its stretch of time, so a spike is never thinned away).

Like the acceptance report, the HTML is one self-contained file under a Content-Security-Policy that loads and
runs nothing, autoescaped, with control characters in node text shown as escapes (:mod:`reports.render`).
"""

from __future__ import annotations

import datetime as dt
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
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
from cluster_accept.watch.words import CollectiveSeen, RankSeen, RankState, Signal, SignalCoverage, WatchFinding

__all__ = ["MAX_POINTS", "watch_context", "watch_page", "watch_prometheus"]

MAX_POINTS = 600  # a chart line's most points: 8 ranks x 600 dots stay a page a browser opens at once
X_TICKS = 6
LEGEND_ENTRIES, LEGEND_STEP = 6, 270  # names under a chart: two rows of three
SUSPECT = "suspect"
_LAG_COLUMNS = ["rank", "node", "gpu", "communicator", "seq", "t_s", "lag_ms", "exec_ms"]


def _status_order(status: Status) -> int:
    """Failed (and errored) findings first, then warnings, then the rest (cleared, skipped)."""
    if status in BAD_STATUSES:
        return 0
    return 1 if status == Status.WARN else 2


def _named(status: Status) -> bool:
    """Whether a finding still names its node: failed or warned, not cleared."""
    return _status_order(status) < 2


def _clock_offsets_ns(ranks: Iterable[RankSeen]) -> dict[str, int]:
    """Each node's clock minus the watcher's, the median over its reads: one slow read's round trip does not
    move it."""
    seen: dict[str, list[int]] = {}
    for r in ranks:
        seen.setdefault(r.node, []).append(r.clock_offset_ns)
    return {node: int(statistics.median(values)) for node, values in seen.items()}


def _collective_frame(collectives: Sequence[CollectiveSeen], offsets_ns: Mapping[str, int]) -> pd.DataFrame:
    """One row per rank's record of a collective, arrival on the watcher's clock. Reads overlap (a Flight
    Recorder holds its last collectives, read again and again) and a rank may be recorded by two sources: the
    Flight Recorder's record is kept (it stamps the arrival itself), and of two reads the later."""
    frame = pd.DataFrame(
        {
            "rank": [c.rank for c in collectives],
            "node": [c.node for c in collectives],
            "gpu": pd.array([c.gpu for c in collectives], dtype="Int64"),
            "communicator": [c.communicator for c in collectives],
            "seq": [c.seq for c in collectives],
            "arrival_ns": [c.enqueue_ns - offsets_ns.get(c.node, 0) for c in collectives],
            "exec_ms": [math.nan if c.exec_ms is None else c.exec_ms for c in collectives],
            "recorder": [c.source == Signal.FLIGHT_RECORDER.value for c in collectives],
        }
    )
    frame["arrival_ns"] = frame["arrival_ns"].astype("int64")
    frame = frame.sort_values("recorder", kind="stable")  # last kept: the recorder's, then the later read
    return frame.drop_duplicates(["communicator", "seq", "rank"], keep="last").drop(columns="recorder")


def _arrival_lags(
    collectives: Sequence[CollectiveSeen], offsets_ns: Mapping[str, int] | None = None, start_ns: int | None = None
) -> pd.DataFrame:
    """Each rank's arrival lag in each collective: its enqueue time minus the median enqueue time of the ranks
    that recorded that collective (a communicator and its sequence number), in ms; positive is late.

    Columns rank, node, gpu, communicator, seq, t_s, lag_ms, exec_ms. ``t_s`` is the collective's median
    arrival in seconds since ``start_ns`` (the watcher's clock; default: the first collective), the same for
    every rank of the collective so that their lines share their x. Arrivals are put on the watcher's clock
    with ``offsets_ns`` (node clock minus the watcher's): nodes whose clocks disagree by more than a lag would
    otherwise name the wrong rank. A collective only one rank recorded has no one to arrive before: left out.
    """
    if not collectives:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in _LAG_COLUMNS})
    frame = _collective_frame(collectives, offsets_ns or {})
    base_ns = int(frame["arrival_ns"].min())
    frame["arrival_ns"] -= base_ns  # small integers: a float median keeps ns exactly
    groups = frame.groupby(["communicator", "seq"])["arrival_ns"]
    frame = frame.assign(median_ns=groups.transform("median"), ranks_seen=groups.transform("size"))
    frame = frame[frame["ranks_seen"] >= 2]
    if start_ns is not None:
        origin_ns = float(start_ns - base_ns)
    else:
        origin_ns = float(frame["median_ns"].min()) if len(frame) else 0.0
    frame = frame.assign(
        t_s=(frame["median_ns"] - origin_ns) / 1e9, lag_ms=(frame["arrival_ns"] - frame["median_ns"]) / 1e6
    )
    return frame[_LAG_COLUMNS].sort_values(["t_s", "communicator", "seq", "rank"]).reset_index(drop=True)


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
        {"rank": r.rank, "node": r.node, "gpu": "" if r.gpu is None else r.gpu, "pid": r.pid, "state": r.state,
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


def _window(lags: pd.DataFrame, window_ns: tuple[int, int] | None) -> tuple[pd.DataFrame, float]:
    """The lags inside the window and the window's length in s (without a window: the collectives' span)."""
    if window_ns is None:
        return lags, float(lags["t_s"].max()) if len(lags) else 0.0
    span_s = (window_ns[1] - window_ns[0]) / 1e9
    return lags[(lags["t_s"] >= 0) & (lags["t_s"] <= span_s)], span_s


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
) -> dict[str, Any]:
    """What both formats of the page show: one pure function, so the HTML and the Markdown say the same."""
    places = _places(ranks, collectives)
    suspects = _suspect_ranks(findings, places)
    lags = _arrival_lags(collectives, _clock_offsets_ns(ranks), None if window_ns is None else window_ns[0])
    lags, span_s = _window(lags, window_ns)
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
) -> tuple[str, str]:
    """(HTML, Markdown) of the job's page: findings cause first, the arrival lag and execution time charts,
    which signal each node gave, and each rank's last state. ``window_ns``: (start, end) on the watcher's
    clock; the charts show the collectives whose median arrival lies inside, lags computed from all rows."""
    context = watch_context(job, findings, ranks, collectives, coverage, window_ns)
    html_env, md_env = _environments()
    return (
        html_env.get_template("watch.html.j2").render(**context),
        md_env.get_template("watch.md.j2").render(**context),
    )


def _label(value: object) -> str:
    """A Prometheus label value: backslash, double quote and newline escaped, None as empty."""
    text = "" if value is None else str(value)
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: object) -> str:
    return ",".join(f'{name}="{_label(value)}"' for name, value in labels.items())


def _family(
    name: str, help_text: str, samples: Iterable[tuple[str, float]], fmt_value: Callable[[float], str]
) -> list[str]:
    lines = [f"{name}{{{labels}}} {fmt_value(value)}" for labels, value in samples]
    return [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", *lines] if lines else []


def _suspect_samples(cluster: str, job: str, findings: Sequence[WatchFinding]) -> list[tuple[str, float]]:
    """One series per (node, rank, GPU, kind, reason): 1 while a finding with those labels names it, 0 once
    every such finding is cleared. Two findings with the same labels make one series (a text file with a series
    twice is refused whole)."""
    value: dict[tuple[str, int, int, str, str], int] = {}  # (node, rank, GPU, kind, reason); -1: none named
    for f in findings:
        key = (f.node, -1 if f.rank is None else f.rank, -1 if f.gpu is None else f.gpu, f.kind, f.reason)
        value[key] = max(value.get(key, 0), int(_named(f.status)))
    return [
        (_labels(cluster=cluster, job=job, node=node, rank=_or_empty(rank), gpu=_or_empty(gpu), kind=kind,
                 reason=reason), v)
        for (node, rank, gpu, kind, reason), v in sorted(value.items())
    ]  # fmt: skip


def _or_empty(number: int) -> str:
    return "" if number < 0 else str(number)


def watch_prometheus(
    job: str,
    cluster: str,
    findings: Sequence[WatchFinding],
    ranks: Sequence[RankSeen],
    collectives: Sequence[CollectiveSeen] = (),
    window_ns: tuple[int, int] | None = None,
) -> str:
    """The job's gauges in the text exposition format (node_exporter's textfile collector): the nodes named
    (``cluster_accept_watch_suspect``, and how many), each rank's process up or not at its last read, and,
    given the collectives, each rank's median arrival lag over the window. Series in a stable order: by node,
    then rank, so two writes of the same rows are the same bytes."""
    named = {f.node for f in findings if _named(f.status)}
    last = sorted(_last_reads(ranks), key=lambda r: (r.node, r.rank))
    lines = _family(
        "cluster_accept_watch_suspect",
        "1 while the watcher names the node (rank, GPU) as behind a dead rank, a hang or a straggler; 0 once cleared.",
        _suspect_samples(cluster, job, findings),
        lambda v: f"{v:.0f}",
    )
    lines += _family(
        "cluster_accept_watch_suspect_nodes",
        "Nodes of the job the watcher names now.",
        [(_labels(cluster=cluster, job=job), float(len(named)))],
        lambda v: f"{v:.0f}",
    )
    up = [
        (_labels(cluster=cluster, job=job, node=r.node, rank=r.rank), float(r.state == RankState.RUNNING)) for r in last
    ]
    lines += _family(
        "cluster_accept_watch_rank_up", "1 while the rank's process runs; 0 stopped, dead, exited or a zombie.", up,
        lambda v: f"{v:.0f}",
    )  # fmt: skip
    start_ns = None if window_ns is None else window_ns[0]
    lags = _window(_arrival_lags(collectives, _clock_offsets_ns(ranks), start_ns), window_ns)[0]
    medians = lags.groupby(["node", "rank"], as_index=False)["lag_ms"].median()
    per_rank = zip(medians["node"], medians["rank"], medians["lag_ms"], strict=True)
    lines += _family(
        "cluster_accept_watch_arrival_lag_ms",
        "The rank's median arrival lag over the window: ms behind the median rank of each collective.",
        [(_labels(cluster=cluster, job=job, node=node, rank=rank), float(v)) for node, rank, v in per_rank],
        lambda v: f"{v:.6g}",
    )
    return "\n".join(lines) + "\n"
