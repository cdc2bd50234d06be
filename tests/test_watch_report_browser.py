"""A watched job's page in headless Chromium: it loads nothing else and runs nothing, its findings table shows the
failed finding first, and its arrival lag chart is drawn with the suspect's line on top and named."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_accept.vocabulary.status import Status
from cluster_accept.watch.report import MAX_POINTS, watch_page
from cluster_accept.watch.words import CollectiveSeen, RankSeen, RankState, SignalCoverage, WatchFinding
from tests.browser import load_page

# Chromium, as the other browser tests
pytestmark = [pytest.mark.testbed, pytest.mark.untimed, pytest.mark.xdist_group("test_watch_report_browser")]

T0 = 1_700_000_000_000_000_000
MS = 1_000_000
NODES = ("node01", "node02")
STRAGGLER = 5  # node02 GPU 1: 3 ms late in every collective
COLLECTIVES = 2 * MAX_POINTS


def rows() -> tuple[list[RankSeen], list[CollectiveSeen]]:
    ranks = [
        RankSeen("job7", NODES[r // 4], r, r % 4, 9000 + r, RankState.RUNNING, T0 + 30_000 * MS, gpu=r % 4)
        for r in range(8)
    ]
    collectives = [
        CollectiveSeen("job7", NODES[r // 4], r, "0:default_pg", "all_reduce", seq,
                       T0 + seq * 20 * MS + (3 * MS if r == STRAGGLER else (r * 37 + seq) % 200 * 1000),
                       "flight_recorder", True, exec_ms=1.5 + r / 100, gpu=r % 4)
        for seq in range(COLLECTIVES) for r in range(8)
    ]  # fmt: skip
    return ranks, collectives


def test_the_watch_page_shows_its_findings_and_the_suspects_line_in_chromium(tmp_path: Path) -> None:
    ranks, collectives = rows()
    findings = [
        WatchFinding("job7", "hang", "node01", Status.PASS, "hang_wavefront", "moving", "moving", "", "", named_ns=1),
        WatchFinding("job7", "comm_straggler", "node02", Status.FAIL, "arrives_last", "3.0 ms late in 1,200 of 1,200",
                     "within 1 ms of the median rank", "collectives 0-1199", "1,200 in a row", rank=STRAGGLER, gpu=1,
                     named_ns=2, confirmed=True, action="drained", owner_line="exclude node02 and resubmit"),
    ]  # fmt: skip
    coverage = [SignalCoverage("job7", n, "inspector", False, "NCCL 2.21 has no Inspector") for n in NODES]
    html, _ = watch_page("job7", findings, ranks, collectives, coverage)
    path = tmp_path / "watch.html"
    path.write_text(html)
    page = load_page(
        path,
        evaluate={
            "findings": "[...document.querySelectorAll('#findings-table tbody tr')].map(r => [...r.cells].slice(0, 6)"
            ".map(c => c.innerText))",
            "owner": "document.querySelector('#findings-table tbody tr').cells[11].innerText",
            "chart_box": "(() => { const b = document.querySelector('svg[data-chart=\"arrival-lag\"]')"
            ".getBoundingClientRect(); return [b.width, b.height]; })()",
            "lines": "document.querySelectorAll('svg[data-chart=\"arrival-lag\"] g.series').length",
            "suspect": "[...document.querySelectorAll('svg[data-chart=\"arrival-lag\"] g.series.bad')]"
            ".map(g => [g.querySelector('title').textContent, g.querySelectorAll('circle').length])",
            "legend": "[...document.querySelectorAll('svg[data-chart=\"arrival-lag\"] text.legend')]"
            ".map(t => t.textContent)",
            "exec_chart": "document.querySelectorAll('svg[data-chart=\"exec-time\"]').length",
            "coverage": "document.querySelector('#coverage-lines li').innerText",
            "headline": "document.getElementById('verdict').innerText",
        },
    )
    assert page.console_errors == []
    assert page.requests == [path.resolve().as_uri()]  # self-contained
    assert page.title == "cluster-accept watch — job7"
    values = page.values
    assert values["findings"] == [
        ["node02", "5", "1", "comm_straggler", "fail", "arrives_last"],
        ["node01", "", "", "hang", "pass", "hang_wavefront"],
    ]
    assert values["owner"] == "exclude node02 and resubmit"
    width, height = values["chart_box"]
    assert width > 600 and height > 200  # drawn, at a readable size
    assert values["lines"] == 8
    assert values["suspect"] == [["rank 5 (node02 GPU 1), suspect", MAX_POINTS]]  # thinned from 1,200
    assert values["legend"] == ["— rank 5 (node02 GPU 1), suspect"]
    assert values["exec_chart"] == 1
    assert values["coverage"] == "inspector unavailable on node[01-02]: NCCL 2.21 has no Inspector"
    assert values["headline"].startswith("Named: node02")
