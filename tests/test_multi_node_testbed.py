"""Multi-node stage on the test-bed (CPU, gloo over the bridge): a rate-limited node is named, and only it;
without the limiter nobody is; a node that dies mid-sweep is reported while the others finish."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from cluster_accept.inventory.hostlist import expand
from cluster_accept.testbed import bed as testbed
from cluster_accept.testbed.faults import fault_plan_from_data
from tests.processes import only_run, run_cli, run_verdicts, start_cli

pytestmark = pytest.mark.testbed
ROOT = Path(__file__).resolve().parent.parent


def multi_node_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=900)


def test_rate_limited_node_is_isolated(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(
        nodes=8,
        faults=fault_plan_from_data({"nodes": {"node05": [{"slow": {"rate_mbit": 50}}]}}),
        prefix="cam",
        subnet="10.254.28.0/24",
    )
    proc = multi_node_cli(
        "run", "--inventory", str(bed.inventory_path), "--out", str(tmp_path), "--stages", "multi-node"
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    got = run_verdicts(tmp_path)
    assert got["node05"][0] == "rejected" and "isolation:slow_node" in got["node05"][1]
    assert {n for n, (v, _) in got.items() if v != "accepted"} == {"node05"}
    run_dir = only_run(tmp_path)
    rounds = pd.read_parquet(run_dir / "isolation.parquet")
    assert len(rounds) >= 2 and set(rounds.phase) >= {"screen", "confirm"}
    bad_groups = [expand(nodes) for nodes in rounds[rounds.bad].nodes]
    assert any("node05" in group for group in bad_groups)  # (shared cores can slow a healthy group too)
    scaling = pd.read_parquet(run_dir / "scaling.parquet")
    assert list(scaling.nodes)[:2] == [2, 4]
    md = (run_dir / "report.md").read_text()
    assert "## Isolation rounds" in md and "## Scaling" in md and "| node05 | rejected |" in md


def test_no_limiter_rejects_nobody(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=8, faults=None, prefix="cam2", subnet="10.254.44.0/24")
    proc = multi_node_cli(
        "run", "--inventory", str(bed.inventory_path), "--out", str(tmp_path), "--stages", "multi-node"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {v for v, _ in run_verdicts(tmp_path).values()} == {"accepted"}
    m = pd.read_parquet(only_run(tmp_path) / "measurements.parquet")
    assert sorted(set(m.group)) == ["node[01-02]", "node[01-04]", "node[01-08]"]
    assert (m.value > 0.03).all()


def test_node_killed_mid_sweep_is_reported_and_others_finish(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=8, faults=None, prefix="cam3", subnet="10.254.48.0/24")
    proc = start_cli("run", "--inventory", str(bed.inventory_path), "--out", str(tmp_path), "--stages", "multi-node")
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list(tmp_path.glob("*/run.json")):
            time.sleep(0.5)
        time.sleep(3)  # the sweep is under way
        testbed.kill_sshd(bed, "node07")
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
        testbed.start_sshd(bed, "node07")
    assert proc.returncode == 1, out + err
    got = run_verdicts(tmp_path)
    assert got["node07"][0] == "unreachable"
    assert {n for n, (v, _) in got.items() if v != "accepted"} == {"node07"}


def test_bisect_names_the_slow_suspect(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(
        nodes=8,
        faults=fault_plan_from_data({"nodes": {"node05": [{"slow": {"rate_mbit": 50}}]}}),
        prefix="cam",
        subnet="10.254.28.0/24",
    )
    proc = multi_node_cli(
        "bisect",
        "--inventory",
        str(bed.inventory_path),
        "--nodes",
        "node[04-06]",
        "--good",
        "node[01-02]",
        "--out",
        str(tmp_path),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    got = run_verdicts(tmp_path)
    assert set(got) == {"node01", "node02", "node04", "node05", "node06"}
    assert got["node05"] == ("rejected", ["isolation:slow_node"])
    assert {n for n, (v, _) in got.items() if v != "accepted"} == {"node05"}
    run = (only_run(tmp_path) / "run.json").read_text()
    assert '"bisect"' in run
