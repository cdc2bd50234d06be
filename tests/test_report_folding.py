"""The report folded for large clusters: identical evidence once with its node set, accepted nodes folded into
node sets, tables paged from JSON data that node output cannot break out of, charts whose size does not grow
with the cluster. Pure, on synthetic rows, exact outputs."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest

from cluster_accept.analysis.verdicts import Verdict, VerdictRow
from cluster_accept.checks.reasons import ReasonCatalog
from cluster_accept.reports import charts, evidence
from cluster_accept.reports.charts import MAX_BARS, MAX_LABELLED, MAX_LINES, Bar, Series
from cluster_accept.reports.paging import Column, PagedTable, from_table
from cluster_accept.tasks.stages import declared_links
from tests.test_verdicts_report import row

LINKS = declared_links()  # the cause links the stages' checks and probes declare
SVG = "{http://www.w3.org/2000/svg}"
LOOPBACK = ("hostname", "warn", "resolves_to_loopback", "127.0.0.1")


def _findings(rows: list) -> dict:
    return evidence.findings_by_node(rows, "inv.yaml", None, ReasonCatalog(), LINKS)


def test_identical_findings_fold_into_one_with_the_node_set_failures_first() -> None:
    rows = [row(f"n{i}", *LOOPBACK, raw="127.0.1.1 host\n") for i in range(1, 6)]
    rows += [row(n, "driver", "fail", "version_mismatch", "570", expected="580", raw="570\n") for n in ("n2", "n4")]
    rows.append(row("n5", "driver", "fail", "version_mismatch", "575", expected="580", raw="575\n"))
    folded = evidence.fold_findings(_findings(rows), "inv.yaml")
    assert [(f.node_set, f.finding["reason"], f.finding["observed"]) for f in folded] == [
        ("n[2,4]", "version_mismatch", "570"),
        ("n5", "version_mismatch", "575"),
        ("n[1-5]", "resolves_to_loopback", "127.0.0.1"),
    ]
    # The rerun takes the node set (quoted for the shell); a warning has nothing to reproduce.
    assert folded[0].reproduce == ("cluster-accept run --inventory inv.yaml --nodes 'n[2,4]' --stages preflight",)
    assert folded[2].reproduce == ()


def test_findings_table_names_counts_and_shares_excerpts() -> None:
    rows = [row(f"n{i}", *LOOPBACK, raw="127.0.1.1 host\n") for i in range(1, 4)]
    rows += [row("n2", "xid", "fail", "xid_79", "1 event", gpu=0, raw="127.0.1.1 host\n")]
    table = evidence.findings_table(evidence.fold_findings(_findings(rows), "inv.yaml"))
    assert [r[0] for r in table.rows] == ["n2", "n[1-3] (3 nodes)"]
    assert table.keys == (("n2",), ("n1", "n2", "n3"))
    assert table.shared == ("127.0.1.1 host\n",)  # one copy, two findings point at it
    assert [r[-1] for r in table.rows] == [0, 0]
    assert table.rows[0][3:5] == ("0", ["fail", "rejected"])


def _verdicts(count: int, rejected: set[int]) -> list[VerdictRow]:
    return [
        VerdictRow("r", "c", f"gpu{i:03d}", "h200", Verdict.REJECTED if i in rejected else Verdict.ACCEPTED,
                   ["driver:version_mismatch"] if i in rejected else [])
        for i in range(1, count + 1)
    ]  # fmt: skip


def test_a_large_cluster_lists_the_rejected_nodes_first_and_folds_the_accepted() -> None:
    records = evidence.node_records(_verdicts(100, {7, 42}), {})
    assert [(r["node"], r["verdict"], r.get("nodes")) for r in records] == [
        ("gpu007", "rejected", None),
        ("gpu042", "rejected", None),
        ("gpu[001-006,008-041,043-100]", "accepted", 98),
    ]
    table = evidence.node_table(records)
    assert table.tags == ("rejected", "rejected", "accepted")
    assert table.rows[0][0] == ["gpu007", "gpu007"] and table.rows[2][0] == ["gpu[001-006,008-041,043-100]", ""]
    assert table.rows[2][5] == ["98 nodes"]


def test_a_small_cluster_lists_every_node() -> None:
    records = evidence.node_records(_verdicts(evidence.LIST_EVERY_NODE_UP_TO, {3}), {})
    assert len(records) == evidence.LIST_EVERY_NODE_UP_TO
    assert records[0]["node"] == "gpu003" and all("nodes" not in r for r in records)


def test_page_data_cannot_end_its_script_block_and_reads_back_unchanged() -> None:
    hostile = "</script><script>alert(1)</script><!-- & ' \u2028 \x1b[31m"
    table = PagedTable("t", (Column("node"), Column("out", "excerpt")), (("n1", 0),), shared=(hostile,))
    data = str(table.data())
    assert re.search(r"[<>&'\x1b\u2028]", data) is None
    # Read back as it was, control characters shown as escapes (as everywhere in the report).
    assert json.loads(data)["shared"] == ["</script><script>alert(1)</script><!-- & ' \\u2028 \\x1b[31m"]


def test_a_probe_table_pages_after_its_first_rows() -> None:
    table = from_table("gpu-table", ("node", "GPU 0"), [(f"n{i:03d}", 700.0 + i) for i in range(120)])
    assert table.paged and len(table.first_page) == 50 and len(table.rows) == 120
    assert table.rows[0] == ("n000", "700") and table.columns[1] == Column("GPU 0", "num")
    with pytest.raises(ValueError, match="kind 'html'"):
        Column("x", "html")


def _marks(markup: str, kind: str) -> list[ET.Element]:
    svg = ET.fromstring(str(markup))
    return [g for g in svg.iter(f"{SVG}g") if kind in g.get("class", "").split()]


@pytest.mark.parametrize("count", [MAX_BARS + 1, 16_384])
def test_many_bars_are_binned_so_the_chart_does_not_grow(count: int) -> None:
    bars = [Bar(f"g{i:05d}", 1000.0 - (i % 1000), bad=i == 5) for i in range(count)]
    drawn = _marks(charts.bar_chart("gemm", "t", bars, "TFLOP/s"), "bar")
    alone = MAX_LABELLED // 4
    assert alone < len(drawn) <= MAX_BARS
    lowest = sorted(bars, key=lambda b: b.value)
    assert [g.findtext(f"{SVG}title") for g in drawn[:alone]] == [
        f"{b.label}: {b.value:.0f} TFLOP/s" for b in lowest[:alone]
    ]
    size = charts.bin_size(count)
    first_bin = lowest[alone : alone + size]
    assert drawn[alone].findtext(f"{SVG}title") == (
        f"{size} bars, {first_bin[0].label} … {first_bin[-1].label} (highest {first_bin[-1].value:.0f} TFLOP/s); "
        f"lowest: {first_bin[0].value:.0f} TFLOP/s"
    )
    assert sum("bad" in g.get("class", "") for g in drawn) == 1  # the bad bar (value 995) sits in one bin


def test_many_lines_draw_the_bad_ones_and_a_band_for_the_rest() -> None:
    sizes = (1 << 20, 1 << 22, 1 << 24)
    series = [Series(f"n{i:04d}", tuple((s, 100.0 + i % 10) for s in sizes), False) for i in range(4000)]
    series += [Series(f"bad{i:02d}", tuple((s, 50.0 - i) for s in sizes), True) for i in range(MAX_LINES + 6)]
    markup = charts.line_chart("ar", "t", series, "GB/s", "size", log2_x=True, x_text="bytes")
    lines = _marks(markup, "series")
    assert len(lines) == MAX_LINES and all("bad" in g.get("class", "") for g in lines)
    # The lowest bad lines are the ones drawn; the other six join the band.
    assert {g.findtext(f"{SVG}title") for g in lines} == {f"bad{i:02d}" for i in range(6, MAX_LINES + 6)}
    (band,) = _marks(markup, "band")
    assert band.findtext(f"{SVG}title") == "4,006 lines: their range and median"
    tips = [c.findtext(f"{SVG}title") for c in band.iter(f"{SVG}circle")]
    assert tips == ["median of 4,006: 104 GB/s (range 45.0 to 109)"] * 3  # bad00 (50) to bad05 (45) in the band
    assert len(str(markup)) < 20_000
