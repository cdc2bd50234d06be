"""Shared parsing helpers for nvidia-smi outputs.

``nvidia-smi`` reports a dead driver with a fixed message and exit code 9 whatever subcommand ran; every
check recognises it the same way, and declares its ``nvidia_smi_failed`` reason from here, so it lives here once.
"""

from __future__ import annotations

import csv
import io

from cluster_accept.checks.base import Status
from cluster_accept.checks.reasons import Action, Reason

# ``nvidia_smi_failed`` as the checks declare it: the checks that judge the driver itself (gpu_count, driver)
# fail the node; the others skip, so one dead driver is not counted once per check.
NVIDIA_SMI_FAILED = Reason(
    "nvidia_smi_failed",
    Status.FAIL,
    "nvidia-smi fails: the driver is not loaded or not installed",
    Action.FIX_CONFIG,
)
NVIDIA_SMI_SKIPPED = Reason(
    "nvidia_smi_failed",
    Status.SKIP,
    "not judged: nvidia-smi fails on this node (gpu_count and driver report it)",
)

DRIVER_FAILURE_MARKERS = (
    "couldn't communicate with the NVIDIA driver",
    "NVIDIA-SMI has failed",
    "No devices were found",
)


def driver_failure(stdout: str, exit_code: int | None) -> str | None:
    """The failure line when nvidia-smi could not talk to the driver, else None."""
    for line in stdout.splitlines():
        if any(marker in line for marker in DRIVER_FAILURE_MARKERS):
            return line.strip()
    if exit_code == 127 or "command not found" in stdout:
        return "nvidia-smi not found on the node"
    return None


def small_int(text: str) -> int | None:
    """``text`` as an int when it is a plain decimal number of at most 18 digits (an exit status, a GPU index),
    else None: ``str.isdigit`` alone takes '²', which ``int`` refuses, and ``int`` refuses over 4300 digits."""
    text = text.strip()
    return int(text) if text.isdecimal() and len(text) <= 18 else None


def csv_rows(stdout: str, columns: int) -> list[list[str]] | None:
    """Rows of a ``--format=csv,noheader,nounits`` output, each with exactly ``columns`` cells; None if any
    non-empty line has another shape (truncated or garbage output)."""
    rows: list[list[str]] = []
    try:
        for record in csv.reader(io.StringIO(stdout), skipinitialspace=True):
            if not record or all(not cell.strip() for cell in record):
                continue
            if len(record) != columns:
                return None
            rows.append([cell.strip() for cell in record])
    except csv.Error:  # a field over the csv limit, a stray NUL or carriage return: not nvidia-smi's shape
        return None
    return rows


def query_gpu(stdout: str, fields: list[str]) -> list[dict[str, str]] | None:
    """Rows of ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`` as dicts keyed by field;
    None when the output does not have that shape (truncated, garbage)."""
    rows = csv_rows(stdout, len(fields))
    if rows is None:
        return None
    return [dict(zip(fields, row, strict=True)) for row in rows]


def query_gpu_command(fields: list[str]) -> str:
    return f"nvidia-smi --query-gpu={','.join(fields)} --format=csv,noheader,nounits"


def not_available(value: str) -> bool:
    """nvidia-smi's ways of saying a field has no value on this GPU."""
    return value.strip() in {"[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", ""}


def read_gpu_query(stdout: str, exit_code: int | None, fields: list[str]) -> tuple[list[dict[str, str]], str, str]:
    """The shared first half of every ``--query-gpu`` parser: (rows, failure, error).

    ``failure``: nvidia-smi could not talk to the driver; ``error``: output we cannot read (non-zero exit,
    cut mid-line, wrong shape, no GPU lines, a non-numeric index). When either is set, rows is empty.
    """
    failure = driver_failure(stdout, exit_code)
    if failure:
        return [], failure, ""
    if exit_code not in (0, None):
        return [], "", f"nvidia-smi exited {exit_code}"
    if stdout and not stdout.endswith("\n"):
        return [], "", "output ends mid-line (truncated)"
    rows = query_gpu(stdout, fields)
    if rows is None:
        return [], "", f"expected {len(fields)} columns per line: {','.join(fields)}"
    if not rows:
        return [], "", "no GPU lines in the output"
    for row in rows:
        if "index" in row and not row["index"].isdigit():
            return [], "", f"bad GPU index {row['index']!r}"
    return rows, "", ""
