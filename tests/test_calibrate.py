"""``cluster-accept calibrate``: K ordinary runs on the trusted nodes, their figures' noise into the history, the
table printed with each row's margin and false rejections per run at the inventory's size. The flow over stand-in
runs that write what a run writes (unit), and the real CLI over two runs of this machine (integration)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from cluster_accept.analysis.calibration import latest_table
from cluster_accept.analysis.schemas import MEASUREMENTS, write_table
from cluster_accept.flows.calibrate import CalibrationRequest, calibrate
from cluster_accept.flows.run_request import RunRequest
from tests.processes import run_cli

INVENTORY = f"""
cluster: cal
defaults: {{profile: cpu}}
nodes:
  - {{hosts: local1, address: local}}
  - {{hosts: local2, address: local}}
  - {{hosts: local3, address: local}}
profiles:
  cpu:
    probes: {{python: {sys.executable}, device: cpu, max_parallel_nodes: 1, collectives: []}}
    training: {{enabled: false}}
    thresholds: {{relative_verdict: warn}}
"""


def inventory(tmp_path: Path, text: str = INVENTORY) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    return path


# The real runs judge their figures against a margin no machine's load reaches: a figure flagged against its peers
# would be measured again in rounds (what the straggler tests cover), and the calibration reads only its figures.
QUIET_PEERS = INVENTORY.replace("relative_verdict: warn", "relative_verdict: warn, straggler_pct: 90")


class StandIn:
    """Runs as ``run`` makes them, standing in for the flow: each writes the figures it is given for its turn into
    its run directory (None: no measurements.parquet, the run measured nothing) and exits with its code."""

    def __init__(self, turns: list[tuple[dict[str, float] | None, int]]):
        self.turns = turns
        self.asked: list[RunRequest] = []

    def __call__(self, request: RunRequest) -> int:
        figures, code = self.turns[len(self.asked)]
        self.asked.append(request)
        run_dir = request.out_dir / str(request.run_id)
        run_dir.mkdir(parents=True)
        if figures is not None:
            rows = [
                {"run_id": request.run_id, "cluster": "cal", "stage": "single-node", "node": node, "profile": "cpu",
                 "metric": "gemm_fp32_gflops", "value": value, "size": 512}
                for node, value in figures.items()
            ]  # fmt: skip
            write_table(run_dir / "measurements.parquet", rows, MEASUREMENTS)
        return code


def test_the_runs_noise_goes_to_the_history_a_failed_node_losing_only_its_own_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = StandIn(
        [({"local1": 100.0, "local2": 200.0}, 0), ({"local1": 102.0}, 3), ({"local1": 98, "local2": 204}, 0)]
    )
    printed = io.StringIO()
    request = CalibrationRequest(inventory(tmp_path), 3, None, "local[1-2]", tmp_path / "runs")
    assert calibrate(request, runs, Console(file=printed, width=300)) == 0
    assert [(r.nodes, r.stages, r.history, r.out_dir) for r in runs.asked] == [
        ("local[1-2]", ["single-node"], None, tmp_path / "runs")
    ] * 3
    table = latest_table(tmp_path / "runs" / "history", "cal")
    assert table is not None
    # local1: 100, 102, 98 (CV 2 %); local2: 200, 204 (CV 1.40 %): p95 1.97 %, margin 3 × 1.97 % over 5 %; the
    # inventory's three nodes judge one figure each a run: 3 × P(Z > 3 / √(1 + π / 6)) false rejections (their
    # median moves too)
    line = (
        "cpu gemm_fp32_gflops: noise p95 1.97% (median 1.70%, 2 figures, 3 runs); margin 5.9% "
        "(straggler_pct 5%, noise_k 3); 3 judged a run on 3 nodes: 0.023 false rejections a run"
    )
    assert line in printed.getvalue().splitlines()
    assert f"calibration {table.calibrated_at} written to" in printed.getvalue()
    assert table.frame[["gpu_model", "metric", "size_tier", "runs", "figures"]].values.tolist() == [
        ["cpu", "gemm_fp32_gflops", "", 3, 2]
    ]
    assert f"run {runs.asked[1].run_id} exited 3" in capsys.readouterr().err


def test_no_figure_measured_twice_is_an_error_saying_what_each_run_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = StandIn([({"local1": 100.0}, 0), (None, 3)])
    request = CalibrationRequest(inventory(tmp_path), 2, None, None, tmp_path / "runs")
    assert calibrate(request, runs, Console(file=io.StringIO())) == 1
    err = capsys.readouterr().err
    first, second = (r.run_id for r in runs.asked)
    assert f"run {second} measured nothing (no measurements.parquet)" in err
    assert f"no figure was measured in two runs or more ({first}: 1 figures, {second}: 0 figures)" in err
    assert not (tmp_path / "runs" / "history" / "calibration").exists()


def test_a_refused_run_stops_the_calibration_and_no_history_refuses_it(tmp_path: Path) -> None:
    runs = StandIn([(None, 2), (None, 0)])
    assert calibrate(CalibrationRequest(inventory(tmp_path), 2, out_dir=tmp_path), runs, Console()) == 2
    assert len(runs.asked) == 1  # the next run would be refused the same way
    nothing = StandIn([])
    request = CalibrationRequest(inventory(tmp_path), 2, out_dir=tmp_path, history="-")
    assert calibrate(request, nothing, Console()) == 2 and not nothing.asked
    wrong = CalibrationRequest(inventory(tmp_path), 2, nodes="local9", out_dir=tmp_path)
    assert calibrate(wrong, nothing, Console()) == 2 and not nothing.asked


@pytest.mark.integration
@pytest.mark.serial  # its A=A runs' spread is the figure: another worker's probes beside them push it past the ceiling
@pytest.mark.soak  # docs/development.md: two runs, a table written by the first read by the last
def test_calibrate_runs_the_real_flow_twice_and_later_reports_rest_on_its_table(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    args = ("--inventory", str(inventory(tmp_path, QUIET_PEERS)), "--nodes", "local[1-2]", "--out", str(out))
    proc = run_cli("calibrate", "--runs", "2", *args, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = latest_table(out / "history", "cal")
    assert table is not None and set(table.frame["gpu_model"]) == {"cpu"}
    assert {"gemm_fp32_gflops", "mem_copy_gbps"} <= set(table.frame["metric"])
    assert (table.frame["runs"] == 2).all()
    assert f"calibration {table.calibrated_at} written to" in proc.stdout
    assert "cpu mem_copy_gbps (large): noise p95" in proc.stdout
    runs = sorted(p for p in out.iterdir() if p.is_dir() and p.name != "history")
    assert len(runs) == 2
    said = pd.read_parquet(runs[-1] / "thresholds.parquet")
    assert set(said["metric"]) >= {"gemm_fp32_gflops", "mem_copy_gbps"}
    assert "Relative thresholds" in (runs[-1] / "report.md").read_text()


@pytest.mark.integration
def test_a_calibration_that_cannot_be_read_is_named_before_any_stage_and_set_aside_by_the_run(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    broken = out / "history" / "calibration" / "cal" / "20260101T000000Z-abcdef.parquet"
    broken.parent.mkdir(parents=True)
    broken.write_text("not parquet")
    args = ("--inventory", str(inventory(tmp_path, QUIET_PEERS)), "--nodes", "local1", "--out", str(out))
    proc = run_cli("run", *args, "--stages", "single-node", timeout=300)  # one node: its stage reads the calibration
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 0, said
    assert f"calibration file {broken} not used: cannot be read as a calibration" in said  # before any stage
    assert f"history file {broken} skipped: cannot be read as a calibration" in said  # by the run, which goes on
    assert not broken.exists() and (out / "history" / "_set_aside" / "calibration" / "cal" / broken.name).is_file()
    [run_dir] = [p for p in out.iterdir() if (p / "run.json").is_file()]
    assert [s["file"] for s in json.loads((run_dir / "run.json").read_text())["history_set_aside"]] == [str(broken)]
