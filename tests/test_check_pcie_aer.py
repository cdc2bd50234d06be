"""The PCIe AER check: its COMMAND against a sysfs tree (the test-bed's, in the kernel's file formats; the real
h200x1 VM's, which has link files and no AER counters), and its judgement of each severity and of a narrowed
link. Growth between runs is the preflight's counter comparison (tested here on the check's counters)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import cluster_accept.checks.nvswitch as nvswitch
import cluster_accept.checks.pcie_aer as aer
from cluster_accept.analysis.regressions import counter_growth
from cluster_accept.checks.base import Status
from cluster_accept.inventory.model import Profile
from cluster_accept.testbed import hgx
from cluster_accept.testbed.hgx_faults import NvswitchBoard, PcieAer
from cluster_accept.testbed.nodedata import build_node
from tests.capture import NO_CLUSTER

ANY = Profile()


def _run(tmp_path: Path, faults: list) -> aer.AerReport:  # type: ignore[type-arg]
    data = build_node("h200x4", faults, {})
    (tmp_path / "bin").mkdir(parents=True)
    env = hgx.write_pci_sysfs(tmp_path / "sys", tmp_path / "bin", data, faults)
    done = subprocess.run(["sh", "-c", aer.COMMAND], capture_output=True, text=True, timeout=60, env=env)
    return aer.parse(done.stdout, done.returncode)


def _rows(model: aer.AerReport) -> list[tuple[str, str, str, str | None]]:
    return [(r.item, r.status.value, r.reason, r.observed) for r in aer.evaluate(model, ANY, NO_CLUSTER)]


@pytest.mark.integration
def test_a_healthy_board_reads_every_gpu_and_switch_with_zero_counters(tmp_path: Path) -> None:
    model = _run(tmp_path, [NvswitchBoard()])
    assert [(d.kind, d.address) for d in model.devices] == [("GPU", "0000:00:06.0"), ("GPU", "0000:00:07.0"),
        ("GPU", "0000:00:08.0"), ("GPU", "0000:00:09.0"), ("NVSwitch", "0000:a5:00.0"), ("NVSwitch", "0000:a6:00.0"),
        ("NVSwitch", "0000:a7:00.0"), ("NVSwitch", "0000:a8:00.0")]  # fmt: skip
    assert {r[1:3] for r in _rows(model)} == {("pass", "ok")} and len(_rows(model)) == 8
    assert _rows(model)[0][3] == "correctable 0, nonfatal 0, fatal 0"
    assert aer.counters(model)["0000:00:06.0.aer_correctable"] == 0 and len(aer.counters(model)) == 24


@pytest.mark.integration
def test_fatal_and_nonfatal_errors_are_named_with_their_counters(tmp_path: Path) -> None:
    faults = [PcieAer(gpu=1, severity="fatal", counter="MalfTLP", value=1),
              PcieAer(gpu=2, severity="nonfatal", counter="CmpltTO", value=3)]  # fmt: skip
    rows = aer.evaluate(_run(tmp_path, faults), ANY, NO_CLUSTER)
    fatal = next(r for r in rows if r.reason == "aer_fatal")
    assert (fatal.item, fatal.status, fatal.observed, fatal.detail) == ("GPU 0000:00:07.0", Status.FAIL, "1 fatal",
                                                                        "MalfTLP 1")  # fmt: skip
    nonfatal = next(r for r in rows if r.reason == "aer_nonfatal")
    assert (nonfatal.item, nonfatal.status, nonfatal.detail) == ("GPU 0000:00:08.0", Status.WARN, "CmpltTO 3")
    assert aer.REASONS["aer_fatal"].action.value == "reboot node"


@pytest.mark.integration
def test_correctable_errors_that_grew_since_the_previous_run_are_flagged(tmp_path: Path) -> None:
    before = aer.counters(_run(tmp_path / "a", [PcieAer(gpu=0, counter="BadTLP", value=2)]))
    after = aer.counters(_run(tmp_path / "b", [PcieAer(gpu=0, counter="BadTLP", value=40)]))
    grown = counter_growth({"n1": {f"pcie_aer.counter:{k}": str(v) for k, v in after.items()}},
                           {"n1": {f"pcie_aer.counter:{k}": str(v) for k, v in before.items()}})  # fmt: skip
    assert [(node, row.check, row.item, row.observed, row.expected) for node, row in grown] == [
        ("n1", "pcie_aer", "counter:0000:00:06.0.aer_correctable", "40", "<= 2")
    ]
    (row,) = [r for r in aer.evaluate(_run(tmp_path / "c", [PcieAer(gpu=0, value=40)]), ANY, NO_CLUSTER)
              if r.item == "GPU 0000:00:06.0"]  # fmt: skip
    assert row.status is Status.PASS and "BadTLP 40 (judged by their growth between runs)" in row.detail


H200X1_SYSFS = (  # the h200x1 VM (../shared/captures/h200x1/aer.txt): link files, no aer_dev_* files
    "D|0000:00:06.0|0x030200|16|16|32.0 GT/s PCIe|32.0 GT/s PCIe\n### end\n"
)


def test_devices_without_aer_files_skip_with_the_reason() -> None:
    assert _rows(aer.parse(H200X1_SYSFS, 0)) == [("aer", "skip", "aer_unavailable", "no aer_dev_* files")]
    assert _rows(aer.parse("### end\n", 0)) == [("devices", "skip", "no_devices", "none")]


def test_a_link_narrower_than_its_maximum_fails_and_truncation_is_an_error() -> None:
    counted = "A|0000:00:06.0|fatal|TOTAL_ERR_FATAL|0\n### end"
    narrow = H200X1_SYSFS.replace("|16|16|", "|8|16|").replace("### end", counted)
    rows = _rows(aer.parse(narrow, 0))
    assert rows == [("GPU 0000:00:06.0 width", "fail", "width_degraded", "x8")]
    (row,) = aer.evaluate(aer.parse(H200X1_SYSFS[:30], 0), ANY, NO_CLUSTER)
    assert (row.status, row.reason) == (Status.ERROR, "unparsable_output")


@pytest.mark.integration
def test_the_walk_over_every_pci_device_starts_no_process_for_the_others(tmp_path: Path) -> None:
    """A bare-metal GPU node lists hundreds of PCI functions, and a Slurm prolog waits on this walk (and the
    NVSwitch check's): a device of another vendor, or one whose files cannot be read, is read without a process
    of its own. A ``cat`` first on the path counts the processes; 200 such devices beside the board add none."""
    faults = [NvswitchBoard()]
    data = build_node("h200x4", faults, {})
    (tmp_path / "bin").mkdir()
    env = hgx.write_pci_sysfs(tmp_path / "sys", tmp_path / "bin", data, faults)
    log = tmp_path / "cat.log"
    (tmp_path / "bin" / "cat").write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec /bin/cat "$@"\n')
    (tmp_path / "bin" / "cat").chmod(0o755)
    env = {**env, "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}

    def processes(command: str) -> tuple[int, str]:
        log.write_text("")
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60, env=env)
        return len(log.read_text().splitlines()), done.stdout

    board = {name: processes(command) for name, command in (("aer", aer.COMMAND), ("nvswitch", nvswitch.COMMAND))}
    devices = tmp_path / "sys" / "bus" / "pci" / "devices"
    for index in range(200):
        other = devices / f"0000:{0x10 + index // 8:02x}:00.{index % 8}"
        other.mkdir()
        if index % 2:  # every other one unreadable: no vendor or class file at all
            (other / "vendor").write_text("0x8086\n")
            (other / "class").write_text("0x020000\n")
    for name, command in (("aer", aer.COMMAND), ("nvswitch", nvswitch.COMMAND)):
        assert processes(command) == board[name], name  # the same output, by the same processes
    assert board["aer"][0] == 4 * 8  # the four link files of each GPU and NVSwitch, read as before
    assert "0000:a5:00.0" in board["nvswitch"][1]
