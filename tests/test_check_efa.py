"""The EFA check through its real command, over a sysfs-shaped tree (EFA devices bound to the ``efa`` driver, the
instance type in DMI), an ``fi_info`` stand-in and a plugin directory on ``LD_LIBRARY_PATH``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cluster_accept.analysis.regressions import counter_growth
from cluster_accept.checks import efa
from cluster_accept.checks.base import ClusterView
from cluster_accept.inventory.model import Profile


def _node(root: Path, devices: int = 32, instance: str = "p5.48xlarge", provider: bool = True) -> dict[str, str]:
    """The node's environment after building its tree under ``root``."""
    sysfs = root / "sys"
    driver = sysfs / "bus" / "pci" / "drivers" / "efa"
    driver.mkdir(parents=True)
    for i in range(devices):
        device = sysfs / "class" / "infiniband" / f"rdmap{i}s27" / "device"
        device.mkdir(parents=True)
        (device / "driver").symlink_to(driver)
    dmi = sysfs / "devices" / "virtual" / "dmi" / "id"
    dmi.mkdir(parents=True)
    (dmi / "product_name").write_text(instance + "\n")
    bin_dir, lib = root / "bin", root / "ofi-nccl" / "lib"
    bin_dir.mkdir()
    lib.mkdir(parents=True)
    (lib / "libnccl-net-ofi.so").write_text("")
    (bin_dir / "fi_info").write_text(f"#!/bin/sh\nexit {0 if provider else 61}\n")
    (bin_dir / "fi_info").chmod(0o755)
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("FI_", "NCCL_", "LD_LIBRARY"))}
    return {
        **keep,
        "CLUSTER_ACCEPT_SYSFS": str(sysfs),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "LD_LIBRARY_PATH": str(lib),
    }


def _rows(env: dict[str, str]) -> list[tuple[str, str, str, str | None]]:
    proc = subprocess.run(["sh", "-c", efa.COMMAND], capture_output=True, text=True, env=env, timeout=30, check=True)
    assert proc.stderr == ""
    model = efa.parse(proc.stdout, 0)
    return [(r.item, r.status.value, r.reason, r.observed) for r in efa.evaluate(model, Profile(), ClusterView({}, 0))]


@pytest.mark.integration
def test_a_healthy_p5_passes(tmp_path: Path) -> None:
    assert _rows(_node(tmp_path)) == [("devices", "pass", "ok", "32")]


@pytest.mark.integration
@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"LD_LIBRARY_PATH": "/nonexistent"}, ("aws-ofi-nccl", "fail", "plugin_missing", "not found")),
        ({"FI_PROVIDER": "tcp"}, ("FI_PROVIDER", "fail", "provider_forced", "tcp")),
        ({"FI_EFA_USE_DEVICE_RDMA": "0"}, ("FI_EFA_USE_DEVICE_RDMA", "fail", "device_rdma_off", "0")),
        (
            {"NCCL_TOPO_FILE": "/nonexistent/topo.xml"},
            ("NCCL_TOPO_FILE", "fail", "topo_file_missing", "/nonexistent/topo.xml (missing)"),
        ),
    ],
)
def test_each_setting_that_takes_nccl_off_the_adapters_is_named(
    tmp_path: Path, change: dict[str, str], expected: tuple
) -> None:
    assert _rows({**_node(tmp_path), **change}) == [expected]


@pytest.mark.integration
def test_a_lost_adapter_and_a_missing_provider(tmp_path: Path) -> None:
    assert _rows(_node(tmp_path, devices=31)) == [("devices", "fail", "devices_missing", "31")]
    assert _rows(_node(tmp_path / "b", provider=False)) == [("libfabric", "fail", "provider_missing", "no_efa")]


@pytest.mark.integration
def test_a_node_without_efa_is_one_skip_row(tmp_path: Path) -> None:
    assert _rows(_node(tmp_path, devices=0, instance="m7i.large")) == [("devices", "skip", "no_efa", "0")]


@pytest.mark.parametrize("stdout", ["", "devices=x\n### end\n", "devices=1\n### end\n"])
def test_unreadable_output_is_an_error_row(stdout: str) -> None:
    reasons = [r.reason for r in efa.evaluate(efa.parse(stdout, 0), Profile(), ClusterView({}, 0))]
    assert reasons == ["unparsable_output"]


@pytest.mark.integration
def test_the_adapters_error_counters_are_kept_for_their_growth(tmp_path: Path) -> None:
    env = _node(tmp_path, devices=2)
    counters = Path(env["CLUSTER_ACCEPT_SYSFS"]) / "class" / "infiniband" / "rdmap1s27" / "ports" / "1" / "hw_counters"
    counters.mkdir(parents=True)
    for name, value in (("retrans_pkts", 7), ("rx_drops", 0), ("tx_pkts", 99)):  # tx_pkts: traffic, not trouble
        (counters / name).write_text(f"{value}\n")
    proc = subprocess.run(["sh", "-c", efa.COMMAND], capture_output=True, text=True, env=env, timeout=30, check=True)
    model = efa.parse(proc.stdout, 0)
    assert efa.counters(model) == {"rdmap1s27/1.retrans_pkts": 7, "rdmap1s27/1.rx_drops": 0}
    before = {f"efa.counter:{k}": str(v) for k, v in efa.counters(model).items()}
    grown = {**before, "efa.counter:rdmap1s27/1.retrans_pkts": "5120"}
    found = counter_growth({"n1": grown}, {"n1": before})
    assert [(row.item, row.reason, row.observed, row.expected) for _, row in found] == [
        ("counter:rdmap1s27/1.retrans_pkts", "counter_grew", "5120", "<= 7")
    ]


@pytest.mark.integration
def test_p6_instances_do_rdma_reads_and_have_eight_adapters(tmp_path: Path) -> None:
    env = {**_node(tmp_path, devices=8, instance="p6-b200.48xlarge"), "FI_EFA_USE_DEVICE_RDMA": "0"}
    assert _rows(env) == [("FI_EFA_USE_DEVICE_RDMA", "fail", "device_rdma_off", "0")]
    assert _rows(_node(tmp_path / "b", devices=7, instance="p6-b200.48xlarge")) == [
        ("devices", "fail", "devices_missing", "7")
    ]
