"""``profile: auto`` with no threshold between nodes written, on the test-bed (real sshd; one simulated HCA per
node in sysfs, its rate in sysfs's format scaled to what gloo moves over the veths): the fabric is read from the
nodes, a port down or at half rate is rejected naming the port, the healthy nodes are accepted, and a network
slow on every node fails the multi-node stage against the floor the NICs imply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from cluster_accept.testbed import bed as testbed
from tests.processes import auto_cpu_inventory, only_run, run_cli, run_verdicts

pytestmark = pytest.mark.testbed
FLOOR = ">= 0.031 GB/s"  # half the line rate of one 0.5 Gb/s port (testbed.ibsys.RATE)
# A slow link: 80 Mbit/s (0.01 GB/s) is a third of that floor and a tenth of a healthy pair's gloo figure, so
# it fails as surely as a slower one, and a run whose every group crosses it takes a quarter of the time.
SLOW_MBIT = 80


def _auto_inventory(bed: testbed.Testbed, path: Path) -> Path:
    """The test-bed's inventory on ``profile: auto``: its own keys for what a CPU test-bed is (gloo ranks, no GPU
    figures), and nothing between nodes: the transport, the ports and the floor come from the fabric."""
    return auto_cpu_inventory(bed.inventory_path, path, relative_verdict="warn")


@pytest.mark.untimed  # preflight only: runs beside another worker (docs/development.md)
@pytest.mark.xdist_group("test_fabric_testbed")
def test_auto_reads_the_fabric_and_names_a_port_down_or_at_half_rate(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    faults = {
        "nodes": {
            "node03": [{"ib_port": {"state": "1: DOWN"}}],
            "node04": [{"ib_port": {"rate": "0.25 Gb/sec (1X SDR)"}}],
        }
    }
    bed = testbed_factory(nodes=4, faults=faults, prefix="cafb", subnet="10.254.143.0/24", rails=1)
    inventory = _auto_inventory(bed, tmp_path / "inventory.yaml")
    out = tmp_path / "out"
    proc = run_cli("run", "--inventory", str(inventory), "--out", str(out), "--stages", "preflight", timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdicts = run_verdicts(out)
    assert {n: v for n, (v, _) in verdicts.items()} == {
        "node01": "accepted",
        "node02": "accepted",
        "node03": "rejected",
        "node04": "rejected",
    }, verdicts
    assert set(verdicts["node03"][1]) == {"infiniband:port_down", "infiniband:ports_missing"}
    # below the fabric's rate, and off the majority's rate for that port
    assert set(verdicts["node04"][1]) == {"infiniband:rate_low", "infiniband:drift"}
    checks = pd.read_parquet(only_run(out) / "checks.parquet")
    fabric = checks[(checks.check == "profile") & (checks["item"] == "fabric")]
    assert set(fabric.node) == set(verdicts) and set(fabric.reason) == {"fabric_derived"}
    assert set(fabric.expected) == {"1 × 0.5 Gb/s InfiniBand port (1X)"}
    assert "inter-node transport NET/IB" in fabric.detail.iloc[0]
    rate = checks[(checks.node == "node04") & (checks.reason == "rate_low")].iloc[0]
    assert (rate["item"], rate.observed, rate.expected) == ("mlx5_0/1 rate", "0.25 Gb/sec (1X SDR)", ">= 0.5 Gb/sec")
    down = checks[(checks.node == "node03") & (checks.reason == "port_down")].iloc[0]
    assert (down["item"], down.observed) == ("mlx5_0/1", "1: DOWN")


@pytest.mark.soak  # docs/development.md: the soak tier (heavy end to end)
def test_a_network_slow_on_every_node_fails_against_the_floor_the_nics_imply(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=3, faults={}, prefix="cafs", subnet="10.254.144.0/24", rails=1)
    inventory = _auto_inventory(bed, tmp_path / "inventory.yaml")
    stages = ["--stages", "preflight,multi-node"]
    healthy = run_cli("run", "--inventory", str(inventory), "--out", str(tmp_path / "healthy"), *stages, timeout=900)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    scaling = pd.read_parquet(only_run(tmp_path / "healthy") / "checks.parquet").query("check == 'scaling'")
    assert set(scaling.reason) == {"ok"} and all(e.startswith(FLOOR) for e in scaling.expected), scaling
    for node in bed.nodes:
        testbed.set_rate(bed, node, SLOW_MBIT)  # every pair equally slow
    try:
        slow = run_cli("run", "--inventory", str(inventory), "--out", str(tmp_path / "slow"), *stages, timeout=900)
    finally:
        for node in bed.nodes:
            testbed.set_rate(bed, node, None)
    assert slow.returncode == 1, slow.stdout + slow.stderr
    assert {v for v, _ in run_verdicts(tmp_path / "slow").values()} == {"rejected"}
    checks = pd.read_parquet(only_run(tmp_path / "slow") / "checks.parquet")
    together = checks[checks.reason == "below_floor_together"]
    assert set(together.node) == set(bed.nodes) and set(together.status) == {"fail"}
    assert all(e.startswith(FLOOR) for e in together.expected), together.expected
    assert all("expected NET/IB" in d for d in together.detail)


@pytest.mark.untimed  # preflight only: runs beside another worker (docs/development.md)
@pytest.mark.xdist_group("test_fabric_testbed")
def test_a_roce_port_whose_gid_index_names_a_roce_v1_entry_is_named(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    roce = {"ib_port": {"link_layer": "Ethernet"}}
    faults = {
        "nodes": {
            "node01": [roce],  # NCCL_IB_GID_INDEX unset: NCCL 2.21+ selects a RoCE v2 entry
            "node02": [roce, {"nccl_env": {"env": {"NCCL_IB_GID_INDEX": "2"}}}],  # RoCE v1
            "node03": [roce, {"nccl_env": {"env": {"NCCL_IB_GID_INDEX": "3"}}}],  # RoCE v2, as seed 002 pins it
            "node04": [roce, {"roce_qos": {"mtu": 1500, "pfc": "00001000"}}],  # off the fabric's MTU and PFC
        }
    }
    bed = testbed_factory(nodes=4, faults=faults, prefix="cafr", subnet="10.254.145.0/24", rails=1)
    inventory = _auto_inventory(bed, tmp_path / "inventory.yaml")
    out = tmp_path / "out"
    proc = run_cli("run", "--inventory", str(inventory), "--out", str(out), "--stages", "preflight", timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdicts = run_verdicts(out)
    assert verdicts["node02"][0] == "rejected" and "roce:gid_not_roce_v2" in verdicts["node02"][1], verdicts
    checks = pd.read_parquet(only_run(out) / "checks.parquet")
    rows = {r.node: r for r in checks[checks.check == "roce"].itertuples()}
    assert (rows["node02"].item, rows["node02"].observed, rows["node02"].expected) == (
        "mlx5_0/1",
        "2: IB/RoCE v1",
        "2: RoCE v2",
    )
    assert (rows["node01"].reason, rows["node01"].observed) == ("ok", "RoCE v2 at 1, 3")
    assert (rows["node03"].reason, rows["node03"].observed) == ("ok", "3: RoCE v2")
    qos = checks[checks.check == "roce_qos"]
    failed = {(r.node, r.item, r.observed, r.expected) for r in qos.itertuples() if r.status == "fail"}
    assert failed == {("node04", "mlx5_0/1 mtu", "1024", "4096"), ("node04", "mlx5_0/1 pfc", "00001000", "00010000")}
    assert verdicts["node04"][0] == "rejected" and verdicts["node04"][1][0] == "roce_qos:differs", verdicts
    assert verdicts["node01"][0] == "accepted" and verdicts["node03"][0] == "accepted", verdicts
    passed = qos[(qos.node == "node01") & (qos.status == "pass")]
    assert set(passed["item"]) == {"NCCL_IB_TC", *(f"mlx5_0/1 {key}" for key in ("mtu", "traffic_class", "pfc", "ecn"))}
    fabric = checks[(checks.check == "profile") & (checks["item"] == "fabric")]
    assert set(fabric.expected) == {"1 × 0.5 Gb/s RoCE port (1X)"} and set(fabric.reason) == {"fabric_derived"}


@pytest.mark.soak  # docs/development.md: the soak tier (heavy end to end)
def test_an_efa_node_without_the_plugin_or_with_device_rdma_off_is_named_as_the_cause(
    testbed_factory,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    efa = {"ib_port": {"link_layer": "Unknown", "driver": "efa"}}
    rdma_off = [{"efa_software": {"instance": "trn1.32xlarge"}}, {"nccl_env": {"env": {"FI_EFA_USE_DEVICE_RDMA": "0"}}}]
    nodes = {"node01": [efa], "node02": [efa, *rdma_off], "node03": [efa, {"efa_software": {"plugin": False}}]}
    faults = {"nodes": nodes}
    bed = testbed_factory(nodes=3, faults=faults, prefix="cafe", subnet="10.254.146.0/24", rails=1)
    inventory = _auto_inventory(bed, tmp_path / "inventory.yaml")
    testbed.set_rate(bed, "node03", SLOW_MBIT)  # what NCCL on sockets instead of the adapters does to its groups
    try:
        stages = ["--stages", "preflight,multi-node"]
        proc = run_cli("run", "--inventory", str(inventory), "--out", str(tmp_path / "out"), *stages, timeout=900)
    finally:
        testbed.set_rate(bed, "node03", None)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdicts = run_verdicts(tmp_path / "out")
    got = {n: v for n, (v, _) in verdicts.items()}
    assert got == {"node01": "accepted", "node02": "rejected", "node03": "rejected"}, verdicts
    assert verdicts["node02"][1][0] == "efa:device_rdma_off", verdicts  # GPUDirect off on an RDMA-read instance
    reasons = verdicts["node03"][1]
    assert reasons[0] == "efa:plugin_missing" and "isolation:slow_node" in reasons, reasons  # the cause first
    checks = pd.read_parquet(only_run(tmp_path / "out") / "checks.parquet")
    fabric = checks[(checks.check == "profile") & (checks["item"] == "fabric")]
    assert set(fabric.expected) == {"1 × 0.5 Gb/s EFA port"} and "NET/Libfabric" in fabric.detail.iloc[0]


def test_a_training_sweep_far_below_the_default_efficiency_fails_with_no_threshold_written(
    testbed_factory,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    """profile: auto with the training sweep on and no training threshold: the default minimum (0.6 of one
    node's tokens/s per GPU) is expected of the 2-node step, and gloo over the test-bed's shared cores keeps a
    few percent of it, so both nodes fail, the minimum in the expected column."""
    bed = testbed_factory(nodes=2, faults={}, prefix="caft", subnet="10.254.147.0/24", rails=1)
    inventory = _auto_inventory(bed, tmp_path / "inventory.yaml")
    data: dict[str, Any] = yaml.safe_load(inventory.read_text())
    next(iter(data["profiles"].values()))["training"] = {"enabled": True, "steps": 6, "warmup_steps": 2}
    inventory.write_text(yaml.safe_dump(data))
    stages = ["--stages", "preflight,multi-node"]
    proc = run_cli("run", "--inventory", str(inventory), "--out", str(tmp_path / "out"), *stages, timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    checks = pd.read_parquet(only_run(tmp_path / "out") / "checks.parquet")
    step = checks[(checks.check == "training_scaling") & (checks["item"] == "2 nodes")]
    low = step[step.reason == "efficiency_low"]
    assert set(low.node) == set(bed.nodes) and set(low.expected) == {">= 60%"}, step
    assert all(float(v.rstrip("%")) < 60 for v in low.observed), low.observed
    verdicts = run_verdicts(tmp_path / "out")
    assert all(v == "rejected" and any(r.startswith("training_scaling:") for r in rs) for v, rs in verdicts.values())
