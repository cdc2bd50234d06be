"""CUDA version as the driver reports it, and the NCCL version the node offers, against profile and majority.

The CUDA version is the one in the plain ``nvidia-smi`` header (``CUDA Version: 13.0``): the highest CUDA the
installed driver supports, major.minor. The profile's ``cuda_version`` is compared to it exactly.

NCCL has no driver-side query; the node shows it in two places, both read in the same command:

- the library the dynamic loader would pick: ``ldconfig -p`` lists sonames (``libnccl.so.2``), so each one is
  resolved with ``readlink -f`` to the versioned file (``libnccl.so.2.28.3``); ``/sbin/ldconfig`` is tried
  too because ``/sbin`` is often not on a non-root SSH session's ``PATH``;
- ``NCCL_VERSION`` in the job environment (NVIDIA's containers set it, e.g. ``2.28.3-1``; the ``-1`` is the
  package revision and is dropped).

The library wins when both are there (it is what gets loaded); both are kept in the row's detail. A Python
job may still load the NCCL bundled with its framework (PyTorch wheels do) — the probes report that one.
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
from cluster_accept.checks.sections import NVIDIA_SMI_SKIPPED, driver_failure

NAME = "cuda"
_NCCL_MARK = "### nccl nvidia-smi rc="
COMMAND = (
    "out=$(nvidia-smi 2>&1); rc=$?; printf '%s\\n' \"$out\" | head -n 12; "
    f"printf '%s\\n' \"{_NCCL_MARK}$rc\"; printf 'env=%s\\n' \"${{NCCL_VERSION:-}}\"; "
    "{ ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | awk '/libnccl\\.so\\.[0-9]/ {print $NF}' | "
    'while read -r lib; do printf \'lib=%s\\n\' "$(readlink -f "$lib")"; done | head -n 8'
)
_CUDA = re.compile(r"CUDA Version:\s*(\S+)")
_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)?")
_ENV_VERSION = re.compile(r"(\d+\.\d+\.\d+)(?:-\d+)?")
_LIB_VERSION = re.compile(r"libnccl\.so\.(\d+\.\d+\.\d+)")
# ``drift`` (common): the CUDA version's is softened to a warning when the node meets the version the profile
# pins; the NCCL version's always warns (a job may load the NCCL its framework bundles instead).
REASONS = declare(
    NVIDIA_SMI_SKIPPED,
    Reason(
        "cuda_mismatch",
        Status.FAIL,
        "the driver's CUDA version differs from the profile's: install the cluster's driver",
        Action.FIX_CONFIG,
    ),
    Reason("cuda_version_unreadable", Status.SKIP, "nvidia-smi's header shows no CUDA version"),
    Reason(
        "nccl_version_unreadable",
        Status.SKIP,
        "no libnccl.so.N in ldconfig -p and NCCL_VERSION unset: the node's NCCL version is unknown",
    ),
)


@dataclass(frozen=True)
class CudaNccl:
    cuda_version: str | None = None  # '13.0'; None when nvidia-smi printed no version ('N/A')
    cuda_text: str | None = None  # what followed 'CUDA Version:'
    nccl_env: str = ""  # NCCL_VERSION as set ('' when unset)
    nccl_libs: list[tuple[str, str]] = field(default_factory=list)  # (resolved path, version), ldconfig order
    failure: str | None = None  # nvidia-smi could not talk to the driver
    error: str | None = None  # output we could not read
    raw: str = ""

    @property
    def nccl_env_version(self) -> str | None:
        match = _ENV_VERSION.fullmatch(self.nccl_env)
        return match.group(1) if match else None

    @property
    def nccl_version(self) -> str | None:
        """The first library ldconfig lists (the one the loader picks), else NCCL_VERSION."""
        return self.nccl_libs[0][1] if self.nccl_libs else self.nccl_env_version

    @property
    def nccl_sources(self) -> str:
        parts = [f"ldconfig: {path}" for path, _ in self.nccl_libs]
        if self.nccl_env:
            parts.append(f"NCCL_VERSION={self.nccl_env}")
        return "; ".join(parts) or "NCCL_VERSION unset and no libnccl.so.N in ldconfig -p"


def _nccl(section: str) -> tuple[str, list[tuple[str, str]]] | None:
    env: str | None = None
    libs: list[tuple[str, str]] = []
    for line in section.splitlines():
        if line.startswith("env="):
            env = line[4:].strip()
        elif line.startswith("lib="):
            match = _LIB_VERSION.search(line.rsplit("/", 1)[-1])
            path = line[4:].strip()
            if match and all(path != p for p, _ in libs):
                libs.append((path, match.group(1)))
    return None if env is None else (env, libs)


def _read(stdout: str, exit_code: int | None) -> CudaNccl:
    smi, sep, rest = stdout.partition(_NCCL_MARK)
    if not sep:
        failure = driver_failure(stdout, exit_code)
        if failure:
            return CudaNccl(failure=failure, raw=stdout)
        return CudaNccl(error="output truncated before the nccl section", raw=stdout)
    if not stdout.endswith("\n"):
        return CudaNccl(error="output ends mid-line (truncated)", raw=stdout)
    rc_text, _, section = rest.partition("\n")
    nccl = _nccl(section)
    if nccl is None:
        return CudaNccl(error="nccl section without its env= line", raw=stdout)
    env, libs = nccl
    smi_rc = int(rc_text) if rc_text.strip().isdigit() else None
    failure = driver_failure(smi, smi_rc)
    if failure:
        return CudaNccl(failure=failure, nccl_env=env, nccl_libs=libs, raw=stdout)
    match = _CUDA.search(smi)
    if match is None:
        return CudaNccl(error=f"no 'CUDA Version:' in the nvidia-smi header (rc={rc_text.strip()})", raw=stdout)
    text = match.group(1)
    version = text if _VERSION.fullmatch(text) else None
    return CudaNccl(cuda_version=version, cuda_text=text, nccl_env=env, nccl_libs=libs, raw=stdout)


def parse(stdout: str, exit_code: int | None = 0) -> CudaNccl:
    try:
        return _read(stdout, exit_code)
    except Exception as exc:  # noqa: BLE001 - a parser never raises
        return CudaNccl(error=f"unreadable output ({type(exc).__name__}: {exc})", raw=stdout)


def cluster_values(model: CudaNccl) -> dict[str, str]:
    if model.error:
        return {}
    values = {"cuda_version": model.cuda_version, "nccl_version": model.nccl_version}
    return {key: value for key, value in values.items() if value}


def _cuda_rows(model: CudaNccl, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    version, wanted = model.cuda_version, profile.cuda_version
    item = "cuda_version"
    detail = "nvidia-smi header: the CUDA version the driver supports"
    if version is None:
        observed = model.cuda_text or "[N/A]"
        if wanted:
            return [CheckRow(NAME, item, Status.FAIL, "cuda_mismatch", observed, wanted, detail)]
        return [CheckRow(NAME, item, Status.SKIP, "cuda_version_unreadable", observed, None, detail)]
    if wanted:
        met = version == wanted
        status, reason = (Status.PASS, "ok") if met else (Status.FAIL, "cuda_mismatch")
        rows = [CheckRow(NAME, item, status, reason, version, wanted, detail)]
    else:
        met = False
        rows = [CheckRow(NAME, item, Status.PASS, "recorded", version, None, detail)]
    majority = cluster.majority_of("cuda_version")
    if majority is not None and majority != version:
        status = Status.WARN if met else Status.FAIL
        rows.append(CheckRow(NAME, "cuda_drift", status, "drift", version, f"{majority} (majority)"))
    return rows


def _nccl_rows(model: CudaNccl, cluster: ClusterView) -> list[CheckRow]:
    version = model.nccl_version
    if version is None:
        return [CheckRow(NAME, "nccl_version", Status.SKIP, "nccl_version_unreadable", None, None, model.nccl_sources)]
    rows = [CheckRow(NAME, "nccl_version", Status.PASS, "recorded", version, None, model.nccl_sources)]
    majority = cluster.majority_of("nccl_version")
    if majority is not None and majority != version:
        rows.append(CheckRow(NAME, "nccl_drift", Status.WARN, "drift", version, f"{majority} (majority)"))
    return rows


def evaluate(model: CudaNccl, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.failure:
        detail = f"nvidia-smi failed; gpu_count and driver judge the node. NCCL: {model.nccl_sources}"
        return [CheckRow(NAME, "nvidia-smi", Status.SKIP, "nvidia_smi_failed", model.failure, None, detail)]
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    return _cuda_rows(model, profile, cluster) + _nccl_rows(model, cluster)


def suggest_values(model: CudaNccl, others: NodeModels) -> SuggestedValues:
    """The ``cuda_version`` a profile starts from (``profile suggest``)."""
    return {"cuda_version": model.cuda_version}


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    cluster_values=cluster_values,
    suggest=suggest_values,
    job_view=True,
    expectations=(Expectation("cuda_version", "preflight", NAME, is_set(lambda p: p.cuda_version)),),
    samples=(
        healthy("h200x4", {"recorded"}, fixture="cuda/h200x4.txt"),
        healthy("h100x1", {"recorded"}, fixture="cuda/h100x1.txt"),
        healthy("h200x4_pinned", {"ok"}, fixture="cuda/h200x4.txt", profile={"cuda_version": "13.0"}),
        fault(
            "cuda_12_4",
            {"cuda_mismatch"},
            fixture="cuda/h200x4_cuda12_4.txt",
            profile={"cuda_version": "13.0"},
        ),
        fault(
            "cuda_12_4_among_13_0",
            {"drift"},
            fixture="cuda/h200x4_cuda12_4.txt",
            majority={"cuda_version": "13.0"},
        ),
        driver_unreachable({"nvidia_smi_failed"}),
    ),
)
