"""What an 8-GPU HGX node needs checked before it takes a job, planted on the test-bed's real sshd nodes and read
back through the real CLI and its history: each fault is named with its reason, its cause and its action, and a
healthy node is accepted.

XIDs and SXIDs are judged new since the node's previous run, not since boot: an XID the previous run already
judged passes (shown as seen before); one logged after it fails.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cluster_accept.testbed import bed as testbed
from cluster_accept.testbed.faults import IbCounter, Xid
from tests.processes import only_run, run_cli, run_verdicts

pytestmark = pytest.mark.testbed

WINDOW_S = 36  # how long a flapped port must stay up before it passes again (``link_flap_clear_h``)


def _preflight(inventory: Path, out: Path, history: Path) -> tuple[dict[str, tuple[str, list[str]]], pd.DataFrame]:
    done = run_cli(
        "run", "--inventory", str(inventory), "--out", str(out), "--history", str(history), "--stages", "preflight"
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return run_verdicts(out), pd.read_parquet(only_run(out) / "checks.parquet")


@pytest.mark.soak  # docs/development.md: the soak tier
def test_a_hardware_xid_fails_every_run_of_its_boot_and_a_new_one_is_named_beside_it(
    testbed_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A hardware XID is judged again by every run until the node reboots (fail closed: a drain that never
    happened cannot let the next run pass it); a new one is named beside it with its own action."""
    old = Xid(code=79, gpu=1, at_s=50.0)  # logged long before the first run (the machine is up for longer)
    bed = testbed_factory(nodes=2, faults={"nodes": {"node01": [old]}}, prefix="cahx", subnet="10.254.156.0/24")
    history = tmp_path / "history"

    verdicts, checks = _preflight(bed.inventory_path, tmp_path / "first", history)
    assert verdicts["node01"] == ("rejected", ["xid:xid_79"]) and verdicts["node02"][0] == "accepted", verdicts
    row = checks[(checks.node == "node01") & (checks.check == "xid")].iloc[0]
    assert (row["item"], row.status, row.observed) == ("xid_79", "fail", "1 event on PCI 0000:00:07")
    assert "since boot" in row.detail  # no previous run: every event since boot is new

    verdicts, checks = _preflight(bed.inventory_path, tmp_path / "second", history)
    assert verdicts["node01"] == ("rejected", ["xid:xid_79"]), verdicts  # the same boot: judged again
    assert verdicts["node02"][0] == "accepted", verdicts

    testbed.set_fault(bed, "node01", [old, Xid(code=48, gpu=2)])  # a double-bit ECC error, now
    verdicts, checks = _preflight(bed.inventory_path, tmp_path / "third", history)
    assert verdicts["node01"][0] == "rejected" and set(verdicts["node01"][1]) == {"xid:xid_79", "xid:xid_48"}
    rows = checks[(checks.node == "node01") & (checks.check == "xid")]
    new = rows[rows["item"] == "xid_48"].iloc[0]
    assert (new.reason, new.status, new.observed) == ("xid_48", "fail", "1 event on PCI 0000:00:08")
    assert new.detail.startswith("XID 48: double-bit ECC error")
    report = (only_run(tmp_path / "third") / "report.html").read_text()
    assert "reset GPU" in report  # the catalogue's action for XID 48


def _hgx_inventory(bed: testbed.Testbed, tmp_path: Path) -> Path:
    """The test-bed's inventory, its profile saying the GPUs are NVSwitch-connected (4 per board)."""
    data = yaml.safe_load(bed.inventory_path.read_text())
    data["profiles"]["testbed-h200x4"]["nvswitch"] = {"count": 4}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.untimed  # preflight only: runs beside another worker (docs/development.md)
@pytest.mark.xdist_group("test_hgx_testbed")
def test_fabric_manager_and_nvswitch_faults_are_named_cause_first(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    plan = {
        "nodes": {
            "node01": ["nvswitch_board"],
            "node02": [{"nvswitch_board": {"fabric_manager": "stopped"}}],
            "node03": [{"nvswitch_board": {"version": "570.86.15"}}],
            "node04": [{"nvswitch_board": {"visible": 3}}],
            "node05": ["nvswitch_board", {"sxid": {"code": 20034, "switch": 2, "fatal": True}}],
        }
    }
    bed = testbed_factory(nodes=6, faults=plan, prefix="cahf", subnet="10.254.160.0/24")
    verdicts, checks = _preflight(_hgx_inventory(bed, tmp_path), tmp_path / "runs", tmp_path / "history")

    assert verdicts["node01"][0] == "accepted" and verdicts["node06"][0] == "accepted", verdicts
    # Fabric Manager stopped: the GPUs never joined the fabric, every NVLink reads inactive; the cause comes first.
    reasons = verdicts["node02"][1]
    assert reasons[0] == "nvswitch:fm_stopped" and "nvlink:link_inactive" in reasons, reasons
    # a Fabric Manager of another version refuses to start: the same symptoms, its own cause first
    reasons = verdicts["node03"][1]
    assert reasons[0] == "nvswitch:fm_version_mismatch" and "nvlink:link_inactive" in reasons, reasons
    assert verdicts["node04"] == ("rejected", ["nvswitch:nvswitch_missing"]), verdicts
    assert verdicts["node05"] == ("rejected", ["xid:sxid_fatal"]), verdicts

    def rows(node: str) -> pd.DataFrame:
        return checks[(checks.node == node) & (checks.check == "nvswitch")]

    healthy = rows("node01")
    assert set(healthy.status) == {"pass"} and len(healthy) == 7  # switches, service, version, 4 GPUs
    stopped = rows("node02")
    service = stopped[stopped["item"] == "fabric_manager"].iloc[0]
    assert (service.observed, service.expected) == ("inactive (success)", "active")
    assert set(stopped[stopped["item"].str.startswith("gpu")].reason) == {"fabric_not_ready"}
    version = rows("node03")[rows("node03")["item"] == "fm_version"].iloc[0]
    assert (version.observed, version.expected) == ("Fabric Manager 570.86.15", "580.159.04 (the loaded driver)")
    slice_ = rows("node06")  # no board: a VM slice whose host runs the fabric; its GPUs' state passes
    assert slice_[slice_["item"] == "nvswitches"].reason.iloc[0] == "managed_elsewhere"
    sxid = checks[(checks.node == "node05") & (checks.check == "xid") & (checks.status == "fail")].iloc[0]
    assert (sxid["item"], sxid.observed) == ("sxid_20034", "1 event (Fatal) on nvswitch2 (0000:a7:00.0)")
    report = (only_run(tmp_path / "runs") / "report.html").read_text()
    assert "nvidia-fabricmanager is not running" in report  # the reason's explanation and action reach the report


@pytest.mark.soak  # docs/development.md: the soak tier
def test_a_flapping_port_fails_until_it_has_stayed_up_long_enough(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=2, prefix="cahl", subnet="10.254.164.0/24", rails=1)
    data = yaml.safe_load(bed.inventory_path.read_text())
    # a preflight run here takes about 12 s, so the third run still falls inside the window
    data["profiles"]["testbed-h200x4"].setdefault("thresholds", {})["link_flap_clear_h"] = WINDOW_S / 3600
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump(data))
    history = tmp_path / "history"
    verdicts, _ = _preflight(inventory, tmp_path / "first", history)
    assert {v for v, _ in verdicts.values()} == {"accepted"}, verdicts

    testbed.set_fault(bed, "node01", [IbCounter(rail=0, counter="link_downed", value=2)])  # mlx5_0 went down twice
    verdicts, checks = _preflight(inventory, tmp_path / "second", history)
    flapped_by = time.monotonic()  # the flap is dated by the run that found it: this one, ended by now
    assert verdicts["node01"] == ("rejected", ["ib_counters:link_flapping"]), verdicts
    row = checks[(checks.node == "node01") & (checks["item"] == "mlx5_0/1 flaps")].iloc[0]
    assert (row.observed, row.expected) == ("link_downed 0 -> 2", "no change since the previous run")
    assert row.detail.startswith("went down between ") and row.detail.endswith("clears after 0.01 h up")

    verdicts, checks = _preflight(inventory, tmp_path / "third", history)  # still within the window
    assert verdicts["node01"] == ("rejected", ["ib_counters:flapped_recently"]), verdicts
    time.sleep(max(0.0, flapped_by + WINDOW_S + 2 - time.monotonic()))  # the window over, not a run's time more
    verdicts, checks = _preflight(inventory, tmp_path / "fourth", history)  # up for longer than the window
    assert verdicts["node01"][0] == "accepted", verdicts
    row = checks[(checks.node == "node01") & (checks["item"] == "mlx5_0/1 flaps")].iloc[0]
    assert row.reason == "flap_cleared" and row.observed.startswith("last flapped ")


def test_firmware_off_the_majority_a_hot_gpu_and_growing_aer_counters(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    plan = {
        "nodes": {
            "node02": [{"hot_gpu": {"gpu": 2, "temp_c": 85}}],  # a failing fan: 85 °C under load, the others 36-39
            "node03": [{"gpu_field": {"field": "vbios_version", "value": "96.00.74.00.0B"}}],  # flashed apart
            "node04": [{"hca_firmware": {"rail": 0, "fw_ver": "28.35.2000"}}],
        }
    }
    bed = testbed_factory(nodes=5, faults=plan, prefix="cahb", subnet="10.254.168.0/24", rails=1)
    data = yaml.safe_load(bed.inventory_path.read_text())
    profile = data["profiles"]["testbed-h200x4"]
    profile["burn"] = {"minutes": 0.1, "light_minutes": 0.1, "sample_interval_s": 0.5, "throughput_drop_max_pct": 90,
                       "sdc": False}  # fmt: skip
    profile["probes"]["max_parallel_nodes"] = 5
    inventory, history = tmp_path / "inventory.yaml", tmp_path / "history"
    inventory.write_text(yaml.safe_dump(data))
    run = run_cli("run", "--inventory", str(inventory), "--out", str(tmp_path / "burn"), "--history", str(history),
                  "--suite", "burn", timeout=900)  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    verdicts = run_verdicts(tmp_path / "burn")
    assert verdicts["node01"][0] == "accepted" and verdicts["node05"][0] == "accepted", verdicts
    assert verdicts["node02"] == ("rejected", ["burn:runs_hot", "burn:thermal_spread"]), verdicts
    assert verdicts["node03"] == ("rejected", ["firmware:drift"]), verdicts
    assert verdicts["node04"] == ("rejected", ["firmware:drift"]), verdicts
    checks = pd.read_parquet(only_run(tmp_path / "burn") / "checks.parquet")
    hot = checks[(checks.node == "node02") & (checks.reason == "runs_hot")].iloc[0]
    assert (hot.gpu, hot.expected) == (2, "≤ 6 °C above the node's median")
    assert hot.observed.startswith("85 °C under load, +")
    uniform = checks[(checks.check == "burn") & (checks["item"] == "thermal") & (checks.node != "node02")]
    assert set(uniform.reason) == {"thermal_uniform"} and set(uniform.node) == {"node01", "node05"}  # burned
    drift = checks[(checks.check == "firmware") & (checks.reason == "drift")]
    assert sorted(zip(drift.node, drift["item"], drift.observed, drift.expected, strict=True)) == [
        ("node03", "vbios_drift", "96.00.74.00.0B", "96.00.A5.00.1A (majority)"),
        ("node04", "hca_fw:MT4129_drift", "28.35.2000", "28.39.1002 (majority)"),
    ]
    report = (only_run(tmp_path / "burn") / "report.html").read_text()
    assert 'data-chart="burn-temp-node02"' in report  # each GPU's temperature over the burn

    # Correctable AER errors on node01's GPU 0 between two runs: the next preflight names the device.
    testbed.set_fault(bed, "node01", [{"pcie_aer": {"gpu": 0, "severity": "correctable", "counter": "BadTLP",
                                                   "value": 12}}])  # fmt: skip
    verdicts, checks = _preflight(inventory, tmp_path / "again", history)
    assert verdicts["node01"][0] == "accepted", verdicts  # a grown correctable count warns
    grew = checks[(checks.node == "node01") & (checks.reason == "counter_grew")]
    assert list(zip(grew.check, grew["item"], grew.observed, grew.expected, strict=True)) == [
        ("pcie_aer", "counter:0000:00:06.0.aer_correctable", "12", "<= 0")
    ]
