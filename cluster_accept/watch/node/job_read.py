"""Node-side reader of an armed job: what each of the job's ranks on this node is doing, and its recent
collectives from PyTorch's Flight Recorder. Run by the watcher over SSH; needs only the standard library.

Prints JSON lines: one ``read`` (this node's clock and name), one ``rank`` per rank the shim registered (its
process state from ``/proc``: running, stopped, zombie, dead — gone without an exit mark — or exited), one
``pg`` per communicator a rank knows, and one ``c`` per collective record newer than ``--since-ns``. A stopped
rank is not asked (it cannot answer); a rank that does not answer within ``--timeout-s`` is said so. Always
exits 0 when it could read the directory: what it found is the answer.

Every file here was written by the job's user and is read by root: nothing is trusted for its name. The job's
directory is used only when it is a real directory of the job's user (``--user``; else its owner) inside a
base only root (or this reader's user) can replace entries of (see ``docs/watch-signals.md``); a directory
another user prepared is named (``dir_error``) and skipped. A rank's file is opened without following a link,
only when it is a regular file of the job's user, read up to :data:`MAX_RANK_BYTES` within
:data:`FILE_TIMEOUT_S`, and must hold a JSON object of the shape the shim writes; anything else is that rank's
``rank_error`` (named ``unreadable`` with why) and the other ranks are read. A rank's socket is asked only when
it is a socket of the job's user whose listening process is the rank's own (``SO_PEERCRED``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import json
import os
import pwd
import re
import signal
import socket
import stat
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

_BYTES = {"Float": 4, "BFloat16": 2, "Half": 2, "Double": 8, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
          "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1}  # fmt: skip
_STATES = {"R": "running", "S": "running", "D": "running", "I": "running", "T": "stopped", "t": "stopped",
           "Z": "zombie", "X": "dead"}  # fmt: skip
MAX_RANK_BYTES = 64 << 10  # a rank's record is a few hundred bytes
MAX_ANSWER_BYTES = 32 << 20  # one Flight Recorder answer: 2000 entries of a few KB each, with room
MAX_RANK_FILES = 1024  # rank files read per node and read: more is a directory filled by hand
FILE_TIMEOUT_S = 2.0  # to open and read one file (a hung network mount must not hold the others)
RANK_FILE = re.compile(r"rank(\d{1,9})\.json")
_INT_RANGE = (-1, 1 << 63)


class Unreadable(Exception):
    """A job-written file the reader refuses, with why; it costs its own rank only."""


def _emit(record: dict[str, object]) -> None:
    print(json.dumps(record, separators=(",", ":")), flush=True)


class _Timex(ctypes.Structure):
    """The kernel's ``struct timex`` (adjtimex(2)), up to the fields read here and padding for the rest."""

    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
                ("rest", ctypes.c_long * 32)]  # fmt: skip


def clock() -> dict[str, object]:
    """How far this node's clock can be from true time, as its own discipline (NTP, PTP) tells the kernel, and
    the boot id: nodes of one boot id share one clock (two "nodes" of one host)."""
    said: dict[str, object] = {"synced": None, "maxerror_us": None, "esterror_us": None}
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            said["boot_id"] = boot.read().strip()
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        timex = _Timex()
        state = libc.adjtimex(ctypes.byref(timex))
        unsynced = state == 5 or bool(timex.status & 0x0040)  # TIME_ERROR, STA_UNSYNC
        said.update(synced=not unsynced, maxerror_us=timex.maxerror, esterror_us=timex.esterror)
    except (OSError, AttributeError) as exc:
        said["detail"] = f"{type(exc).__name__}: {exc}"[:200]
    return said


def pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


# Files and directories the job wrote ---------------------------------------------------------------------------


def kind_of(mode: int) -> str:
    kinds = ((stat.S_ISLNK, "a link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "a regular file" if stat.S_ISREG(mode) else "unknown")


def file_refusal(st: os.stat_result, uid: int, want: str = "a regular file") -> str:
    """Why a file the job wrote is not read ('' when it is): it must be ``want`` (never followed as a link) and
    its owner the job's user."""
    if stat.S_ISLNK(st.st_mode):
        return "a link, not followed"
    if kind_of(st.st_mode) != want:
        return f"{kind_of(st.st_mode)}, not {want}"
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not the job's user {uid}"
    return ""


@contextlib.contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Raise :class:`Unreadable` when the body takes longer than ``seconds`` (a read on a hung mount); only the
    main thread can take the alarm, elsewhere the body runs unbounded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: object) -> None:
        raise Unreadable(f"{what} took over {seconds:g} s: not read")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def read_job_file(dir_fd: int, name: str, uid: int, bound: int) -> bytes:
    """The file ``name`` of the job's directory (open as ``dir_fd``): never through a link, never a FIFO or a
    device (looked at before it is opened, and again once open), only the job's user's, at most ``bound``
    bytes within :data:`FILE_TIMEOUT_S`; else :class:`Unreadable` with why."""
    before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    refusal = file_refusal(before, uid)
    if refusal:
        raise Unreadable(refusal)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    chunks: list[bytes] = []
    with deadline(FILE_TIMEOUT_S, name):
        fd = os.open(name, flags, dir_fd=dir_fd)
        try:
            opened = os.fstat(fd)
            if (opened.st_dev, opened.st_ino) != (before.st_dev, before.st_ino) or file_refusal(opened, uid):
                raise Unreadable("replaced while it was opened")
            left = bound + 1
            while left > 0 and (chunk := os.read(fd, min(left, 1 << 16))):
                chunks.append(chunk)
                left -= len(chunk)
        finally:
            os.close(fd)
    data = b"".join(chunks)
    if len(data) > bound:
        raise Unreadable(f"larger than {bound} bytes: not read")
    return data


# What the shim writes: key -> (the JSON types it may have, whether it must be there).
RANK_KEYS: dict[str, tuple[tuple[type, ...], bool]] = {
    "rank": ((int,), True), "local_rank": ((int,), True), "pid": ((int,), True), "start_ticks": ((int,), False),
    "hostname": ((str,), False), "gpu": ((int, type(None)), False), "started_ns": ((int,), False),
    "world_size": ((int,), False), "job": ((str,), False), "pidns": ((str,), False), "detail": ((str,), False),
}  # fmt: skip


def _typed(value: object, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return int in kinds and _INT_RANGE[0] <= value < _INT_RANGE[1]
    return isinstance(value, kinds)


def rank_record(data: bytes, number: int) -> dict[str, Any]:
    """A rank file's record in the shim's shape, its strings cut to 300 characters; :class:`Unreadable` naming
    the key that is missing or of another type, or a record of another rank than its file's name says."""
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Unreadable(f"not JSON: {exc}"[:200]) from None
    if not isinstance(raw, dict):
        raise Unreadable(f"a JSON {type(raw).__name__}, not an object")
    record: dict[str, Any] = {}
    for key, (kinds, required) in RANK_KEYS.items():
        if key not in raw and not required:
            continue
        value = raw.get(key)
        if not _typed(value, kinds):
            raise Unreadable(f"key {key!r} is {json.dumps(value)[:40]}, not {' or '.join(k.__name__ for k in kinds)}")
        record[key] = value[:300] if isinstance(value, str) else value
    if record["rank"] != number or record["pid"] <= 0:
        raise Unreadable(f"rank {record['rank']}, pid {record['pid']}: not rank {number} as its name says")
    return record


class JobDir(NamedTuple):
    """The job's own directory, open (``fd``), and the job's user."""

    path: str
    fd: int
    uid: int


def base_refusal(st: os.stat_result) -> str:
    """Why the base (``CA_WATCH_DIR``) is not trusted: whoever can replace its entries could hand the reader
    another user's directory. Root's (or this reader's user's), and sticky where others may write in it."""
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{kind_of(st.st_mode)}, not a directory"
    if st.st_uid not in (0, os.geteuid()):
        return f"owned by uid {st.st_uid}, not root: its owner could replace any job's directory in it"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return f"writable by other users without the sticky bit (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def dir_refusal(st: os.stat_result, uid: int | None) -> str:
    """Why a job's directory is not the job's user's own ('' when it is)."""
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{kind_of(st.st_mode)}, not a directory: skipped"
    if uid is not None and st.st_uid != uid:
        return f"prepared by uid {st.st_uid}, not the job's user {uid}: skipped"
    if st.st_mode & 0o022:
        return f"writable by other users (mode {stat.S_IMODE(st.st_mode):o}): skipped"
    return ""


def _candidates(base: str, job: str, uid: int | None) -> list[tuple[str, int | None]]:
    """The job's directories to look at, each with the owner it must have: ``<job>`` (the job's user's, or
    when that is not known, whoever's), and ``<job>.<uid>``, where the shim goes when ``<job>`` is not its."""
    if uid is not None:
        return [(job, uid), (f"{job}.{uid}", uid)]
    tagged = re.compile(re.escape(job) + r"\.(\d{1,10})")
    named = sorted((m.group(0), int(m.group(1))) for n in os.listdir(base) if (m := tagged.fullmatch(n)))
    return [(job, None), *named]


def job_directory(directory: str, uid: int | None) -> tuple[JobDir | None, list[str]]:
    """The job's directory to read, and every directory refused, with why. ``directory`` is ``<base>/<job>``;
    a job whose user is not known is read only where one user's directory is found."""
    base, job = os.path.split(directory.rstrip("/"))
    try:
        refusal = base_refusal(os.lstat(base))
    except FileNotFoundError:
        return None, []  # not armed on this node (yet): the coverage says so
    if refusal:
        return None, [f"{base}: {refusal}; make it root's: install -d -m 1777 -o root {base}"]
    refused: list[str] = []
    owners: dict[int, str] = {}
    for name, owner in _candidates(base, job, uid):
        try:
            st = os.lstat(os.path.join(base, name))
        except FileNotFoundError:
            continue
        refusal = dir_refusal(st, owner)
        if refusal:
            refused.append(f"{os.path.join(base, name)}: {refusal}")
        else:
            owners.setdefault(st.st_uid, name)
    if len(owners) > 1:
        found = ", ".join(f"{name} (uid {owner})" for owner, name in owners.items())
        refused.append(f"{base}: directories of {len(owners)} users for job {job} ({found}) and the job's user "
                       "is not known: none is read")  # fmt: skip
        return None, refused
    if not owners:
        return None, refused
    ((owner, name),) = owners.items()
    return _open_dir(os.path.join(base, name), owner, refused)


def _open_dir(path: str, uid: int, refused: list[str]) -> tuple[JobDir | None, list[str]]:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        return None, [*refused, f"{path}: {type(exc).__name__}: {exc}"]
    refusal = dir_refusal(os.fstat(fd), uid)
    if refusal:
        os.close(fd)
        return None, [*refused, f"{path}: replaced while it was opened: {refusal}"]
    return JobDir(path, fd, uid), refused


def user_uid(user: str | None) -> int | None:
    """The job's user as a uid on this node: a number, or a name this node knows (KeyError if not)."""
    if user is None or user == "":
        return None
    return int(user) if user.isdigit() else pwd.getpwnam(user).pw_uid


# The rank's process ----------------------------------------------------------------------------------------------


def exit_marked(path: str, uid: int | None = None) -> bool:
    """The rank's exit mark is there: a regular file (a link or a FIFO is no mark), the job's user's."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and (uid is None or st.st_uid == uid)


def process_state(pid: int, start_ticks: int, exit_path: str, pidns: str = "", uid: int | None = None) -> str:
    """The rank's state; a pid reused by another process (another start time) counts as the rank gone. A rank in
    another pid namespace than this reader (a container, the reader run on its host) cannot be looked up by its
    pid: ``unknown``, never ``dead``, unless its exit mark says it ended."""
    if pidns and pid_namespace() and pidns != pid_namespace():
        return "exited" if exit_marked(exit_path, uid) else "unknown"
    fields = stat_fields(pid)
    if fields and int(fields[19]) == start_ticks:
        return _STATES.get(fields[0], "running")
    return "exited" if exit_marked(exit_path, uid) else "dead"


MAX_STAT_BYTES = 4096  # /proc/<pid>/stat: 52 numbers and a name of at most 64 bytes


def stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after its name (state first, start time at index 19); empty where the
    process is gone. A line not of that shape raises (IndexError): an unreadable rank, never a dead one."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            text = stat_file.read(MAX_STAT_BYTES)
    except OSError:
        return []
    return text.rsplit(")", 1)[1].split()


MAX_THREADS = 1024  # a rank's threads summed per read: torch's pools, gloo's and NCCL's, a data loader's few
MAX_SCHEDSTAT_BYTES = 256  # "<run ns> <wait ns> <slices>\n"


def _schedstat(path: str) -> tuple[int, int] | None:
    """(run, run-queue wait) in ns from one ``schedstat`` file of ``/proc`` (the kernel's; a thread that ended
    meanwhile, or a kernel without schedstats, gives None)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fields = os.read(fd, MAX_SCHEDSTAT_BYTES).split()
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(fields) < 2 or not (fields[0].isdigit() and fields[1].isdigit()):
        return None
    return int(fields[0]), int(fields[1])


def cpu_times(pid: int, start_ticks: int) -> tuple[int, int] | None:
    """The rank's threads' time on a CPU and waiting for one (run queue), summed, in ns since each started; None
    where the process is no longer the rank's (another start time) or the kernel keeps no schedstats. A rank whose
    compute is slowed by other work on its cores waits for a CPU; one slowed by its network sleeps in a receive."""
    try:
        fields = stat_fields(pid)  # again: the pid may have been reused since its state was read
        if not fields or int(fields[19]) != start_ticks:
            return None
        tids = os.listdir(f"/proc/{pid}/task")[:MAX_THREADS]
    except (OSError, IndexError, ValueError):
        return None
    run = wait = read = 0
    for tid in tids:
        if tid.isdigit() and (times := _schedstat(f"/proc/{pid}/task/{tid}/schedstat")) is not None:
            run, wait, read = run + times[0], wait + times[1], read + 1
    return (run, wait) if read else None


# The rank's worker server ------------------------------------------------------------------------------------------

# The handlers that dump the Flight Recorder as JSON: the recorder of every backend but NCCL (torch 2.10 on) and
# NCCL's own (torch 2.5 on); a rank answers with what it has, and the two are merged.
HANDLERS = ("fr_trace_json", "dump_nccl_trace_json")


class Peer(NamedTuple):
    """Who must be listening on a rank's socket: the job's user, and the rank's own process where this reader
    can see its pid (``None``: in another pid namespace)."""

    path: str
    uid: int
    pid: int | None


def connect(peer: Peer, timeout_s: float) -> socket.socket:
    """A connection to the rank's socket, once the process listening on it is the rank's (``SO_PEERCRED``);
    :class:`Unreadable` before anything is sent otherwise."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(timeout_s)
        conn.connect(peer.path)
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _ = struct.unpack("3i", creds)
        if uid != peer.uid or (peer.pid is not None and pid != peer.pid):
            wanted = f"the rank's pid {peer.pid}" if peer.pid is not None else "a process"
            raise Unreadable(f"its listener is pid {pid} of uid {uid}, not {wanted} of uid {peer.uid}: not asked")
    except BaseException:
        conn.close()
        raise
    return conn


def _post(peer: Peer, handler: str, until: float) -> tuple[str, bytes]:
    """(status line, body) of ``POST /handler/<handler>`` on the rank's worker-server socket, the answer read
    until ``until`` (monotonic) and at most :data:`MAX_ANSWER_BYTES`."""
    request = f"POST /handler/{handler} HTTP/1.1\r\nHost: rank\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    with connect(peer, max(0.1, until - time.monotonic())) as conn:
        conn.sendall(request.encode())
        chunks, size = [], 0
        while (left := until - time.monotonic()) > 0:
            conn.settimeout(left)
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise Unreadable(f"its answer is over {MAX_ANSWER_BYTES} bytes: not read")
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return head.split(b"\r\n", 1)[0].decode(errors="replace"), body


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def ask_flight_recorder(peer: Peer, timeout_s: float) -> dict[str, Any]:
    """The rank's Flight Recorder as JSON: the entries of every handler of :data:`HANDLERS` its torch answers,
    merged (the communicators and their progress too, a recorder with entries speaking last); all within
    ``timeout_s``."""
    merged: dict[str, Any] = {"entries": [], "pg_config": {}, "pg_status": {}}
    said, answered = [], False
    until = time.monotonic() + timeout_s
    for handler in HANDLERS:
        status, body = _post(peer, handler, until)
        if " 200 " not in status + " ":
            said.append(f"{handler}: {status!r}")
            continue
        answer = json.loads(body)
        if not isinstance(answer, dict):
            raise ValueError(f"{handler} answered a JSON {type(answer).__name__}, not an object")
        answered = True
        entries = [e for e in answer.get("entries") or [] if isinstance(e, dict)]
        merged["entries"].extend(entries)
        merged["pg_config"].update(_object(answer.get("pg_config")))
        if entries or not merged["pg_status"]:
            merged["pg_status"].update(_object(answer.get("pg_status")))
    if not answered:
        raise OSError(f"worker server answered {'; '.join(said)}")
    return merged


def _size_bytes(entry: dict[str, Any]) -> int | None:
    try:
        sizes, dtypes = entry["input_sizes"], entry["input_dtypes"]
        total = 0
        for shape, dtype in zip(sizes, dtypes, strict=True):
            count = 1
            for dim in shape:
                count *= int(dim)
            total += count * _BYTES[dtype]
        return total
    except (KeyError, TypeError, ValueError):
        return None


def _number(value: object) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def collective_lines(rank: int, trace: dict[str, Any], since_ns: int, limit: int) -> list[dict[str, object]]:
    """The ``pg`` and ``c`` lines of a rank's Flight Recorder; an entry of another shape gives empty fields."""
    lines: list[dict[str, object]] = []
    for pg_name, config in _object(trace.get("pg_config")).items():
        config = _object(config)
        lines.append({"pg": {"rank": rank, "name": pg_name, "desc": config.get("desc"), "ranks": config.get("ranks")}})
    entries = [e for e in trace.get("entries") or [] if _number(e.get("time_created_ns")) > since_ns
               or not e.get("retired")][-limit:]  # fmt: skip
    for e in entries:
        group = e.get("process_group")
        group = group if isinstance(group, list) and len(group) == 2 else ["", ""]
        lines.append({"c": {"rank": rank, "pg": f"{group[0]}:{group[1]}", "op": e.get("profiling_name"),
                      "seq": e.get("collective_seq_id"), "p2p": e.get("is_p2p"), "created": e.get("time_created_ns"),
                      "started": e.get("time_discovered_started_ns"), "ms": e.get("duration_ms"),
                      "completed": e.get("time_discovered_completed_ns"), "retired": e.get("retired"),
                      "state": e.get("state"), "bytes": _size_bytes(e)}})  # fmt: skip
    return lines


def _ask(job: JobDir, stem: str, answer: dict[str, Any], args: argparse.Namespace) -> list[dict[str, object]]:
    """Ask a live rank over its socket, ``answer`` updated; its collective lines. The socket must be a socket of
    the job's user in the job's own directory, and its listener the rank's process."""
    try:
        st = os.stat(f"{stem}.sock", dir_fd=job.fd, follow_symlinks=False)
    except FileNotFoundError:
        answer["detail"] = answer.get("detail") or "no worker-server socket"
        return []
    try:
        refusal = file_refusal(st, job.uid, want="a socket")
        if refusal:
            raise Unreadable(f"{stem}.sock is {refusal}: not asked")
        pid = None if answer["state"] == "unknown" else int(answer["pid"])
        via = f"/proc/self/fd/{job.fd}/{stem}.sock"  # resolved in the directory checked, not by its name again
        peer = Peer(via if os.path.isdir(f"/proc/self/fd/{job.fd}") else os.path.join(job.path, f"{stem}.sock"),
                    job.uid, pid)  # fmt: skip
        trace = ask_flight_recorder(peer, args.timeout_s)
        status = _object(_object(trace.get("pg_status")).get("0"))
        answer.update(answered=True, last_enqueued=status.get("last_enqueued_collective"),
                      last_completed=status.get("last_completed_collective"))  # fmt: skip
        lines = collective_lines(int(answer["rank"]), trace, args.since_ns, args.limit)
        answer["entries"] = len([line for line in lines if "c" in line])
        return lines
    except Unreadable as exc:
        answer["detail"] = f"flight recorder not asked: {exc}"[:300]
    except (OSError, ValueError, TypeError, AttributeError, RecursionError) as exc:
        answer["detail"] = f"flight recorder did not answer: {type(exc).__name__}: {exc}"[:300]
    return []


def read_rank(job: JobDir, name: str, args: argparse.Namespace) -> None:
    """One rank's line, its collectives' lines before it; :class:`Unreadable` (or any error) for its file."""
    match = RANK_FILE.fullmatch(name)
    if match is None:
        raise Unreadable("not named rank<N>.json")
    rank = rank_record(read_job_file(job.fd, name, job.uid, MAX_RANK_BYTES), int(match.group(1)))
    stem = name[: -len(".json")]
    exit_path = os.path.join(job.path, f"{stem}.exit")
    state = process_state(rank["pid"], rank.get("start_ticks", -1), exit_path, rank.get("pidns", ""), job.uid)
    answer: dict[str, Any] = {**rank, "state": state, "answered": False, "entries": 0}
    if state == "unknown":
        answer["detail"] = "the rank is in another pid namespace: read it where the job runs (probes.command_prefix)"
    elif state == "running" and (times := cpu_times(rank["pid"], rank.get("start_ticks", -1))) is not None:
        answer.update(cpu_run_ns=times[0], cpu_wait_ns=times[1])
    lines: list[dict[str, object]] = []
    if state in ("running", "unknown"):
        if time.monotonic() < args.until:
            lines = _ask(job, stem, answer, args)
        else:
            answer["detail"] = "not asked: this read's time was spent on the node's other ranks"
    if state == "unknown" and answer["answered"]:
        answer.update(state="running", detail="")  # its recorder answered: alive, whatever its pid here
    for line in lines:
        _emit(line)
    _emit({"rank": answer})


def read_ranks(job: JobDir, args: argparse.Namespace) -> None:
    """Every rank file of the job's directory, each on its own: one that cannot be read is that rank's
    ``rank_error`` (``unreadable`` and why), and the others are read."""
    names = sorted(n for n in os.listdir(job.fd) if n.startswith("rank") and n.endswith(".json"))
    numbered = sorted(names, key=lambda n: (0, int(m.group(1))) if (m := RANK_FILE.fullmatch(n)) else (1, 0))
    for index, name in enumerate(numbered):
        match = RANK_FILE.fullmatch(name)
        said: dict[str, object] = {"file": name, "rank": int(match.group(1)) if match else None}
        if index >= MAX_RANK_FILES:
            _emit({"rank_error": {**said, "detail": f"unreadable: over {MAX_RANK_FILES} rank files: not read"}})
            continue
        try:
            read_rank(job, name, args)
        except Unreadable as exc:
            _emit({"rank_error": {**said, "detail": f"unreadable: {exc}"[:300]}})
        except Exception as exc:  # noqa: BLE001 - one rank's file, whatever it holds, never costs the others
            _emit({"rank_error": {**said, "detail": f"unreadable: {type(exc).__name__}: {exc}"[:300]}})


def inspector_dir(job: JobDir) -> None:
    """Where NCCL's Inspector writes for this job (``<job dir>/inspector``), when it is a real directory of the job's
    user: the watcher then asks ``inspector_read.py`` there."""
    try:
        st = os.stat("inspector", dir_fd=job.fd, follow_symlinks=False)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode) and st.st_uid == job.uid:
        _emit({"inspector_dir": {"path": os.path.join(job.path, "inspector"), "uid": job.uid}})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="the job's directory under the armed CA_WATCH_DIR")
    parser.add_argument("--user", help="the job's user (name or uid); not given: the owner of the job's directory")
    parser.add_argument("--since-ns", type=int, default=0, help="only collectives created after this node time")
    parser.add_argument("--limit", type=int, default=2000, help="at most this many records per rank")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="for one rank's answer")
    parser.add_argument("--budget-s", type=float, default=40.0, help="for asking every rank of this read")
    args = parser.parse_args()
    args.until = time.monotonic() + args.budget_s
    _emit({"read": {"node_ns": time.time_ns(), "hostname": socket.gethostname(), "clock": clock()}})
    try:
        job, refused = job_directory(args.dir, user_uid(args.user))
    except (KeyError, ValueError, OSError) as exc:
        job, refused = None, [f"{args.dir}: {type(exc).__name__}: {exc}"[:300]]
    for detail in refused:
        _emit({"dir_error": {"dir": args.dir, "detail": detail[:400]}})
    if job is not None:
        _emit({"job_dir": {"path": job.path, "uid": job.uid}})  # whose job it is: RAS is asked of that user only
        read_ranks(job, args)
        inspector_dir(job)
    _emit({"done": {"node_ns": time.time_ns()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
