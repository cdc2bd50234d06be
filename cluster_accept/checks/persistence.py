"""Persistence mode per GPU: with it off, the driver unloads between jobs and every job start pays for it.

``nvidia-smi`` reports ``Enabled`` or ``Disabled`` per GPU (Linux only; ``[N/A]`` elsewhere). A GPU whose mode
differs from the profile's ``persistence_mode`` fails; without the key, the mode is only recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cluster_accept.checks.contract import (
    Action,
    Check,
    CheckRow,
    ClusterView,
    Expectation,
    NodeModels,
    Profile,
    Reason,
    Status,
    SuggestedValues,
    declare,
    driver_unreachable,
    error_row,
    fault,
    healthy,
    is_set,
    one_value,
)
from cluster_accept.checks.sections import NVIDIA_SMI_SKIPPED, not_available, query_gpu_command, read_gpu_query

NAME = "persistence"
FIELDS = ["index", "persistence_mode"]
COMMAND = query_gpu_command(FIELDS)
_MODES = ("Enabled", "Disabled")
REASONS = declare(
    NVIDIA_SMI_SKIPPED,
    Reason(
        "persistence_disabled",
        Status.FAIL,
        "persistence mode is off: enable nvidia-persistenced (or nvidia-smi -pm 1)",
        Action.FIX_CONFIG,
    ),
    Reason(
        "persistence_enabled",
        Status.FAIL,
        "persistence mode is on where the profile wants it off: stop nvidia-persistenced (or nvidia-smi -pm 0)",
        Action.FIX_CONFIG,
    ),
)


@dataclass(frozen=True)
class GpuPersistence:
    index: int
    mode: str  # 'Enabled', 'Disabled', or nvidia-smi's not-available text ('[N/A]')


@dataclass(frozen=True)
class PersistenceModes:
    gpus: list[GpuPersistence] = field(default_factory=list)
    failure: str | None = None  # nvidia-smi could not talk to the driver
    error: str | None = None  # output we could not read
    raw: str = ""


def _read(stdout: str, exit_code: int | None) -> PersistenceModes:
    rows, failure, error = read_gpu_query(stdout, exit_code, FIELDS)
    if failure:
        return PersistenceModes(failure=failure, raw=stdout)
    if error:
        return PersistenceModes(error=error, raw=stdout)
    gpus = []
    for row in rows:
        index, mode = row["index"], row["persistence_mode"]
        if mode not in _MODES and not not_available(mode):
            return PersistenceModes(error=f"GPU {index}: unexpected persistence_mode {mode!r}", raw=stdout)
        gpus.append(GpuPersistence(int(index), mode))
    return PersistenceModes(gpus=gpus, raw=stdout)


def parse(stdout: str, exit_code: int | None = 0) -> PersistenceModes:
    try:
        return _read(stdout, exit_code)
    except Exception as exc:  # noqa: BLE001 - csv can raise on garbage (huge fields, stray CR); never propagate
        return PersistenceModes(error=f"unreadable output ({type(exc).__name__}: {exc})", raw=stdout)


def cluster_values(model: PersistenceModes) -> dict[str, str]:
    modes = {g.mode for g in model.gpus}
    if model.failure or model.error or len(modes) != 1:
        return {}
    return {"persistence_mode": modes.pop()}


def evaluate(model: PersistenceModes, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.failure:
        detail = "nvidia-smi failed; gpu_count and driver judge the node"
        return [CheckRow(NAME, "nvidia-smi", Status.SKIP, "nvidia_smi_failed", model.failure, None, detail)]
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    wanted = profile.persistence_mode.capitalize() if profile.persistence_mode else None
    rows: list[CheckRow] = []
    for gpu in model.gpus:
        if wanted is None:
            status, reason = Status.PASS, "recorded"
        elif not_available(gpu.mode):
            status, reason = Status.SKIP, "not_available"
        elif gpu.mode == wanted:
            status, reason = Status.PASS, "ok"
        elif gpu.mode == "Disabled":
            status, reason = Status.FAIL, "persistence_disabled"
        else:
            status, reason = Status.FAIL, "persistence_enabled"
        rows.append(CheckRow(NAME, "mode", status, reason, gpu.mode, wanted, gpu=gpu.index))
    return rows


def suggest_values(model: PersistenceModes, others: NodeModels) -> SuggestedValues:
    """``enabled``/``disabled``; GPUs that differ show as ``mixed``; nvidia-smi's ``[N/A]`` gives no value."""
    mode = one_value(g.mode for g in model.gpus)
    if mode in ("Enabled", "Disabled"):
        return {"persistence_mode": mode.lower()}
    return {"persistence_mode": mode if mode and mode.startswith("mixed ") else None}


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    cluster_values=cluster_values,
    suggest=suggest_values,
    expectations=(Expectation("persistence_mode", "preflight", NAME, is_set(lambda p: p.persistence_mode)),),
    samples=(
        healthy("h200x4", {"recorded"}, fixture="persistence/h200x4.txt"),
        healthy("h100x1", {"recorded"}, fixture="persistence/h100x1.txt"),
        fault(
            "disabled",
            {"persistence_disabled"},
            fixture="persistence/disabled.txt",
            profile={"persistence_mode": "enabled"},
        ),
        driver_unreachable({"nvidia_smi_failed"}),
    ),
)
