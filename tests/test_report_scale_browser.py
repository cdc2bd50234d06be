"""The report of a 4,096-node run (5 % of the nodes faulty) in headless Chromium: small, verdict and rejected
nodes first, healthy nodes folded, every row reachable by paging or filter, and a page whose element count
does not grow with the cluster. (Its load time is measured by ``bench/report_scale.py``, not here.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_accept.analysis.verdicts import Verdict
from cluster_accept.inventory.hostlist import fold
from cluster_accept.reports.paging import PAGE_ROWS
from cluster_accept.reports.render import build_context, render
from tests.browser import load_page
from tests.report_scale_data import synthetic_run

# Chromium, as the other browser tests
pytestmark = [pytest.mark.testbed, pytest.mark.untimed, pytest.mark.xdist_group("test_report_scale_browser")]

NODES = 4096
MAX_HTML_BYTES = 20 * 2**20
# What the page may hold whatever the cluster's size: a page of each table (PAGE_ROWS rows) and charts of at most
# MAX_BARS bars or MAX_LINES lines and a band. About 3,100 elements at 1,024 nodes, 3,500 at 4,096 (the findings'
# first page fills up), and no more beyond: nothing else on the page has a part per node or per GPU.
MAX_ELEMENTS = 5_000
NODE_PAGER = "p.pager[data-for='node-table']"
EVERY_NODE_ROW = f"""(() => {{
  const next = document.querySelector("{NODE_PAGER} [data-role=next]");
  const status = document.querySelector("{NODE_PAGER} [data-role=status]");
  const pages = Number(status.innerText.split(" of ").pop());
  const seen = [];
  for (let page = 0; page < pages; page += 1) {{
    if (page) {{ next.click(); }}
    for (const r of document.querySelectorAll("#node-table tbody tr")) {{
      seen.push([r.getAttribute("data-verdict"), r.cells[0].innerText, r.cells[4].innerText, r.cells[5].innerText]);
    }}
  }}
  return {{pages: pages, status: status.innerText, rows: seen}};
}})()"""


def test_a_4096_node_report_is_small_folded_and_pages_in_chromium(tmp_path: Path) -> None:
    run = synthetic_run(NODES, faulty_pct=5.0)
    html, md = render(build_context(run.run, run.verdicts, run.data), tmp_path)
    assert html.stat().st_size < MAX_HTML_BYTES
    not_accepted = {v.node: v for v in run.verdicts if v.verdict != Verdict.ACCEPTED}
    accepted = [v.node for v in run.verdicts if v.verdict == Verdict.ACCEPTED]
    assert 150 < len(not_accepted) < 250  # 5 %
    last = max(not_accepted)
    page = load_page(
        html,
        evaluate={
            "elements": "document.getElementsByTagName('*').length",
            "order": "['verdict', 'nodes', 'measurements', 'findings'].map(id => document.getElementById(id)"
            ".getBoundingClientRect().top)",
            "summary": "document.getElementById('verdict').innerText",
            "every_row": EVERY_NODE_ROW,
            # The history's second page, drawn by the script: a sparkline per row, as on the first.
            "history_page_2": "(() => { document.querySelector(\"p.pager[data-for='history-table'] [data-role=next]\")"
            ".click(); return [...document.querySelectorAll('#history-table tbody tr')].map(r => "
            "r.querySelectorAll('svg.sparkline circle').length); })()",
            # A node's link filters the findings to that node, wherever its finding sits in the table's pages.
            "last_findings": f"(() => {{ location.hash = '#node-{last}'; return new Promise(done => setTimeout("
            "() => done([...document.querySelectorAll('#findings-table tbody tr')].map(r => r.cells[0].innerText"
            " + ' ' + r.cells[1].innerText + ':' + r.cells[5].innerText)), 100)); })()",
        },
        timeout_s=60,
    )
    assert page.console_errors == []
    assert page.requests == [html.resolve().as_uri()]  # nothing loads beyond the file itself
    values = page.values
    assert values["elements"] < MAX_ELEMENTS
    assert values["order"] == sorted(values["order"])  # the verdict, the nodes, then measurements and evidence
    assert values["summary"].startswith(f"Not accepted: {fold(sorted(not_accepted))}")
    every = values["every_row"]
    assert every["pages"] > 1 and every["status"].startswith(f"rows {(every['pages'] - 1) * PAGE_ROWS + 1}–")
    verdicts = [verdict for verdict, *_ in every["rows"]]
    assert verdicts == sorted(verdicts, key=lambda v: v == "accepted")  # rejected, unreachable … before accepted
    listed = {node: (reasons, evidence) for verdict, node, reasons, evidence in every["rows"] if verdict != "accepted"}
    assert listed.keys() == not_accepted.keys()  # the last page reached: every node to act on, each by name
    assert all(listed[node][0] == ", ".join(v.reasons) for node, v in not_accepted.items())
    assert [(node, evidence.strip()) for verdict, node, _, evidence in every["rows"] if verdict == "accepted"] == [
        (fold(accepted), f"{len(accepted):,} nodes")
    ]
    assert values["history_page_2"] == [1] * PAGE_ROWS
    reasons = {code.split(":")[1] for code in not_accepted[last].reasons}
    assert reasons and all(any(f":{reason}" in found for found in values["last_findings"]) for reason in reasons)
    text = md.read_text()
    assert text.index("## Nodes") < text.index("## Findings")
    assert all(f"| {node} | {v.verdict.value} |" in text for node, v in not_accepted.items())
    assert f"| {fold(accepted)} ({len(accepted):,} nodes) | accepted |" in text
    assert len(text) < 200_000
