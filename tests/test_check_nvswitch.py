"""The nvswitch check: its COMMAND run by ``sh`` against a test-bed node's stand-ins (nvidia-smi answering from
the real 4 x H200 capture, whose GPUs report their fabric Completed / Success, and the h200x1 capture, whose GPU
reports N/A; the board's sysfs tree and Fabric Manager tools), and its judgement of each state."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import cluster_accept.checks.nvswitch as nvswitch
from cluster_accept.checks.base import ClusterView, Status
from cluster_accept.inventory.model import Profile
from cluster_accept.testbed import hgx
from cluster_accept.testbed.hgx_faults import NvswitchBoard
from cluster_accept.testbed.nodedata import build_node, write_node_data
from cluster_accept.testbed.standins import write_standins
from tests.capture import NO_CLUSTER

HGX = Profile.model_validate({"nvswitch": {"count": 4}})
HGX_ANY = Profile.model_validate({"nvswitch": {}})
PROC_VERSION = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U16)\n"


def _run(tmp_path: Path, board: NvswitchBoard | None) -> nvswitch.Fabric:
    """The check's output on a test-bed node of the h200x4 base with ``board``; /proc/driver/nvidia/version is
    the test-bed's (given by a stand-in ``cat`` path: outside the node's mount namespace there is none)."""
    faults = [board] if board is not None else []
    data = hgx.with_board(build_node("h200x4", faults, {}), faults)
    write_node_data(data, tmp_path / "data", seed="n")
    bin_dir = tmp_path / "bin"
    write_standins(bin_dir, tmp_path / "data")
    env = hgx.write_pci_sysfs(tmp_path / "sys", bin_dir, data, faults)
    proc = tmp_path / "proc-version"
    proc.write_text(PROC_VERSION)
    command = nvswitch.COMMAND.replace("/proc/driver/nvidia/version", str(proc))
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", **env})  # fmt: skip
    return nvswitch.parse(done.stdout, done.returncode)


def _rows(model: nvswitch.Fabric, profile: Profile = HGX, cluster: ClusterView = NO_CLUSTER) -> list[tuple[str, ...]]:
    return [(r.item, r.status.value, r.reason, r.observed or "") for r in nvswitch.evaluate(model, profile, cluster)]


@pytest.mark.integration
def test_a_healthy_board_passes_every_row(tmp_path: Path) -> None:
    model = _run(tmp_path, NvswitchBoard())
    assert model.switches == ["0000:a5:00.0", "0000:a6:00.0", "0000:a7:00.0", "0000:a8:00.0"]
    assert (model.fm_version, model.driver_version, model.running) == ("580.159.04", "580.159.04", True)
    assert [(g.state, g.status) for g in model.gpus] == [("Completed", "Success")] * 4
    assert _rows(model) == [
        ("nvswitches", "pass", "ok", "4 NVSwitches"),
        ("fabric_manager", "pass", "ok", "active"),
        ("fm_version", "pass", "ok", "Fabric Manager 580.159.04"),
        *[(f"gpu{i}", "pass", "ok", "Completed, Success") for i in range(4)],
    ]


@pytest.mark.integration
@pytest.mark.parametrize(
    ("board", "service", "gpus"),
    [
        (NvswitchBoard(fabric_manager="stopped"), ("fm_stopped", "inactive (success)"), "fabric_not_ready"),
        (NvswitchBoard(fabric_manager="failed"), ("fm_stopped", "failed (exit-code)"), "fabric_not_ready"),
        (NvswitchBoard(fabric_manager="missing"), ("fm_missing", "not installed"), "fabric_not_ready"),
    ],
)
def test_fabric_manager_down_fails_the_service_and_every_gpu(
    tmp_path: Path, board: NvswitchBoard, service: tuple[str, str], gpus: str
) -> None:
    rows = _rows(_run(tmp_path, board))
    assert rows[0] == ("nvswitches", "pass", "ok", "4 NVSwitches")
    assert rows[1] == ("fabric_manager", "fail", *service)
    assert [r[1:] for r in rows if r[0].startswith("gpu")] == [("fail", gpus, "In Progress, N/A")] * 4
    assert nvswitch.REASONS[service[0]].action.value == "fix config"


@pytest.mark.integration
def test_a_fabric_manager_of_another_version_than_the_driver_fails(tmp_path: Path) -> None:
    rows = _rows(_run(tmp_path, NvswitchBoard(version="570.86.15")))
    (version,) = [r for r in rows if r[0] == "fm_version"]
    assert version == ("fm_version", "fail", "fm_version_mismatch", "Fabric Manager 570.86.15")
    row = next(r for r in nvswitch.evaluate(_run(tmp_path / "again", NvswitchBoard(version="570.86.15")), HGX,
                                            NO_CLUSTER) if r.item == "fm_version")  # fmt: skip
    assert row.expected == "580.159.04 (the loaded driver)"


@pytest.mark.integration
def test_a_switch_off_the_bus_is_missing_against_the_profile_and_the_majority(tmp_path: Path) -> None:
    model = _run(tmp_path, NvswitchBoard(visible=3))
    assert _rows(model)[0] == ("nvswitches", "fail", "nvswitch_missing", "3 NVSwitches")
    majority = ClusterView({"nvswitch_count": "4"}, 8)
    assert _rows(model, HGX_ANY, majority)[0] == ("nvswitches", "fail", "nvswitch_missing", "3 NVSwitches")
    assert nvswitch.cluster_values(model) == {"nvswitch_count": "3"}


@pytest.mark.integration
def test_a_vm_slice_whose_host_runs_the_fabric_passes_on_its_gpus_state(tmp_path: Path) -> None:
    """No switch visible, no Fabric Manager, every GPU's fabric completed (the real 4 x H200 machine)."""
    model = _run(tmp_path, None)
    assert not model.switches and model.fm_version is None and not model.running
    assert _rows(model) == [
        ("nvswitches", "pass", "managed_elsewhere", "0 NVSwitches visible"),
        *[(f"gpu{i}", "pass", "ok", "Completed, Success") for i in range(4)],
    ]


def _output(switches: str = "", service: str = "", fm: str = "", fabric: str = "") -> str:
    return (f"### switches\n{switches}### service\n{service}rc=0\n### process\nnone\n### fm_version\n{fm}rc=127\n"
            f"### driver\n{PROC_VERSION}### fabric\n{fabric}### end\n")  # fmt: skip


def test_one_gpu_reporting_no_fabric_and_no_switch_is_a_skip_not_a_pass() -> None:
    """The h200x1 capture: one H200 of a VM, its Fabric section N/A, no NVSwitch, no Fabric Manager."""
    model = nvswitch.parse(_output(fabric="GPU 00000000:00:06.0\n        State    : N/A\n        Status   : N/A\n"))
    assert [(g.bus_id, g.state) for g in model.gpus] == [("00000000:00:06.0", "N/A")]
    assert _rows(model) == [("fabric", "skip", "no_nvswitch", "no NVSwitch, no GPU fabric")]


def test_without_nvswitch_in_the_profile_the_count_is_recorded() -> None:
    model = nvswitch.parse(_output(switches="0000:a5:00.0\n"))
    assert _rows(model, Profile()) == [("nvswitches", "pass", "recorded", "1 NVSwitch")]


@pytest.mark.parametrize("cut", [0, 40, 120])
def test_truncated_output_is_an_error_row(cut: int) -> None:
    model = nvswitch.parse(_output()[:cut])
    (row,) = nvswitch.evaluate(model, HGX, NO_CLUSTER)
    assert (row.status, row.reason) == (Status.ERROR, "unparsable_output")


def test_a_completed_fabric_whose_status_is_not_success_failed() -> None:
    fabric = "GPU 00000000:18:00.0\n        State   : Completed\n        Status  : Failure\n"
    rows = _rows(nvswitch.parse(_output(switches="0000:a5:00.0\n", fabric=fabric)), HGX_ANY)
    assert ("gpu0", "fail", "fabric_failed", "Completed, Failure") in rows
