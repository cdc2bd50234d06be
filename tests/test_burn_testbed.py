"""The burn stage on the test-bed: four nodes burned in with ``--suite burn`` (preflight, then the burn).

node02's GPU 1 throttles under load (its nvidia-smi answers 900 MHz with HW thermal slowdown while the burn
samples it), node03's GPU 2 flips a bit of its product, node04's ``dcgmi diag`` fails PCIe on GPU 0: each is named
with its reason, node01 is accepted, the per-second series are in ``burn/<node>.parquet`` and a chart per node is in the
report. A second run on a node without dcgmi says so in a skip row.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from cluster_accept.testbed import bed as testbed
from tests.processes import only_run, run_cli, run_verdicts

pytestmark = pytest.mark.testbed
FAULTS = {
    "node02": [{"throttle": {"gpu": 1, "sm_clock_mhz": 900, "reasons": "0x40"}}],
    "node03": [{"sdc": {"gpu": 2}}],
    "node04": [{"dcgm_fail": {"test": "pcie", "gpu": 0}}],
}


def _inventory(bed: testbed.Testbed, tmp_path: Path) -> Path:
    data = yaml.safe_load(bed.inventory_path.read_text())
    profile = data["profiles"]["testbed-h200x4"]
    # Six seconds sampled every half second; CPU throughput on shared cores swings, so only a collapse fails.
    profile["burn"] = {"minutes": 0.1, "light_minutes": 0.1, "sample_interval_s": 0.5, "throughput_drop_max_pct": 90,
                       "dcgm_level": 2}  # fmt: skip
    profile["probes"]["max_parallel_nodes"] = 4
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_burn_names_throttling_bit_flips_and_dcgm_failures(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=4, faults={"nodes": FAULTS}, prefix="cab", subnet="10.254.120.0/24")
    inventory, out = _inventory(bed, tmp_path), tmp_path / "runs"
    run = run_cli("run", "--inventory", str(inventory), "--out", str(out), "--suite", "burn", timeout=600)
    assert run.returncode == 1, run.stdout + run.stderr
    verdicts = run_verdicts(out)
    assert verdicts["node01"][0] == "accepted", verdicts
    assert "burn:throttled" in verdicts["node02"][1] and "sdc:mismatch" in verdicts["node03"][1], verdicts
    assert "dcgm:pcie_error" in verdicts["node04"][1], verdicts
    run_dir = only_run(out)
    checks = pd.read_parquet(run_dir / "checks.parquet")
    assert set(checks.stage) == {"preflight", "burn"} and not (checks.check == "coverage").any()
    bad = checks[checks.status.isin(["fail", "error"])]
    named = sorted(zip(bad.node, bad.check, bad.reason, bad.gpu, strict=True))
    assert named == [("node02", "burn", "throttled", 1), ("node03", "sdc", "mismatch", 2),
                     ("node04", "dcgm", "pcie_error", 0)], bad  # fmt: skip
    throttled = bad[bad.reason == "throttled"].iloc[0]
    assert throttled.observed.startswith("900 MHz under load (HW thermal slowdown active in")
    assert throttled.expected.endswith("; ≥ 1782 MHz")
    assert "PCI link width 8X" in bad[bad.reason == "pcie_error"].observed.iloc[0]
    sustained = checks[(checks.check == "burn") & (checks.reason == "sustained")]
    assert len(sustained) == 4 * 4 - 1  # every other GPU of the four nodes held
    same = checks[(checks.check == "sdc") & (checks.reason == "same")]
    assert len(same) == 15 and same.expected.iloc[0] == "as 15 of 16 GPUs"
    series = pd.read_parquet(run_dir / "burn")
    loaded = series[(series.kind == "sample") & (series.node == "node02")]
    assert set(loaded[loaded.gpu == 1].sm_clock_mhz) == {900.0} and set(loaded[loaded.gpu == 0].sm_clock_mhz) == {
        1980.0
    }
    assert set(series[series.kind == "throughput"].groupby("node").gpu.nunique()) == {4}
    report = (run_dir / "report.html").read_text()
    assert all(f'data-chart="burn-node0{i}"' in report for i in range(1, 5))

    testbed.set_fault(bed, "node01", [{"no_dcgm": {}}])
    again = run_cli("run", "--inventory", str(inventory), "--out", str(tmp_path / "again"), "--stages", "burn",
                    "--nodes", "node01", timeout=600)  # fmt: skip
    checks = pd.read_parquet(only_run(tmp_path / "again") / "checks.parquet")
    dcgm = checks[checks.check == "dcgm"]
    assert list(zip(dcgm.status, dcgm.reason, strict=True)) == [("skip", "not_installed")], (again.stdout, dcgm)


def test_a_co_tenant_that_starts_half_way_through_the_burn_is_named_as_the_cause(  # type: ignore[no-untyped-def]
    testbed_factory, tmp_path: Path
) -> None:
    """node02's GPU 2 gets another job's process two seconds into the burn: nvidia-smi lists it while the burn
    samples, and that GPU's products then take ten times as long. The verdict names the process first, as the
    cause of the GPU's throughput drop, and the finding takes the process's action, not the GPU's."""
    cotenant = {"cotenant": {"gpu": 2, "pid": 4242, "name": "python", "after_s": 2, "slowdown": 10}}
    bed = testbed_factory(nodes=2, faults={"nodes": {"node02": [cotenant]}}, prefix="cac", subnet="10.254.150.0/24")
    inventory, out = _inventory(bed, tmp_path), tmp_path / "runs"
    data = yaml.safe_load(inventory.read_text())
    data["profiles"]["testbed-h200x4"]["burn"] |= {"throughput_drop_max_pct": 50, "dcgm_level": None}
    inventory.write_text(yaml.safe_dump(data))
    run = run_cli("run", "--inventory", str(inventory), "--out", str(out), "--suite", "burn", timeout=600)
    assert run.returncode == 1, run.stdout + run.stderr
    verdicts = run_verdicts(out)
    assert verdicts["node01"][0] == "accepted", verdicts
    assert verdicts["node02"][1][:2] == ["gpu:busy", "burn:throughput_dropped"], verdicts
    run_dir = only_run(out)
    checks = pd.read_parquet(run_dir / "checks.parquet")
    bad = checks[(checks.node == "node02") & checks.status.isin(["fail", "error"])]
    assert sorted(zip(bad.check, bad.reason, bad.gpu, strict=True)) == [("burn", "throughput_dropped", 2),
                                                                        ("gpu", "busy", 2)], bad  # fmt: skip
    busy = bad[bad.reason == "busy"].iloc[0]
    assert busy.stage == "burn" and busy.observed.startswith("pid 4242 python (30000.0 MiB)"), busy
    cause = pd.read_parquet(run_dir / "verdicts.parquet").set_index("node").loc["node02", "cause"]
    assert cause.startswith("burn gpu2 gpu 2 ") and ": gpu:busy pid 4242 python" in cause, cause
    # Before it started, preflight saw no other process on any GPU of either node.
    apps = checks[(checks.check == "gpu") & (checks.stage == "preflight") & (checks.item == "compute_apps")]
    assert set(apps.status) == {"pass"} and set(apps.node) == {"node01", "node02"}, apps
    report = (run_dir / "report.html").read_text()
    assert "explained by gpu:busy" in report
