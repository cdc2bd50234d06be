"""An HGX board on a simulated node (:mod:`testbed.hgx_faults`): what its GPUs say of the fabric, its NVSwitch
errors in the kernel log, and its PCI devices in the node's sysfs tree (GPUs with their PCIe link and AER
counters, NVSwitches), with the Fabric Manager tools (``systemctl``, ``pgrep``, ``nv-fabricmanager``) that answer
for the service and hand every other question to the real tool.

The checks read ``$CLUSTER_ACCEPT_SYSFS`` (default ``/sys``): every test-bed node gets a tree of its own, so a
node without a board shows its GPUs and no switch, as a VM slice of an HGX host does.
"""

from __future__ import annotations

import re
import shlex
import shutil
from collections.abc import Sequence
from pathlib import Path

from cluster_accept.testbed import nodedata
from cluster_accept.testbed.fault_base import _Fault
from cluster_accept.testbed.faults import NvlinkInactive
from cluster_accept.testbed.hgx_faults import NvswitchBoard, PcieAer, Sxid

NVIDIA, MELLANOX = "0x10de", "0x15b3"
GPU_CLASS, NVSWITCH_CLASS = "0x030200", "0x068000"
LINK_SPEED = "32.0 GT/s PCIe"  # Gen5, as the h200x1 capture's sysfs shows it
CORRECTABLE = ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF")
UNCORRECTABLE = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF", "MalfTLP",
                 "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr",
                 "PoisonTLPBlocked")  # fmt: skip
_TOTALS = {"correctable": "TOTAL_ERR_COR", "nonfatal": "TOTAL_ERR_NONFATAL", "fatal": "TOTAL_ERR_FATAL"}


def board_of(faults: Sequence[_Fault]) -> NvswitchBoard | None:
    return next((f for f in faults if isinstance(f, NvswitchBoard)), None)


def switch_address(index: int) -> str:
    return f"0000:{0xA5 + index:02x}:00.0"


def apply_board(data: nodedata.NodeData, board: NvswitchBoard) -> None:
    """Where Fabric Manager does not run, the GPUs never join the fabric: their state stays ``In Progress`` and
    every NVLink reads inactive (NCCL then falls back to SHM)."""
    if board.fabric_up:
        return
    for gpu in range(data.table.gpu_count):
        nodedata.edit_gpu(data, gpu, _not_joined_q, _not_joined_x)
        links = re.findall(r"^\s+Link (\d+): .*GB/s$", _gpu_block(data, gpu), flags=re.M)
        for link in links:
            nodedata.apply_nvlink_inactive(data, NvlinkInactive(gpu=gpu, link=int(link)))


def _gpu_block(data: nodedata.NodeData, gpu: int) -> str:
    """GPU ``gpu``'s part of ``nvlink -s``."""
    text = data.files.get("nvlink-s.txt", "")
    blocks = re.split(r"^(?=GPU \d+:)", text, flags=re.M)
    return next((b for b in blocks if b.startswith(f"GPU {gpu}:")), "")


def _not_joined_q(block: str) -> str:
    block = re.sub(r"(\n    Fabric\n        State\s+: )\S.*", r"\1In Progress", block)
    return re.sub(r"(\n    Fabric\n        State[^\n]*\n        Status\s+: )\S.*", r"\1N/A", block)


def _not_joined_x(block: str) -> str:
    block = re.sub(r"(<fabric>\s*<state>)[^<]*(</state>)", r"\1In Progress\2", block)
    return re.sub(r"(<fabric>\s*<state>[^<]*</state>\s*<status>)[^<]*(</status>)", r"\1N/A\2", block)


def with_board(data: nodedata.NodeData, faults: Sequence[_Fault]) -> nodedata.NodeData:
    """The node's data with its HGX board applied (the GPUs' fabric, NVLinks) and its SXIDs in the kernel log."""
    board = board_of(faults)
    try:
        if board is not None:
            apply_board(data, board)
    except nodedata.FaultApplyError as exc:
        raise nodedata.FaultApplyError(f"nvswitch_board: {exc}") from exc
    data.dmesg += sxid_lines(faults)
    return data


def sxid_lines(faults: Sequence[_Fault]) -> str:
    """The kernel log lines of each planted SXID, stamped now."""
    lines = []
    for seq, fault in enumerate(f for f in faults if isinstance(f, Sxid)):
        stamp = nodedata.uptime_s() + 0.25 * seq
        where = f"nvidia-nvswitch{fault.switch}: SXid (PCI:{switch_address(fault.switch)}): {fault.code}"
        severity = "Fatal" if fault.fatal else "Non-fatal"
        lines += [
            f"[{stamp:12.6f}] {where}, {severity}, Link 51 LTSSM Fault Up",
            f"[{stamp + 0.000006:12.6f}] {where}, Severity 5 Engine instance 51 Sub-engine instance 00",
            f"[{stamp + 0.000009:12.6f}] {where}, Data {{0x00000000, 0x00000000, 0x00000000, 0x00000000}}",
        ]
    return "".join(line + "\n" for line in lines)


def write_pci_sysfs(root: Path, bin_dir: Path, data: nodedata.NodeData, faults: Sequence[_Fault]) -> dict[str, str]:
    """``root/bus/pci/devices``, rebuilt: each GPU (its link at the maximum, its AER counters as planted) and the
    board's NVSwitches; the Fabric Manager tools in ``bin_dir``; the node's environment for the tree."""
    devices = root / "bus" / "pci" / "devices"
    shutil.rmtree(devices, ignore_errors=True)
    devices.mkdir(parents=True)
    planted = [f for f in faults if isinstance(f, PcieAer)]
    for gpu in range(data.table.gpu_count):
        bus = data.table.get("pci.bus_id", gpu).lower()
        address = bus[-12:] if len(bus) > 12 else bus  # 00000000:00:07.0 -> 0000:00:07.0
        _device(devices / address, NVIDIA, GPU_CLASS, [f for f in planted if f.gpu == gpu])
    board = board_of(faults)
    if board is not None:
        visible = board.switches if board.visible is None else min(board.visible, board.switches)
        for index in range(visible):
            _device(devices / switch_address(index), NVIDIA, NVSWITCH_CLASS, [])
    _write_fabric_tools(bin_dir, board, _driver_version(data))
    return {"CLUSTER_ACCEPT_SYSFS": str(root)}


def _device(path: Path, vendor: str, klass: str, aer: Sequence[PcieAer]) -> None:
    path.mkdir(parents=True)
    files = {"vendor": vendor, "class": klass, "current_link_speed": LINK_SPEED, "max_link_speed": LINK_SPEED,
             "current_link_width": "16", "max_link_width": "16"}  # fmt: skip
    for severity, names in (("correctable", CORRECTABLE), ("nonfatal", UNCORRECTABLE), ("fatal", UNCORRECTABLE)):
        counts = {name: sum(f.value for f in aer if f.severity == severity and f.counter == name) for name in names}
        body = "".join(f"{name} {count}\n" for name, count in counts.items())
        files[f"aer_dev_{severity}"] = body + f"{_TOTALS[severity]} {sum(counts.values())}"
    for name, text in files.items():
        (path / name).write_text(text + "\n")


def _driver_version(data: nodedata.NodeData) -> str:
    found = re.search(r"\s(\d+\.\d+(?:\.\d+)?)\s", data.files.get("proc-driver-version.txt", ""))
    return found.group(1) if found else "0.0"


def _write_fabric_tools(bin_dir: Path, board: NvswitchBoard | None, driver: str) -> None:
    """``systemctl``, ``pgrep`` and ``nv-fabricmanager`` answering for the board's Fabric Manager (none without a
    board: not installed); any other question goes to the real tool."""
    state = board.fabric_manager if board is not None else "missing"
    props = {
        "running": "LoadState=loaded\nActiveState=active\nSubState=running\nResult=success",
        "stopped": "LoadState=loaded\nActiveState=inactive\nSubState=dead\nResult=success",
        "failed": "LoadState=loaded\nActiveState=failed\nSubState=failed\nResult=exit-code",
        "missing": "LoadState=not-found\nActiveState=inactive\nSubState=dead\nResult=success",
    }[state]
    tools = {
        "systemctl": 'if [ "$1" = show ] && [ "$2" = nvidia-fabricmanager ]; then '
        f'printf %s\\\\n {shlex.quote(props)}; exit 0; fi; exec /usr/bin/systemctl "$@"',
        "pgrep": 'if [ "$*" = "-u root -x nv-fabricmanage" ]; then '
        f"{'exit 0' if state == 'running' else 'exit 1'}; fi; "
        'exec /usr/bin/pgrep "$@"',
    }
    if state != "missing":
        version = board.version if board is not None and board.version else driver
        tools["nv-fabricmanager"] = f"echo 'Fabric Manager version is : {version}'"
    for name in ("systemctl", "pgrep", "nv-fabricmanager"):
        (bin_dir / name).unlink(missing_ok=True)
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
