"""NCCL Inspector's GPU times put on the Flight Recorder's records of the same collectives.

The Flight Recorder numbers a rank's collectives per process group (``collective_seq_id``); the Inspector numbers
them per NCCL communicator (``coll_sn``), which counts from another start (collectives torch ran before the
communicator's first recorded one, or that NCCL ran for itself): the two differ by an offset per rank and
communicator that neither writes. Both stamp a collective's enqueue on the same host clock, from one call, so under
the right offset the skew between the two stamps is nearly constant, and under any other it varies with the spacing
of the job's collectives. The offset is learned from the records themselves: the one whose skews spread least
(their median absolute deviation), whatever their constant part. Measured on 2 × H200, NCCL 2.28.9: a spread of
0.006 ms under the right offset (skew 0.024 ms), 0.044 and 0.056 ms under its neighbours, whose collectives were
enqueued 0.2-0.4 ms apart; the execution times then agree with NCCL's timing to 0.01 ms. An alignment that is not
clearly the tightest (under half the runner-up's spread), or whose skew is over :data:`MAX_SKEW_MS`, joins
nothing: no time is put on a record it may not be of.

A joined record takes the Inspector's execution time (the collective's kernel on the GPU, as
``TORCH_NCCL_ENABLE_TIMING`` measures it, without the CUDA events that break compute overlap) and its kernel's
start and completion; ``source`` says the time is the Inspector's."""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from cluster_accept.watch.words import CollectiveSeen, Signal

MAX_SKEW_MS = 1.0  # enqueue times of one collective in torch and in NCCL, on one host clock
SEARCH_MS = 50.0  # how far apart in time a candidate alignment is looked for
MIN_MATCHES = 3
NS_PER_MS = 1_000_000


@dataclass(frozen=True)
class Alignment:
    """Inspector communicator ``inspector`` of ``rank`` is Flight Recorder group ``group``, its ``coll_sn`` plus
    ``offset`` the group's sequence number; ``skew_ms``: the median enqueue skew under it (the Inspector's stamp
    less the Flight Recorder's), ``spread_ms`` its median absolute deviation."""

    rank: int
    inspector: str
    group: str
    offset: int
    skew_ms: float
    spread_ms: float
    matches: int


def _skews(records: Sequence[CollectiveSeen], table: dict[int, CollectiveSeen], offset: int) -> list[float]:
    """Enqueue skews (ms, signed) of the records whose counterpart under ``offset`` exists with the same size."""
    out = []
    for record in records:
        other = table.get(record.seq + offset)
        if other is not None and other.size_bytes == record.size_bytes:
            out.append((record.enqueue_ns - other.enqueue_ns) / NS_PER_MS)
    return out


def _spread(skews: Sequence[float]) -> tuple[float, float]:
    """(median, median absolute deviation) of the skews."""
    middle = statistics.median(skews)
    return middle, statistics.median(abs(s - middle) for s in skews)


def _candidates(records: Sequence[CollectiveSeen], group: Sequence[CollectiveSeen]) -> set[int]:
    """Offsets that put some record next to a group record enqueued within :data:`SEARCH_MS`."""
    times = [c.enqueue_ns for c in group]
    out: set[int] = set()
    for record in records:
        lo = bisect.bisect_left(times, record.enqueue_ns - int(SEARCH_MS * NS_PER_MS))
        hi = bisect.bisect_right(times, record.enqueue_ns + int(SEARCH_MS * NS_PER_MS))
        out.update(group[i].seq - record.seq for i in range(lo, hi))
    return out


def align(
    rank: int, inspector: str, records: Sequence[CollectiveSeen], groups: dict[str, list[CollectiveSeen]]
) -> Alignment | None:
    """The one clear alignment of an Inspector communicator's records with a Flight Recorder group, or None."""
    timed = [r for r in records if r.enqueue_ns]  # a record without its event trace has no enqueue time
    scored: list[tuple[float, int, str, int, float]] = []  # (spread, -matches, group, offset, skew)
    for name, group in groups.items():
        table = {c.seq: c for c in group}
        for offset in _candidates(timed, group):
            skews = _skews(timed, table, offset)
            if len(skews) >= MIN_MATCHES:
                middle, spread = _spread(skews)
                scored.append((spread, -len(skews), name, offset, middle))
    if not scored:
        return None
    scored.sort()
    best, runner = scored[0], scored[1] if len(scored) > 1 else None
    if abs(best[4]) > MAX_SKEW_MS or (runner is not None and best[0] >= runner[0] / 2):
        return None
    return Alignment(rank, inspector, best[2], best[3], round(best[4], 3), round(best[0], 4), -best[1])


def _groups_of(recorded: Iterable[CollectiveSeen]) -> dict[int, dict[str, list[CollectiveSeen]]]:
    """Each rank's Flight Recorder records by group, in enqueue order."""
    out: dict[int, dict[str, list[CollectiveSeen]]] = {}
    for c in sorted(recorded, key=lambda c: c.enqueue_ns):
        out.setdefault(c.rank, {}).setdefault(c.communicator, []).append(c)
    return out


def join_inspector(
    recorded: Sequence[CollectiveSeen], inspected: Sequence[CollectiveSeen]
) -> tuple[list[CollectiveSeen], list[Alignment]]:
    """The Flight Recorder's records with the Inspector's times where an alignment joins them, and the alignments."""
    groups = _groups_of(c for c in recorded if c.source == Signal.FLIGHT_RECORDER.value)
    by_comm: dict[tuple[int, str], list[CollectiveSeen]] = {}
    for record in inspected:
        by_comm.setdefault((record.rank, record.communicator), []).append(record)
    times: dict[tuple[int, str, int], CollectiveSeen] = {}
    alignments = []
    for (rank, comm), records in sorted(by_comm.items()):
        found = align(rank, comm, records, groups.get(rank, {}))
        if found is None:
            continue
        alignments.append(found)
        times.update({(rank, found.group, r.seq + found.offset): r for r in records})
    out = []
    for c in recorded:
        timed = times.get((c.rank, c.communicator, c.seq))
        if timed is not None and timed.size_bytes == c.size_bytes:
            c = replace(c, exec_ms=timed.exec_ms, start_ns=timed.start_ns, complete_ns=timed.complete_ns,
                        completed=True, busbw_gbps=timed.busbw_gbps, source=Signal.INSPECTOR.value)  # fmt: skip
        out.append(c)
    return out, alignments
