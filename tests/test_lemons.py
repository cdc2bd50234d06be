"""Lemon nodes, ranked from the fleet's history on synthetic runs: the share of runs not accepted, the reasons that
came back and the figures sliding down make one score from 0 to 1; a node that failed once is no lemon; the
ranking is the same for the same history; the report, the Prometheus file and ``history --lemons`` show it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from cluster_accept.analysis.fleet import DRIFT_COLUMNS, read_fleet
from cluster_accept.analysis.lemons import LEMON_COLUMNS, lemon_score, lemons
from cluster_accept.reports.render import ReportData, build_context, render
from cluster_accept.reports.summary import prometheus_text
from tests.processes import run_cli
from tests.test_fleet import RULES
from tests.test_fleet import RUNS as FLEET_RUNS
from tests.test_fleet import _history as fleet_history

RUNS = [f"2026110{d}T000000Z-aaaaaa" for d in range(1, 9)]  # eight runs, oldest first


def _verdicts() -> pd.DataFrame:
    rows: list[tuple[str, str, str, list[str]]] = []
    for i, run in enumerate(RUNS):
        rows.append((run, "node01", "accepted", []))  # healthy
        bad02 = i in (0, 2, 3, 7)  # the same NVLink again and again, once out of reach
        verdict02 = "rejected" if bad02 else "unreachable" if i == 5 else "accepted"
        reasons02 = ["nvlink:inactive"] if bad02 else ["ssh:refused"] if i == 5 else []
        rows.append((run, "node02", verdict02, reasons02))
        rows.append((run, "node03", "rejected" if i == 0 else "accepted", ["pcie:width_low"] if i == 0 else []))
        # node04: judged in three runs (skipped in four, the tool failed once), sent back in two, for other reasons
        verdict04 = {1: "rejected", 4: "rejected", 6: "accepted", 7: "tool_error"}.get(i, "skipped")
        reasons04 = {1: ["gemm:straggler"], 4: ["hbm:straggler"], 7: ["tool:internal_error"]}.get(i, [])
        rows.append((run, "node04", verdict04, reasons04))
        rows.append((run, "node05", "accepted", []))  # passes, but its figures slide
        # node06: judged in six runs, sent back in four, never for the same reason: the same score as node04
        reasons06 = {0: ["a:x"], 1: ["b:y"], 3: ["c:z"], 4: ["d:w"]}.get(i)
        if i < 6:
            rows.append((run, "node06", "rejected" if reasons06 else "accepted", reasons06 or []))
    return pd.DataFrame(rows, columns=["run_id", "node", "verdict", "reasons"])


def _drifting() -> pd.DataFrame:
    rows = [
        ["node02", "gemm_bf16_tflops", 8, 780.5, 726.5, 6.91, "TFLOP/s"],
        ["node05", "hbm_copy_gbps", 8, 4000.0, 3780.0, 5.5, "GB/s"],
        ["node05", "gemm_bf16_tflops", 8, 780.0, 717.6, 8.0, "TFLOP/s"],
    ]
    return pd.DataFrame(rows, columns=DRIFT_COLUMNS)


def test_lemons_are_ranked_with_exact_scores() -> None:
    found = lemons(_verdicts(), _drifting(), last_runs=8)
    assert list(found.columns) == LEMON_COLUMNS
    assert found[["node", "score", "runs_seen", "not_accepted"]].values.tolist() == [
        ["node02", 0.575, 8, 5],  # 0.6 x 5/8 + 0.15 (nvlink:inactive came back) + 0.05 (one figure slides)
        ["node06", 0.4, 6, 4],  # 0.6 x 4/6, nothing came back: ties node04, ranked by runs not accepted
        ["node04", 0.4, 3, 2],  # 0.6 x 2/3: skipped and tool-failed runs are no runs of it
        ["node05", 0.1, 8, 0],  # 0.05 x 2 figures sliding
    ]  # node01 healthy, node03 failed once: no lemons
    node02 = found.iloc[0]
    assert (node02["repeat_reasons"], node02["sliding_figures"]) == ("nvlink:inactive x4", "gemm_bf16_tflops -6.9%")
    assert node02["why"] == (
        "not accepted in 5 of its last 8 runs; nvlink:inactive came back in 4 runs; "
        "gemm_bf16_tflops slid 6.9% down over its recent runs."
    )
    node05 = found.iloc[3]
    assert node05["sliding_figures"] == "gemm_bf16_tflops -8.0%, hbm_copy_gbps -5.5%"
    assert node05["why"] == "gemm_bf16_tflops slid 8.0% down over its recent runs (and 1 more figure(s))."
    assert found.iloc[1]["repeat_reasons"] == "" and found.iloc[1]["sliding_figures"] == ""


def test_the_ranking_is_the_same_whatever_the_rows_order() -> None:
    verdicts = _verdicts()
    shuffled = verdicts.sample(frac=1.0, random_state=7).reset_index(drop=True)
    pd.testing.assert_frame_equal(lemons(shuffled, _drifting().iloc[::-1], 8), lemons(verdicts, _drifting(), 8))


def test_only_the_last_runs_count() -> None:
    found = lemons(_verdicts(), _drifting(), last_runs=3)
    row = found[found["node"] == "node02"].iloc[0]
    # its last three runs: unreachable, accepted, rejected: nothing came back within them
    assert (row["score"], row["runs_seen"], row["not_accepted"], row["repeat_reasons"]) == (0.45, 3, 2, "")


def test_the_score_is_bounded_and_an_empty_history_names_no_lemon() -> None:
    assert lemon_score(1.0, 9, 9) == 1.0 and lemon_score(0.0, 0, 0) == 0.0
    assert lemon_score(0.5, 1, 3) == 0.55
    empty = lemons(pd.DataFrame(), pd.DataFrame(columns=DRIFT_COLUMNS))
    assert empty.empty and list(empty.columns) == LEMON_COLUMNS


def test_the_lemons_are_exported_and_reported(tmp_path: Path) -> None:
    fleet = read_fleet(fleet_history(tmp_path), "c", RULES, last_runs=8, min_bad=3)
    assert fleet.lemons[["node", "score"]].values.tolist() == [["node02", 0.575]]
    text = prometheus_text({"run_id": FLEET_RUNS[-1], "cluster": "c"}, [], {}, fleet)
    assert "# TYPE cluster_accept_lemon_score gauge" in text
    assert 'cluster_accept_lemon_score{cluster="c",node="node02"} 0.575' in text
    run = {"run_id": FLEET_RUNS[-1], "cluster": "c", "started": "s", "ended": "e", "inventory": "i.yaml"}
    out = tmp_path / "report"
    out.mkdir()
    html, markdown = render(build_context(run, [], ReportData(links=(), fleet=fleet)), out)
    assert "| node02 | 0.575 | 5 | 8 | nvlink:inactive x4 | gemm_bf16_tflops -6.9% | not accepted in 5" in (
        markdown.read_text()
    )
    shown = html.read_text()
    assert 'id="lemons"' in shown and '<td>node02</td><td class="num">0.575</td>' in shown


@pytest.mark.integration
def test_the_history_command_ranks_the_lemons(tmp_path: Path) -> None:
    history = str(fleet_history(tmp_path))
    as_json = run_cli("history", "--history", history, "--runs", "8", "--lemons", "--json")
    assert as_json.returncode == 0, as_json.stdout + as_json.stderr
    listed = json.loads(as_json.stdout)
    assert list(listed) == ["lemons"] and [(r["node"], r["score"]) for r in listed["lemons"]] == [("node02", 0.575)]
    hostlist = run_cli("history", "--history", history, "--runs", "8", "--lemons", "--format", "hostlist")
    assert (hostlist.returncode, hostlist.stdout) == (0, "node02\n")
    none = run_cli("history", "--history", history, "--lemons", "--format", "hostlist", "--min-score", "0.6")
    assert (none.returncode, none.stdout) == (0, "\n")
    table = run_cli("history", "--history", history, "--runs", "8", "--lemons")
    assert table.returncode == 0 and "lemons" in table.stdout and "node02" in table.stdout
    assert "repeat offenders" not in table.stdout
    refused = run_cli("history", "--history", history, "--format", "hostlist")
    assert refused.returncode == 2 and "hostlist with --lemons" in refused.stderr
