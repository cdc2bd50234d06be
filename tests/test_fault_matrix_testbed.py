"""The fault matrix: one planted fault per node, the whole run through preflight and the single-node stage.

For each fault: the run completes; the node's rows say what happened with a reason code; the other nodes'
results are complete; no process of ours is left on any node; nothing is written twice. A multi-node probe
that hangs and a run directory on a read-only disk are separate tests; nodes that die mid-run are in
test_node_death_testbed.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cluster_accept.checks.base import discover as discover_checks
from cluster_accept.testbed import bed as testbed
from cluster_accept.testbed import net
from tests.processes import only_run, run_cli, run_verdicts, start_cli

pytestmark = pytest.mark.testbed

PLAN = {
    "nodes": {
        "node02": ["down"],
        "node03": ["auth_refused"],
        "node04": ["host_key_changed"],
        "node05": ["nvidia_smi_hang"],
        "node06": ["nvidia_smi_fail"],
        "node07": ["garbage"],
        "node08": ["truncated"],
    }
}
# node -> (verdict, a reason that must be among its reasons)
EXPECTED = {
    "node01": ("accepted", None),
    "node02": ("unreachable", "ssh:refused"),
    "node03": ("unreachable", "ssh:auth"),
    "node04": ("unreachable", "ssh:host-key"),
    "node05": ("rejected", "driver:command_timeout"),
    "node06": ("rejected", "driver:nvidia_smi_failed"),
    "node07": ("rejected", None),
    "node08": ("rejected", None),
    "node09": ("accepted", None),
}
HEALTHY = ("node01", "node09")


def ours_left(bed: testbed.Testbed) -> dict[str, list[str]]:
    """Per node, processes in its namespace other than its sshd: what a run could have left behind."""
    left: dict[str, list[str]] = {}
    for node in bed.nodes:
        for pid in net.netns_pids(bed.netns(node)):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                continue
            if cmdline and not cmdline.startswith("sshd:") and "sshd" not in cmdline.split()[0]:
                left.setdefault(node, []).append(cmdline)
    return left


def wait_until_clean(bed: testbed.Testbed, timeout_s: float = 30) -> dict[str, list[str]]:
    deadline = time.monotonic() + timeout_s
    left = ours_left(bed)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = ours_left(bed)
    return left


def no_duplicates(run_dir: Path) -> None:
    checks = pd.read_parquet(run_dir / "checks.parquet")
    assert not checks.duplicated(subset=["node", "stage", "check", "item", "gpu", "reason"]).any()
    verdicts = pd.read_parquet(run_dir / "verdicts.parquet")
    assert verdicts.node.is_unique
    if (run_dir / "measurements.parquet").exists():
        m = pd.read_parquet(run_dir / "measurements.parquet")
        assert not m.duplicated(subset=["node", "stage", "probe", "metric", "gpu", "size", "group"]).any()


@pytest.mark.soak  # docs/development.md: the soak tier (heavy end to end)
def test_fault_matrix(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=9, faults=PLAN, prefix="caf9", subnet="10.254.72.0/24")
    data = yaml.safe_load(bed.inventory_path.read_text())
    data["defaults"]["ssh"]["command_timeout_s"] = 10  # node05's hung nvidia-smi is stopped after 10 s, not 30
    quick = bed.inventory_path.with_name("inventory-quick-timeout.yaml")  # beside it: relative paths hold
    quick.write_text(yaml.safe_dump(data))
    proc = run_cli("run", "--inventory", str(quick), "--out", str(tmp_path), "--stages", "preflight,single-node")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_dir = only_run(tmp_path)
    got = run_verdicts(tmp_path)
    for node, (verdict, reason) in EXPECTED.items():
        assert got[node][0] == verdict, (node, got[node])
        if reason:
            assert reason in got[node][1], (node, got[node])
        if verdict != "accepted":
            assert got[node][1], f"{node} is {verdict} without a reason"
    checks = pd.read_parquet(run_dir / "checks.parquet")
    for node in ("node07", "node08"):  # malformed and truncated output: an error row, with the raw text kept
        rows = checks[(checks.node == node) & checks.status.isin(["error", "fail"])]
        assert len(rows) and all(rows.reason.str.len() > 0), node
    # The healthy nodes' results are complete: every check judged, every probe figure there.
    checks_per_node = checks[checks.stage == "preflight"].groupby("node").check.nunique()
    discovered = discover_checks()  # each with its samples, or discovery refuses it
    assert checks_per_node["node01"] == checks_per_node["node09"] == len({c.name for c in discovered})
    assert set(checks[(checks.stage == "preflight") & (checks.node == "node01")].check) >= {c.name for c in discovered}
    measurements = pd.read_parquet(run_dir / "measurements.parquet")
    assert set(measurements.node) == set(HEALTHY)
    per_node = measurements.groupby("node").metric.apply(lambda s: tuple(sorted(set(s))))
    assert per_node["node01"] == per_node["node09"] and "allreduce_busbw_gbps" in per_node["node01"]
    no_duplicates(run_dir)
    assert wait_until_clean(bed) == {}  # the hung nvidia-smi was killed on node05, nothing else left


@pytest.mark.soak  # docs/development.md: the soak tier (heavy end to end)
def test_hanging_multi_node_probe_is_stopped_everywhere(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """One rank stops dead (SIGSTOP: a hung GPU in a collective); the others block in the all-reduce.
    The run must end at the probe timeout, say so, and leave nothing running on any node."""
    bed = testbed_factory(nodes=3, faults={}, prefix="cah9", subnet="10.254.80.0/24")
    data = yaml.safe_load(bed.inventory_path.read_text())
    for profile in data["profiles"].values():
        profile.setdefault("probes", {})["timeout_s"] = 30  # a healthy pair takes 5-10 s here
    short = bed.inventory_path.with_name("inventory-short-timeout.yaml")  # beside it: relative paths hold
    short.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    proc = start_cli("run", "--inventory", str(short), "--out", str(out), "--stages", "multi-node")
    victim = bed.netns("node02")
    stopped: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not stopped:
            for pid in net.netns_pids(victim):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"allreduce.py" in cmdline and b"torch.distributed.run" not in cmdline:
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
            time.sleep(0.1)
        assert stopped, "node02's rank never started"
        out_text, err_text = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    # A hung run stops every rank alike at the probe timeout: no rank stands out, so none is blamed and no node
    # is rejected for it: the run is a rerun, said on both nodes (exit 3); isolation's re-tests pass.
    assert proc.returncode == 3, out_text + err_text
    run_dir = only_run(out)
    checks = pd.read_parquet(run_dir / "checks.parquet")
    hung = checks[checks.reason.isin(["collective_timeout", "collective_failed", "run_unattributed"])]
    assert set(hung.node) == {"node01", "node02"}, checks[["node", "reason"]]
    assert set(hung.reason) == {"run_unattributed"} and set(hung.item) == {"inter_node node[01-02]"}
    assert all("no rank of it can be blamed" in detail for detail in hung.detail)
    verdicts = pd.read_parquet(run_dir / "verdicts.parquet")
    got = dict(zip(verdicts.node, verdicts.verdict, strict=True))
    assert got == {"node01": "tool_error", "node02": "tool_error", "node03": "accepted"}
    no_duplicates(run_dir)
    assert wait_until_clean(bed, 60) == {}


def test_read_only_run_directory_is_a_clear_error_before_anything_runs(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=2, faults={}, prefix="car9", subnet="10.254.84.0/24")
    mount = tmp_path / "ro"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(mount)], check=True)
    try:
        proc = run_cli("run", "--inventory", str(bed.inventory_path), "--out", str(mount / "runs"))
    finally:
        subprocess.run(["umount", str(mount)], check=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"cannot write run directories under {mount / 'runs'}" in proc.stderr and "Read-only" in proc.stderr
    assert ours_left(bed) == {}
