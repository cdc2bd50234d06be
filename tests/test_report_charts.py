"""Charts (inline SVG), the figures chosen for them, and the suggested actions: pure, exact numbers."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from cluster_accept.checks.base import NodeRow, Status, discover
from cluster_accept.checks.reasons import Reason, ReasonCatalog, catalog, declare
from cluster_accept.probes import gemm, hbm
from cluster_accept.reports import charts, figures
from cluster_accept.reports.actions import Action, Suggestion, reproduce, suggest
from cluster_accept.reports.charts import BOTTOM, HEIGHT, LEFT, MAX_LABELLED, RIGHT, TOP, WIDTH, Bar, Ref, Series
from cluster_accept.reports.figures import ReportView
from cluster_accept.vocabulary.rows import Measurement

SVG = "{http://www.w3.org/2000/svg}"
PLOT_H = HEIGHT - TOP - BOTTOM


def parse(markup: str) -> ET.Element:
    return ET.fromstring(str(markup))


def rects(svg: ET.Element) -> list[ET.Element]:
    return [g.find(f"{SVG}rect") for g in svg.iter(f"{SVG}g") if "bar" in g.get("class", "").split()]  # type: ignore[misc]


def test_bar_heights_scale_to_the_axis_and_bad_bars_are_marked() -> None:
    svg = parse(charts.bar_chart("gemm", "t", [Bar("n1/gpu0", 50.0), Bar("n1/gpu1", 100.0, bad=True)], "TFLOP/s"))
    assert svg.get("data-chart") == "gemm"
    heights = [float(r.get("height")) for r in rects(svg)]  # type: ignore[arg-type]
    top = 200.0  # 100 * 1.05 rounds up to 200 on a 1-2-2.5-5 scale
    assert heights == [round(PLOT_H * 50 / top, 1), round(PLOT_H * 100 / top, 1)]
    bad = [g for g in svg.iter(f"{SVG}g") if g.get("class") == "bar bad"]
    assert len(bad) == 1 and bad[0].findtext(f"{SVG}title") == "n1/gpu1: 100 TFLOP/s"


def test_reference_lines_sit_at_their_value() -> None:
    svg = parse(charts.bar_chart("x", "t", [Bar("a", 40.0)], "GB/s", [Ref("threshold", 50.0, "threshold")]))
    ref = next(g for g in svg.iter(f"{SVG}g") if g.get("class") == "ref threshold")
    line = ref.find(f"{SVG}line")
    assert line is not None and float(line.get("y1", "0")) == round(TOP + PLOT_H - PLOT_H * 50 / 100, 1)


def test_labels_are_escaped() -> None:
    markup = str(charts.bar_chart("x", "<b>title</b>", [Bar("<script>x</script>", 1.0)], "u"))
    assert "<script>" not in markup and "<b>" not in markup and "&lt;script&gt;" in markup
    parse(markup)  # still well-formed XML


def test_many_bars_are_sorted_ascending_and_only_the_lowest_labelled() -> None:
    bars = [Bar(f"n{i:03d}", float(1000 - i)) for i in range(200)]
    svg = parse(charts.bar_chart("gemm", "t", bars, "TFLOP/s"))
    titles = [g.findtext(f"{SVG}title") for g in svg.iter(f"{SVG}g") if g.get("class") == "bar"]
    assert titles[0] == "n199: 801 TFLOP/s" and titles[-1] == "n000: 1000 TFLOP/s"
    labels = [t.text for t in svg.iter(f"{SVG}text") if "rotate(-60" in t.get("transform", "")]
    assert labels == [f"n{i:03d}" for i in range(199, 199 - MAX_LABELLED // 4, -1)]


def test_line_chart_spaces_message_sizes_on_a_log2_axis() -> None:
    series = [Series("n1", ((1 << 20, 10.0), (1 << 22, 20.0), (1 << 24, 30.0)))]
    svg = parse(charts.line_chart("ar", "t", series, "GB/s", "message size", log2_x=True, x_text="bytes"))
    dots = [float(c.get("cx", "0")) for c in svg.iter(f"{SVG}circle")]
    width = WIDTH - LEFT - RIGHT
    assert dots == [LEFT, round(LEFT + width / 2, 1), LEFT + width]
    assert {"1 MiB", "4 MiB", "16 MiB"} <= {t.text for t in svg.iter(f"{SVG}text")}


def test_sparkline_marks_the_current_run() -> None:
    svg = parse(charts.sparkline([700.0, 710.0, 600.0]))
    assert svg.findtext(f"{SVG}title") == "700, 710, 600"
    assert len(list(svg.iter(f"{SVG}circle"))) == 1
    assert str(charts.sparkline([])) == ""


MEASUREMENTS = [
    Measurement(run_id="r", cluster="c", stage="single-node", node=n, metric=m, value=v, gpu=g, profile="h100", unit=u)
    for n, g, m, v, u in [
        ("n1", 0, "gemm_bf16_tflops", 740.0, "TFLOP/s"),
        ("n1", 1, "gemm_bf16_tflops", 745.0, "TFLOP/s"),
        ("n2", 0, "gemm_bf16_tflops", 370.0, "TFLOP/s"),
        ("n2", 1, "gemm_bf16_tflops", 742.0, "TFLOP/s"),
        ("n1", 0, "gemm_fp16_tflops", 660.0, "TFLOP/s"),
    ]
]


def _row(node: str, gpu: int, check: str, status: Status) -> NodeRow:
    return NodeRow("r", "c", "single-node", node, check, "gemm_bf16_tflops", status, "ok", gpu=gpu)


def test_gemm_chart_marks_the_failing_gpu_and_draws_median_and_threshold() -> None:
    rows = [_row("n2", 0, "gemm", Status.FAIL), _row("n1", 0, "gemm", Status.PASS)]
    view = ReportView(MEASUREMENTS, rows, {"h100": {"gemm_bf16_tflops_min": 600.0}})
    section = gemm.report(view)
    assert section is not None and len(section.charts) == 1
    svg = parse(section.charts[0])
    bars = [(g.findtext(f"{SVG}title"), g.get("class")) for g in svg.iter(f"{SVG}g") if "bar" in g.get("class", "")]
    assert bars == [
        ("n1/gpu0: 740 TFLOP/s", "bar"),
        ("n1/gpu1: 745 TFLOP/s", "bar"),
        ("n2/gpu0: 370 TFLOP/s", "bar bad"),
        ("n2/gpu1: 742 TFLOP/s", "bar"),
    ]
    refs = [g.findtext(f"{SVG}title") for g in svg.iter(f"{SVG}g") if g.get("class", "").startswith("ref")]
    assert refs == ["median: 741", "threshold: 600"]
    assert hbm.report(ReportView(MEASUREMENTS, rows, {})) is None  # no memory figures: no section


def test_gpu_table_puts_the_worst_node_first() -> None:
    section = gemm.report(ReportView(MEASUREMENTS, [], {}))
    assert section is not None and section.table is not None
    table = section.table
    assert table.title == "gemm_bf16_tflops per GPU (TFLOP/s), worst node first"
    assert table.columns == ("node", "GPU 0", "GPU 1", "min", "median")
    assert table.rows == (("n2", 370.0, 742.0, 370.0, 556.0), ("n1", 740.0, 745.0, 740.0, 742.5))


def test_history_rows_compare_with_the_median_of_past_runs() -> None:
    trends = [
        {"node": "n1", "metric": "gemm_bf16_tflops", "unit": "TFLOP/s", "value": v, "current": c}
        for v, c in [(700.0, False), (720.0, False), (710.0, False), (639.0, True)]
    ]
    (row,) = figures.history_rows(trends)
    assert (row["runs"], row["previous_median"], row["current"]) == (3, 710.0, 639.0)
    assert row["change_pct"] == pytest.approx(-10.0)
    assert figures.history_rows(trends[-1:]) == []  # no past runs: nothing to compare


# The checks' declarations, and two of the probes' (declared in probes/ and the multi-node stage) as stand-ins.
REASONS = catalog(
    [
        *((check.name, check.reasons) for check in discover()),
        ("gemm", declare(Reason("probe_timeout", Status.TIMEOUT, "the probe hung", Action.CHECK_NODE))),
        ("isolation", declare(Reason("slow_node", Status.FAIL, "slows every group it joins", Action.RESEAT_CABLE))),
    ]
)


def node_row(
    check: str, reason: str, status: str, node: str = "n1", stage: str = "preflight", command: str = ""
) -> NodeRow:
    return NodeRow("r1", "c", stage, node, check, "item", Status(status), reason, command=command)


@pytest.mark.parametrize(
    ("check", "reason", "status", "action"),
    [
        ("gpu_count", "count_low", "fail", Action.REPLACE_GPU),
        ("memory", "remap_failed", "fail", Action.REPLACE_GPU),
        ("pcie", "width_degraded", "fail", Action.RESEAT_CABLE),
        ("isolation", "slow_node", "fail", Action.RESEAT_CABLE),
        ("driver", "version_mismatch", "fail", Action.FIX_CONFIG),
        ("persistence", "persistence_disabled", "fail", Action.FIX_CONFIG),
        ("driver", "nvidia_smi_failed", "fail", Action.FIX_CONFIG),
        ("xid", "xid_79", "fail", Action.REBOOT_NODE),
        ("xid", "xid_13", "fail", Action.RESTART_JOB),
        ("ssh", "refused", "unreachable", Action.CHECK_NODE),
        ("ssh", "auth", "unreachable", Action.FIX_CONFIG),
        ("gemm", "probe_timeout", "timeout", Action.CHECK_NODE),
        ("topology", "unparsable_output", "error", Action.RERUN),
        ("something_new", "never_seen", "fail", Action.RERUN),
    ],
)
def test_suggested_action(check: str, reason: str, status: str, action: str) -> None:
    assert suggest(node_row(check, reason, status), REASONS).action == action


def test_suggestions_are_the_declarations() -> None:
    """The action and the wording come from the reason's declaration, nothing else: the check's own first,
    then the common one; an undeclared reason is a rerun, whatever its spelling or status."""
    own = REASONS.lookup("memory", "remap_failed")
    assert suggest(node_row("memory", "remap_failed", "fail"), REASONS) == Suggestion(own.action, own.explanation)
    common = REASONS.lookup("pcie", "command_timeout")
    assert common.severity == Status.TIMEOUT and common.action == Action.CHECK_NODE
    assert suggest(node_row("pcie", "command_timeout", "timeout"), REASONS).why == common.explanation
    assert suggest(node_row("nvlink", "count_drift", "fail"), REASONS).action == Action.RERUN
    assert suggest(node_row("xid", "xid_79", "fail"), ReasonCatalog()).action == Action.RERUN  # not in the catalogue
    assert suggest(node_row("ssh", "dns", "unreachable"), catalog([])).action == Action.FIX_CONFIG


def test_reproduce_gives_the_node_side_command_and_the_rerun() -> None:
    row = node_row("driver", "version_mismatch", "fail", node="node04", command="nvidia-smi -q | grep 'Driver'")
    assert reproduce(row, "inv.yaml") == [
        "ssh node04 'nvidia-smi -q | grep '\"'\"'Driver'\"'\"''",
        "cluster-accept run --inventory inv.yaml --nodes node04 --stages preflight",
    ]
    multi = node_row("allreduce", "slow", "fail", node="node08", stage="multi-node")
    assert reproduce(multi, "inv.yaml", "node01") == [
        "cluster-accept bisect --inventory inv.yaml --nodes node08 --good node01"
    ]
    unreachable = node_row("ssh", "refused", "unreachable", node="n; rm -rf /")
    assert reproduce(unreachable, "i") == ["ssh -v 'n; rm -rf /' true"]
