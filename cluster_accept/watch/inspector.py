"""NCCL Inspector records as :class:`CollectiveSeen` rows: the parse of what ``watch/node/inspector_read.py``
prints (the Inspector's own JSON lines, as NCCL writes them, with the reader's ``"ca"`` key added).

The format is NCCL's (``plugins/profiler/inspector/inspector_json.cc`` from 2.29.7, ``ext-profiler/inspector/``
before): one object per line with ``header`` (the communicator: ``id`` its hash, ``comm_name`` from 2.30,
``rank`` the rank *in that communicator*, ``n_ranks``, ``nnodes``), ``metadata`` (``dump_timestamp_us``,
``hostname``, ``pid``) and ``coll_perf`` (``coll``, ``coll_sn``, ``coll_msg_size_bytes``, ``coll_exec_time_us``,
``coll_timing_source``, ``coll_algobw_gbs``, ``coll_busbw_gbs``; with ``NCCL_INSPECTOR_DUMP_VERBOSE=1`` also
``event_trace_ts``: host wall-clock microseconds of the collective's enqueue and of each channel's kernel start
and stop). ``p2p_perf`` records (2.30) are not collectives and are left out: their sequence numbers count
sends and receives per communicator, not operations every rank takes part in.

Only completed collectives are written, so every row is ``completed``. ``enqueue_ns`` is 0 when the record has
no event trace (not verbose): the time a rank entered the collective is then unknown.
"""

from __future__ import annotations

import json
import re
from typing import Any

from cluster_accept.watch.words import CollectiveSeen, Signal

_OPS = {"All2All": "all_to_all", "AllGatherV": "all_gather_v", "SendRecv": "send_recv"}


def op_name(coll: str) -> str:
    """NCCL's ``AllReduce`` as the watcher names it everywhere: ``all_reduce``."""
    return _OPS.get(coll) or re.sub(r"(?<!^)(?=[A-Z])", "_", coll).lower()


def _number(value: Any) -> float | None:
    """A JSON number; NCCL's JSON writer prints a NaN double as the string ``"nan"``."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _kernel_span_ns(trace: dict[str, Any]) -> tuple[int | None, int | None]:
    """First kernel start and last kernel stop over the channels, in nanoseconds (0 means not recorded)."""
    events = trace.get("kernel_events") or []
    starts = [int(e["kernel_start_ts"]) for e in events if int(e.get("kernel_start_ts") or 0) > 0]
    stops = [int(e["kernel_stop_ts"]) for e in events if int(e.get("kernel_stop_ts") or 0) > 0]
    return (min(starts) * 1000 if starts else None, max(stops) * 1000 if stops else None)


def communicator_of(header: dict[str, Any]) -> str:
    """``'<hash>:<name>'`` where NCCL gives a name (2.30 on), else the hash alone."""
    name = str(header.get("comm_name") or "")
    return f"{header['id']}:{name}" if name and name != "unknown" else str(header["id"])


def collective_of(record: dict[str, Any], job: str, node: str) -> CollectiveSeen | None:
    """One record's row, or None when it is not a collective (a P2P record, or a line of the reader's own)."""
    perf, header = record.get("coll_perf"), record.get("header")
    if not isinstance(perf, dict) or not isinstance(header, dict):
        return None
    extra = record.get("ca") or {}
    trace = perf.get("event_trace_ts") or {}
    start_ns, complete_ns = _kernel_span_ns(trace)
    exec_us = _number(perf.get("coll_exec_time_us"))
    rank = extra.get("rank")
    return CollectiveSeen(
        job=job,
        node=node,
        rank=int(rank if rank is not None else header["rank"]),
        communicator=communicator_of(header),
        op=op_name(str(perf["coll"])),
        seq=int(perf["coll_sn"]),
        enqueue_ns=int(trace.get("coll_start_ts") or 0) * 1000,
        source=Signal.INSPECTOR.value,
        completed=True,
        start_ns=start_ns,
        complete_ns=complete_ns,
        exec_ms=exec_us / 1000 if exec_us is not None else None,
        size_bytes=int(perf["coll_msg_size_bytes"]),
        busbw_gbps=_number(perf.get("coll_busbw_gbs")),
        backend="nccl",  # NCCL's own profiler plugin
    )


def parse_inspector_lines(text: str, job: str, node: str) -> list[CollectiveSeen]:
    """Every collective in the text, in its order. ``rank`` is the job's global rank where the node's reader
    found it in the process's environment (``"ca": {"rank": ...}``), else the rank within the communicator.
    Lines that are not JSON (a record the dump thread was still writing) and the reader's summary are skipped."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        row = collective_of(record, job, node) if isinstance(record, dict) else None
        if row is not None:
            rows.append(row)
    return rows
