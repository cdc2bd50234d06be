"""Arms one rank of a training job for the watcher; Python loads it at start-up from the ``PYTHONPATH`` the
job was armed with, so the job's code is never touched.

In a process that is a rank of a distributed job (``RANK`` and ``LOCAL_RANK`` set, as torchrun and srun
wrappers set them) and armed (``CA_WATCH_DIR``), it starts PyTorch's own worker server on a Unix socket,
``<CA_WATCH_DIR>/<job>/rank<R>.sock``: the watcher asks it for the rank's Flight Recorder from the node, over
the socket, so nothing inside the job waits on the watcher. It also leaves ``rank<R>.json`` (who the rank is:
its pid, process start time, GPU) and, when the interpreter ends normally, ``rank<R>.exit``: a rank whose
process is gone without that file was killed. Child processes of the rank (data loader workers, compile
workers) inherit the environment and are not armed again. Anything that fails here is written to the rank's
file, never raised: arming must not break a job. Afterwards the ``sitecustomize`` this one shadows, if any,
is loaded as it would have been.

The job's directory is this user's own or is not used (``docs/watch-signals.md``): ``CA_WATCH_DIR`` must be a
real directory of root's (or this user's), sticky where others may write in it; ``<job>`` under it is used when
this user made it, else ``<job>.<uid>``, and the job's other signals (the Flight Recorder's dumps, the
Inspector's directory) are pointed there too. A directory another user prepared is never written into: with
neither usable, the rank is not armed and says why. Files are created without following a link.

Needs only the standard library and the torch the job already imports.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import os
import re
import socket
import stat
import sys
import time

_ARMED_PID = "CA_WATCH_ARMED_PID"
_SERVER = None  # kept alive for the life of the process


def _job_name() -> str:
    raw = os.environ.get("CA_WATCH_JOB") or os.environ.get("SLURM_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID")
    return re.sub(r"[^A-Za-z0-9_.-]", "_", raw or "job")[:64]


def _gpu(local_rank: int) -> int | None:
    """The physical GPU of the rank when the job follows the usual one-GPU-per-local-rank layout."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    if visible != [""]:
        pick = visible[local_rank] if local_rank < len(visible) else ""
        return int(pick) if pick.strip().isdigit() else None
    return local_rank


def _pid_namespace() -> str:
    """The rank's pid namespace: a reader in another one cannot look the rank up by its pid."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _start_ticks() -> int:
    with open("/proc/self/stat") as stat_file:  # field 22 after the parenthesised command name
        return int(stat_file.read().rsplit(")", 1)[1].split()[19])


def _write(path: str, record: dict[str, object]) -> None:
    """``record`` as the JSON of ``path``, whole or not at all; its temporary file made new (``O_EXCL``), never
    through a link left where it goes."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary)  # left by an earlier process of this pid
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(temporary, flags, 0o600), "w") as out:
        json.dump(record, out)
    os.replace(temporary, path)


# The variables that put the job's other signals under its directory (arming.py sets them).
_UNDER_JOB_DIR = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "NCCL_INSPECTOR_DUMP_DIR")


def _base_refusal(watch_dir: str) -> str:
    """Why ``CA_WATCH_DIR`` cannot hold this job's directory ('' when it can). Root makes it (mode 1777, as
    ``/tmp``); a rank running as root makes a missing one so."""
    uid = os.geteuid()
    if uid == 0 and not os.path.lexists(watch_dir):
        os.makedirs(watch_dir, exist_ok=True)
        os.chmod(watch_dir, 0o1777)
    try:
        st = os.lstat(watch_dir)
    except FileNotFoundError:
        return f"{watch_dir} does not exist: root makes it once (install -d -m 1777 -o root {watch_dir})"
    if not stat.S_ISDIR(st.st_mode):
        return f"{watch_dir} is not a directory (or is a link)"
    if st.st_uid not in (0, uid):
        return f"{watch_dir} is uid {st.st_uid}'s, not root's: its owner could replace the job's directory"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return f"{watch_dir} is writable by others without the sticky bit: another user could replace it"
    return ""


def _own_dir(path: str) -> bool:
    """``path`` is this user's own directory (made here when missing), writable by no one else."""
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return False
    if st.st_mode & 0o022:
        os.chmod(path, 0o700)
    return True


def _job_dir(watch_dir: str, job: str) -> str:
    """The job's directory for this user: ``<job>``, or ``<job>.<uid>`` when another user holds ``<job>``; the
    variables pointing under ``<job>`` follow it, or are dropped when neither is this user's (OSError)."""
    primary = os.path.join(watch_dir, job)
    refusal = _base_refusal(watch_dir)
    chosen = "" if refusal else next(
        (p for p in (primary, f"{primary}.{os.geteuid()}") if _own_dir(p)), ""
    )  # fmt: skip
    for name in _UNDER_JOB_DIR:
        value = os.environ.get(name, "")
        under = next((d for d in (primary, f"{primary}.{os.geteuid()}") if value.startswith(d + "/")), chosen)
        if under != chosen and chosen:
            os.environ[name] = chosen + value[len(under) :]
        elif under != chosen:
            del os.environ[name]  # never have torch or NCCL write into a directory another user holds
    if not chosen:
        raise OSError(refusal or f"{primary} and {primary}.{os.geteuid()} are other users' directories")
    return chosen


def _mark_exit(path: str) -> None:
    _write(path, {"pid": os.getpid(), "ended_ns": time.time_ns()})


def _serve(job_dir: str, rank: str) -> str:
    global _SERVER
    path = os.path.join(job_dir, f"rank{rank}.sock")
    if os.path.exists(path):
        os.unlink(path)  # left by an earlier process of this rank (a restart)
    try:
        from torch._C._distributed_c10d import _WorkerServer

        _SERVER = _WorkerServer(path)
        return ""
    except Exception as exc:  # noqa: BLE001 - an old torch without a worker server still runs the job
        return f"no worker server: {type(exc).__name__}: {exc}"[:300]


def _arm() -> None:
    watch_dir, rank = os.environ.get("CA_WATCH_DIR"), os.environ.get("RANK")
    if not watch_dir or rank is None or "LOCAL_RANK" not in os.environ:
        return
    if os.environ.get(_ARMED_PID, str(os.getpid())) != str(os.getpid()):
        return  # a child of an armed rank
    os.environ[_ARMED_PID] = str(os.getpid())
    job_dir = _job_dir(watch_dir.rstrip("/") or "/", _job_name())
    local_rank = int(os.environ["LOCAL_RANK"])
    record: dict[str, object] = {
        "rank": int(rank), "local_rank": local_rank, "pid": os.getpid(), "start_ticks": _start_ticks(),
        "hostname": socket.gethostname(), "gpu": _gpu(local_rank), "started_ns": time.time_ns(),
        "world_size": int(os.environ.get("WORLD_SIZE", "0")), "job": _job_name(), "pidns": _pid_namespace(),
    }  # fmt: skip
    exit_path = os.path.join(job_dir, f"rank{rank}.exit")
    if os.path.exists(exit_path):
        os.unlink(exit_path)
    record["detail"] = _serve(job_dir, rank)
    _write(os.path.join(job_dir, f"rank{rank}.json"), record)
    atexit.register(_mark_exit, exit_path)


def _chain() -> None:
    """Load the ``sitecustomize`` this one shadows (a distribution's own), as Python would have."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        candidate = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.abspath(entry or ".") != here and os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


try:
    _arm()
except Exception as exc:  # noqa: BLE001 - arming must never stop the job from starting
    print(f"cluster-accept watch: not armed: {type(exc).__name__}: {exc}", file=sys.stderr)
_chain()
