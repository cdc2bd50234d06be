"""Node-side: the newest NCCL Inspector records of a job, as compact JSON lines.

NCCL's Inspector plugin (``NCCL_INSPECTOR_ENABLE=1``) appends one JSON object per completed collective to
``<NCCL_INSPECTOR_DUMP_DIR>/<hostname>-pid<pid>.log``, one file per process, growing for the job's life
(200-500 bytes a collective). This reads each file from its end, keeps the records dumped after ``--since-us``
(the Inspector's ``metadata.dump_timestamp_us``, the node's wall clock in microseconds), at most ``--limit`` per
process, and prints them oldest first, one line each, with a ``"ca"`` key added: the file, and the process's
global and local rank as its environment gives them (``RANK``/``LOCAL_RANK`` from torchrun, ``SLURM_PROCID``/
``SLURM_LOCALID``, Open MPI's, PMI's), since the Inspector knows only each communicator's rank. The per-channel
kernel events of a verbose record are folded into one (first start, last stop, channel count).

A last line the dump thread was still writing is not JSON yet: it is counted as skipped, never printed. The
last line printed is a summary, ``{"inspector": "read", ...}``, or ``{"inspector": "unavailable", ...}`` when
the directory is missing: the exit status is 0 either way. Only the standard library is needed.

The files are the job's user's and the reader is root: the directory is used only when it is a real directory
of the job's user (``--uid``; else its owner), each file is opened without following a link and only when it is
a regular file of that user (a FIFO, a device, a link or another user's file is listed in the summary's
``refused``, with why), at most ``--max-bytes`` of it within :data:`FILE_TIMEOUT_S`; a process's ranks are
read from its environment only when the process is that user's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import stat
import sys
import threading
from collections.abc import Iterator
from typing import BinaryIO

FILE_NAME = re.compile(r".+-pid(\d+)\.log")
RANK_KEYS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
LOCAL_RANK_KEYS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
BLOCK_BYTES = 65536
FILE_TIMEOUT_S = 5.0  # to read one file's end (a hung network mount must not hold the others)
MAX_ENVIRON_BYTES = 1 << 20
MAX_FILES = 4096  # files read per directory: more is a directory filled by hand


class Refused(OSError):
    """A file of the job's directory that is not read, with why."""


@contextlib.contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Raise :class:`Refused` when the body takes longer than ``seconds``; only the main thread can take the
    alarm, elsewhere the body runs unbounded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: object) -> None:
        raise Refused(f"{what} took over {seconds:g} s: not read")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _refusal(st: os.stat_result, uid: int | None) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "a link"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if uid is not None and st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not the job's user {uid}"
    return ""


def open_regular(path: str, dir_fd: int | None = None, uid: int | None = None) -> BinaryIO:
    """``path`` opened for reading only when it is a regular file (never through a link, never a FIFO or a
    device: looked at before it is opened and again once open), ``uid``'s where given; else :class:`Refused`."""
    before = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    why = _refusal(before, uid)
    if why:
        raise Refused(f"{why}: not read")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dir_fd)
    opened = os.fstat(fd)
    if (opened.st_dev, opened.st_ino) != (before.st_dev, before.st_ino) or _refusal(opened, uid):
        os.close(fd)
        raise Refused("replaced while it was opened: not read")
    return os.fdopen(fd, "rb")


def lines_backwards(path: str, max_bytes: int, dir_fd: int | None = None, uid: int | None = None) -> Iterator[bytes]:
    """The file's lines from the last one back, reading at most ``max_bytes`` from its end; a line cut by that
    limit is not given. The file is opened by :func:`open_regular`."""
    with open_regular(path, dir_fd, uid) as handle:
        handle.seek(0, os.SEEK_END)
        position = handle.tell()
        floor = max(0, position - max_bytes)
        tail = b""
        while position > floor:
            size = min(BLOCK_BYTES, position - floor)
            position -= size
            handle.seek(position)
            lines = (handle.read(size) + tail).split(b"\n")
            tail = lines.pop(0)
            yield from reversed(lines)
        if floor == 0 and tail:
            yield tail


def newest_records(
    path: str, since_us: int, limit: int, max_bytes: int, dir_fd: int | None = None, uid: int | None = None
) -> tuple[list[dict[str, object]], int]:
    """The file's records dumped after ``since_us``, at most ``limit``, oldest first; and how many lines were
    not JSON objects of the Inspector's shape. Dumps are appended in time order, so reading back stops at the
    first older record. Read within :data:`FILE_TIMEOUT_S` (:class:`Refused` after)."""
    found: list[dict[str, object]] = []
    skipped = 0
    with deadline(FILE_TIMEOUT_S, path):
        lines = list(lines_backwards(path, max_bytes, dir_fd, uid))
    for raw in lines:
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
            stamp = int(record["metadata"]["dump_timestamp_us"])
        except (ValueError, KeyError, TypeError, IndexError, RecursionError):
            skipped += 1
            continue
        if stamp <= since_us or len(found) >= limit:
            break
        found.append(record)
    return found[::-1], skipped


def process_ranks(pid: int, uid: int | None = None) -> dict[str, int | None]:
    """The global and local rank in the process's environment; None where it is gone, not readable, or (``uid``
    given) another user's process than the file named after it."""
    try:
        if uid is not None and _real_uid(pid) != uid:
            raise Refused(f"process {pid} is not uid {uid}'s")
        with open(f"/proc/{pid}/environ", "rb") as handle:
            pairs = handle.read(MAX_ENVIRON_BYTES).split(b"\0")
    except OSError:
        return {"rank": None, "local_rank": None}
    env = dict(p.decode("utf-8", "replace").split("=", 1) for p in pairs if b"=" in p)
    return {"rank": _first_int(env, RANK_KEYS), "local_rank": _first_int(env, LOCAL_RANK_KEYS)}


def _real_uid(pid: int) -> int | None:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    return None


def _first_int(env: dict[str, str], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        if env.get(key, "").strip().isdigit():
            return int(env[key])
    return None


def compact(record: dict[str, object]) -> dict[str, object]:
    """A verbose record's per-channel kernel events folded into one, and its event sequence numbers dropped."""
    for key in ("coll_perf", "p2p_perf"):
        perf = record.get(key)
        if not isinstance(perf, dict):
            continue
        perf.pop("event_trace_sn", None)
        trace = perf.get("event_trace_ts")
        events = trace.get("kernel_events") if isinstance(trace, dict) else None
        if isinstance(trace, dict) and isinstance(events, list) and events:
            starts = [int(e.get("kernel_start_ts") or 0) for e in events]
            stops = [int(e.get("kernel_stop_ts") or 0) for e in events]
            recorded = [s for s in starts if s > 0]
            trace["kernel_events"] = [
                {
                    "kernel_start_ts": min(recorded) if recorded else 0,
                    "kernel_stop_ts": max(stops),
                    "channels": len(events),
                }
            ]
    return record


def open_dir(directory: str, uid: int | None) -> tuple[int, int]:
    """(the directory open, its user): a real directory (not a link), ``uid``'s where given; else
    :class:`Refused`."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    owner = os.fstat(fd).st_uid
    if uid is not None and owner != uid:
        os.close(fd)
        raise Refused(f"{directory} is uid {owner}'s, not the job's user {uid}: not read")
    return fd, owner


def read_dir(
    directory: str, since_us: int, limit: int, max_bytes: int, uid: int | None = None
) -> tuple[list[str], dict[str, object]]:
    """The lines to print and the summary; a file that is not read is in the summary's ``refused``."""
    fd, owner = open_dir(directory, uid)
    try:
        names = sorted(name for name in os.listdir(fd) if FILE_NAME.fullmatch(name))
        out: list[str] = []
        refused: list[dict[str, str]] = []
        skipped = records = 0
        for index, name in enumerate(names):
            match = FILE_NAME.fullmatch(name)
            assert match is not None
            try:
                if index >= MAX_FILES:
                    raise Refused(f"over {MAX_FILES} files: not read")
                found, bad = newest_records(name, since_us, limit, max_bytes, fd, owner)
            except OSError as exc:
                refused.append({"file": name, "detail": str(exc)[:300]})
                continue
            skipped += bad
            ranks = process_ranks(int(match.group(1)), owner) if found else {}
            for record in found:
                record["ca"] = {"file": name, **ranks}
                out.append(json.dumps(compact(record), separators=(",", ":")))
            records += len(found)
    finally:
        os.close(fd)
    summary = {"inspector": "read", "dir": directory, "files": len(names), "records": records, "skipped": skipped}
    return out, {**summary, "refused": refused} if refused else summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", help="the job's NCCL_INSPECTOR_DUMP_DIR")
    parser.add_argument("--since-us", type=int, default=0, help="only records dumped after this (node clock, us)")
    parser.add_argument("--limit", type=int, default=200, help="at most this many records per process")
    parser.add_argument("--max-bytes", type=int, default=4 << 20, help="read at most this much of each file's end")
    parser.add_argument("--uid", type=int, help="the job's user; not given: the directory's owner")
    args = parser.parse_args(argv)
    if not os.path.lexists(args.dir):
        print(json.dumps({"inspector": "unavailable", "detail": f"no directory {args.dir}"}))
        return 0
    try:
        lines, summary = read_dir(args.dir, args.since_us, args.limit, args.max_bytes, args.uid)
    except OSError as exc:
        print(json.dumps({"inspector": "unavailable", "detail": f"{type(exc).__name__}: {exc}"}))
        return 0
    for line in lines:
        print(line)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
