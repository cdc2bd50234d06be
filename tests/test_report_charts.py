"""Charts (inline SVG), the figures chosen for them, and the suggested actions: pure, exact numbers."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from cluster_accept.reports import charts, figures
from cluster_accept.reports.actions import Action, reproduce, suggest
from cluster_accept.reports.charts import BOTTOM, HEIGHT, LEFT, MAX_LABELLED, RIGHT, TOP, WIDTH, Bar, Ref, Series

pytestmark = pytest.mark.pure
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
    {"stage": "single-node", "node": n, "gpu": g, "profile": "h100", "metric": m, "value": v, "unit": u, "size": None}
    for n, g, m, v, u in [
        ("n1", 0, "gemm_bf16_tflops", 740.0, "TFLOP/s"),
        ("n1", 1, "gemm_bf16_tflops", 745.0, "TFLOP/s"),
        ("n2", 0, "gemm_bf16_tflops", 370.0, "TFLOP/s"),
        ("n2", 1, "gemm_bf16_tflops", 742.0, "TFLOP/s"),
        ("n1", 0, "gemm_fp16_tflops", 660.0, "TFLOP/s"),
    ]
]


def test_gemm_chart_marks_the_failing_gpu_and_draws_median_and_threshold() -> None:
    rows = [
        {"node": "n2", "gpu": 0, "check": "gemm", "status": "fail"},
        {"node": "n1", "gpu": 0, "check": "gemm", "status": "pass"},
    ]
    chart = figures.per_gpu_chart(
        "gemm", figures.GEMM_METRICS, "gemm", MEASUREMENTS, rows, {"h100": {"gemm_bf16_tflops_min": 600.0}}
    )
    assert chart is not None
    svg = parse(chart)
    bars = [(g.findtext(f"{SVG}title"), g.get("class")) for g in svg.iter(f"{SVG}g") if "bar" in g.get("class", "")]
    assert bars == [
        ("n1/gpu0: 740 TFLOP/s", "bar"),
        ("n1/gpu1: 745 TFLOP/s", "bar"),
        ("n2/gpu0: 370 TFLOP/s", "bar bad"),
        ("n2/gpu1: 742 TFLOP/s", "bar"),
    ]
    refs = [g.findtext(f"{SVG}title") for g in svg.iter(f"{SVG}g") if g.get("class", "").startswith("ref")]
    assert refs == ["median: 741", "threshold: 600"]
    assert figures.per_gpu_chart("m", figures.MEMORY_METRICS, "hbm", MEASUREMENTS, rows, {}) is None


def test_gpu_table_puts_the_worst_node_first() -> None:
    table = figures.gpu_table(MEASUREMENTS)
    assert table is not None and table["metric"] == "gemm_bf16_tflops" and table["gpus"] == [0, 1]
    assert [(r["node"], r["values"], r["min"], r["median"]) for r in table["rows"]] == [
        ("n2", [370.0, 742.0], 370.0, 556.0),
        ("n1", [740.0, 745.0], 740.0, 742.5),
    ]


def test_history_rows_compare_with_the_median_of_past_runs() -> None:
    trends = [
        {"node": "n1", "metric": "gemm_bf16_tflops", "unit": "TFLOP/s", "value": v, "current": c}
        for v, c in [(700.0, False), (720.0, False), (710.0, False), (639.0, True)]
    ]
    (row,) = figures.history_rows(trends)
    assert (row["runs"], row["previous_median"], row["current"]) == (3, 710.0, 639.0)
    assert row["change_pct"] == pytest.approx(-10.0)
    assert figures.history_rows(trends[-1:]) == []  # no past runs: nothing to compare


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
        ("xid", "xid_79", "fail", Action.REPLACE_GPU),
        ("xid", "xid_13", "fail", Action.CHECK_NODE),
        ("ssh", "refused", "unreachable", Action.CHECK_NODE),
        ("ssh", "auth", "unreachable", Action.FIX_CONFIG),
        ("gemm", "probe_timeout", "timeout", Action.CHECK_NODE),
        ("topology", "unparsable_output", "error", Action.RERUN),
        ("something_new", "never_seen", "fail", Action.RERUN),
    ],
)
def test_suggested_action(check: str, reason: str, status: str, action: str) -> None:
    assert suggest({"check": check, "reason": reason, "status": status}).action == action


def test_reproduce_gives_the_node_side_command_and_the_rerun() -> None:
    row = {"node": "node04", "stage": "preflight", "status": "fail", "command": "nvidia-smi -q | grep 'Driver'"}
    assert reproduce(row, "inv.yaml") == [
        "ssh node04 'nvidia-smi -q | grep '\"'\"'Driver'\"'\"''",
        "cluster-accept run --inventory inv.yaml --nodes node04 --stages preflight",
    ]
    multi = {"node": "node08", "stage": "multi-node", "status": "fail", "command": ""}
    assert reproduce(multi, "inv.yaml", "node01") == [
        "cluster-accept bisect --inventory inv.yaml --nodes node08 --good node01"
    ]
    assert reproduce({"node": "n; rm -rf /", "status": "unreachable"}, "i") == ["ssh -v 'n; rm -rf /' true"]
