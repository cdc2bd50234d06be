"""NVSwitches and Fabric Manager: on an HGX board the GPUs reach each other through NVSwitches, which
``nvidia-fabricmanager`` sets up; with the service down (or of another version than the driver), CUDA sees no
NVLink peers, NCCL falls back to SHM and jobs fail at init. Read on the node:

- the NVSwitches on the PCI bus (vendor NVIDIA, class bridge ``0x0680``), under ``$CLUSTER_ACCEPT_SYSFS``;
- the service's state (``systemctl show nvidia-fabricmanager``), whether its process runs as root, and its version
  (``nv-fabricmanager --version``) against the loaded driver's (``/sys/module/nvidia/version``): they must match;
- the fabric state each GPU reports (``nvidia-smi -q``'s Fabric section, Hopper and later): ``Completed`` with
  status ``Success`` when the GPU joined the fabric.

Where the profile says the node's GPUs are NVSwitch-connected (``nvswitch:``; the built-in HGX profiles do),
each is a row with its reason and action. Where no NVSwitch is visible and every GPU's fabric is completed, the
fabric is managed outside this OS (a VM whose host runs Fabric Manager; a GB200 tray): the service is not
judged here, the GPUs' state is. Where no switch is visible and the GPUs report no fabric (a 4-GPU board whose
GPUs link directly, a one-GPU slice), the check skips with that reason: NVLink itself is the nvlink check's.
SXIDs (the NVSwitch driver's errors) are read with the XIDs from the kernel log (:mod:`checks.xid`).
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
    dead,
    declare,
    error_row,
    fault,
    healthy,
    is_set,
)
from cluster_accept.checks.sections import marked_sections
from cluster_accept.vocabulary.text import quote

NAME = "nvswitch"
SERVICE = "nvidia-fabricmanager"
_SECTIONS = frozenset({"switches", "service", "process", "fm_version", "driver", "fabric"})
# The Fabric Manager's process as pgrep sees it: the kernel keeps the first 15 characters of a program's name
# (pgrep matches nothing longer), and root's only: any user can start a program of that name.
_PROCESS = "nv-fabricmanager"[:15]
COMMAND = (
    's="${CLUSTER_ACCEPT_SYSFS:-/sys}"; echo "### switches"; '
    'for d in "$s"/bus/pci/devices/*; do v=; { IFS= read -r v < "$d/vendor"; } 2>/dev/null; '
    '[ "$v" = 0x10de ] || continue; c=; { IFS= read -r c < "$d/class"; } 2>/dev/null; '
    'case "$c" in 0x0680*) echo "${d##*/}";; esac; done; '
    f'echo "### service"; systemctl show {SERVICE} -p LoadState -p ActiveState -p SubState -p Result 2>&1; '
    'echo "rc=$?"; '
    f'echo "### process"; pgrep -u root -x {_PROCESS} >/dev/null 2>&1 && echo running || echo none; '
    'echo "### fm_version"; nv-fabricmanager --version 2>&1; echo "rc=$?"; '
    'echo "### driver"; cat /proc/driver/nvidia/version 2>&1; '
    'echo "### fabric"; nvidia-smi -q 2>&1 | awk \'/^GPU [0-9A-Fa-f]/ { print; next } '
    "/^    Fabric *$/ { f = 1; next } f && /^        (State|Status) / { print; next } "
    '/^    [^ ]/ { f = 0 }\'; echo "### end"'
)
_VERSION = re.compile(r"(\d+\.\d+(?:\.\d+)?)")
_GPU = re.compile(r"^GPU ([0-9A-Fa-f:.]{4,32})\s*$")
_FIELD = re.compile(r"^\s+(State|Status)\s+:\s*(.*?)\s*$")
# The findings of a fabric that is down: they explain missing NVLink peers (the nvlink and topology checks) and,
# in the single-node stage, a failed or slow all-reduce and NCCL's fallback to SHM (each declares it).
FABRIC_DOWN = frozenset({"fm_stopped", "fm_missing", "fm_version_mismatch", "fabric_not_ready", "fabric_failed",
                         "nvswitch_missing"})  # fmt: skip

REASONS = declare(
    Reason(
        "fm_stopped",
        Status.FAIL,
        "nvidia-fabricmanager is not running: the GPUs cannot join the NVSwitch fabric (no NVLink peers, NCCL "
        "falls back to SHM); start it (systemctl enable --now nvidia-fabricmanager) and read its log if it stops",
        Action.FIX_CONFIG,
    ),
    Reason(
        "fm_missing",
        Status.FAIL,
        "NVSwitches are on the bus but Fabric Manager is not installed: install nvidia-fabricmanager of the "
        "driver's exact version",
        Action.FIX_CONFIG,
    ),
    Reason(
        "fm_version_mismatch",
        Status.FAIL,
        "Fabric Manager's version differs from the loaded driver's: it refuses to start or the fabric fails; "
        "install the nvidia-fabricmanager package of the driver's version",
        Action.FIX_CONFIG,
    ),
    Reason(
        "fabric_not_ready",
        Status.FAIL,
        "the GPU has not joined the NVSwitch fabric (its state is not Completed): Fabric Manager is not running "
        "or still training the links; check the service, then reset the GPUs",
        Action.CHECK_NODE,
    ),
    Reason(
        "fabric_failed",
        Status.FAIL,
        "the GPU's fabric registration failed (its status is not Success): read Fabric Manager's log "
        "(/var/log/fabricmanager.log); reset the GPUs and NVSwitches (reboot the node)",
        Action.REBOOT_NODE,
    ),
    Reason(
        "nvswitch_missing",
        Status.FAIL,
        "fewer NVSwitches on the bus than the node has: a switch fell off the bus; reboot the node, and have the "
        "baseboard serviced if it stays missing",
        Action.REBOOT_NODE,
    ),
    Reason(
        "managed_elsewhere",
        Status.PASS,
        "no NVSwitch is visible to this OS and every GPU's fabric is completed: Fabric Manager runs outside it "
        "(the hypervisor of a VM, the NVLink switch trays of a rack)",
    ),
    Reason(
        "no_nvswitch",
        Status.SKIP,
        "no NVSwitch on this node and its GPUs report no fabric (GPUs linked directly, or one GPU of a host): "
        "NVLink is judged by the nvlink check",
    ),
    Reason(
        "fabric_state_unreported",
        Status.SKIP,
        "the GPUs report no fabric state (GPUs before Hopper): the fabric is judged by the service alone",
    ),
)


@dataclass(frozen=True)
class GpuFabric:
    bus_id: str
    state: str  # 'Completed', 'In Progress', 'Not Started', 'N/A'
    status: str  # 'Success', 'N/A', or the failure the driver names


@dataclass(frozen=True)
class Fabric:
    switches: list[str] = field(default_factory=list)  # PCI addresses of the NVSwitches
    service: dict[str, str] = field(default_factory=dict)  # systemctl's properties; empty: no answer
    service_said: str = ""  # what systemctl printed when it printed no properties
    running: bool = False  # an nv-fabricmanager process
    fm_version: str | None = None
    fm_said: str = ""
    driver_version: str | None = None
    gpus: list[GpuFabric] = field(default_factory=list)
    error: str | None = None
    raw: str = ""


def _gpus(lines: list[str]) -> list[GpuFabric]:
    gpus: list[GpuFabric] = []
    bus: str | None = None
    values: dict[str, str] = {}
    for line in [*lines, "GPU 0000:00:00.0"]:  # a sentinel closes the last GPU
        gpu, value = _GPU.match(line), _FIELD.match(line)
        if gpu:
            if bus is not None:
                gpus.append(GpuFabric(bus, values.get("State", "N/A"), values.get("Status", "N/A")))
            bus, values = gpu.group(1), {}
        elif value and bus is not None:
            values[value.group(1)] = value.group(2)
    return gpus


def parse(stdout: str, exit_code: int | None = 0) -> Fabric:
    parts = marked_sections(stdout, _SECTIONS)
    if parts is None:
        return Fabric(error="output truncated or without its sections", raw=stdout)
    service = dict(line.split("=", 1) for line in parts["service"] if "=" in line and not line.startswith("rc="))
    said = "; ".join(line for line in parts["service"] if "=" not in line)
    fm = (
        _VERSION.search(" ".join(parts["fm_version"][:-1]))
        if "not found" not in " ".join(parts["fm_version"])
        else None
    )
    driver = _VERSION.search(" ".join(parts["driver"]))
    return Fabric(
        switches=[line.strip() for line in parts["switches"] if line.strip()],
        service=service,
        service_said=said,
        running="running" in parts["process"],
        fm_version=fm.group(1) if fm else None,
        fm_said="; ".join(parts["fm_version"][:2]),
        driver_version=driver.group(1) if driver and "No such file" not in " ".join(parts["driver"]) else None,
        gpus=_gpus(parts["fabric"]),
        raw=stdout,
    )


def cluster_values(model: Fabric) -> dict[str, str]:
    if model.error:
        return {}
    return {"nvswitch_count": str(len(model.switches))}


def _gpu_rows(model: Fabric) -> list[CheckRow]:
    rows = []
    for index, gpu in enumerate(model.gpus):
        seen = f"{gpu.state}, {gpu.status}"
        if gpu.state == "Completed" and gpu.status == "Success":
            rows.append(CheckRow(NAME, f"gpu{index}", Status.PASS, "ok", seen, "Completed, Success", gpu.bus_id, index))
        elif gpu.state == "Completed":
            rows.append(CheckRow(NAME, f"gpu{index}", Status.FAIL, "fabric_failed", seen, "Completed, Success",
                                 gpu.bus_id, index))  # fmt: skip
        else:
            rows.append(CheckRow(NAME, f"gpu{index}", Status.FAIL, "fabric_not_ready", seen, "Completed, Success",
                                 gpu.bus_id, index))  # fmt: skip
    return rows


def _switches(model: Fabric) -> str:
    count = len(model.switches)
    return f"{count} NVSwitch{'' if count == 1 else 'es'}"


def _switch_row(model: Fabric, profile: Profile, cluster: ClusterView) -> CheckRow:
    spec = profile.nvswitch
    wanted = spec.count if spec is not None and spec.count is not None else None
    majority = cluster.majority_of("nvswitch_count")
    expected = wanted if wanted is not None else (int(majority) if majority is not None else None)
    seen = _switches(model)
    detail = ", ".join(model.switches) or "none on the bus"
    source = "the profile" if wanted is not None else "the cluster's majority"
    if expected is None:
        return CheckRow(NAME, "nvswitches", Status.PASS, "recorded", seen, None, detail)
    if len(model.switches) < expected:
        return CheckRow(NAME, "nvswitches", Status.FAIL, "nvswitch_missing", seen, f"{expected} ({source})", detail)
    return CheckRow(NAME, "nvswitches", Status.PASS, "ok", seen, f"{expected} ({source})", detail)


def _service_rows(model: Fabric) -> list[CheckRow]:
    state = model.service.get("ActiveState")
    load = model.service.get("LoadState")
    said = " ".join(f"{k}={v}" for k, v in sorted(model.service.items())) or quote(model.service_said)
    if (load == "not-found" or not model.service) and model.fm_version is None and not model.running:
        return [CheckRow(NAME, "fabric_manager", Status.FAIL, "fm_missing", "not installed", "active", said)]
    if state != "active" and not (state is None and model.running):
        seen = f"{state or 'unknown'} ({model.service.get('Result', 'no result')})"
        return [CheckRow(NAME, "fabric_manager", Status.FAIL, "fm_stopped", seen, "active", said)]
    rows = [CheckRow(NAME, "fabric_manager", Status.PASS, "ok", "active", "active", said)]
    if model.fm_version is not None and model.driver_version is not None:
        seen, want = f"Fabric Manager {model.fm_version}", f"{model.driver_version} (the loaded driver)"
        ok = model.fm_version == model.driver_version
        rows.append(CheckRow(NAME, "fm_version", Status.PASS if ok else Status.FAIL,
                             "ok" if ok else "fm_version_mismatch", seen, want, model.fm_said))  # fmt: skip
    return rows


def evaluate(model: Fabric, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    if profile.nvswitch is None:
        return [
            CheckRow(NAME, "nvswitches", Status.PASS, "recorded", _switches(model), None, "the profile expects none")
        ]
    reported = [g for g in model.gpus if g.state != "N/A"]
    if not model.switches and not reported:
        return [CheckRow(NAME, "fabric", Status.SKIP, "no_nvswitch", "no NVSwitch, no GPU fabric", "NVSwitch fabric")]
    gpu_rows = _gpu_rows(model) if reported else [
        CheckRow(NAME, "fabric", Status.SKIP, "fabric_state_unreported", "N/A", "Completed, Success")]  # fmt: skip
    if not model.switches:
        joined = all(r.status is Status.PASS for r in gpu_rows)
        row = CheckRow(NAME, "nvswitches", Status.PASS if joined else Status.FAIL,
                       "managed_elsewhere" if joined else "nvswitch_missing", "0 NVSwitches visible",
                       "the GPUs' fabric completed", "none on the bus")  # fmt: skip
        return [row, *gpu_rows]
    return [_switch_row(model, profile, cluster), *_service_rows(model), *gpu_rows]


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    cluster_values=cluster_values,
    expectations=(Expectation("nvswitch", "preflight", NAME, is_set(lambda p: p.nvswitch)),),
    samples=(
        healthy("h200x4", {"managed_elsewhere", "ok"}, fixture="nvswitch/h200x4.txt", profile={"nvswitch": {}}),
        healthy("h100x1", {"recorded"}, fixture="nvswitch/h100x1.txt"),
        fault(
            "fabric_not_ready",
            {"fabric_not_ready", "nvswitch_missing"},
            fixture="nvswitch/fabric_not_ready.txt",
            profile={"nvswitch": {}},
        ),
        dead("no_output", {"unparsable_output"}, text="", exit_code=127),
    ),
)
