"""Charts as inline SVG, drawn here from numbers: the report is one file that opens on a machine with no
internet, so there is no chart library or CDN to load. Pure functions; every text is escaped.

Bars and lines carry a ``<title>`` (the browser's tooltip) with the exact value. Each chart is an ``<svg>``
with ``data-chart`` naming it, so tests and readers can find it. Large clusters stay legible: a bar chart
with more bars than :data:`MAX_LABELLED` sorts them ascending and labels only the lowest, where the
problems are.

A chart's size does not grow with the cluster: past :data:`MAX_BARS` bars, the lowest stay bars of their own
and the others are drawn in bins of neighbours (each bin at its lowest value, bad when any of its bars is); past
:data:`MAX_LINES` lines, the bad lines are drawn (the lowest first) and the others as one band, their range and
median at each point. The tooltips say how many each mark stands for.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

WIDTH, HEIGHT = 900, 320
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 34, 90
MAX_LABELLED = 48
MAX_BARS = 240
MAX_LINES = 24
COLOURS = {
    "ok": "#4a7fb5", "bad": "#c0392b", "median": "#2c3e50", "threshold": "#c0392b", "current": "#e67e22",
    "band": "#4a7fb5",
}  # fmt: skip


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    bad: bool = False


@dataclass(frozen=True)
class Ref:
    """A horizontal reference line: the cluster median or a profile threshold."""

    label: str
    value: float
    kind: str = "median"  # median | threshold


@dataclass(frozen=True)
class Series:
    name: str
    points: tuple[tuple[float, float], ...]
    bad: bool = False


def fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def size_label(n_bytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:g} {unit}"
    return f"{n_bytes:g} B"


def _nice_top(value: float) -> float:
    if value <= 0:
        return 1.0
    exponent = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * exponent >= value:
            return step * exponent
    return 10 * exponent


def _frame(chart_id: str, title: str, unit: str, top: float, body: list[str]) -> Markup:
    plot_h = HEIGHT - TOP - BOTTOM
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-chart="{escape(chart_id)}" role="img" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" aria-label="{escape(title)}">',
        f'<text x="{LEFT}" y="20" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    for i in range(5):
        value = top * i / 4
        y = TOP + plot_h - plot_h * i / 4
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{fmt(value)}</text>'
        )
    parts.append(
        f'<text x="14" y="{TOP + plot_h / 2:.1f}" font-size="11" transform="rotate(-90 14 {TOP + plot_h / 2:.1f})" '
        f'text-anchor="middle">{escape(unit)}</text>'
    )
    parts += body
    parts.append("</svg>")
    return Markup("".join(parts))


def _refs(refs: Sequence[Ref], top: float) -> list[str]:
    plot_h = HEIGHT - TOP - BOTTOM
    out = []
    for ref in refs:
        y = TOP + plot_h - plot_h * min(ref.value, top) / top
        dash = "6 4" if ref.kind == "threshold" else "2 3"
        out.append(
            f'<g class="ref {escape(ref.kind)}"><title>{escape(ref.label)}: {fmt(ref.value)}</title>'
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="{COLOURS[ref.kind]}" '
            f'stroke-width="1.5" stroke-dasharray="{dash}"/>'
            # medians labelled on the right, thresholds on the left: close values stay readable
            f'<text x="{WIDTH - RIGHT if ref.kind == "median" else LEFT + 4}" y="{y - 4:.1f}" font-size="11" '
            f'text-anchor="{"end" if ref.kind == "median" else "start"}" '
            f'fill="{COLOURS[ref.kind]}">{escape(ref.label)} {fmt(ref.value)}</text></g>'
        )
    return out


def bar_chart(chart_id: str, title: str, bars: Sequence[Bar], unit: str, refs: Sequence[Ref] = ()) -> Markup:
    """One bar per item (GPU, node, group). More than :data:`MAX_LABELLED` bars: sorted, lowest labelled; more
    than :data:`MAX_BARS`: the lowest alone, the others in bins (:func:`binned`)."""
    items = list(bars)
    count = len(items)
    many = count > MAX_LABELLED
    if many:
        items.sort(key=lambda b: b.value)
    if count > MAX_BARS:
        items = binned(items, unit)
    top = _nice_top(max([b.value for b in items] + [r.value for r in refs] + [0.0]) * 1.05)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(1, len(items))
    body = []
    for i, bar in enumerate(items):
        h = plot_h * max(bar.value, 0.0) / top
        x = LEFT + i * slot
        colour = COLOURS["bad" if bar.bad else "ok"]
        body.append(
            f'<g class="bar{" bad" if bar.bad else ""}"><title>{escape(bar.label)}: {fmt(bar.value)} {escape(unit)}'
            f'</title><rect x="{x + slot * 0.1:.1f}" y="{TOP + plot_h - h:.1f}" width="{max(slot * 0.8, 0.5):.1f}" '
            f'height="{h:.1f}" fill="{colour}"/></g>'
        )
        if not many or i < MAX_LABELLED // 4:
            lx, ly = x + slot / 2, TOP + plot_h + 8
            body.append(
                f'<text x="{lx:.1f}" y="{ly:.1f}" font-size="10" text-anchor="end" '
                f'transform="rotate(-60 {lx:.1f} {ly:.1f})">{escape(bar.label)}</text>'
            )
    if many:
        body.append(
            f'<text x="{LEFT}" y="{HEIGHT - 6}" font-size="11">{count:,} bars sorted ascending; '
            f"the lowest {MAX_LABELLED // 4} are labelled"
            + (f"; past them, each bar the lowest of a bin of {bin_size(count):,}" if count > MAX_BARS else "")
            + "</text>"
        )
    return _frame(chart_id, title, unit, top, body + _refs(refs, top))


def bin_size(count: int) -> int:
    """How many sorted bars one bin holds so that ``count`` bars make at most :data:`MAX_BARS` marks."""
    alone = MAX_LABELLED // 4
    return -(-(count - alone) // (MAX_BARS - alone))


def binned(ordered: Sequence[Bar], unit: str) -> list[Bar]:
    """Bars sorted ascending → the lowest :data:`MAX_LABELLED` // 4 as they are, the rest in bins of
    :func:`bin_size` neighbours: a bin is drawn at its lowest value (the chart still shows the worst), bad when
    any of its bars is, its label naming its range."""
    alone = MAX_LABELLED // 4
    size = bin_size(len(ordered))
    out = list(ordered[:alone])
    for start in range(alone, len(ordered), size):
        members = ordered[start : start + size]
        low, high = members[0], members[-1]
        bad = sum(b.bad for b in members)
        said = f", {bad} bad" if bad else ""
        label = f"{len(members)} bars, {low.label} … {high.label} (highest {fmt(high.value)} {unit}){said}; lowest"
        out.append(Bar(label, low.value, bad > 0))
    return out


def _line(s: Series, unit: str, pos: Callable[[float], float], ypos: Callable[[float], float]) -> str:
    """One series: its polyline and a dot per point, each with its figure as a tooltip."""
    colour = COLOURS["bad" if s.bad else "ok"]
    points = " ".join(f"{pos(x):.1f},{ypos(y):.1f}" for x, y in sorted(s.points))
    dots = "".join(
        f'<circle cx="{pos(x):.1f}" cy="{ypos(y):.1f}" r="2.5" fill="{colour}">'
        f"<title>{escape(s.name)}: {fmt(y)} {escape(unit)}</title></circle>"
        for x, y in s.points
    )
    return (
        f'<g class="series{" bad" if s.bad else ""}"><title>{escape(s.name)}</title>'
        f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="{2 if s.bad else 1.2}"/>'
        f"{dots}</g>"
    )


def _legend(shown: Sequence[Series]) -> list[str]:
    """At most 8 names, in rows of 5 under the plot, coloured as their lines."""
    return [
        f'<text x="{LEFT + 10 + 150 * (i % 5)}" y="{HEIGHT - 30 + 14 * (i // 5)}" font-size="11" '
        f'fill="{COLOURS["bad" if s.bad else "ok"]}">— {escape(s.name)}</text>'
        for i, s in enumerate(shown[:8])
    ]


def line_chart(
    chart_id: str,
    title: str,
    series: Sequence[Series],
    unit: str,
    x_label: str,
    log2_x: bool = False,
    refs: Sequence[Ref] = (),
    x_text: str = "number",
) -> Markup:
    """Lines over a shared x axis (message size in bytes on a log2 axis, or node counts). More than
    :data:`MAX_LINES` lines: the bad ones drawn (lowest first, at most that many), the others as a band."""
    xs = sorted({x for s in series for x, _ in s.points})
    ys = [y for s in series for _, y in s.points] + [r.value for r in refs] + [0.0]
    top = _nice_top(max(ys) * 1.05)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def pos(x: float) -> float:
        if len(xs) < 2:
            return LEFT + plot_w / 2
        lo, hi = (math.log2(xs[0]), math.log2(xs[-1])) if log2_x else (xs[0], xs[-1])
        value = math.log2(x) if log2_x else x
        return LEFT + plot_w * (value - lo) / (hi - lo)

    def ypos(y: float) -> float:
        return TOP + plot_h - plot_h * max(y, 0.0) / top

    body = []
    for x in xs:
        text = size_label(x) if x_text == "bytes" else fmt(x)
        body.append(f'<text x="{pos(x):.1f}" y="{TOP + plot_h + 16}" font-size="10" text-anchor="middle">{text}</text>')
    body.append(
        f'<text x="{LEFT + plot_w / 2}" y="{TOP + plot_h + 34}" font-size="11" text-anchor="middle">'
        f"{escape(x_label)}</text>"
    )
    body += plotted(series, unit, pos, ypos, lambda ordered: _legend([s for s in ordered if s.bad] or ordered[:6]))
    return _frame(chart_id, title, unit, top, body + _refs(refs, top))


def plotted(
    series: Sequence[Series],
    unit: str,
    pos: Callable[[float], float],
    ypos: Callable[[float], float],
    legend: Callable[[list[Series]], list[str]],
    noun: str = "lines",
) -> list[str]:
    """The plot of ``series`` on the axes ``pos``/``ypos``: more than :data:`MAX_LINES` as a band, the bad lines
    drawn last (on top), ``legend`` of the lines drawn, and a note of how many went into the band."""
    drawn, banded = split_lines(series)
    body = [_band(banded, unit, pos, ypos)] if banded else []
    ordered = sorted(drawn, key=lambda s: s.bad)
    body += [_line(s, unit, pos, ypos) for s in ordered]
    body += legend(ordered)
    if banded:
        body.append(
            f'<text x="{LEFT}" y="{HEIGHT - 2}" font-size="11">{len(series):,} {noun}: {len(drawn)} drawn, '
            f"the other {len(banded):,} as a band (their range) and its median</text>"
        )
    return body


def split_lines(series: Sequence[Series]) -> tuple[list[Series], list[Series]]:
    """(lines drawn one by one, lines drawn as a band): all drawn up to :data:`MAX_LINES`; beyond, the bad
    lines with the lowest points, at most :data:`MAX_LINES`, and every other line in the band."""
    if len(series) <= MAX_LINES:
        return list(series), []
    bad = sorted((s for s in series if s.bad), key=lambda s: (min(y for _, y in s.points), s.name))
    drawn = bad[:MAX_LINES]
    chosen = {id(s) for s in drawn}
    return drawn, [s for s in series if id(s) not in chosen]


def _band(series: Sequence[Series], unit: str, pos: Callable[[float], float], ypos: Callable[[float], float]) -> str:
    """Many lines as one mark: the range of their values at each x (a shaded polygon) and the median line."""
    at: dict[float, list[float]] = {}
    for s in series:
        for x, y in s.points:
            at.setdefault(x, []).append(y)
    xs = sorted(at)
    low = [f"{pos(x):.1f},{ypos(min(at[x])):.1f}" for x in xs]
    high = [f"{pos(x):.1f},{ypos(max(at[x])):.1f}" for x in reversed(xs)]
    middle = [(x, statistics.median(at[x])) for x in xs]
    median = " ".join(f"{pos(x):.1f},{ypos(y):.1f}" for x, y in middle)
    dots = "".join(
        f'<circle cx="{pos(x):.1f}" cy="{ypos(y):.1f}" r="2.5" fill="{COLOURS["median"]}"><title>median of '
        f"{len(at[x]):,}: {fmt(y)} {escape(unit)} (range {fmt(min(at[x]))} to {fmt(max(at[x]))})</title></circle>"
        for x, y in middle
    )
    return (
        f'<g class="band"><title>{len(series):,} lines: their range and median</title>'
        f'<polygon points="{" ".join(low + high)}" fill="{COLOURS["band"]}" fill-opacity="0.25" stroke="none"/>'
        f'<polyline points="{median}" fill="none" stroke="{COLOURS["median"]}" stroke-width="1.5"/>{dots}</g>'
    )


def sparkline(values: Sequence[float], current_last: bool = True, width: int = 160, height: int = 28) -> Markup:
    """A node's figure over its runs, the current run (last) marked: for the history table."""
    if not values:
        return Markup("")
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0

    def point(i: int, v: float) -> tuple[float, float]:
        x = 4 + (width - 8) * (i / max(1, len(values) - 1))
        return x, height - 4 - (height - 8) * (v - lo) / span

    coords = [point(i, v) for i, v in enumerate(values)]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
    x, y = coords[-1]
    mark = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{COLOURS["current"]}"/>' if current_last else ""
    tip = ", ".join(fmt(v) for v in values)
    return Markup(
        f'<svg xmlns="http://www.w3.org/2000/svg" class="sparkline" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}"><title>{tip}</title>'
        f'<polyline points="{line}" fill="none" stroke="{COLOURS["ok"]}" stroke-width="1.5"/>{mark}</svg>'
    )
