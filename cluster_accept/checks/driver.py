"""Driver version: what nvidia-smi reports, what the loaded kernel module says, the profile, the majority.

nvidia-smi and ``/proc/driver/nvidia/version`` disagree after a driver upgrade without a reboot (userspace
new, kernel module old) — jobs then fail with "driver/library version mismatch". A node whose driver
differs from the rest of the cluster is drift even when no version is pinned in the profile.
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
)
from cluster_accept.checks.sections import NVIDIA_SMI_FAILED, csv_rows, driver_failure, small_int
from cluster_accept.inventory.model import MinVersion

NAME = "driver"
_PROC_MARK = "### /proc/driver/nvidia/version rc="
COMMAND = (
    "nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1; "
    f'echo "{_PROC_MARK}$?"; cat /proc/driver/nvidia/version 2>&1'
)
_PROC_VERSION = re.compile(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s")
# ``drift`` (common) is softened to a warning when the node meets a version the profile pins exactly.
REASONS = declare(
    NVIDIA_SMI_FAILED,
    Reason(
        "versions_differ_between_gpus",
        Status.FAIL,
        "nvidia-smi reports different driver versions for the node's GPUs: reinstall the driver",
        Action.FIX_CONFIG,
    ),
    Reason(
        "proc_version_unreadable",
        Status.WARN,
        "/proc/driver/nvidia/version could not be read, so the loaded kernel module was not compared",
    ),
    Reason(
        "kernel_module_mismatch",
        Status.FAIL,
        "the loaded kernel module differs from nvidia-smi's driver (upgraded without a reboot): reboot the node",
        Action.FIX_CONFIG,
    ),
    Reason(
        "version_mismatch",
        Status.FAIL,
        "the driver differs from the version the profile pins: install the cluster's driver version",
        Action.FIX_CONFIG,
    ),
    Reason(
        "version_too_old",
        Status.FAIL,
        "the driver is older than the profile's minimum: install the cluster's driver version",
        Action.FIX_CONFIG,
    ),
)


@dataclass(frozen=True)
class DriverVersions:
    smi_versions: list[str] = field(default_factory=list)
    kernel_module: str | None = None
    failure: str | None = None
    error: str | None = None
    raw: str = ""

    @property
    def version(self) -> str | None:
        versions = sorted(set(self.smi_versions))
        return versions[0] if len(versions) == 1 else None


def parse(stdout: str, exit_code: int | None = 0) -> DriverVersions:
    smi_part, sep, rest = stdout.partition(_PROC_MARK)
    if not sep:
        return DriverVersions(error="output truncated before the /proc section", raw=stdout)
    smi_rc_text, _, proc_part = rest.partition("\n")
    failure = driver_failure(smi_part, small_int(smi_rc_text))
    match = _PROC_VERSION.search(proc_part)
    kernel_module = match.group(1) if match else None
    if failure:
        return DriverVersions(failure=failure, kernel_module=kernel_module, raw=stdout)
    rows = csv_rows(smi_part, 1)
    if not rows or not all(re.fullmatch(r"\d{1,9}\.\d{1,9}(\.\d{1,9})?", r[0]) for r in rows):
        return DriverVersions(error="unexpected nvidia-smi driver_version output", raw=stdout)
    return DriverVersions(smi_versions=[r[0] for r in rows], kernel_module=kernel_module, raw=stdout)


def cluster_values(model: DriverVersions) -> dict[str, str]:
    return {"driver_version": model.version} if model.version else {}


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def evaluate(model: DriverVersions, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.failure:
        return [
            CheckRow(NAME, "nvidia-smi", Status.FAIL, "nvidia_smi_failed", model.failure, model.kernel_module or "")
        ]
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    version = model.version
    rows: list[CheckRow] = []
    if version is None:
        observed = ",".join(sorted(set(model.smi_versions)))
        return [CheckRow(NAME, "nvidia-smi", Status.FAIL, "versions_differ_between_gpus", observed, "one version")]
    if model.kernel_module is None:
        rows.append(CheckRow(NAME, "kernel_module", Status.WARN, "proc_version_unreadable", None, version))
    elif model.kernel_module != version:
        rows.append(
            CheckRow(NAME, "kernel_module", Status.FAIL, "kernel_module_mismatch", model.kernel_module, version)
        )
    else:
        rows.append(CheckRow(NAME, "kernel_module", Status.PASS, "ok", model.kernel_module, version))
    wanted = profile.driver_version
    pinned_and_met = False
    if isinstance(wanted, str):
        pinned_and_met = version == wanted
        status, reason = (Status.PASS, "ok") if pinned_and_met else (Status.FAIL, "version_mismatch")
        rows.append(CheckRow(NAME, "version", status, reason, version, wanted))
    elif isinstance(wanted, MinVersion):
        ok = _version_tuple(version) >= _version_tuple(wanted.min)
        rows.append(
            CheckRow(
                NAME,
                "version",
                Status.PASS if ok else Status.FAIL,
                "ok" if ok else "version_too_old",
                version,
                f">= {wanted.min}",
            )
        )
    majority = cluster.majority_of("driver_version")
    if majority is not None and majority != version:
        status = Status.WARN if pinned_and_met else Status.FAIL
        rows.append(CheckRow(NAME, "drift", status, "drift", version, f"{majority} (majority)"))
    return rows


def suggest_values(model: DriverVersions, others: NodeModels) -> SuggestedValues:
    """The ``driver_version`` a profile starts from (``profile suggest``)."""
    return {"driver_version": model.version}


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    cluster_values=cluster_values,
    suggest=suggest_values,
    expectations=(Expectation("driver_version", "preflight", NAME, is_set(lambda p: p.driver_version)),),
    samples=(
        healthy("h200x4", {"ok"}, fixture="driver/h200x4.txt"),
        healthy("h100x1", {"ok"}, fixture="driver/h100x1.txt"),
        fault("driver_mismatch", {"versions_differ_between_gpus"}, fixture="driver/driver_mismatch.txt"),
        driver_unreachable({"unparsable_output"}),
    ),
)
