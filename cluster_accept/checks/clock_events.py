"""Clock event (throttle) reasons per GPU: a GPU slowed by heat or by its power supply fails.

``clocks_event_reasons.active`` (alias ``clocks_throttle_reasons.active``) is the NVML bitmask
``nvmlClocksEventReason*`` printed as ``0x0000000000000001``. Hardware slowdowns (HW slowdown, HW thermal,
HW power brake) and SW thermal slowdown fail: the GPU runs at a fraction of its clocks. SW power cap only
warns (an idle GPU should not hit it, a loaded one may). Idle, applications clocks, sync boost and display
clock settings are normal states and pass; the observed value lists them.

Drivers before the rename (R535) know only the ``clocks_throttle_reasons`` name, which carries the same bits:
the query falls back to it (:class:`~cluster_accept.checks.sections.GpuQuery`) rather than fail the node, and
the row's detail says which name answered.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cluster_accept.checks.contract import (
    Action,
    Check,
    CheckRow,
    ClusterView,
    Profile,
    Reason,
    Status,
    declare,
    driver_unreachable,
    error_row,
    fault,
    healthy,
)
from cluster_accept.checks.sections import NVIDIA_SMI_SKIPPED, GpuQuery, not_available

NAME = "clock_events"
MASK = "clocks_event_reasons.active"
FIELDS = ["index", MASK]
QUERY = GpuQuery(FIELDS)
COMMAND = QUERY.command

# nvml.h nvmlClocksEventReason* bits
EVENT_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clock_setting",
}
FAILING = ("hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")
WARNING = ("sw_power_cap",)
_EXPECTED = "none of " + ", ".join(FAILING)
_KNOWN_BITS = sum(EVENT_BITS)
_THROTTLES = {
    "hw_slowdown": "the GPU's hardware slowdown is engaged (heat or a power supply event): check cooling and power",
    "sw_thermal": "the driver holds the clocks down to cool the GPU: check fans, airflow and inlet temperature",
    "hw_thermal": "the GPU is too hot and slows itself: check fans, airflow and inlet temperature",
    "hw_power_brake": "the node's power brake signal slows the GPU: check the power supplies",
    "sw_power_cap": "the GPU is at its power limit: normal under load, not at idle; check the power limit",
}
REASONS = declare(
    NVIDIA_SMI_SKIPPED,
    *(Reason(f"throttle_{name}", Status.FAIL, _THROTTLES[name], Action.CHECK_NODE) for name in FAILING),
    *(Reason(f"throttle_{name}", Status.WARN, _THROTTLES[name], Action.CHECK_NODE) for name in WARNING),
    Reason(
        "unknown_event_reason",
        Status.WARN,
        "a clock event bit NVML does not define: read nvidia-smi -q -d PERFORMANCE on the node",
        Action.CHECK_NODE,
    ),
)


@dataclass(frozen=True)
class GpuClockEvents:
    index: int
    mask: int | None  # None: nvidia-smi said [N/A] / [Not Supported]
    text: str  # as printed

    @property
    def names(self) -> list[str]:
        """Active reasons, by bit order; a bit NVML does not define shows as its hex value."""
        if self.mask is None:
            return []
        names = [name for bit, name in EVENT_BITS.items() if self.mask & bit]
        unknown = self.mask & ~_KNOWN_BITS
        return names + ([hex(unknown)] if unknown else [])


@dataclass(frozen=True)
class ClockEvents:
    gpus: list[GpuClockEvents] = field(default_factory=list)
    failure: str | None = None  # nvidia-smi could not talk to the driver
    error: str | None = None  # output we could not read
    raw: str = ""
    source: str = MASK  # the field name the driver answered to (clocks_throttle_reasons.active before R535)
    note: str = ""  # why it answered to another name ('' when it answered to MASK)


def _read(stdout: str, exit_code: int | None) -> ClockEvents:
    answer = QUERY.read(stdout, exit_code)
    if answer.failure:
        return ClockEvents(failure=answer.failure, raw=stdout)
    if answer.error:
        return ClockEvents(error=answer.error, raw=stdout)
    source, note = answer.name(MASK), answer.note(MASK)
    gpus = []
    for row in answer.rows:
        index, text = row["index"], row[MASK]
        if not_available(text):
            gpus.append(GpuClockEvents(int(index), None, text))
        elif re.fullmatch(r"0x[0-9A-Fa-f]{1,16}", text):
            gpus.append(GpuClockEvents(int(index), int(text, 16), text))
        else:
            return ClockEvents(error=f"GPU {index}: unexpected {source} {text!r}", raw=stdout)
    return ClockEvents(gpus=gpus, raw=stdout, source=source, note=note)


def parse(stdout: str, exit_code: int | None = 0) -> ClockEvents:
    try:
        return _read(stdout, exit_code)
    except Exception as exc:  # noqa: BLE001 - csv can raise on garbage (huge fields, stray CR); never propagate
        return ClockEvents(error=f"unreadable output ({type(exc).__name__}: {exc})", raw=stdout)


def _gpu_rows(gpu: GpuClockEvents, source: str, note: str) -> list[CheckRow]:
    item = "event_reasons"
    detail = f"{source}={gpu.text}" + (f" ({note})" if note else "")
    if gpu.mask is None:
        return [CheckRow(NAME, item, Status.SKIP, "not_available", gpu.text, _EXPECTED, detail, gpu.index)]
    names = gpu.names
    observed = ", ".join(names) or "none"
    rows = [
        CheckRow(NAME, item, Status.FAIL, f"throttle_{name}", observed, _EXPECTED, detail, gpu.index)
        for name in FAILING
        if name in names
    ]
    rows += [
        CheckRow(NAME, item, Status.WARN, f"throttle_{name}", observed, f"no {name}", detail, gpu.index)
        for name in WARNING
        if name in names
    ]
    if gpu.mask & ~_KNOWN_BITS:
        rows.append(
            CheckRow(NAME, item, Status.WARN, "unknown_event_reason", observed, "known NVML reasons", detail, gpu.index)
        )
    return rows or [CheckRow(NAME, item, Status.PASS, "ok", observed, _EXPECTED, detail, gpu.index)]


def evaluate(model: ClockEvents, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.failure:
        detail = "nvidia-smi failed; gpu_count and driver judge the node"
        return [CheckRow(NAME, "nvidia-smi", Status.SKIP, "nvidia_smi_failed", model.failure, None, detail)]
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    return [row for gpu in model.gpus for row in _gpu_rows(gpu, model.source, model.note)]


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    samples=(
        healthy("h200x4", {"ok"}, fixture="clock_events/h200x4.txt"),
        healthy("h100x1", {"ok"}, fixture="clock_events/h100x1.txt"),
        fault("hw_slowdown", {"throttle_hw_slowdown"}, fixture="clock_events/hw_slowdown.txt"),
        driver_unreachable({"nvidia_smi_failed"}),
    ),
)
