"""GPU count and model, from ``nvidia-smi --query-gpu``: a node showing 7 of 8 GPUs fails.

A GPU that fell off the bus simply disappears from nvidia-smi, so the count is the first thing to judge;
a dead driver makes nvidia-smi print a fixed message and exit 9, which is a failure with that reason.
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
from cluster_accept.checks.sections import NVIDIA_SMI_FAILED, csv_rows, driver_failure, small_int

NAME = "gpu_count"
# The same field list as the captured tests/data output, so the parser is tested on the real thing.
COMMAND = (
    "nvidia-smi --query-gpu=index,name,driver_version,persistence_mode,pcie.link.width.current,"
    "pcie.link.width.max --format=csv,noheader,nounits"
)
REASONS = declare(
    NVIDIA_SMI_FAILED,
    Reason("count_low", Status.FAIL, "a GPU is missing from the bus: reseat it or replace it", Action.REPLACE_GPU),
    Reason(
        "count_high",
        Status.WARN,
        "more GPUs than the profile expects: is the profile right for this node?",
        Action.FIX_CONFIG,
    ),
    Reason(
        "model_mismatch",
        Status.FAIL,
        "a GPU of another model than the profile's: fix the inventory or the node",
        Action.FIX_CONFIG,
    ),
)


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    driver_version: str


@dataclass(frozen=True)
class GpuList:
    gpus: list[Gpu] = field(default_factory=list)
    failure: str | None = None  # nvidia-smi could not talk to the driver
    error: str | None = None  # output we could not read
    raw: str = ""


def parse(stdout: str, exit_code: int | None = 0) -> GpuList:
    failure = driver_failure(stdout, exit_code)
    if failure:
        return GpuList(failure=failure, raw=stdout)
    rows = csv_rows(stdout, 6)
    if rows is None or (exit_code not in (0, None)):
        return GpuList(error=f"unexpected nvidia-smi output (exit {exit_code})", raw=stdout)
    gpus = []
    for index, name, driver_version, *_ in rows:
        number = small_int(index)
        if number is None:
            return GpuList(error=f"bad GPU index {index!r}", raw=stdout)
        gpus.append(Gpu(number, name, driver_version))
    return GpuList(gpus=gpus, raw=stdout)


def cluster_values(model: GpuList) -> dict[str, str]:
    if model.failure or model.error:
        return {}
    values = {"gpu_count": str(len(model.gpus))}
    names = sorted({g.name for g in model.gpus})
    if len(names) == 1:
        values["gpu_model"] = names[0]
    return values


def evaluate(model: GpuList, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.failure:
        return [CheckRow(NAME, "nvidia-smi", Status.FAIL, "nvidia_smi_failed", model.failure, "GPUs listed")]
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    count = len(model.gpus)
    rows: list[CheckRow] = []
    expected = profile.gpu.count if profile.gpu else None
    if expected is None:
        majority = cluster.majority_of("gpu_count")
        if majority is not None and majority != str(count):
            rows.append(CheckRow(NAME, "count", Status.FAIL, "drift", str(count), f"{majority} (majority)"))
        else:
            rows.append(CheckRow(NAME, "count", Status.PASS, "ok", str(count), majority))
    elif count < expected:
        rows.append(CheckRow(NAME, "count", Status.FAIL, "count_low", str(count), str(expected)))
    elif count > expected:
        rows.append(CheckRow(NAME, "count", Status.WARN, "count_high", str(count), str(expected)))
    else:
        rows.append(CheckRow(NAME, "count", Status.PASS, "ok", str(count), str(expected)))
    if profile.gpu and profile.gpu.model is not None:
        for gpu in model.gpus:
            if gpu.name != profile.gpu.model:
                rows.append(
                    CheckRow(NAME, "model", Status.FAIL, "model_mismatch", gpu.name, profile.gpu.model, gpu=gpu.index)
                )
    return rows


def suggest_values(model: GpuList, others: NodeModels) -> SuggestedValues:
    """The GPU model and count a profile starts from (``profile suggest``)."""
    gpus = model.gpus
    return {"gpu.model": one_value(g.name for g in gpus), "gpu.count": str(len(gpus)) if gpus else None}


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    cluster_values=cluster_values,
    suggest=suggest_values,
    expectations=(Expectation("gpu", "preflight", NAME, is_set(lambda p: p.gpu)),),
    samples=(
        healthy("h200x4", {"ok"}, fixture="captures/h200x4/query-gpu-noheader.txt"),
        healthy("h100x1", {"ok"}, fixture="captures/h100x1/query-gpu-noheader.txt"),
        fault("gpu_missing", {"count_low"}, fixture="gpu_count/gpu_missing.txt", profile={"gpu": {"count": 4}}),
        driver_unreachable({"nvidia_smi_failed"}),
    ),
)
