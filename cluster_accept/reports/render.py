"""Render the acceptance report (HTML and Markdown) from a run's rows. The context is built by a pure
function so the two formats say the same thing.

The HTML is one self-contained file (these machines have no internet): styles, charts (inline SVG) and the
small table filter are inside it, and its Content-Security-Policy allows nothing else to load or run. Node
output is never trusted: Jinja2 autoescapes everything, and the policy only runs the one script whose
hash it names, so even an escaping mistake could not run a GPU name that carries ``<script>``. Control
characters in node output (ESC sequences, CR, BEL, bidi overrides) reach neither file raw: every value both
templates print passes through :func:`~cluster_accept.vocabulary.text.visible`, which shows them as escapes.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from cluster_accept.analysis import coverage
from cluster_accept.analysis.fleet import FleetView
from cluster_accept.analysis.verdicts import Verdict, VerdictRow, differences, fold_by, values_by_node
from cluster_accept.checks.base import NodeRow, Status
from cluster_accept.checks.declarations import Link
from cluster_accept.checks.reasons import ReasonCatalog
from cluster_accept.inventory.hostlist import fold
from cluster_accept.reports import evidence, figures, nccl, paging
from cluster_accept.reports.charts import fmt, sparkline
from cluster_accept.reports.evidence import EXCERPT_CHARS
from cluster_accept.vocabulary.rows import NodeValue
from cluster_accept.vocabulary.text import visible

TEMPLATES = Path(__file__).parent / "templates"
__all__ = ["EXCERPT_CHARS", "ReportData", "build_context", "render"]
MARKDOWN_ROWS = 50  # a probe's table in the Markdown: its first (worst) rows; every row is in the HTML and Parquet
# Hashed as printed: every printed value passes through visible(), so the script does too.
FILTER_SCRIPT = visible((TEMPLATES / "filter.js").read_text())


@dataclass
class ReportData:
    """Everything a report is drawn from, beyond the run and its verdicts; each part may be empty."""

    rows: Sequence[NodeRow] = ()
    values: Sequence[NodeValue] = ()
    scaling: Sequence[Mapping[str, Any]] = ()
    isolation: Sequence[Mapping[str, Any]] = ()
    trends: Sequence[Mapping[str, Any]] = ()
    thresholds: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # profile -> Thresholds fields
    reasons: ReasonCatalog = field(default_factory=ReasonCatalog)  # what each row's reason means, its action
    sections: Sequence[figures.ReportSection] = ()  # each probe's charts and table, in probe order
    links: Sequence[Link] = field(kw_only=True)  # which findings explain which: the causes the stages declare
    fleet: FleetView | None = field(default=None, kw_only=True)  # the fleet read from the history, when kept
    nccl: Sequence[Any] = field(default=(), kw_only=True)  # NCCL's account of each run (nccl.parquet's rows)


def charts(data: ReportData) -> dict[str, Markup]:
    """The multi-node charts (scaling, isolation); the probes draw their own (``sections``)."""
    efficiency_min = next(
        (t.get("scaling_efficiency_min") for t in data.thresholds.values() if t.get("scaling_efficiency_min")), None
    )
    drawn = {
        "scaling": figures.scaling_chart(data.scaling, efficiency_min),
        "isolation": figures.isolation_chart(data.isolation),
    }
    return {name: chart for name, chart in drawn.items() if chart is not None}


def build_context(run: Mapping[str, Any], verdicts: Sequence[VerdictRow], data: ReportData) -> dict[str, Any]:
    counts = {v.value: 0 for v in Verdict}
    for verdict in verdicts:
        counts[verdict.verdict.value] += 1
    rows = [r if isinstance(r, NodeRow) else NodeRow.from_record(r) for r in data.rows]
    skipped: dict[str, list[str]] = {}
    for row in rows:
        if row.status == Status.SKIP:
            skipped.setdefault(f"{row.check}: {row.reason}", []).append(row.node)
    per_item = values_by_node(data.values)
    unreachable = {r.node: r.reason for r in rows if r.status == Status.UNREACHABLE}
    tested = [v for v in verdicts if v.verdict != Verdict.SKIPPED]
    good_node = next((v.node for v in verdicts if v.verdict == Verdict.ACCEPTED), None)
    inventory = str(run.get("inventory") or "INVENTORY")
    findings = evidence.findings_by_node(rows, inventory, good_node, data.reasons, data.links)
    folded = evidence.fold_findings(findings, inventory)
    node_rows = evidence.node_records(verdicts, findings)
    history = figures.history_rows(data.trends)
    return {
        "run": run,
        "counts": counts,
        "tested": len(tested),
        "all_accepted": bool(tested) and all(v.verdict == Verdict.ACCEPTED for v in tested),
        "node_rows": node_rows,
        "node_table": evidence.node_table(node_rows),
        "node_count": len(verdicts),
        "verdict_sets": fold_by({v.node: v.verdict.value for v in verdicts}),
        "findings": findings,
        "folded_findings": folded,
        "findings_count": sum(len(f.nodes) for f in folded),
        "findings_table": evidence.findings_table(folded),
        "scaling": list(data.scaling),
        "isolation": list(data.isolation),
        "skipped": sorted((what, fold(sorted(set(nodes)))) for what, nodes in skipped.items()),
        "not_judged": [(nj.figure, nj.write, fold(sorted(nj.nodes))) for nj in coverage.not_judged(rows)],
        "differences": differences(per_item),
        "nccl_account": nccl.account_lines(data.nccl),
        "unreachable_sets": fold_by(unreachable),
        "rejected_nodes": fold([v.node for v in verdicts if v.verdict not in (Verdict.ACCEPTED, Verdict.SKIPPED)]),
        "charts": charts(data),
        "sections": [shown_section(s) for s in data.sections],
        "history": history,
        "history_table": paging.history_table(history),
        "fleet": fleet_context(data.fleet),
        "md_rows": MARKDOWN_ROWS,
    }


def fleet_context(fleet: FleetView | None) -> dict[str, Any] | None:
    """The fleet's tables as the templates show them; None when the history names nothing."""
    if fleet is None or fleet.empty:
        return None
    return {
        "runs": fleet.runs,
        "offenders": fleet.offenders.to_dict("records"),
        "flaky": fleet.flaky.to_dict("records"),
        "drifting": fleet.drifting.to_dict("records"),
        "lemons": fleet.lemons.to_dict("records"),
    }


def shown_section(section: figures.ReportSection) -> dict[str, Any]:
    """A probe's section as the templates show it: its charts, each table with its paged form."""
    shown = [
        (table, paging.from_table(table.table_id or f"{section.section_id}-table-{i}", table.columns, table.rows))
        for i, table in enumerate(section.tables)
    ]
    return {"section_id": section.section_id, "charts": section.charts, "tables": shown}


def markdown_text(value: object) -> str:
    """Every value put into the Markdown: ``<``, ``>`` and ``&`` escaped, since wherever the Markdown is
    rendered (ticket systems, chat) raw HTML in it would be live; control characters shown as escapes, since it
    is as often read in a terminal."""
    text = visible("" if value is None else str(value))
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def markdown_cell(value: object) -> str:
    """A Markdown table cell: pipes and newlines would break the table."""
    return str(value if value is not None else "").replace("|", "\\|").replace("\n", " ")


def html_text(value: object) -> object:
    """Every value put into the HTML, before autoescaping: control characters shown as escapes. Markup (the
    charts, the script) stays Markup: the escapes add no character that HTML treats specially."""
    html = getattr(value, "__html__", None)
    if html is not None:
        return Markup(visible(html()))
    return visible(str(value))


def script_hash(script: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()


def number_or_text(value: Any) -> str:
    """A table cell: a number formatted, text (a reason, a measured value with its unit) as it is."""
    if value is None:
        return ""
    return value if isinstance(value, str) else fmt(float(value))


def environments() -> tuple[Environment, Environment]:
    """(HTML, Markdown) environments over the report templates: every printed value made visible, HTML
    autoescaped, Markdown escaped (its ``cell`` filter for table cells). New ones each call: callers add filters."""
    html_env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(["html", "j2"]),
        keep_trailing_newline=True,
        finalize=html_text,
    )
    md_env = Environment(  # noqa: S701 - Markdown, escaped by markdown_text on every output
        loader=FileSystemLoader(TEMPLATES), autoescape=False, keep_trailing_newline=True, finalize=markdown_text
    )
    md_env.filters["cell"] = markdown_cell
    return html_env, md_env


def render(context: Mapping[str, Any], out_dir: Path) -> tuple[Path, Path]:
    html_env, md_env = environments()
    html_env.filters["num"] = number_or_text
    html_env.filters["sparkline"] = lambda cell: sparkline(cell[0], cell[1])
    md_env.filters["num"] = lambda v: markdown_cell(v) if isinstance(v, str) else number_or_text(v)
    html_path = out_dir / "report.html"
    md_path = out_dir / "report.md"
    page = html_env.get_template("report.html.j2").render(
        **context, script=Markup(FILTER_SCRIPT), script_hash=script_hash(FILTER_SCRIPT)
    )
    for path, text in ((html_path, page), (md_path, md_env.get_template("report.md.j2").render(**context))):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return html_path, md_path
