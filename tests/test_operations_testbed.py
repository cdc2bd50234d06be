"""Scheduled-check operations end to end on the test-bed: a planted regression against a node's own history,
and a served deployment's run. Drain and resume run against a real Slurm (tests/test_slurm_testbed.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cluster_accept.analysis.schemas import MEASUREMENTS, NODE_VALUES, RUNS, write_table
from tests.prefect_server import prefect_server, stop
from tests.processes import ROOT, only_run, run_cli

pytestmark = pytest.mark.testbed


@pytest.mark.soak  # docs/development.md: the soak tier
def test_planted_regression_is_flagged_with_its_trend(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """node01 measured now is far below its own history (planted by rewriting three earlier runs in the
    history with node01 about 20x faster): flagged although it passes every threshold and the cluster median, and
    still so when measured again beside a control node."""
    faults = {"nodes": {"node02": [{"nvlink_errors": {"gpu": 0, "link": 3, "crc": 12}}]}}
    bed = testbed_factory(nodes=3, faults=faults, prefix="caq", subnet="10.254.92.0/24")
    out = tmp_path / "runs"
    first = run_cli("run", "--inventory", str(bed.inventory_path), "--out", str(out), "--suite", "light")
    assert first.returncode == 0, first.stdout + first.stderr
    history = out / "history"
    source = only_run(out)
    measured = pq.read_table(source / "measurements.parquet").to_pandas()
    started = pd.read_parquet(source / "runs.parquet").started.iloc[0]
    days = (
        (1, "20200101T000000Z-aaaaaa", 20.0),
        (2, "20200102T000000Z-bbbbbb", 20.4),
        (3, "20200103T000000Z-cccccc", 19.6),
    )
    for day, run_id, faster in days:  # three earlier runs: the fewest a judgement against its own past takes
        past = measured.assign(run_id=run_id)
        past.loc[past.node == "node01", "value"] *= faster
        part = history / "measurements" / f"date=2020-01-0{day}"
        part.mkdir(parents=True)
        pq.write_table(
            pa.Table.from_pandas(past, schema=MEASUREMENTS, preserve_index=False), part / f"{run_id}.parquet"
        )
        (history / "runs" / f"date=2020-01-0{day}").mkdir(parents=True)
        when = (started - pd.Timedelta(days=4 - day)).to_pydatetime()
        row = {"run_id": run_id, "cluster": "testbed", "started": when}
        write_table(history / "runs" / f"date=2020-01-0{day}" / f"{run_id}.parquet", [row], RUNS)
    (own_file,) = (history / "measurements").glob(f"*/{source.name}.parquet")  # the first run: node01 as fast too
    own = pd.read_parquet(own_file)
    own.loc[own.node == "node01", "value"] *= 20.2
    pq.write_table(pa.Table.from_pandas(own, schema=MEASUREMENTS, preserve_index=False), own_file)
    # The first run saw node02's CRC counter at 12; make its record say 2, so the counter "grew" since then.
    (values_file,) = (history / "node_values").glob(f"*/{source.name}.parquet")
    values = pd.read_parquet(values_file)
    crc = (values.key == "counter:gpu0.link3.crc") & (values.node == "node02")
    assert list(values[crc].value) == ["12"]
    assert set(values[(values.key == "counter:gpu0.link3.crc") & ~crc].value) == {"0"}
    values.loc[crc, "value"] = "2"
    write_table(values_file, values.to_dict("records"), NODE_VALUES)
    shutil.rmtree(source)
    second = run_cli("run", "--inventory", str(bed.inventory_path), "--out", str(out), "--suite", "light")
    assert second.returncode == 0, second.stdout + second.stderr  # CPU nodes: regressions are warnings
    run_dir = only_run(out)
    checks = pd.read_parquet(run_dir / "checks.parquet")
    flagged = checks[checks.reason == "regression"]
    assert set(flagged.node) == {"node01"}, checks[checks.item.str.endswith("_vs_history")][["node", "item", "status"]]
    assert set(flagged.status) == {"warn"} and "below this node's own median" in flagged.detail.iloc[0]
    assert all(d.endswith(": confirmed") and "measured again: " in d for d in flagged.detail), flagged.detail
    history_rows = checks[checks.item.str.endswith("_vs_history")]
    assert set(history_rows.node) == {"node01", "node02", "node03"}  # everyone compared, only node01 flagged
    summary = json.loads((run_dir / "summary.json").read_text())
    warned = {w["node"]: w["warnings"] for w in summary["accepted_with_warnings"]}
    assert "gemm:regression" in warned["node01"] and "nvlink:counter_grew" in warned["node02"]
    grew = checks[checks.reason == "counter_grew"]
    assert list(zip(grew.node, grew.check, grew.item, grew.observed, grew.expected, strict=True)) == [
        ("node02", "nvlink", "counter:gpu0.link3.crc", "12", "<= 2")
    ]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["suite"] == "light" and run["quick_probes"] is True
    html = (run_dir / "report.html").read_text()
    assert 'id="history-table"' in html and "node01" in html and "regression" in html


@pytest.mark.soak  # docs/development.md: the soak tier (heavy end to end)
def test_served_deployment_runs_against_the_testbed(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=2, faults={}, prefix="cav", subnet="10.254.96.0/24")
    out = tmp_path / "runs"
    served = None
    extra = {"PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2"}
    with prefect_server(tmp_path / "prefect-home", extra) as env:
        try:
            deadline = time.monotonic() + 120
            served = subprocess.Popen(
                [sys.executable, "-m", "cluster_accept.flows.cli", "serve", "--inventory", str(bed.inventory_path),
                 "--cron", "*/30 * * * *", "--suite", "light", "--out", str(out), "--name", "testbed-light"],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            )  # fmt: skip
            deployment = None
            while deployment is None:
                assert time.monotonic() < deadline + 60, "the deployment was never registered"
                got = subprocess.run(
                    [sys.executable, "-m", "prefect", "deployment", "inspect", "acceptance/testbed-light"],
                    env=env, capture_output=True, text=True,
                )  # fmt: skip
                deployment = got.stdout if got.returncode == 0 else None
                time.sleep(1)
            assert "*/30 * * * *" in deployment and "'suite': 'light'" in deployment
            trigger = subprocess.run(
                [sys.executable, "-m", "prefect", "deployment", "run", "acceptance/testbed-light"],
                env=env, capture_output=True, text=True,
            )  # fmt: skip
            assert trigger.returncode == 0, trigger.stdout + trigger.stderr
            finished = None
            deadline = time.monotonic() + 300
            while finished is None and time.monotonic() < deadline:
                for run_json in out.glob("*/run.json"):
                    info = json.loads(run_json.read_text())
                    if info.get("ended"):
                        finished = info
                time.sleep(1)
            assert finished is not None, "the triggered run did not finish"
            assert finished["suite"] == "light" and finished["stages"] == ["preflight", "single-node", "burn"]
            run_dir = only_run(out)
            verdicts = pd.read_parquet(run_dir / "verdicts.parquet")
            assert set(verdicts.verdict) == {"accepted"} and len(verdicts) == 2
            assert (run_dir / "summary.json").exists()
        finally:
            stop(served)
