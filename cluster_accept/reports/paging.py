"""Tables that page in the report: the first page is HTML, every row is data the page's script pages and filters.

A cluster of thousands of nodes gives tables of thousands of rows (a row per node, per GPU, per finding), and a
browser lays out every element it is given: a page with all of them opens in seconds, not at once. So a table's
first :data:`PAGE_ROWS` rows are rendered (the worst first: tables are sorted so), and all its rows travel as
JSON in a ``<script type="application/json">`` block, which the browser does not run (the page's
Content-Security-Policy, which runs only the script whose hash it names, has nothing to allow). The script
(``filter.js``) builds the other pages' rows with ``textContent`` only: node output in the data is text, never
markup. The JSON is Jinja's ``tojson`` (:func:`jinja2.utils.htmlsafe_json_dumps`), escaped so that nothing in it
can end the block (``<``, ``>``, ``&`` and ``'`` as ``\\u003c`` …), and every text in it has passed
:func:`~cluster_accept.vocabulary.text.visible`.

Cells are plain values typed by their column's kind:

- ``text``, ``num`` (already formatted; right-aligned): a string or None;
- ``class``: ``[text, css class]`` (a verdict, a status);
- ``link``: ``[text, node]``: a link to that node's findings (no link when the node is empty);
- ``lines``: a list of strings, one a line; ``code``: a list of commands;
- ``excerpt``: the index of a shared text (raw output that many rows show is stored once), or None;
- ``spark``: ``[values, current]``: a sparkline of a node's figure over its runs (``current``: the last is this
  run's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jinja2.utils import htmlsafe_json_dumps
from markupsafe import Markup

from cluster_accept.reports.charts import fmt
from cluster_accept.vocabulary.text import visible

PAGE_ROWS = 50
KINDS = frozenset({"text", "num", "class", "link", "lines", "code", "excerpt", "spark"})


@dataclass(frozen=True)
class Column:
    name: str
    kind: str = "text"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"column {self.name!r}: kind {self.kind!r} is not one of {sorted(KINDS)}")


@dataclass(frozen=True)
class PagedTable:
    """Every row of a table, its first page rendered, the rest paged by the script.

    ``keys``: per row, the names the filter matches exactly besides the row's text (the nodes of a folded node
    set, so that a node's link finds the findings it shares with others); ``tags``: per row, the value the
    table's select filter compares (a verdict); ``shared``: the texts ``excerpt`` cells point at."""

    table_id: str
    columns: tuple[Column, ...]
    rows: tuple[tuple[Any, ...], ...]
    keys: tuple[tuple[str, ...], ...] = ()
    tags: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()
    page_rows: int = PAGE_ROWS

    @property
    def first_page(self) -> tuple[tuple[Any, ...], ...]:
        return self.rows[: self.page_rows]

    @property
    def paged(self) -> bool:
        return len(self.rows) > self.page_rows

    @property
    def status(self) -> str:
        """The pager's line before the script has run (the script writes it the same way)."""
        shown = f"1–{len(self.first_page)}" if self.rows else "0"
        pages = max(1, -(-len(self.rows) // self.page_rows))
        return f"rows {shown} of {len(self.rows):,}, page 1 of {pages}"

    def row_tag(self, index: int) -> str:
        return self.tags[index] if self.tags else ""

    def data(self) -> Markup:
        """The JSON block's content, safe inside ``<script type="application/json">``: Jinja's ``tojson``, which
        writes ``<``, ``>``, ``&`` and ``'`` as ``\\u`` escapes (nothing can end the element or open a comment in
        it), here with every other character past ASCII escaped too (the line separators older parsers choke on);
        ``JSON.parse`` reads all of them back unchanged."""
        payload = {
            "kinds": [c.kind for c in self.columns],
            "rows": [[_visible(cell) for cell in row] for row in self.rows],
            "keys": [list(k) for k in self.keys],
            "tags": list(self.tags),
            "shared": [visible(text) for text in self.shared],
            "page": self.page_rows,
        }
        return htmlsafe_json_dumps(payload, ensure_ascii=True, separators=(",", ":"))


def _visible(cell: Any) -> Any:
    if isinstance(cell, str):
        return visible(cell)
    if isinstance(cell, (list, tuple)):
        return [_visible(c) for c in cell]
    return cell


def cell_text(value: Any) -> str | None:
    """A table value as the data holds it: numbers formatted as the report prints them, text as it is."""
    if value is None or isinstance(value, str):
        return value
    return fmt(float(value))


def from_table(table_id: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> PagedTable:
    """A probe's table (first cell text, the others numbers) as a paged one."""
    kinds = tuple(Column(name, "text" if i == 0 else "num") for i, name in enumerate(columns))
    return PagedTable(table_id, kinds, tuple(tuple(cell_text(v) for v in row) for row in rows))


HISTORY_COLUMNS = (
    Column("node"), Column("metric"), Column("previous runs", "num"), Column("their median", "num"),
    Column("this run", "num"), Column("change", "num"), Column("trend", "spark"),
)  # fmt: skip


def history_table(history: Sequence[Mapping[str, Any]]) -> PagedTable:
    """Each node's figures against its previous runs (:func:`~cluster_accept.reports.figures.history_rows`)."""
    rows = []
    for h in history:
        unit = f" {h['unit']}" if h["unit"] else ""
        current = h["current"]
        change = h["change_pct"]
        rows.append(
            (
                h["node"], h["metric"], str(h["runs"]), f"{cell_text(h['previous_median'])}{unit}",
                "" if current is None else f"{cell_text(current)}{unit}",
                "" if change is None else f"{change:+.1f}%", [list(h["values"]), current is not None],
            )
        )  # fmt: skip
    return PagedTable("history-table", HISTORY_COLUMNS, tuple(rows))
