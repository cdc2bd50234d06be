"""The firmware check: its COMMAND against a test-bed node's stand-ins (nvidia-smi answering VBIOS and InfoROM
from the real 4 x H200 capture; simulated HCAs in sysfs), and its judgement against the profile and the
cluster's majority."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import cluster_accept.checks.firmware as firmware
from cluster_accept.checks.base import ClusterView, Status
from cluster_accept.inventory.model import Profile
from cluster_accept.testbed.faults import GpuField
from cluster_accept.testbed.nodedata import build_node, write_node_data
from cluster_accept.testbed.standins import write_standins
from tests.capture import NO_CLUSTER, every_field_block

VBIOS = "96.00.A5.00.1A"  # every GPU of the 4 x H200 capture, and the h200x1 capture's GPU
INFOROM = "G520.0282.02.02"


def _run(tmp_path: Path, faults: list[GpuField], hcas: dict[str, tuple[str, str]] | None = None) -> firmware.Firmware:
    data = build_node("h200x4", faults, {})
    write_node_data(data, tmp_path / "data", seed="n")
    write_standins(tmp_path / "bin", tmp_path / "data")
    for name, (fw, kind) in (hcas or {}).items():
        hca = tmp_path / "sys" / "class" / "infiniband" / name
        hca.mkdir(parents=True)
        (hca / "fw_ver").write_text(fw + "\n")
        (hca / "hca_type").write_text(kind + "\n")
        (hca / "board_id").write_text("MT_0000000838\n")
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "CLUSTER_ACCEPT_SYSFS": str(tmp_path / "sys")}
    done = subprocess.run(["sh", "-c", firmware.COMMAND], capture_output=True, text=True, env=env, timeout=60)
    return firmware.parse(done.stdout, done.returncode)


ANY = Profile()


def _rows(model: firmware.Firmware, profile: Profile = ANY, cluster: ClusterView = NO_CLUSTER) -> list[tuple]:
    return [
        (r.item, r.status.value, r.reason, r.observed, r.expected) for r in firmware.evaluate(model, profile, cluster)
    ]


@pytest.mark.integration
def test_the_captured_versions_are_read_per_gpu_and_per_hca(tmp_path: Path) -> None:
    model = _run(tmp_path, [], {"mlx5_0": ("28.39.1002", "MT4129"), "mlx5_1": ("28.39.1002", "MT4129")})
    assert every_field_block("vbios_version")[1:] == [VBIOS] * 4
    assert model.vbios == dict.fromkeys(range(4), VBIOS) and model.inforom == dict.fromkeys(range(4), INFOROM)
    assert [(h.name, h.fw_ver, h.hca_type) for h in model.hcas] == [("mlx5_0", "28.39.1002", "MT4129"),
                                                                    ("mlx5_1", "28.39.1002", "MT4129")]  # fmt: skip
    assert firmware.cluster_values(model) == {"vbios": VBIOS, "inforom": INFOROM, "hca_fw:MT4129": "28.39.1002"}
    assert _rows(model) == [
        ("vbios", "pass", "recorded", VBIOS, None),
        ("inforom", "pass", "recorded", INFOROM, None),
        ("hca_fw:MT4129", "pass", "recorded", "28.39.1002", None),
    ]


@pytest.mark.integration
def test_a_gpu_flashed_apart_warns_and_compares_as_mixed(tmp_path: Path) -> None:
    model = _run(tmp_path, [GpuField(field="vbios_version", value="96.00.99.00.01", gpu=2)])
    (row, *_) = _rows(model)
    assert row[:3] == ("vbios", "warn", "differs_between_gpus")
    assert row[3] == f"gpu0 {VBIOS}, gpu1 {VBIOS}, gpu2 96.00.99.00.01, gpu3 {VBIOS}"
    assert firmware.cluster_values(model)["vbios"] == "mixed"


def _model(vbios: str = VBIOS, hca_fw: tuple[str, ...] = ("28.39.1002",), ofed: str = "none") -> firmware.Firmware:
    smi = "".join(f"{i}, 00000000:{0x18 + i:02X}:00.0, {vbios}, {INFOROM}\n" for i in range(8))
    hcas = "".join(f"mlx5_{k}|{fw}|MT4129|MT_0000000838\n" for k, fw in enumerate(hca_fw))
    return firmware.parse(f"{smi}### rc=0\n### hca\n{hcas}### ofed\n{ofed}\n### end\n", 0)


def test_drift_from_the_majority_fails_and_a_pinned_version_met_only_warns() -> None:
    majority = ClusterView({"vbios": VBIOS, "inforom": INFOROM, "hca_fw:MT4129": "28.39.1002"}, 16)
    odd = _model(vbios="96.00.74.00.0B")
    assert _rows(odd, cluster=majority)[0] == ("vbios_drift", "fail", "drift", "96.00.74.00.0B", f"{VBIOS} (majority)")
    pinned = Profile.model_validate({"firmware": {"vbios": "96.00.74.00.0B"}})
    assert [r[:3] for r in _rows(odd, pinned, majority)][:2] == [
        ("vbios", "pass", "ok"),
        ("vbios_drift", "warn", "drift"),
    ]
    assert _rows(_model(), cluster=majority)[0] == ("vbios", "pass", "ok", VBIOS, f"{VBIOS} (majority)")


def test_a_pin_the_node_misses_fails_with_the_pinned_version_beside() -> None:
    pinned = Profile.model_validate({"firmware": {"hca_fw": "28.41.1000", "ofed": "MLNX_OFED_LINUX-24.10-1.1.4.0"}})
    rows = _rows(_model(ofed="MLNX_OFED_LINUX-23.10-2.1.3.1"), pinned)
    assert ("hca_fw:MT4129", "fail", "version_mismatch", "28.39.1002", "28.41.1000") in rows
    assert (
        "ofed",
        "fail",
        "version_mismatch",
        "MLNX_OFED_LINUX-23.10-2.1.3.1",
        "MLNX_OFED_LINUX-24.10-1.1.4.0",
    ) in rows
    assert ("ofed", "fail", "version_mismatch", "none", "MLNX_OFED_LINUX-24.10-1.1.4.0") in _rows(_model(), pinned)


def test_hcas_of_one_type_on_different_firmware_warn() -> None:
    (_, _, row) = _rows(_model(hca_fw=("28.39.1002", "28.35.2000")))
    assert row[:3] == ("hca_fw:MT4129", "warn", "differs_between_hcas")


def test_a_dead_driver_skips_and_truncated_output_is_an_error() -> None:
    said = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
    dead = f"{said}### rc=9\n### hca\n### ofed\nnone\n### end\n"
    assert [r[1:3] for r in _rows(firmware.parse(dead, 0))] == [("skip", "nvidia_smi_failed")]
    (row,) = firmware.evaluate(firmware.parse(f"0, 00000000:18:00.0, {VBIOS}", 0), Profile(), NO_CLUSTER)
    assert (row.status, row.reason) == (Status.ERROR, "unparsable_output")


def test_nvidia_peermem_off_the_majority_is_drift_and_absent_says_nothing() -> None:
    text = _model().raw.replace("### end\n", "### peermem\n580.95.05\n### end\n")
    model = firmware.parse(text, 0)
    assert model.peermem == "580.95.05" and firmware.cluster_values(model)["peermem"] == "580.95.05"
    majority = ClusterView({"peermem": "580.159.04"}, 8)
    assert ("peermem_drift", "fail", "drift", "580.95.05", "580.159.04 (majority)") in _rows(model, cluster=majority)
    absent = firmware.parse(_model().raw.replace("### end\n", "### peermem\nnone\n### end\n"), 0)
    assert absent.peermem is None and not [r for r in _rows(absent) if r[0].startswith("peermem")]


def _mixed(versions: list[str], hca_fw: tuple[str, ...] = ("28.39.1002",)) -> firmware.Firmware:
    """A node whose GPUs run ``versions`` (one a GPU, by index)."""
    smi = "".join(f"{i}, 00000000:{0x18 + i:02X}:00.0, {v}, {INFOROM}\n" for i, v in enumerate(versions))
    hcas = "".join(f"mlx5_{k}|{fw}|MT4129|MT_0000000838\n" for k, fw in enumerate(hca_fw))
    return firmware.parse(f"{smi}### rc=0\n### hca\n{hcas}### ofed\nnone\n### end\n", 0)


def test_gpus_on_several_versions_fail_a_pin_none_of_them_may_soften() -> None:
    """Pinned VBIOS 96.00.A5.00.1A, GPUs on 96.00.61… x3 and 96.00.74… x1: the pin is missed by every GPU, and a
    further disagreement among them does not turn that failure into a warning."""
    node = _mixed(["96.00.61.00.01"] * 3 + ["96.00.74.00.0B"])
    pinned = Profile.model_validate({"firmware": {"vbios": VBIOS}})
    assert _rows(node, pinned)[0] == (
        "vbios",
        "fail",
        "version_mismatch",
        "gpu0 96.00.61.00.01, gpu1 96.00.61.00.01, gpu2 96.00.61.00.01, gpu3 96.00.74.00.0B",
        VBIOS,
    )
    one_off = _mixed([VBIOS] * 3 + ["96.00.74.00.0B"])  # the pin met by three GPUs of four: not met
    (row, *_) = firmware.evaluate(one_off, pinned, NO_CLUSTER)
    assert (row.item, row.status, row.reason, row.observed, row.expected) == (
        "vbios", Status.FAIL, "version_mismatch", "gpu3 96.00.74.00.0B", VBIOS)  # fmt: skip
    assert row.detail == f"several versions on the node: gpu0 {VBIOS}, gpu1 {VBIOS}, gpu2 {VBIOS}, gpu3 96.00.74.00.0B"
    assert _rows(_mixed([VBIOS] * 4), pinned)[0] == ("vbios", "pass", "ok", VBIOS, VBIOS)


def test_gpus_on_several_versions_warn_without_a_pin_and_those_off_the_majority_fail() -> None:
    node = _mixed([VBIOS] * 3 + ["96.00.74.00.0B"])
    seen = f"gpu0 {VBIOS}, gpu1 {VBIOS}, gpu2 {VBIOS}, gpu3 96.00.74.00.0B"
    assert _rows(node)[0] == ("vbios", "warn", "differs_between_gpus", seen, "one version on every GPU")
    majority = ClusterView({"vbios": VBIOS}, 16)
    assert _rows(node, cluster=majority)[:2] == [
        ("vbios", "warn", "differs_between_gpus", seen, "one version on every GPU"),
        ("vbios_drift", "fail", "drift", "gpu3 96.00.74.00.0B", f"{VBIOS} (majority)"),
    ]
    elsewhere = ClusterView({"vbios": "96.00.99.00.01"}, 16)  # the node's every GPU off the majority
    assert _rows(node, cluster=elsewhere)[1] == ("vbios_drift", "fail", "drift", seen, "96.00.99.00.01 (majority)")


def test_a_majority_of_mixed_nodes_is_no_version_to_drift_from() -> None:
    mostly_mixed = ClusterView({"vbios": "mixed", "inforom": INFOROM}, 16)
    assert _rows(_model(), cluster=mostly_mixed)[0] == ("vbios", "pass", "recorded", VBIOS, None)


def test_hcas_of_one_type_on_several_versions_fail_a_pin_and_an_hca_pin_needs_an_hca() -> None:
    pinned = Profile.model_validate({"firmware": {"hca_fw": "28.39.1002"}})
    rows = _rows(_model(hca_fw=("28.39.1002", "28.35.2000", "28.39.1002")), pinned)
    assert ("hca_fw:MT4129", "fail", "version_mismatch", "mlx5_1 28.35.2000", "28.39.1002") in rows
    assert not [r for r in rows if r[0].startswith("hca_fw") and r[1] != "fail"]
    majority = ClusterView({"hca_fw:MT4129": "28.39.1002"}, 16)
    unpinned = _rows(_model(hca_fw=("28.39.1002", "28.35.2000")), cluster=majority)
    assert ("hca_fw:MT4129_drift", "fail", "drift", "mlx5_1 28.35.2000", "28.39.1002 (majority)") in unpinned
    assert ("hca_fw", "fail", "version_mismatch", "no HCA", "28.39.1002") in _rows(_model(hca_fw=()), pinned)
