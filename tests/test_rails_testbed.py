"""Every collective and every link on the test-bed: 4 nodes with two rails each (a veth per rail on its own
bridge, one simulated HCA per rail in sysfs), one node's rail1 held to a few Mbit/s by tc.

One run measures all-gather, reduce-scatter, all-to-all and send/recv beside all-reduce in every node and
across the nodes, finds rail1 slow against rail0 and names (node03, rail1, mlx5_1) by isolation on that rail
alone; a second run after an InfiniBand error counter grew on node02 flags that port.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from cluster_accept.inventory.model import busbw_threshold
from cluster_accept.testbed import bed as testbed
from cluster_accept.testbed.faults import IbCounter, SlowRail
from tests.processes import only_run, run_cli, run_verdicts

pytestmark = pytest.mark.testbed
OPS = ["all_gather", "reduce_scatter", "all_to_all", "send_recv"]


def _inventory(bed: testbed.Testbed, tmp_path: Path) -> Path:
    data = yaml.safe_load(bed.inventory_path.read_text())
    profile = data["profiles"]["testbed-h200x4"]
    profile["probes"]["collectives"] = OPS
    profile["probes"]["max_parallel_nodes"] = 4  # single-node figures are not under test here: no waves
    assert [r["ifname"] for r in profile["probes"]["rails"]] == ["rail0", "rail1"]
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.soak  # docs/development.md: the soak tier (heavy end to end)
def test_slow_rail_is_named_and_grown_counter_flagged(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(
        nodes=4,
        faults={"nodes": {"node03": [{"slow_rail": {"rail": 1, "rate_mbit": 8}}]}},
        prefix="carl",
        subnet="10.254.116.0/24",
        rails=2,
    )
    inventory, out, history = _inventory(bed, tmp_path), tmp_path / "runs", tmp_path / "history"
    first = run_cli("run", "--inventory", str(inventory), "--out", str(out), "--history", str(history), timeout=900)
    assert first.returncode == 1, first.stdout + first.stderr
    verdicts = run_verdicts(out)
    assert {n for n, (v, _) in verdicts.items() if v != "accepted"} == {"node03"}, verdicts
    run_dir = only_run(out)
    checks = pd.read_parquet(run_dir / "checks.parquet")
    assert not (checks.check == "coverage").any(), checks[checks.check == "coverage"]
    # The rail verdict: rail1 slower than rail0 on every node (the symptom), node03's rail1 named (the cause).
    rails = checks[checks.check == "rails"]
    assert set(rails[rails["item"] == "rail0"].reason) == {"ok"}
    assert set(rails[rails["item"] == "rail1"].reason) == {"below_other_rails"}
    named = checks[(checks.check == "isolation") & (checks.reason == "slow_rail")]
    assert list(named.node) == ["node03"] and list(named["item"]) == ["rail1"]
    assert named.observed.iloc[0] == "node03 rail1 (mlx5_1)"
    assert not ((checks.check == "isolation") & (checks.reason == "slow_node")).any()  # eth0 is healthy
    # Each collective: a figure in every node and across all four, with nccl-tests' bus bandwidth.
    m = pd.read_parquet(run_dir / "measurements.parquet")
    for op in OPS:
        metric = op.replace("_", "") + "_busbw_gbps"
        intra = m[(m.metric == metric) & (m.stage == "single-node")]
        assert set(intra.node) == {f"node0{i}" for i in range(1, 5)} and (intra.value > 0).all(), op
        inter = m[(m.metric == metric) & (m.stage == "multi-node")]
        assert len(inter) == 1 and inter.world_size.iloc[0] == 4 and inter.value.iloc[0] > 0, op
        rows = checks[(checks.check == "collectives") & (checks["item"] == f"{op}_inter")]
        # the profile sets no minimum between nodes for it, and one run of the four has no peer: not judged
        assert set(zip(rows.status, rows.reason, strict=True)) == {("not_judged", "no_expectation")}, op
        key = busbw_threshold(op, "inter")
        assert len(rows) == 4 and set(rows.expected) == {f"none: set thresholds.{key}"}, op
    rail_figures = m[m.probe.isin(["rail0", "rail1"])]
    assert set(rail_figures.label) >= {"rail0", "rail1"}
    # The simulated HCAs: recorded, counters all 0; no earlier reading to date a flap by (first_reading).
    ib = checks[checks.check == "ib_counters"]
    assert set(zip(ib["item"], ib.reason, strict=True)) == {
        ("mlx5_0/1", "ok"),
        ("mlx5_1/1", "ok"),
        ("mlx5_0/1 flaps", "first_reading"),
        ("mlx5_1/1 flaps", "first_reading"),
    }

    # A symbol error counter grows on node02's rail0 HCA; the next preflight names that port.
    testbed.set_fault(bed, "node02", [IbCounter(rail=0, counter="symbol_error", value=17)])
    testbed.set_fault(bed, "node03", [SlowRail(rail=1, rate_mbit=8)])
    again = tmp_path / "again"
    second = run_cli(
        "run", "--inventory", str(inventory), "--out", str(again), "--history", str(history), "--stages", "preflight"
    )
    assert second.returncode == 0, second.stdout + second.stderr  # a grown counter warns: node02 stays accepted
    checks = pd.read_parquet(only_run(again) / "checks.parquet")
    grew = checks[checks.reason == "counter_grew"]
    assert list(grew.node) == ["node02"] and list(grew.check) == ["ib_counters"]
    assert grew["item"].iloc[0] == "counter:mlx5_0/1.symbol_error" and grew.observed.iloc[0] == "17"
    seen = checks[(checks.check == "ib_counters") & (checks.node == "node02") & (checks["item"] == "mlx5_0/1")]
    assert seen.reason.iloc[0] == "errors_since_reset" and "symbol_error 17" in seen.observed.iloc[0]
