"""Render the acceptance report (HTML and Markdown) from a run's rows. The context is built by a pure
function so the two formats say the same thing; HTML is autoescaped (node output is never trusted)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape

from analysis.verdicts import Verdict, differences, fold_by
from inventory.hostlist import fold

TEMPLATES = Path(__file__).parent / "templates"
EXCERPT_CHARS = 1200


def build_context(
    run: Mapping[str, Any],
    verdicts: Sequence[Mapping[str, Any]],
    rows: Sequence[Mapping[str, Any]],
    values: Sequence[Mapping[str, Any]] = (),
    scaling: Sequence[Mapping[str, Any]] = (),
    isolation: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    counts = {v: 0 for v in (Verdict.ACCEPTED, Verdict.REJECTED, Verdict.UNREACHABLE, Verdict.SKIPPED)}
    for verdict in verdicts:
        counts[verdict["verdict"]] = counts.get(verdict["verdict"], 0) + 1
    findings: dict[str, list[Mapping[str, Any]]] = {}
    skipped: dict[str, list[str]] = {}
    for row in rows:
        if row["status"] == "skip":
            skipped.setdefault(f"{row['check']}: {row['reason']}", []).append(row["node"])
        elif row["status"] != "pass":
            findings.setdefault(row["node"], []).append(
                {**row, "excerpt": (row.get("raw_output") or "")[:EXCERPT_CHARS]}
            )
    per_item: dict[str, dict[str, str]] = {}
    for value in values:
        per_item.setdefault(value["node"], {})[f"{value['check']}.{value['key']}"] = str(value["value"])
    unreachable = {r["node"]: r["reason"] for r in rows if r["status"] == "unreachable"}
    tested = [v for v in verdicts if v["verdict"] != Verdict.SKIPPED]
    return {
        "run": run,
        "counts": counts,
        "tested": len(tested),
        "all_accepted": bool(tested) and all(v["verdict"] == Verdict.ACCEPTED for v in tested),
        "verdicts": sorted(verdicts, key=lambda v: (v["verdict"] == Verdict.ACCEPTED, v["node"])),
        "verdict_sets": fold_by({v["node"]: v["verdict"] for v in verdicts}),
        "findings": dict(sorted(findings.items())),
        "scaling": list(scaling),
        "isolation": list(isolation),
        "skipped": sorted((what, fold(sorted(set(nodes)))) for what, nodes in skipped.items()),
        "differences": differences(per_item),
        "unreachable_sets": fold_by(unreachable),
        "rejected_nodes": fold(
            [v["node"] for v in verdicts if v["verdict"] != Verdict.ACCEPTED and v["verdict"] != Verdict.SKIPPED]
        ),
    }


def render(context: Mapping[str, Any], out_dir: Path) -> tuple[Path, Path]:
    html_env = Environment(
        loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html", "j2"]), keep_trailing_newline=True
    )
    md_env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=False, keep_trailing_newline=True)  # noqa: S701
    md_env.filters["cell"] = lambda text: str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")
    html_path = out_dir / "report.html"
    md_path = out_dir / "report.md"
    html_path.write_text(html_env.get_template("report.html.j2").render(**context))
    md_path.write_text(md_env.get_template("report.md.j2").render(**context))
    return html_path, md_path
