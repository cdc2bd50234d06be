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
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterator

FILE_NAME = re.compile(r".+-pid(\d+)\.log")
RANK_KEYS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
LOCAL_RANK_KEYS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
BLOCK_BYTES = 65536


def lines_backwards(path: str, max_bytes: int) -> Iterator[bytes]:
    """The file's lines from the last one back, reading at most ``max_bytes`` from its end; a line cut by that
    limit is not given."""
    with open(path, "rb") as handle:
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


def newest_records(path: str, since_us: int, limit: int, max_bytes: int) -> tuple[list[dict[str, object]], int]:
    """The file's records dumped after ``since_us``, at most ``limit``, oldest first; and how many lines were
    not JSON. Dumps are appended in time order, so reading back stops at the first older record."""
    found: list[dict[str, object]] = []
    skipped = 0
    for raw in lines_backwards(path, max_bytes):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
            stamp = int(record["metadata"]["dump_timestamp_us"])
        except (ValueError, KeyError, TypeError):
            skipped += 1
            continue
        if stamp <= since_us or len(found) >= limit:
            break
        found.append(record)
    return found[::-1], skipped


def process_ranks(pid: int) -> dict[str, int | None]:
    """The global and local rank in the process's environment; None where it is gone or not readable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            pairs = handle.read().split(b"\0")
    except OSError:
        return {"rank": None, "local_rank": None}
    env = dict(p.decode("utf-8", "replace").split("=", 1) for p in pairs if b"=" in p)
    return {"rank": _first_int(env, RANK_KEYS), "local_rank": _first_int(env, LOCAL_RANK_KEYS)}


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


def read_dir(directory: str, since_us: int, limit: int, max_bytes: int) -> tuple[list[str], dict[str, object]]:
    """The lines to print and the summary."""
    names = sorted(name for name in os.listdir(directory) if FILE_NAME.fullmatch(name))
    out: list[str] = []
    skipped = records = 0
    for name in names:
        match = FILE_NAME.fullmatch(name)
        assert match is not None
        found, bad = newest_records(os.path.join(directory, name), since_us, limit, max_bytes)
        skipped += bad
        ranks = process_ranks(int(match.group(1))) if found else {}
        for record in found:
            record["ca"] = {"file": name, **ranks}
            out.append(json.dumps(compact(record), separators=(",", ":")))
        records += len(found)
    summary = {"inspector": "read", "dir": directory, "files": len(names), "records": records, "skipped": skipped}
    return out, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", help="the job's NCCL_INSPECTOR_DUMP_DIR")
    parser.add_argument("--since-us", type=int, default=0, help="only records dumped after this (node clock, us)")
    parser.add_argument("--limit", type=int, default=200, help="at most this many records per process")
    parser.add_argument("--max-bytes", type=int, default=4 << 20, help="read at most this much of each file's end")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.dir):
        print(json.dumps({"inspector": "unavailable", "detail": f"no directory {args.dir}"}))
        return 0
    try:
        lines, summary = read_dir(args.dir, args.since_us, args.limit, args.max_bytes)
    except OSError as exc:
        print(json.dumps({"inspector": "unavailable", "detail": f"{type(exc).__name__}: {exc}"}))
        return 0
    for line in lines:
        print(line)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
