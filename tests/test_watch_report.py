"""The page of a watched job and its Prometheus text, on synthetic rows with exact numbers: arrival lags on the
watcher's clock, findings failed first, the suspect's line marked, coverage folded by node sets, thinning that
keeps the peak, and the textfile exposition byte for byte."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import replace

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster_accept.vocabulary.status import Status
from cluster_accept.watch import report as watch
from cluster_accept.watch.report import MAX_POINTS, watch_context, watch_page, watch_prometheus
from cluster_accept.watch.words import CollectiveSeen, RankSeen, RankState, SignalCoverage, WatchFinding

pytestmark = pytest.mark.unit

SVG = "{http://www.w3.org/2000/svg}"
T0 = 1_700_000_000_000_000_000  # 2023-11-14T22:13:20Z
MS = 1_000_000
PG = "0:default_pg"
# rank -> (node, GPU); node02's clock runs 2 ms ahead of the watcher's
PLACES = {0: ("node01", 0), 1: ("node01", 1), 2: ("node02", 1)}
OFFSETS = {"node01": 0, "node02": 2 * MS}
# Each rank's enqueue time in each collective, ms after the collective's second, on its node's clock.
ARRIVALS_MS = {0: (0, 0, 0), 1: (1, 1, 1), 2: (5, 7, 3)}


def collective(rank: int, seq: int, enqueue_ns: int, **kw: object) -> CollectiveSeen:
    node, gpu = PLACES[rank]
    values: dict = {"source": "flight_recorder", "completed": True, "gpu": gpu, **kw}
    return CollectiveSeen("job1", node, rank, PG, "all_reduce", seq, enqueue_ns, **values)


def seen(rank: int, state: str = "running", read_ns: int = T0 + 10_000 * MS, **kw: object) -> RankSeen:
    node, gpu = PLACES[rank]
    values: dict = {"clock_offset_ns": OFFSETS[node], "gpu": gpu, **kw}
    return RankSeen("job1", node, rank, gpu, 4000 + rank, RankState(state), read_ns, **values)


def three_collectives(timed: bool = True) -> list[CollectiveSeen]:
    """Each collective completes 2 ms after its last rank arrived (watcher's clock): a rank's own execution time
    is its wait for the last plus 2 ms, so the lags read on the device are the enqueue lags on the watcher's clock.
    ``timed`` off: enqueue times only."""
    arrived = {rank: [ms - OFFSETS[PLACES[rank][0]] / MS for ms in times] for rank, times in ARRIVALS_MS.items()}
    done = [max(times[seq] for times in arrived.values()) + 2.0 for seq in range(3)]
    return [
        collective(
            rank, seq, T0 + seq * 1_000 * MS + ms * MS, exec_ms=done[seq] - arrived[rank][seq] if timed else None
        )
        for rank, times in ARRIVALS_MS.items()
        for seq, ms in enumerate(times)
    ]


def finding(node: str, status: Status, **kw: object) -> WatchFinding:
    values: dict = {
        "kind": "comm_straggler", "reason": "arrives_last", "observed": "o", "expected": "e", "evidence": "ev",
        "persistence": "p", **kw,
    }  # fmt: skip
    return WatchFinding("job1", node=node, status=status, **values)


def test_arrival_lags_are_behind_the_median_rank_on_the_watchers_clock() -> None:
    rows = three_collectives()
    rows += [
        collective(2, 1, T0 + 1_000 * MS + 99 * MS, source="inspector"),  # another source: the recorder's kept
        collective(0, 1, T0 + 1_000 * MS),  # the same record read again
        collective(0, 3, T0 + 3_000 * MS),  # only rank 0 recorded it: no one to arrive before
    ]
    lags = watch._arrival_lags("job1", [seen(0), seen(1), seen(2)], rows, (T0, T0 + 3_000 * MS))
    assert list(lags.columns) == ["rank", "node", "gpu", "communicator", "seq", "t_s", "lag_ms", "exec_ms"]
    # node02's arrivals, 2 ms fast, are 3, 5, 1 ms on the watcher's clock; the median rank is rank 1 (1 ms)
    got = {(int(r.seq), int(r.rank)): (round(r.lag_ms, 6), round(r.t_s, 6)) for r in lags.itertuples()}
    assert got == {
        (0, 0): (-1.0, 0.001), (0, 1): (0.0, 0.001), (0, 2): (2.0, 0.001),
        (1, 0): (-1.0, 1.001), (1, 1): (0.0, 1.001), (1, 2): (4.0, 1.001),
        (2, 0): (-1.0, 2.001), (2, 1): (0.0, 2.001), (2, 2): (0.0, 2.001),
    }  # fmt: skip
    assert list(lags[lags["rank"] == 2]["gpu"]) == [1, 1, 1]
    uncorrected = watch._arrival_lags("job1", [], three_collectives(timed=False))  # enqueue, no clock read
    assert list(uncorrected[uncorrected["rank"] == 2]["lag_ms"].round(6)) == [4.0, 6.0, 2.0]
    assert list(uncorrected["t_s"].round(6).unique()) == [0.0, 1.0, 2.0]  # from the first collective
    on_device = watch._arrival_lags("job1", [], three_collectives())  # execution times need no clock
    assert list(on_device[on_device["rank"] == 2]["lag_ms"].round(6)) == [2.0, 4.0, 0.0]


def test_prometheus_text_exactly_with_labels_escaped() -> None:
    findings = [
        finding("node02", Status.FAIL, rank=2, gpu=1, named_ns=5),
        finding("node02", Status.WARN, rank=2, gpu=1, named_ns=9),  # the same labels: one series
        finding("node01", Status.PASS, kind="hang", reason='said "stuck"\\here\nnext'),  # cleared: 0
        finding("node10", Status.FAIL, rank=10, kind="dead_rank", reason="rank_dead"),  # rank 10 after rank 2
    ]
    ranks = [seen(0), seen(1), seen(2, read_ns=T0), seen(2, "dead", read_ns=T0 + 20_000 * MS)]
    name = 'job "a"\\b\nc'
    collectives = [replace(c, job=name) for c in three_collectives()]  # the lag is the job's, as judged
    text = watch_prometheus(name, "clu", findings, ranks, collectives)
    job = 'job="job \\"a\\"\\\\b\\nc"'
    assert text == "\n".join(
        [
            "# HELP cluster_accept_watch_suspect 1 while the watcher names the node (rank, GPU) as behind a dead rank,"
            " a hang or a straggler; 0 once cleared.",
            "# TYPE cluster_accept_watch_suspect gauge",
            f'cluster_accept_watch_suspect{{cluster="clu",gpu="",{job},kind="hang",node="node01",rank="",'
            'reason="said \\"stuck\\"\\\\here\\nnext"} 0.0',
            f'cluster_accept_watch_suspect{{cluster="clu",gpu="1",{job},kind="comm_straggler",node="node02",rank="2",'
            'reason="arrives_last"} 1.0',
            f'cluster_accept_watch_suspect{{cluster="clu",gpu="",{job},kind="dead_rank",node="node10",rank="10",'
            'reason="rank_dead"} 1.0',
            "# HELP cluster_accept_watch_suspect_nodes Nodes of the job the watcher names now.",
            "# TYPE cluster_accept_watch_suspect_nodes gauge",
            f'cluster_accept_watch_suspect_nodes{{cluster="clu",{job}}} 2.0',
            "# HELP cluster_accept_watch_rank_up 1 while the rank's process runs; 0 stopped, dead, exited or a zombie.",
            "# TYPE cluster_accept_watch_rank_up gauge",
            f'cluster_accept_watch_rank_up{{cluster="clu",{job},node="node01",rank="0"}} 1.0',
            f'cluster_accept_watch_rank_up{{cluster="clu",{job},node="node01",rank="1"}} 1.0',
            f'cluster_accept_watch_rank_up{{cluster="clu",{job},node="node02",rank="2"}} 0.0',
            "# HELP cluster_accept_watch_arrival_lag_ms The rank's median arrival lag over the window: ms behind the"
            " median rank of each collective.",
            "# TYPE cluster_accept_watch_arrival_lag_ms gauge",
            f'cluster_accept_watch_arrival_lag_ms{{cluster="clu",{job},node="node01",rank="0"}} -1.0',
            f'cluster_accept_watch_arrival_lag_ms{{cluster="clu",{job},node="node01",rank="1"}} 0.0',
            f'cluster_accept_watch_arrival_lag_ms{{cluster="clu",{job},node="node02",rank="2"}} 2.0',
            "",
        ]
    )
    reordered = watch_prometheus(name, "clu", findings[::-1], ranks[::-1], collectives[::-1])
    assert reordered == text  # stable: the same rows in another order, the same bytes


def test_prometheus_text_parses_back_to_the_same_names_labels_and_values() -> None:
    """Read back by Prometheus's own parser: every family a gauge, each label value as written (quotes,
    backslashes and newlines of node text included), each value the figure."""
    hostile = 'said "stuck"\\here\nnext'
    findings = [finding("node02", Status.FAIL, rank=2, gpu=1), finding("node01", Status.PASS, reason=hostile)]
    ranks = [seen(0), seen(1), seen(2, "stopped")]
    text = watch_prometheus("job1", 'clu "x"', findings, ranks, three_collectives())
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {f.type for f in families.values()} == {"gauge"}
    samples = {name: {tuple(sorted(s.labels.items())): s.value for s in f.samples} for name, f in families.items()}
    where = (("cluster", 'clu "x"'), ("job", "job1"))
    suspect = {dict(labels)["reason"]: value for labels, value in samples["cluster_accept_watch_suspect"].items()}
    assert suspect == {"arrives_last": 1.0, hostile: 0.0}
    assert samples["cluster_accept_watch_suspect_nodes"] == {where: 1.0}
    up = {(dict(k)["node"], dict(k)["rank"]): v for k, v in samples["cluster_accept_watch_rank_up"].items()}
    assert up == {("node01", "0"): 1.0, ("node01", "1"): 1.0, ("node02", "2"): 0.0}
    lag = {dict(k)["rank"]: v for k, v in samples["cluster_accept_watch_arrival_lag_ms"].items()}
    assert lag == {"0": -1.0, "1": 0.0, "2": 2.0}
    assert all(set(dict(k)) >= {"cluster", "job"} for s in samples.values() for k in s)


def test_prometheus_lag_only_inside_the_window() -> None:
    text = watch_prometheus(
        "job1", "c", [], [seen(0), seen(1), seen(2)], three_collectives(), (T0 + 1_500 * MS, T0 + 3_000 * MS)
    )
    lags = [line for line in text.splitlines() if line.startswith("cluster_accept_watch_arrival_lag_ms{")]
    assert lags == [
        'cluster_accept_watch_arrival_lag_ms{cluster="c",job="job1",node="node01",rank="0"} -1.0',
        'cluster_accept_watch_arrival_lag_ms{cluster="c",job="job1",node="node01",rank="1"} 0.0',
        'cluster_accept_watch_arrival_lag_ms{cluster="c",job="job1",node="node02",rank="2"} 0.0',  # seq 2 alone
    ]


def ordered_findings() -> list[WatchFinding]:
    return [
        finding("node03", Status.PASS, named_ns=1, confirmed=False, retest="gemm 980 vs 990 TFLOP/s"),
        finding("node01", Status.WARN, kind="hang", reason="hang_wavefront", named_ns=2),
        finding("node02", Status.FAIL, rank=2, gpu=1, named_ns=8, confirmed=True, retest="allreduce 180 vs 370 GB/s",
                action="drained", owner_line="exclude node02: its GPU 1 arrives last"),
        finding("node04", Status.ERROR, kind="dead_rank", reason="rank_dead", rank=7, named_ns=3),
    ]  # fmt: skip


def test_findings_failed_first_then_warned_then_cleared() -> None:
    rows = watch_context("job1", ordered_findings(), [], [], [])["findings"]
    assert [(r["node"], r["status"]) for r in rows] == [
        ("node04", "error"), ("node02", "fail"), ("node01", "warn"), ("node03", "pass"),
    ]  # fmt: skip
    assert rows[1] == {
        "node": "node02", "rank": 2, "gpu": 1, "kind": "comm_straggler", "status": "fail", "reason": "arrives_last",
        "observed": "o", "expected": "e", "persistence": "p", "retest": "confirmed: allreduce 180 vs 370 GB/s",
        "action": "drained", "owner_line": "exclude node02: its GPU 1 arrives last", "evidence": "ev",
    }  # fmt: skip
    assert [r["retest"] for r in rows] == [
        "not run",
        rows[1]["retest"],
        "not run",
        "not confirmed: gemm 980 vs 990 TFLOP/s",
    ]
    html, md = watch_page("job1", ordered_findings(), [], [], [])
    table = html.split('<table id="findings-table">', 1)[1].split("</table>", 1)[0]
    assert re.findall(r'<tr data-status="(\w+)"><td>(node\d+)</td>', table) == [
        ("error", "node04"), ("fail", "node02"), ("warn", "node01"), ("pass", "node03"),
    ]  # fmt: skip
    assert (
        "| node02 | 2 | 1 | comm_straggler | fail | arrives_last | o | e | p | confirmed: allreduce 180 vs 370 GB/s "
        "| drained | exclude node02: its GPU 1 arrives last | ev |"
    ) in md.splitlines()
    assert "**Named:** node[01-02,04]" in md  # the cleared node03 is not named


def lag_chart(html: str, chart: str = "arrival-lag") -> ET.Element:
    start = html.index(f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-chart="{chart}"')
    return ET.fromstring(html[start : html.index("</svg>", start) + len("</svg>")])


def test_the_suspects_line_is_marked_and_named_in_the_legend() -> None:
    ranks = [seen(0), seen(1), seen(2)]
    findings = [finding("node02", Status.FAIL, rank=2, gpu=1), finding("node01", Status.PASS, rank=0)]
    html, _ = watch_page("job1", findings, ranks, three_collectives(), [])
    for chart in ("arrival-lag", "exec-time"):
        svg = lag_chart(html, chart)
        series = {g.findtext(f"{SVG}title"): g for g in svg.iter(f"{SVG}g") if "series" in g.get("class", "")}
        assert set(series) == {"rank 0 (node01 GPU 0)", "rank 1 (node01 GPU 1)", "rank 2 (node02 GPU 1), suspect"}
        suspect = series["rank 2 (node02 GPU 1), suspect"]
        assert suspect.get("class") == "series bad"
        assert [g.get("class") for g in series.values()].count("series bad") == 1
        line = suspect.find(f"{SVG}polyline")
        assert line is not None and line.get("stroke-width") == "2" and line.get("stroke") == "#c0392b"
        legend = [t.text for t in svg.iter(f"{SVG}text") if "legend" in (t.get("class") or "")]
        assert legend == ["— rank 2 (node02 GPU 1), suspect"]
    lag_titles = [c.findtext(f"{SVG}title") for c in series_of(lag_chart(html), "rank 2 (node02 GPU 1), suspect")]
    assert lag_titles == ["rank 2 (node02 GPU 1), suspect: 2 ms", "rank 2 (node02 GPU 1), suspect: 4 ms",
                          "rank 2 (node02 GPU 1), suspect: 0 ms"]  # fmt: skip


def series_of(svg: ET.Element, name: str) -> list[ET.Element]:
    group = next(g for g in svg.iter(f"{SVG}g") if g.findtext(f"{SVG}title") == name)
    return list(group.iter(f"{SVG}circle"))


def test_a_finding_naming_only_a_node_marks_each_of_its_ranks() -> None:
    html, _ = watch_page("job1", [finding("node01", Status.WARN)], [seen(0), seen(1), seen(2)], three_collectives(), [])
    svg = lag_chart(html)
    bad = sorted(g.findtext(f"{SVG}title") or "" for g in svg.iter(f"{SVG}g") if g.get("class") == "series bad")
    assert bad == ["rank 0 (node01 GPU 0), suspect", "rank 1 (node01 GPU 1), suspect"]


def test_coverage_is_folded_by_node_sets_unavailable_first() -> None:
    nodes = [f"node0{i}" for i in range(1, 5)]
    coverage = [SignalCoverage("job1", n, "flight_recorder", True, "armed: 4 ranks answer") for n in nodes]
    coverage += [SignalCoverage("job1", n, "inspector", False, "NCCL 2.21 has no Inspector") for n in nodes]
    coverage += [
        SignalCoverage("job1", "node05", "flight_recorder", True, "armed: 4 ranks answer"),
        SignalCoverage("job1", "node05", "flight_recorder", False, "worker server did not answer"),  # the last read
        SignalCoverage("job1", "node05", "inspector", False, "NCCL 2.21 has no Inspector"),
    ]
    context = watch_context("job1", [], [], [], coverage)
    assert context["coverage_lines"] == [
        "flight_recorder unavailable on node05: worker server did not answer",
        "inspector unavailable on node[01-05]: NCCL 2.21 has no Inspector",
        "flight_recorder available on node[01-04]",
    ]
    assert context["coverage_rows"][-1] == {
        "signal": "flight_recorder", "available": "yes", "nodes": "node[01-04]", "count": 4,
        "detail": "armed: 4 ranks answer",
    }  # fmt: skip
    _, md = watch_page("job1", [], [], [], coverage)
    assert "- inspector unavailable on node[01-05]: NCCL 2.21 has no Inspector" in md.splitlines()


def test_thinning_keeps_the_highest_point_of_each_stretch() -> None:
    count = 10 * MAX_POINTS
    values = [float(i % 7) for i in range(count)]
    values[4321] = 250.0
    points = pd.DataFrame({"t_s": [i / 100 for i in range(count)], "lag_ms": values})
    thinned = watch._thinned(points, "lag_ms", span_s=count / 100)
    assert len(thinned) == MAX_POINTS
    assert max(y for _, y in thinned) == 250.0
    assert all(y == 6.0 for _, y in thinned if y != 250.0)  # each stretch of 10 holds a 6
    assert watch._thinned(points.head(5), "lag_ms", 1.0) == tuple((i / 100, float(i % 7)) for i in range(5))


def test_a_long_window_draws_at_most_max_points_a_line_and_keeps_the_spike() -> None:
    count = 3 * MAX_POINTS
    rows = [collective(r, seq, T0 + seq * 10 * MS + r * 10_000) for r in (0, 1) for seq in range(count)]
    rows += [collective(2, seq, T0 + seq * 10 * MS + (40 * MS if seq == 1234 else 30_000)) for seq in range(count)]
    html, _ = watch_page("job1", [finding("node02", Status.FAIL, rank=2)], [], rows, [])
    dots = series_of(lag_chart(html), "rank 2 (node02 GPU 1), suspect")
    assert len(dots) == MAX_POINTS
    assert "rank 2 (node02 GPU 1), suspect: 40.0 ms" in [d.findtext(f"{SVG}title") for d in dots]
    summary = watch_context("job1", [], [], rows, [])["lag_summary"]
    assert (summary[0]["rank"], summary[0]["collectives"], summary[0]["max_lag_ms"]) == (2, count, 40.0 - 0.01)
    assert summary[0]["last_pct"] == 100.0


def test_ranks_last_state_and_the_last_collective_entered() -> None:
    ranks = [seen(0), seen(1, last_enqueued_seq=41, last_completed_seq=40), seen(2, read_ns=T0), seen(2, "stopped")]
    rows = watch_context("job1", [], ranks, [collective(0, 2, T0, completed=False)], [])["rank_rows"]
    assert [(r["rank"], r["node"], r["gpu"], r["pid"], r["state"], r["last"]) for r in rows] == [
        (0, "node01", 0, 4000, "running", "all_reduce #2 on 0:default_pg (not completed)"),
        (1, "node01", 1, 4001, "running", "#41 entered, #40 completed"),
        (2, "node02", 1, 4002, "stopped", ""),
    ]


def test_node_text_reaches_both_formats_as_text() -> None:
    hostile = finding("node02", Status.FAIL, owner_line="<script>alert(1)</script> | \x1b[2J")
    html, md = watch_page("job1", [hostile], [], [], [])
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "\x1b" not in html
    assert "<script>" not in md and "&lt;script&gt;alert(1)&lt;/script&gt; \\| \\x1b[2J" in md
