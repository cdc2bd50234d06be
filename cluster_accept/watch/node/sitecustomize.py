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

Needs only the standard library and the torch the job already imports.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import re
import socket
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
    with open("/proc/self/stat") as stat:  # field 22 after the parenthesised command name
        return int(stat.read().rsplit(")", 1)[1].split()[19])


def _write(path: str, record: dict[str, object]) -> None:
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as out:
        json.dump(record, out)
    os.replace(temporary, path)


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
    job_dir = os.path.join(watch_dir, _job_name())
    os.makedirs(job_dir, mode=0o700, exist_ok=True)
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
