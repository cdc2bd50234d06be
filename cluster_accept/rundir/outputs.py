"""The run directory: ``run.json``, the Parquet files and the reports, written stage by stage.

Everything an operator needs after the run is here; a crash keeps what completed.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import platform
import secrets
import socket
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO, Any

TOOLS = ("cluster-accept", "prefect", "fabric", "paramiko", "pyarrow", "pandas", "pydantic", "ClusterShell")


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def new_run_id() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def tool_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in TOOLS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


@dataclass
class RunDir:
    path: Path
    run_id: str
    lock: IO[str] | None = field(default=None, repr=False, compare=False)  # held while this process runs it

    def hold(self) -> None:
        """Take the run's lock (:func:`hold_run`) for this process; raises :class:`RunLocked`."""
        if self.lock is None:
            self.lock = hold_run(self.path)

    def release(self) -> None:
        if self.lock is not None:
            self.lock.close()
            self.lock = None

    @classmethod
    def create(cls, out_dir: Path, run_id: str | None = None) -> RunDir:
        run_id = run_id or new_run_id()
        path = out_dir / run_id
        path.mkdir(parents=True, exist_ok=False)
        return cls(path, run_id)

    def write_json(self, name: str, data: dict[str, Any]) -> Path:
        target = self.path / name
        tmp = target.with_name(name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        tmp.replace(target)
        return target


def start_run(out_dir: Path, run_id: str | None, run_info: dict[str, Any]) -> tuple[RunDir, dict[str, Any]]:
    """A new run directory with its ``run.json`` (``run_info`` plus id, start time and tool versions)."""
    run_dir = RunDir.create(out_dir, run_id)
    run_dir.hold()
    info = {"run_id": run_dir.run_id, **run_info, "started": now_iso(), "ended": None, "tools": tool_versions()}
    run_dir.write_json("run.json", info)
    return run_dir, info


class ResumeError(ValueError):
    """A run that cannot be resumed: unknown, already finished, or its inventory changed."""


class RunLocked(RuntimeError):
    """Another live process holds the run directory (running or resuming it): nothing was written."""


LOCK_FILE = "run.lock"


def hold_run(path: Path) -> IO[str]:
    """Hold ``path``'s lock for as long as this process runs it (the caller keeps the returned file open; the
    kernel drops the lock when the process ends, ``kill -9`` included). Raises :class:`RunLocked` naming the
    holder when another process has it: two controllers writing one run would interleave its tables."""
    handle = (path / LOCK_FILE).open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise RunLocked(f"run {path.name} is in use by {holder}: wait for it to end, or stop it first") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    handle.flush()
    return handle


def check_not_held(path: Path) -> None:
    """Raise :class:`RunLocked` when another process holds ``path`` (the lock is taken and let go at once)."""
    if (path / LOCK_FILE).exists():
        hold_run(path).close()


def resumable_info(out_dir: Path, run_id: str) -> dict[str, Any]:
    """``run.json`` of the interrupted run ``run_id`` under ``out_dir``; writes nothing."""
    path = out_dir / run_id / "run.json"
    try:
        run_info: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ResumeError(f"cannot resume {run_id}: no readable {path} ({exc})") from None
    if not isinstance(run_info, dict):
        raise ResumeError(f"cannot resume {run_id}: {path} holds a JSON {type(run_info).__name__}, not an object")
    if run_info.get("ended"):
        raise ResumeError(f"run {run_id} already finished at {run_info['ended']}; nothing to resume")
    return run_info
