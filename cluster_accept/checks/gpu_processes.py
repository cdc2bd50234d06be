"""Other processes on the GPUs before acceptance measures them (check ``gpu``).

A job left running, a monitoring agent that allocates, a co-tenant: each takes compute and memory from the
probes, and a GPU measured while shared is reported slow for a reason that is not its own. Preflight lists
every compute process per GPU (``--query-compute-apps``, mapped to GPU indices through the UUIDs); the GPU
bench samples the same list while it runs (:mod:`cluster_accept.probes.gemm`), since a co-tenant may start
later. Either way the finding is ``gpu:busy``, with the process's pid, name and memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cluster_accept.checks.contract import (
    Action,
    Check,
    CheckRow,
    ClusterView,
    FindingKind,
    Profile,
    Reason,
    Status,
    declare,
    driver_unreachable,
    error_row,
    fault,
    healthy,
)
from cluster_accept.checks.sections import NVIDIA_SMI_SKIPPED, driver_failure, small_int
from cluster_accept.vocabulary.text import keep_head, quote

NAME = "gpu"
_END = "### end"
COMMAND = (
    "echo '### gpus'; nvidia-smi --query-gpu=index,uuid --format=csv,noheader 2>&1; "
    "echo '### apps'; nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory "
    f"--format=csv,noheader,nounits 2>&1; echo '{_END}'"
)
BUSY = Reason(
    "busy",
    Status.FAIL,
    "another process uses this GPU (see pid and name): its figures are not the GPU's own; stop the process "
    "(or drain the node of jobs) and rerun before judging the GPU",
    Action.CHECK_NODE,
    kind=FindingKind.RELATIVE,  # a co-tenant is often gone by the next run: drained once it repeats
)
REASONS = declare(NVIDIA_SMI_SKIPPED, BUSY)


@dataclass(frozen=True)
class ComputeApp:
    gpu: int | None  # None when the UUID matches no listed GPU
    pid: int | None  # None when nvidia-smi's pid could not be read: the process still counts
    name: str
    used_memory_mib: str


@dataclass(frozen=True)
class GpuProcesses:
    gpus: int = 0
    apps: list[ComputeApp] = field(default_factory=list)
    failure: str | None = None
    error: str | None = None
    raw: str = ""


def _sections(stdout: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    current = None
    for line in stdout.splitlines():
        if line in ("### gpus", "### apps", _END):
            current = line
            found[current] = []
        elif current is not None:
            found[current].append(line)
    return found


def parse(stdout: str, exit_code: int | None = 0) -> GpuProcesses:
    failure = driver_failure(stdout, exit_code)
    if failure:
        return GpuProcesses(failure=failure, raw=stdout)
    sections = _sections(stdout)
    if _END not in sections:
        return GpuProcesses(error="output truncated before the end marker", raw=stdout)
    uuids = {}
    for line in sections.get("### gpus", []):
        index, _, uuid = line.partition(",")
        if small_int(index) is not None and uuid.strip().startswith(("GPU-", "MIG-")):
            uuids[uuid.strip()] = small_int(index)
    apps = [app for line in sections.get("### apps", []) if (app := _app(line, uuids)) is not None]
    if not uuids:  # nvidia-smi missing or listing no GPU: gpu_count and driver say which
        said = keep_head(" ".join(sections.get("### gpus", [])).strip(), 300) or "nvidia-smi listed no GPU"
        return GpuProcesses(failure=said, raw=stdout)
    return GpuProcesses(len(uuids), apps, raw=stdout)


def _app(line: str, uuids: dict[str, int | None]) -> ComputeApp | None:
    """One line of ``--query-compute-apps=gpu_uuid,pid,process_name,used_memory``, or None for a line that names
    no GPU (a header, a message). nvidia-smi does not quote its CSV, and a process's name is its path, which may
    hold commas (``/home/m/a,b/python3``): the name is all between the pid and the last field, the memory (a
    number or ``[N/A]``, never a comma). A line of a GPU that cannot be read so is a process all the same (the
    line as its name; a pid that is not a number unknown): a co-tenant is never dropped for its name."""
    uuid, _, rest = line.partition(",")
    if not uuid.strip().startswith(("GPU-", "MIG-")):
        return None
    gpu = uuids.get(uuid.strip())
    pid_text, _, rest = rest.partition(",")
    name, comma, memory = rest.rpartition(",")
    pid = small_int(pid_text)
    if not comma:
        return ComputeApp(gpu, pid, f"unreadable line {quote(line)}", "?")
    return ComputeApp(gpu, pid, keep_head(name.strip(), 200), keep_head(memory.strip(), 20))


def evaluate(model: GpuProcesses, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.failure:
        return [CheckRow(NAME, "compute_apps", Status.SKIP, "nvidia_smi_failed", None, None, model.failure)]
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    tested = profile.probes.tested_gpus
    mine = [a for a in model.apps if tested is None or a.gpu is None or a.gpu in tested]
    if not mine:
        said = f"no compute process on the {model.gpus} GPUs"
        if tested is not None:
            others = {a.gpu for a in model.apps if a.gpu is not None}
            said = f"no compute process on GPUs {_said(tested)}" + (
                f" (the profile tests those; a process on GPU {_said(others)})" if others else ""
            )
        return [CheckRow(NAME, "compute_apps", Status.PASS, "ok", said, "no other process")]
    return [busy_row(app.gpu, app.pid, app.name, app.used_memory_mib, "found before the probes ran") for app in mine]


def _said(gpus: frozenset[int] | set[int]) -> str:
    return ",".join(str(g) for g in sorted(gpus))


def busy_row(gpu: int | None, pid: int | None, name: str, memory_mib: object, when: str) -> CheckRow:
    """``gpu:busy`` for one other process, found by preflight or by the GPU bench while it ran."""
    who = f"pid {pid} " if pid is not None else ""
    return CheckRow(
        NAME,
        "compute_apps",
        Status.FAIL,
        "busy",
        f"{who}{name} ({memory_mib} MiB)",
        "no other process",
        when,
        gpu,
    )


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    samples=(
        healthy("idle", {"ok"}, fixture="gpu_processes/idle.txt"),
        healthy("idle_h100x1", {"ok"}, fixture="gpu_processes/idle_h100x1.txt"),
        fault("busy", {"busy"}, fixture="gpu_processes/busy.txt"),
        fault("busy_h100x1", {"busy"}, fixture="gpu_processes/busy_h100x1.txt"),
        driver_unreachable({"nvidia_smi_failed"}),
    ),
)
