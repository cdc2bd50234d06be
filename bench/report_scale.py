"""The report at scale: a synthetic run of N nodes (4 GPUs each, 5 % of the nodes faulty; the shapes of a real
``preflight,single-node`` run, :mod:`tests.report_scale_data`) rendered to HTML and Markdown, then opened in
headless Chromium. For each N it prints:

- the HTML's and the Markdown's sizes;
- the Python time to build the report's context and render both files;
- Chromium's load time (to the load event, a fresh browser each time) and its ratio to the 5 s target;
- the page's element count (what the browser lays out).

``python3 bench/report_scale.py [--sizes 1024,4096] [--large] [--label after] [--out bench/results/report-scale]``
(``--large`` adds 16,384 nodes). Results go to ``results.json`` under the label (so a run of the code before a
change and one after sit side by side) and ``table.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cluster_accept.reports.render import build_context, render  # noqa: E402
from tests.browser import load_page  # noqa: E402
from tests.report_scale_data import synthetic_run  # noqa: E402

TARGET_S = 5.0
SIZE_TARGET_MIB = 20.0


def measure(nodes: int, faulty_pct: float, work: Path) -> dict[str, float | int]:
    built = time.perf_counter()
    run = synthetic_run(nodes, faulty_pct)
    started = time.perf_counter()
    html, md = render(build_context(run.run, run.verdicts, run.data), work)
    rendered = time.perf_counter()
    page = load_page(html, evaluate={"elements": "document.getElementsByTagName('*').length"}, timeout_s=300)
    load_s = time.perf_counter() - rendered
    return {
        "nodes": nodes,
        "data_s": round(started - built, 2),
        "render_s": round(rendered - started, 2),
        "html_mib": round(html.stat().st_size / 2**20, 3),
        "md_kib": round(md.stat().st_size / 2**10, 1),
        "load_s": round(load_s, 2),
        "load_ratio": round(load_s / TARGET_S, 2),
        "elements": int(page.values["elements"]),
        "console_errors": len(page.console_errors),
    }


def blank_page() -> dict[str, float | int]:
    """Chromium opening an empty page (its start included, as in every figure here): the floor of a load time.
    Opened twice; the second is kept, so that a cold disk cache does not count."""
    with tempfile.TemporaryDirectory(prefix="report-scale-") as work:
        page = Path(work) / "blank.html"
        page.write_text("<!doctype html><title>blank</title>")
        for _ in range(2):
            started = time.perf_counter()
            load_page(page)
            load_s = time.perf_counter() - started
    return {"nodes": 0, "data_s": 0, "render_s": 0, "html_mib": 0, "md_kib": 0, "load_s": round(load_s, 2),
            "load_ratio": round(load_s / TARGET_S, 2), "elements": 4, "console_errors": 0}  # fmt: skip


def table(results: dict[str, list[dict[str, float | int]]]) -> str:
    lines = [
        "| code | nodes | HTML MiB | Markdown KiB | render s (Python) | Chromium load s | load / 5 s | elements |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, rows in results.items():
        for r in rows:
            nodes = f"{int(r['nodes']):,}" if r["nodes"] else "blank page"
            lines.append(
                f"| {label} | {nodes} | {r['html_mib']:.2f} | {r['md_kib']:.0f} | {r['render_s']:.1f} "
                f"| {r['load_s']:.2f} | {r['load_ratio']:.2f} | {int(r['elements']):,} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,4096")
    parser.add_argument("--large", action="store_true", help="add 16,384 nodes")
    parser.add_argument("--faulty-pct", type=float, default=5.0)
    parser.add_argument("--label", default="after", help="the code measured (before, after, a commit)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "report-scale")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] + ([16384] if args.large else [])
    measured = [blank_page()]
    for nodes in sizes:
        with tempfile.TemporaryDirectory(prefix="report-scale-") as work:
            measured.append(measure(nodes, args.faulty_pct, Path(work)))
        print(table({args.label: measured[-1:]}).splitlines()[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stored = args.out / "results.json"
    results = json.loads(stored.read_text()) if stored.exists() else {}
    results[args.label] = measured
    stored.write_text(json.dumps(results, indent=2) + "\n")
    text = table(results)
    text += (
        f"\n\nTargets: HTML under {SIZE_TARGET_MIB:g} MiB, Chromium load under {TARGET_S:g} s (ratio under 1.0). "
        f"Synthetic runs: 4 GPUs per node, {args.faulty_pct:g} % of the nodes faulty, preflight and single-node rows.\n"
    )
    (args.out / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
