"""The HGX checks on what their own commands printed on a lent 4 x H100 machine (``tests/data/hgx/h100x4``, from
``bench/hgx_checks.sh``: a VM of four H100 SXM GPUs whose host runs the NVSwitch fabric): each is read with its
exact values and judged as on that healthy machine, where ``check --local`` accepted the node."""

from __future__ import annotations

from pathlib import Path

import cluster_accept.checks.firmware as firmware
import cluster_accept.checks.ib_counters as ib_counters
import cluster_accept.checks.nvswitch as nvswitch
import cluster_accept.checks.pcie_aer as pcie_aer
import cluster_accept.checks.xid as xid
from cluster_accept.checks.base import Status
from cluster_accept.inventory.builtin import builtin_profile
from tests.capture import NO_CLUSTER

DATA = Path(__file__).parent / "data" / "hgx" / "h100x4"
H100 = builtin_profile("h100-sxm")


def _read(name: str) -> str:
    return (DATA / f"{name}.txt").read_text()


def test_the_fabric_completed_on_every_gpu_with_the_switches_managed_by_the_host() -> None:
    model = nvswitch.parse(_read("nvswitch"))
    assert model.switches == [] and model.service == {} and model.fm_version is None and not model.running
    assert model.service_said == "sh: 1: systemctl: not found" and model.driver_version == "580.159.04"
    assert [(g.bus_id, g.state, g.status) for g in model.gpus] == [
        (f"00000000:00:0{i}.0", "Completed", "Success") for i in range(6, 10)
    ]
    assert H100 is not None and H100.nvswitch is not None  # the built-in HGX profile expects the fabric
    rows = nvswitch.evaluate(model, H100, NO_CLUSTER)
    assert [(r.item, r.status, r.reason) for r in rows] == [
        ("nvswitches", Status.PASS, "managed_elsewhere"),
        *[(f"gpu{i}", Status.PASS, "ok") for i in range(4)],
    ]


def test_vbios_and_inforom_are_read_per_gpu() -> None:
    model = firmware.parse(_read("firmware"))
    assert model.vbios == dict.fromkeys(range(4), "96.00.99.00.0D")
    assert model.inforom == dict.fromkeys(range(4), "G520.0202.00.03") and model.hcas == [] and model.ofed is None
    assert firmware.cluster_values(model) == {"vbios": "96.00.99.00.0D", "inforom": "G520.0202.00.03"}


def test_the_vm_shows_gpu_links_at_gen5_x16_and_no_aer_counters() -> None:
    model = pcie_aer.parse(_read("pcie_aer"))
    assert [(d.address, d.kind, d.width, d.max_width, d.speed) for d in model.devices] == [
        (f"0000:00:0{i}.0", "GPU", 16, 16, "32.0 GT/s PCIe") for i in range(6, 10)
    ]
    rows = pcie_aer.evaluate(model, H100, NO_CLUSTER)
    assert [(r.item, r.status, r.reason) for r in rows] == [("aer", Status.SKIP, "aer_unavailable")]


def test_the_kernel_log_since_boot_has_no_xid_and_marks_where_it_was_read() -> None:
    model = xid.parse(_read("xid"))
    assert (model.source, model.events, model.sxids) == ("dmesg", [], [])
    assert xid.marks(model) == {"boot_id": "270d5218-095e-4095-b1fc-07407e3ff100", "uptime_s": "246.030"}
    (row,) = xid.evaluate(model, H100, NO_CLUSTER)
    assert (row.status, row.reason, row.detail) == (Status.PASS, "ok", "read with dmesg, since boot; 0 SXID events")


def test_no_hca_is_no_port_and_the_controllers_clock_is_kept_for_flaps() -> None:
    model = ib_counters.parse(_read("ib_counters"))  # captured before the command printed the boot id
    assert model.ports == [] and model.boot is None and model.error is None
    assert ib_counters.marks(ib_counters.since(model, {}, now_s=1_795_000_000)) == {"at_s": "1795000000"}
