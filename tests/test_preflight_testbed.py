"""Preflight end to end: one planted fault per kind on an 8-node test-bed, each found with its reason."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from cluster_accept.testbed.faults import fault_plan_from_data
from tests.processes import only_run, run_cli

pytestmark = [pytest.mark.testbed, pytest.mark.untimed, pytest.mark.xdist_group("test_preflight_testbed")]
ROOT = Path(__file__).resolve().parent.parent

PLAN = {
    "nodes": {
        "node02": [{"driver_version": {"version": "570.86.15"}}, {"pcie_width": {"gpu": 2, "width": 8}}],
        "node03": ["gpu_missing", {"nccl_env": {"NCCL_SOCKET_IFNAME": "eth9"}}],
        "node04": ["nvidia_smi_fail"],
        "node05": [{"persistence_disabled": {"gpu": 1}}, {"xid": {"code": 79, "gpu": 1}}],
        "node06": [
            {"nvlink_inactive": {"gpu": 1, "link": 7}},
            {"nvlink_errors": {"gpu": 0, "link": 3, "crc": 12}},
            {"nccl_env": {"NCCL_P2P_DISABLE": "1"}},  # a leftover from debugging: SHM instead of NVLink
        ],
        # A driver from before the rename of clock throttle reasons, without the recent remapped_rows fields:
        # still accepted, the clock events read under their older name, the missing fields skipped with why.
        "node08": ["old_driver"],
        "node07": [
            {"gpu_field": {"field": "clocks_event_reasons.active", "gpu": 2, "value": "0x0000000000000008"}},
            {"gpu_field": {"field": "remapped_rows.pending", "gpu": 3, "value": "Yes"}},
            {"nccl_env": {"NCCL_IB_DISABLE": None}},
        ],
    }
}

# node -> (verdict, reasons that must be there, checks allowed to fail)
EXPECTED = {
    "node01": ("accepted", set(), set()),
    "node02": ("rejected", {"driver:version_mismatch", "pcie:width_degraded"}, {"driver", "pcie"}),
    "node03": (
        "rejected",
        {"gpu_count:count_low", "nccl_env:value_mismatch", "nccl_harmful:socket_ifname_missing"},
        {"gpu_count", "nccl_env", "nccl_harmful", "topology"},
    ),
    "node04": ("rejected", {"gpu_count:nvidia_smi_failed", "driver:nvidia_smi_failed"}, {"gpu_count", "driver"}),
    "node05": ("rejected", {"persistence:persistence_disabled", "xid:xid_79"}, {"persistence", "xid"}),
    "node06": (
        "rejected",
        {"nvlink:link_inactive", "nccl_harmful:p2p_disabled"},
        {"nvlink", "topology", "nccl_harmful"},
    ),
    "node07": (
        "rejected",
        {"clock_events:throttle_hw_slowdown", "memory:remap_pending", "nccl_env:missing"},
        {"clock_events", "memory", "nccl_env"},
    ),
    "node08": ("accepted", set(), set()),
}


def test_every_planted_fault_is_found_with_its_reason(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=8, faults=fault_plan_from_data(PLAN), prefix="cap", subnet="10.254.20.0/24")
    proc = run_cli(
        "run", "--inventory", str(bed.inventory_path), "--out", str(tmp_path), "--stages", "preflight", timeout=240
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_dir = only_run(tmp_path)
    verdicts = {r.node: (r.verdict, set(r.reasons)) for r in pd.read_parquet(run_dir / "verdicts.parquet").itertuples()}
    for node, (verdict, must, allowed_checks) in EXPECTED.items():
        got_verdict, reasons = verdicts[node]
        assert got_verdict == verdict, (node, reasons)
        assert must <= reasons, (node, reasons)
        assert {r.split(":")[0] for r in reasons} <= allowed_checks, (node, reasons)

    checks = pd.read_parquet(run_dir / "checks.parquet")
    # Harmful settings are named with where they were set and what the node has instead.
    harmful = checks[(checks.check == "nccl_harmful") & (checks.status == "fail")]
    said = {(r.node, r.item): r.detail for r in harmful.itertuples()}
    assert set(said) == {("node03", "NCCL_SOCKET_IFNAME"), ("node06", "NCCL_P2P_DISABLE")}
    old = checks[checks.node == "node08"]
    events = old[old.check == "clock_events"]
    gpus = int(old[(old.check == "gpu_count") & (old.item == "count")].observed.iloc[0])
    assert set(events.status) == {"pass"} and sorted(events.gpu) == list(range(gpus))
    assert all(d.endswith("(driver before clocks_event_reasons)") for d in events.detail), list(events.detail)
    assert all(d.startswith("clocks_throttle_reasons.active=0x") for d in events.detail)
    remapped = old[(old.check == "memory") & (old.reason == "field_not_in_driver")]
    assert len(remapped) > 0 and set(remapped.status) == {"skip"}
    assert said[("node03", "NCCL_SOCKET_IFNAME")].startswith("set in the job environment: no interface matches 'eth9'")
    assert "it has eth0, lo" in said[("node03", "NCCL_SOCKET_IFNAME")]
    assert said[("node06", "NCCL_P2P_DISABLE")].startswith("set in the job environment: NCCL uses shared memory")
    assert set(checks[checks.check == "nccl_harmful"].node) == {f"node{i:02d}" for i in range(1, 9)}
    inactive = checks[(checks.node == "node06") & (checks.reason == "link_inactive")]
    assert list(inactive.gpu) == [1] and list(inactive.observed) == ["<inactive>"]
    crc = checks[(checks.node == "node06") & (checks.reason == "link_errors")]
    assert list(crc.status) == ["warn"] and list(crc.gpu) == [0]
    width = checks[(checks.node == "node02") & (checks.reason == "width_degraded")]
    assert list(width.gpu) == [2] and list(width.observed) == ["x8"]
    healthy = checks[checks.node.isin(["node01", "node08"])]
    assert set(healthy.status) <= {"pass", "skip", "warn"}
    assert {
        "driver",
        "gpu_count",
        "persistence",
        "nvlink",
        "pcie",
        "memory",
        "clock_events",
        "xid",
        "nccl_env",
        "infiniband",
        "topology",
        "cuda",
    } <= set(healthy.check)

    md = (run_dir / "report.md").read_text()
    assert "580.159.04 on node[01,03,05-08]; 570.86.15 on node02" in md
    for node in ("node02", "node03", "node04", "node05", "node06", "node07"):
        assert f"| {node} | rejected |" in md
