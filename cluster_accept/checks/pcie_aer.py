"""PCIe Advanced Error Reporting of every GPU, NVSwitch and NVIDIA/Mellanox NIC: the kernel's AER counters
(sysfs ``aer_dev_correctable``, ``aer_dev_nonfatal``, ``aer_dev_fatal``) and each link's width against its
maximum, under ``$CLUSTER_ACCEPT_SYSFS``.

A fatal uncorrectable error took the link down (the GPU falls off the bus next); a non-fatal one lost a
transaction; correctable errors (bad TLPs and DLLPs, replays) are a link degrading, and matter by how fast they
grow: each severity's total is a counter compared with the node's previous run (``counter_grew``). A link
narrower than its maximum is a reseat. The speed is recorded, not judged here: an idle GPU trains its link down to
save power, so the burn judges each GPU's link under load (``burn:pcie_downtrained``). A node whose devices
expose no AER files (a VM) is a skip with that reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cluster_accept.checks.contract import (
    Action,
    Check,
    CheckRow,
    ClusterView,
    Expectation,
    Profile,
    Reason,
    Status,
    always,
    dead,
    declare,
    error_row,
    fault,
    healthy,
)

NAME = "pcie_aer"
SEVERITIES = ("correctable", "nonfatal", "fatal")
_KINDS = {"0x0302": "GPU", "0x0680": "NVSwitch", "0x0207": "HCA", "0x0200": "NIC"}
COMMAND = (
    's="${CLUSTER_ACCEPT_SYSFS:-/sys}"; for d in "$s"/bus/pci/devices/*; do v=; '
    '{ IFS= read -r v < "$d/vendor"; } 2>/dev/null; case "$v" in 0x10de|0x15b3) ;; *) continue;; esac; '
    'c=; { IFS= read -r c < "$d/class"; } 2>/dev/null; '
    'case "$c" in 0x0302*|0x0680*|0x0207*|0x0200*) ;; *) continue;; esac; a=${d##*/}; '
    'echo "D|$a|$c|$(cat "$d/current_link_width" 2>/dev/null)|$(cat "$d/max_link_width" 2>/dev/null)|'
    '$(cat "$d/current_link_speed" 2>/dev/null)|$(cat "$d/max_link_speed" 2>/dev/null)"; '
    'for k in correctable nonfatal fatal; do [ -r "$d/aer_dev_$k" ] || continue; '
    'while read -r n x; do echo "A|$a|$k|$n|$x"; done < "$d/aer_dev_$k"; done; done; echo "### end"'
)
_DEVICE = re.compile(r"^D\|(?P<addr>[0-9a-f:.]{7,16})\|(?P<klass>0x[0-9a-f]{6})\|(?P<cw>\d{0,3})\|(?P<mw>\d{0,3})\|"
                     r"(?P<cs>[^|]*)\|(?P<ms>[^|]*)$")  # fmt: skip
_COUNT = re.compile(r"^A\|(?P<addr>[0-9a-f:.]{7,16})\|(?P<sev>correctable|nonfatal|fatal)\|(?P<name>\w{1,40})\|"
                    r"(?P<n>\d{1,20})$")  # fmt: skip

REASONS = declare(
    Reason(
        "aer_fatal",
        Status.FAIL,
        "fatal uncorrectable PCIe errors since boot: the link went down; reboot the node, reseat the device if "
        "they come back",
        Action.REBOOT_NODE,
    ),
    Reason(
        "aer_nonfatal",
        Status.WARN,
        "non-fatal uncorrectable PCIe errors since boot (transactions lost): watch their growth; reseat the "
        "device if they grow",
        Action.RESEAT_CABLE,
    ),
    Reason(
        "width_degraded",
        Status.FAIL,
        "the PCIe link trained narrower than its maximum: reseat the device (or its riser/cable)",
        Action.RESEAT_CABLE,
    ),
    Reason("aer_unavailable", Status.SKIP, "the devices expose no AER counters here (a VM, or AER off in the kernel)"),
    Reason("no_devices", Status.SKIP, "no NVIDIA or Mellanox PCI device is visible in sysfs"),
)


@dataclass
class Device:
    address: str
    kind: str  # GPU, NVSwitch, HCA, NIC
    width: int | None
    max_width: int | None
    speed: str
    max_speed: str
    aer: dict[str, dict[str, int]] = field(default_factory=dict)  # severity -> counter -> count (TOTAL_* too)

    def total(self, severity: str) -> int | None:
        counts = self.aer.get(severity)
        if counts is None:
            return None
        totals = [v for k, v in counts.items() if k.startswith("TOTAL_")]
        return totals[0] if totals else sum(counts.values())


@dataclass(frozen=True)
class AerReport:
    devices: list[Device] = field(default_factory=list)
    error: str | None = None
    raw: str = ""


def parse(stdout: str, exit_code: int | None = 0) -> AerReport:
    if "### end" not in stdout:
        return AerReport(error="output truncated before its end", raw=stdout)
    devices: dict[str, Device] = {}
    for line in stdout.splitlines():
        device, count = _DEVICE.match(line), _COUNT.match(line)
        if device:
            kind = _KINDS.get(device.group("klass")[:6], "device")
            cw, mw = device.group("cw"), device.group("mw")
            widths = (int(cw) if cw else None, int(mw) if mw else None)
            devices[device.group("addr")] = Device(device.group("addr"), kind, *widths, device.group("cs"),
                                                   device.group("ms"))  # fmt: skip
        elif count and count.group("addr") in devices:
            aer = devices[count.group("addr")].aer.setdefault(count.group("sev"), {})
            aer[count.group("name")] = int(count.group("n"))
    return AerReport(devices=list(devices.values()), raw=stdout)


def counters(model: AerReport) -> dict[str, int]:
    """Each device's total per severity: compared with the node's previous run (growth is a link degrading)."""
    found: dict[str, int] = {}
    for device in model.devices:
        for severity in SEVERITIES:
            total = device.total(severity)
            if total is not None:
                found[f"{device.address}.aer_{severity}"] = total
    return found


def _named(device: Device, severity: str) -> str:
    counts = {k: v for k, v in device.aer.get(severity, {}).items() if v and not k.startswith("TOTAL_")}
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "no counter named"


def _device_rows(device: Device) -> list[CheckRow]:
    item = f"{device.kind} {device.address}"
    rows: list[CheckRow] = []
    if device.width is not None and device.max_width is not None and device.width < device.max_width:
        rows.append(CheckRow(NAME, f"{item} width", Status.FAIL, "width_degraded", f"x{device.width}",
                             f"x{device.max_width}", f"link speed {device.speed} of {device.max_speed}"))  # fmt: skip
    totals = {s: device.total(s) for s in SEVERITIES}
    if totals["fatal"]:
        rows.append(CheckRow(NAME, item, Status.FAIL, "aer_fatal", f"{totals['fatal']} fatal", "0 fatal",
                             _named(device, "fatal")))  # fmt: skip
    if totals["nonfatal"]:
        rows.append(CheckRow(NAME, item, Status.WARN, "aer_nonfatal", f"{totals['nonfatal']} non-fatal",
                             "0 non-fatal", _named(device, "nonfatal")))  # fmt: skip
    if not rows:
        seen = ", ".join(f"{s} {t}" for s, t in totals.items() if t is not None)
        detail = (
            f"x{device.width} of x{device.max_width}, {device.speed} of {device.max_speed} (speed judged under load)"
        )
        if totals["correctable"]:
            detail += f"; correctable: {_named(device, 'correctable')} (judged by their growth between runs)"
        rows.append(CheckRow(NAME, item, Status.PASS, "ok", seen, "0 fatal, 0 non-fatal", detail))
    return rows


def evaluate(model: AerReport, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    if not model.devices:
        return [CheckRow(NAME, "devices", Status.SKIP, "no_devices", "none", "GPUs and NICs in sysfs")]
    rows = [row for device in model.devices for row in _device_rows(device)]
    if not any(device.aer for device in model.devices):
        where = ", ".join(f"{d.kind} {d.address}" for d in model.devices)
        rows = [r for r in rows if r.reason != "ok"]
        rows.append(CheckRow(NAME, "aer", Status.SKIP, "aer_unavailable", "no aer_dev_* files", "AER counters", where))
    return rows


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    counters=counters,
    expectations=(Expectation("pcie_aer", "preflight", NAME, always),),
    samples=(
        healthy("healthy", {"ok"}, fixture="pcie_aer/healthy.txt"),
        fault("fatal_errors", {"aer_fatal"}, fixture="pcie_aer/fatal_errors.txt"),
        dead("no_sysfs", {"unparsable_output"}, text="", exit_code=1),
    ),
)
