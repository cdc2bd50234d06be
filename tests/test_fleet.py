"""The fleet read from the history, on synthetic runs: a repeat offender, a flaky check and a drifting node are
each named; a node repaired once, a check that flips because its node changed and a figure that only wobbles
are not."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pandas as pd
import pytest

from cluster_accept.analysis.fleet import drifting_figures, flaky_checks, read_fleet, repeat_offenders
from cluster_accept.analysis.history import append_run
from cluster_accept.analysis.probe_verdicts import MetricRule
from cluster_accept.analysis.schemas import TABLES, write_table
from cluster_accept.reports.render import ReportData, build_context, fleet_context, render
from cluster_accept.reports.summary import prometheus_text
from tests.processes import run_cli

RUNS = [f"2026110{d}T000000Z-aaaaaa" for d in range(1, 9)]  # eight runs, oldest first
RULES = {"gemm_bf16_tflops": MetricRule("gemm", "gemm_bf16_tflops_min", True)}


def _verdicts() -> pd.DataFrame:
    rows = []
    for i, run in enumerate(RUNS):
        rows.append((run, "node01", "accepted", []))
        # node02: sent back in five of eight runs, mostly for its NVLink
        bad = i in (0, 2, 3, 5, 7)
        reasons = ["nvlink:inactive"] if i != 5 else ["ssh:refused"]
        rows.append((run, "node02", "rejected" if bad and i != 5 else "unreachable" if bad else "accepted",
                     reasons if bad else []))  # fmt: skip
        rows.append((run, "node03", "rejected" if i == 0 else "accepted", ["pcie:width_low"] if i == 0 else []))
    return pd.DataFrame(rows, columns=["run_id", "node", "verdict", "reasons"])


def test_a_repeat_offender_is_named_with_its_reasons() -> None:
    found = repeat_offenders(_verdicts(), last_runs=8, min_bad=3)
    assert found["node"].tolist() == ["node02"]  # node03 failed once, was repaired: no offender
    row = found.iloc[0]
    assert (row["not_accepted"], row["runs"], row["last_run"]) == (5, 8, RUNS[-1])
    assert row["reasons"] == "nvlink:inactive x4, ssh:refused x1"
    assert repeat_offenders(_verdicts(), last_runs=3, min_bad=3).empty  # 2 of its last 3 runs
    assert repeat_offenders(pd.DataFrame(), 10, 3).empty


def _checks_and_values() -> tuple[pd.DataFrame, pd.DataFrame]:
    checks, values = [], []
    for i, run in enumerate(RUNS):
        for node in ("node01", "node02"):
            # clock_events on node01 flips every other run with nothing changed: flaky
            flaky = node == "node01" and i % 2 == 1
            checks.append((run, node, "clock_events", "fail" if flaky else "pass"))
            # driver on node02 fails from run 4 on, when its recorded driver version changed: not flaky
            changed = node == "node02" and i >= 4
            checks.append((run, node, "driver", "fail" if changed else "pass"))
            version = "570.86.15" if changed else "580.159.04"
            values.append((run, node, "driver", "driver_version", version))
            values.append((run, node, "ib_counters", "counter:mlx5_0/1/symbol_error", str(i)))  # grows: ignored
    checks_df = pd.DataFrame(checks, columns=["run_id", "node", "check", "status"])
    values_df = pd.DataFrame(values, columns=["run_id", "node", "check", "key", "value"])
    return checks_df, values_df


def test_a_check_that_flips_with_nothing_changed_is_flaky() -> None:
    checks, values = _checks_and_values()
    found = flaky_checks(checks, values)
    assert found["check"].tolist() == ["clock_events"]
    row = found.iloc[0]
    assert (row["flips"], row["pairs"], row["nodes"]) == (7, 14, "node01")  # 7 flips over 7 pairs x 2 nodes
    assert row["flake_rate"] == 0.5


def test_a_flip_with_a_change_recorded_is_no_flake() -> None:
    checks, values = _checks_and_values()
    assert "driver" not in set(flaky_checks(checks, values)["check"])
    unrecorded = values[values["check"] != "driver"]  # the same flip, nothing recorded about the change
    assert "driver" in set(flaky_checks(checks, unrecorded)["check"])


def _measurements(series: dict[str, list[float]]) -> pd.DataFrame:
    rows = [
        {"run_id": RUNS[i], "stage": "single-node", "node": node, "gpu": gpu, "metric": "gemm_bf16_tflops",
         "value": value + gpu, "unit": "TFLOP/s", "size": None, "model": None}
        for node, values in series.items() for i, value in enumerate(values) for gpu in (0, 1)
    ]  # fmt: skip
    return pd.DataFrame(rows)


def test_a_figure_falling_run_after_run_is_named_before_a_threshold_is_crossed() -> None:
    measured = _measurements(
        {
            "node01": [780, 781, 779, 780, 782, 780, 779, 781],  # wobbles
            "node02": [780, 772, 765, 760, 748, 741, 735, 726],  # slides: 7 % in eight runs, still far above 600
            "node03": [780, 700, 780, 700, 780, 700, 780, 700],  # jumps about: no steady fall
        }
    )
    found = drifting_figures(measured, RULES, min_runs=4, min_drop_pct=5.0)
    assert found["node"].tolist() == ["node02"]
    row = found.iloc[0]
    assert (row["metric"], row["runs"], row["first"], row["last"], row["unit"]) == (
        "gemm_bf16_tflops",
        8,
        780.5,
        726.5,
        "TFLOP/s",
    )
    assert 6.5 < row["drop_pct"] < 7.5
    assert drifting_figures(measured, RULES, min_drop_pct=8.0).empty
    assert drifting_figures(_measurements({"node02": [780, 760, 740]}), RULES, min_runs=4).empty  # too few runs
    # Mostly falling, but one run's dip is most of the fitted drop: the fit's own uncertainty (9.7 %) is larger
    # than the drop it fits (6.4 %), so it has not slid; a steady slide of the same first and last is found.
    dip = _measurements({"node04": [800, 792, 784, 640, 776, 768]})
    assert drifting_figures(dip, RULES, noise_k=1.0).empty
    assert drifting_figures(dip, RULES, noise_k=0.0)["node"].tolist() == ["node04"]


def _history(tmp_path: Path) -> Path:
    """The synthetic runs above as a history directory, each run's tables appended as a run appends them."""
    checks, values = _checks_and_values()
    measured = _measurements({"node01": [780] * 8, "node02": [780, 772, 765, 760, 748, 741, 735, 726]})
    verdicts = _verdicts()
    history = tmp_path / "history"
    for run in RUNS:
        run_dir = tmp_path / "runs" / run
        run_dir.mkdir(parents=True)
        tag = {"run_id": run, "cluster": "c"}
        started = dt.datetime(2026, 11, int(run[7]), tzinfo=dt.timezone.utc)
        write_table(run_dir / "runs.parquet", [{**tag, "started": started}], TABLES["runs"])
        mine = [{**r, "cluster": "c", "profile": "p"} for r in verdicts[verdicts.run_id == run].to_dict("records")]
        write_table(run_dir / "verdicts.parquet", mine, TABLES["verdicts"])
        rows = [{**r, "cluster": "c", "stage": "preflight", "item": "x", "reason": "r"} for r in
                checks[checks.run_id == run].to_dict("records")]  # fmt: skip
        write_table(run_dir / "checks.parquet", rows, TABLES["checks"])
        kept = [{**r, "cluster": "c"} for r in values[values.run_id == run].to_dict("records")]
        write_table(run_dir / "node_values.parquet", kept, TABLES["node_values"])
        figures = [{**r, "cluster": "c"} for r in measured[measured.run_id == run].to_dict("records")]
        write_table(run_dir / "measurements.parquet", figures, TABLES["measurements"])
        append_run(history, run_dir, run, f"2026-11-0{run[7]}")
    return history


def test_the_fleet_is_read_from_the_history_and_exported(tmp_path: Path) -> None:
    fleet = read_fleet(_history(tmp_path), "c", RULES, last_runs=8, min_bad=3)
    assert fleet.runs == 8 and not fleet.empty
    assert fleet.offenders["node"].tolist() == ["node02"]
    assert fleet.flaky["check"].tolist() == ["clock_events"]
    assert fleet.drifting["node"].tolist() == ["node02"]
    text = prometheus_text({"run_id": RUNS[-1], "cluster": "c"}, [], {}, fleet)
    assert "# TYPE cluster_accept_node_recent_not_accepted gauge" in text
    assert 'cluster_accept_node_recent_not_accepted{cluster="c",node="node02"} 5' in text
    assert 'cluster_accept_check_flake_rate{check="clock_events",cluster="c"} 0.5' in text  # labels by name
    assert 'cluster_accept_node_figure_drift_pct{cluster="c",metric="gemm_bf16_tflops",node="node02"} 6.91' in text
    family = ""
    for line in text.splitlines():  # every sample follows its own family's header
        if line.startswith("# TYPE"):
            family = line.split()[2]
        elif not line.startswith("#"):
            assert line.split("{")[0] == family, (line, family)
    shown = fleet_context(fleet)
    assert shown is not None and shown["offenders"][0]["reasons"] == "nvlink:inactive x4, ssh:refused x1"
    assert fleet_context(read_fleet(tmp_path / "none", "c", RULES)) is None
    run = {"run_id": RUNS[-1], "cluster": "c", "started": "s", "ended": "e", "inventory": "i.yaml"}
    out = tmp_path / "report"
    out.mkdir()
    html, markdown = render(build_context(run, [], ReportData(links=(), fleet=fleet)), out)
    said = markdown.read_text()
    assert "| node02 | 5 | 8 | " + RUNS[-1] + " | nvlink:inactive x4, ssh:refused x1 |" in said
    assert "| clock_events | 7 | 14 | 50.0% | node01 |" in said
    assert "| node02 | gemm_bf16_tflops | 8 |" in said and "6.9% |" in said
    assert 'id="fleet"' in html.read_text() and "Flaky checks" in html.read_text()


@pytest.mark.integration
def test_the_history_command_names_the_three(tmp_path: Path) -> None:
    history = _history(tmp_path)
    done = run_cli("history", "--history", str(history), "--runs", "8", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    tables = json.loads(done.stdout)
    assert [r["node"] for r in tables["repeat_offenders"]] == ["node02"]
    assert [r["check"] for r in tables["flaky_checks"]] == ["clock_events"]
    assert [(r["node"], r["metric"]) for r in tables["drifting_figures"]] == [("node02", "gemm_bf16_tflops")]
    text = run_cli("history", "--history", str(history))
    assert text.returncode == 0 and "node02" in text.stdout and "clock_events" in text.stdout
    assert run_cli("history", "--history", str(tmp_path / "nothing")).returncode == 2
