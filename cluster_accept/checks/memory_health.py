"""GPU memory health per GPU: ECC on, no uncorrected errors, no pending or failed row remapping/page retirement.

Field names as ``nvidia-smi --help-query-gpu`` (driver 580) lists them:

- ``ecc.mode.current``: ``Enabled``/``Disabled`` (a change needs a reboot; ``ecc.mode.pending`` is not read);
- ``ecc.errors.uncorrected.volatile.total``: uncorrected ECC errors since the driver was loaded;
- ``remapped_rows.pending``: a row remap waits for a GPU reset (Ampere and later);
- ``remapped_rows.failure``: a remap failed at some point in the GPU's life: the GPU should be replaced;
- ``retired_pages.pending``: pages waiting for retirement at the next reboot (pre-Ampere page retirement).

``[N/A]`` is not a failure: an H200/H100 reports ``retired_pages.pending`` as ``[N/A]`` because it uses row
remapping instead of page retirement, and counters read ``[N/A]`` with ECC off (which fails on its own).

The ``remapped_rows.*`` fields are recent in ``--query-gpu`` (older drivers read row remapping only through
``--query-remapped-rows``): on a driver that refuses them the query runs without them
(:class:`~cluster_accept.checks.sections.GpuQuery`), the other fields are judged, and each of theirs is a
``field_not_in_driver`` skip, so an older driver neither fails the node nor passes what it cannot report.
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
from cluster_accept.checks.sections import FIELD_NOT_IN_DRIVER, NVIDIA_SMI_SKIPPED, GpuQuery, not_available

NAME = "memory"
FIELDS = [
    "index",
    "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "retired_pages.pending",
]
QUERY = GpuQuery(FIELDS)
COMMAND = QUERY.command

# field -> (item, pattern of a readable value, the healthy value, fail reason when it differs)
_JUDGED: dict[str, tuple[str, str, str, str]] = {
    "ecc.mode.current": ("ecc_mode", r"Enabled|Disabled", "Enabled", "ecc_disabled"),
    "ecc.errors.uncorrected.volatile.total": ("uncorrected_ecc", r"\d+", "0", "uncorrected_ecc"),
    "remapped_rows.pending": ("remapped_rows_pending", r"Yes|No", "No", "remap_pending"),
    "remapped_rows.failure": ("remapped_rows_failure", r"Yes|No", "No", "remap_failed"),
    "retired_pages.pending": ("retired_pages_pending", r"Yes|No", "No", "retired_pages_pending"),
}
_DETAILS = {
    "uncorrected_ecc": "uncorrected ECC errors since the driver was loaded",
    "remap_pending": "a row remapping waits for a GPU reset (nvidia-smi -r or reboot)",
    "remap_failed": "row remapping failed: the GPU has run out of spare rows and should be replaced",
    "retired_pages_pending": "pages are pending retirement: reboot to retire them",
    "ecc_disabled": "enable with nvidia-smi -e 1, then reboot",
}
REASONS = declare(
    NVIDIA_SMI_SKIPPED,
    FIELD_NOT_IN_DRIVER,
    Reason("ecc_disabled", Status.FAIL, "ECC is off: nvidia-smi -e 1 and reboot", Action.FIX_CONFIG),
    Reason("uncorrected_ecc", Status.FAIL, "uncorrected ECC errors since the driver was loaded", Action.REPLACE_GPU),
    Reason("remap_pending", Status.FAIL, "a row remap waits for a GPU reset: reset, then rerun", Action.CHECK_NODE),
    Reason(
        "remap_failed",
        Status.FAIL,
        "row remapping failed: the GPU has no spare rows left",
        Action.REPLACE_GPU,
    ),
    Reason(
        "retired_pages_pending",
        Status.FAIL,
        "pages wait for retirement: reboot, then rerun",
        Action.CHECK_NODE,
    ),
)


@dataclass(frozen=True)
class GpuMemory:
    index: int
    values: dict[str, str]  # field -> nvidia-smi's value ('Enabled', '0', 'No', '[N/A]', ...); reported ones only


@dataclass(frozen=True)
class MemoryHealth:
    gpus: list[GpuMemory] = field(default_factory=list)
    failure: str | None = None  # nvidia-smi could not talk to the driver
    error: str | None = None  # output we could not read
    raw: str = ""
    missing: dict[str, str] = field(default_factory=dict)  # field the driver is too old to report -> why


def _read(stdout: str, exit_code: int | None) -> MemoryHealth:
    answer = QUERY.read(stdout, exit_code)
    if answer.failure:
        return MemoryHealth(failure=answer.failure, raw=stdout)
    if answer.error:
        return MemoryHealth(error=answer.error, raw=stdout)
    judged = {name: spec for name, spec in _JUDGED.items() if name not in answer.missing}
    gpus = []
    for row in answer.rows:
        for name, (_, pattern, _, _) in judged.items():
            if not re.fullmatch(pattern, row[name]) and not not_available(row[name]):
                return MemoryHealth(error=f"GPU {row['index']}: unexpected {name} {row[name]!r}", raw=stdout)
        gpus.append(GpuMemory(int(row["index"]), {name: row[name] for name in judged}))
    missing = {name: answer.note(name) for name in answer.missing}
    return MemoryHealth(gpus=gpus, raw=stdout, missing=missing)


def parse(stdout: str, exit_code: int | None = 0) -> MemoryHealth:
    try:
        return _read(stdout, exit_code)
    except Exception as exc:  # noqa: BLE001 - csv can raise on garbage (huge fields, stray CR); never propagate
        return MemoryHealth(error=f"unreadable output ({type(exc).__name__}: {exc})", raw=stdout)


def counters(model: MemoryHealth) -> dict[str, int]:
    """Uncorrected ECC errors per GPU (``gpu1.uncorrected_ecc``), compared with the node's previous run."""
    found: dict[str, int] = {}
    for gpu in model.gpus:
        value = gpu.values.get("ecc.errors.uncorrected.volatile.total", "")
        if value.isascii() and value.isdigit() and len(value) <= 20:  # a 64-bit counter; int() refuses 4300+ digits
            found[f"gpu{gpu.index}.uncorrected_ecc"] = int(value)
    return found


def evaluate(model: MemoryHealth, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.failure:
        detail = "nvidia-smi failed; gpu_count and driver judge the node"
        return [CheckRow(NAME, "nvidia-smi", Status.SKIP, "nvidia_smi_failed", model.failure, None, detail)]
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    rows: list[CheckRow] = []
    for gpu in model.gpus:
        for name, (item, _, expected, bad_reason) in _JUDGED.items():
            if name in model.missing:
                why = model.missing[name]
                rows.append(CheckRow(NAME, item, Status.SKIP, "field_not_in_driver", None, expected, why, gpu.index))
                continue
            value = gpu.values[name]
            if not_available(value):
                status, reason, detail = Status.SKIP, "not_available", f"{name} not reported"
            elif value == expected:
                status, reason, detail = Status.PASS, "ok", ""
            else:
                status, reason, detail = Status.FAIL, bad_reason, _DETAILS[bad_reason]
            rows.append(CheckRow(NAME, item, status, reason, value, expected, detail, gpu.index))
    return rows


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    counters=counters,
    samples=(
        healthy("h200x4", {"not_available", "ok"}, fixture="memory_health/h200x4.txt"),
        healthy("h100x1", {"not_available", "ok"}, fixture="memory_health/h100x1.txt"),
        fault("uncorrected", {"remap_pending", "uncorrected_ecc"}, fixture="memory_health/uncorrected.txt"),
        driver_unreachable({"nvidia_smi_failed"}),
    ),
)
