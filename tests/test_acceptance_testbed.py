"""End to end: the real CLI, real Prefect, real sshd nodes with planted faults; Parquet and report on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from cluster_accept.testbed.faults import load_fault_plan
from tests.processes import only_run, run_cli

pytestmark = pytest.mark.testbed
ROOT = Path(__file__).resolve().parent.parent

EXPECTED = {
    "node01": ("accepted", []),
    "node02": ("unreachable", ["ssh:refused"]),
    "node03": ("unreachable", ["ssh:host-key"]),
    "node04": ("rejected", ["driver:version_mismatch", "driver:drift"]),
    "node05": ("rejected", ["gpu_count:count_low"]),
    "node06": ("rejected", ["driver:nvidia_smi_failed", "gpu_count:nvidia_smi_failed"]),
    "node07": ("accepted", []),
    "node08": ("accepted", []),
}


@pytest.mark.untimed  # preflight, or Slurm alone: runs beside another worker (docs/development.md)
@pytest.mark.xdist_group("test_acceptance_testbed")
def test_run_on_faulty_testbed_names_every_fault(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    plan = load_fault_plan(ROOT / "cluster_accept" / "testbed" / "demo-faults.yaml")
    bed = testbed_factory(nodes=8, faults=plan, prefix="cae", subnet="10.254.16.0/24")
    # Preflight names every planted fault but node08's slow link, which the demo's stage between nodes finds
    # (tests/test_report_browser.py runs the demo).
    proc = run_cli("run", "--inventory", str(bed.inventory_path), "--out", str(tmp_path), "--stages", "preflight")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_dir = only_run(tmp_path)
    verdicts = pd.read_parquet(run_dir / "verdicts.parquet")
    got = {row.node: (row.verdict, list(row.reasons)) for row in verdicts.itertuples()}
    assert got == EXPECTED
    checks = pd.read_parquet(run_dir / "checks.parquet")
    assert set(checks.columns) >= {
        "run_id",
        "stage",
        "node",
        "gpu",
        "check",
        "status",
        "reason",
        "observed",
        "expected",
        "detail",
        "raw_output",
    }
    mismatch = checks[(checks.node == "node04") & (checks.reason == "version_mismatch")].iloc[0]
    assert (mismatch.observed, mismatch.expected) == ("570.86.15", "580.159.04")
    assert "570.86.15" in mismatch.raw_output
    run = json.loads((run_dir / "run.json").read_text())
    assert run["run_id"] == run_dir.name and run["ended"] and run["inventory_digest"]
    assert run["tools"]["prefect"].startswith("3.")
    html = (run_dir / "report.html").read_text()
    md = (run_dir / "report.md").read_text()
    for node in ("node02", "node03", "node04", "node05", "node06"):
        assert node in html and node in md
    assert "580.159.04 on node[01,05,07-08]; 570.86.15 on node04" in md
    values = pd.read_parquet(run_dir / "node_values.parquet")
    assert set(values[values.key == "driver_version"].node) == {"node01", "node04", "node05", "node07", "node08"}
    assert "Not accepted:** node[02-06]" in md


def test_run_with_only_healthy_nodes_exits_0(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    plan = load_fault_plan(ROOT / "cluster_accept" / "testbed" / "demo-faults.yaml")
    bed = testbed_factory(nodes=8, faults=plan, prefix="cae", subnet="10.254.16.0/24")
    proc = run_cli("run", "--inventory", str(bed.inventory_path), "--out", str(tmp_path), "--nodes", "node[01,07]")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdicts = pd.read_parquet(only_run(tmp_path) / "verdicts.parquet")
    assert sorted(verdicts.node) == ["node01", "node07"]
    assert set(verdicts.verdict) == {"accepted"}
