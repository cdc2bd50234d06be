"""Node-side reader of an armed job: what each of the job's ranks on this node is doing, and its recent
collectives from PyTorch's Flight Recorder. Run by the watcher over SSH; needs only the standard library.

Prints JSON lines: one ``read`` (this node's clock and name), one ``rank`` per rank the shim registered (its
process state from ``/proc``: running, stopped, zombie, dead — gone without an exit mark — or exited), one
``pg`` per communicator a rank knows, and one ``c`` per collective record newer than ``--since-ns``. A stopped
rank is not asked (it cannot answer); a rank that does not answer within ``--timeout-s`` is said so. Always
exits 0 when it could read the directory: what it found is the answer.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import glob
import json
import os
import socket
import time
from typing import Any

_BYTES = {"Float": 4, "BFloat16": 2, "Half": 2, "Double": 8, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
          "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1}  # fmt: skip
_STATES = {"R": "running", "S": "running", "D": "running", "I": "running", "T": "stopped", "t": "stopped",
           "Z": "zombie", "X": "dead"}  # fmt: skip


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


def process_state(pid: int, start_ticks: int, exit_path: str, pidns: str = "") -> str:
    """The rank's state; a pid reused by another process (another start time) counts as the rank gone. A rank in
    another pid namespace than this reader (a container, the reader run on its host) cannot be looked up by its
    pid: ``unknown``, never ``dead``, unless its exit mark says it ended."""
    if pidns and pid_namespace() and pidns != pid_namespace():
        return "exited" if os.path.exists(exit_path) else "unknown"
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        fields = []
    if fields and int(fields[19]) == start_ticks:
        return _STATES.get(fields[0], "running")
    return "exited" if os.path.exists(exit_path) else "dead"


# The handlers that dump the Flight Recorder as JSON: the recorder of every backend but NCCL (torch 2.10 on) and
# NCCL's own (torch 2.5 on); a rank answers with what it has, and the two are merged.
HANDLERS = ("fr_trace_json", "dump_nccl_trace_json")


def _post(path: str, handler: str, timeout_s: float) -> tuple[str, bytes]:
    """(status line, body) of ``POST /handler/<handler>`` on the rank's worker-server socket."""
    request = f"POST /handler/{handler} HTTP/1.1\r\nHost: rank\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    deadline = time.monotonic() + timeout_s
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout_s)
        conn.connect(path)
        conn.sendall(request.encode())
        chunks = []
        while time.monotonic() < deadline:
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return head.split(b"\r\n", 1)[0].decode(errors="replace"), body


def ask_flight_recorder(path: str, timeout_s: float) -> dict[str, Any]:
    """The rank's Flight Recorder as JSON: the entries of every handler of :data:`HANDLERS` its torch answers,
    merged (the communicators and their progress too, a recorder with entries speaking last)."""
    merged: dict[str, Any] = {"entries": [], "pg_config": {}, "pg_status": {}}
    said, answered = [], False
    for handler in HANDLERS:
        status, body = _post(path, handler, timeout_s)
        if " 200 " not in status + " ":
            said.append(f"{handler}: {status!r}")
            continue
        answer = json.loads(body)
        answered = True
        entries = answer.get("entries") or []
        merged["entries"].extend(entries)
        merged["pg_config"].update(answer.get("pg_config") or {})
        if entries or not merged["pg_status"]:
            merged["pg_status"].update(answer.get("pg_status") or {})
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


def emit_collectives(rank: int, trace: dict[str, Any], since_ns: int, limit: int) -> int:
    for pg_name, config in (trace.get("pg_config") or {}).items():
        _emit({"pg": {"rank": rank, "name": pg_name, "desc": config.get("desc"), "ranks": config.get("ranks")}})
    entries = [e for e in trace.get("entries") or [] if int(e.get("time_created_ns", 0)) > since_ns
               or not e.get("retired")][-limit:]  # fmt: skip
    for e in entries:
        group = e.get("process_group") or ["", ""]
        _emit({"c": {"rank": rank, "pg": f"{group[0]}:{group[1]}", "op": e.get("profiling_name"),
                     "seq": e.get("collective_seq_id"), "p2p": e.get("is_p2p"), "created": e.get("time_created_ns"),
                     "started": e.get("time_discovered_started_ns"), "completed": e.get("time_discovered_completed_ns"),
                     "ms": e.get("duration_ms"), "retired": e.get("retired"), "state": e.get("state"),
                     "bytes": _size_bytes(e)}})  # fmt: skip
    return len(entries)


def read_rank(path: str, args: argparse.Namespace) -> None:
    with open(path) as handle:
        rank = json.load(handle)
    base = path[: -len(".json")]
    state = process_state(int(rank["pid"]), int(rank.get("start_ticks", -1)), base + ".exit", rank.get("pidns", ""))
    answer: dict[str, object] = {**rank, "state": state, "answered": False, "entries": 0}
    if state == "unknown":
        answer["detail"] = "the rank is in another pid namespace: read it where the job runs (probes.command_prefix)"
    if state in ("running", "unknown") and os.path.exists(base + ".sock"):
        try:
            trace = ask_flight_recorder(base + ".sock", args.timeout_s)
            status = (trace.get("pg_status") or {}).get("0") or {}
            answer.update(answered=True, last_enqueued=status.get("last_enqueued_collective"),
                          last_completed=status.get("last_completed_collective"))  # fmt: skip
            answer["entries"] = emit_collectives(int(rank["rank"]), trace, args.since_ns, args.limit)
        except (OSError, ValueError) as exc:
            answer["detail"] = f"flight recorder did not answer: {type(exc).__name__}: {exc}"[:300]
    elif state == "running":
        answer["detail"] = rank.get("detail") or "no worker-server socket"
    if state == "unknown" and answer["answered"]:
        answer.update(state="running", detail="")  # its recorder answered: alive, whatever its pid here
    _emit({"rank": answer})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="the job's directory under the armed CA_WATCH_DIR")
    parser.add_argument("--since-ns", type=int, default=0, help="only collectives created after this node time")
    parser.add_argument("--limit", type=int, default=2000, help="at most this many records per rank")
    parser.add_argument("--timeout-s", type=float, default=5.0)
    args = parser.parse_args()
    _emit({"read": {"node_ns": time.time_ns(), "hostname": socket.gethostname(), "clock": clock()}})
    for path in sorted(glob.glob(os.path.join(args.dir, "rank*.json"))):
        try:
            read_rank(path, args)
        except (OSError, ValueError, KeyError) as exc:
            _emit({"rank_error": {"file": os.path.basename(path), "detail": f"{type(exc).__name__}: {exc}"[:300]}})
    _emit({"done": {"node_ns": time.time_ns()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
