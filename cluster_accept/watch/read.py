"""A node's answer to the watcher's read (``watch/node/job_read.py``) as typed rows: its ranks, their
collectives, and which signals it could give. Pure: the text in, rows out; a line of another shape is a
problem named in the result, never a silent skip.

The node's clock offset from the watcher's is estimated as NTP does from one exchange: the node stamped its
clock between the watcher's send and receive, so offset = node time − midpoint, good to half the round trip.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cluster_accept.watch.ras import RasSeen
from cluster_accept.watch.ras_diagnostics import DiagnosticsReport
from cluster_accept.watch.words import CollectiveSeen, RankSeen, RankState, Signal, SignalCoverage

_BACKENDS = ("nccl:", "gloo:", "ucc:", "mpi:", "xccl:")


@dataclass(frozen=True)
class ReadWindow:
    """When the watcher sent its read to a node and when the answer came back, on the watcher's clock."""

    sent_ns: int
    received_ns: int


@dataclass
class NodeRead:
    """What one read of one node gave."""

    node: str
    ranks: list[RankSeen] = field(default_factory=list)
    collectives: list[CollectiveSeen] = field(default_factory=list)
    coverage: list[SignalCoverage] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    node_ns: int | None = None  # the node's clock when it read
    clock: NodeClock | None = None
    ras: RasSeen | None = None  # NCCL RAS's report of the whole job, where this node was the one asked
    inspector_dir: tuple[str, int] | None = None  # (path, uid) of the job's Inspector files on this node
    job_uid: int | None = None  # the owner of the job's directory read on this node: the job's user there
    diagnostics: DiagnosticsReport | None = None  # NCCL RAS's diagnostics, where this node was the one asked


@dataclass(frozen=True)
class NodeClock:
    """What a node's kernel says of its clock: whether NTP/PTP keeps it synchronised and how far off it may be;
    its boot id (nodes of one boot id are one machine, one clock)."""

    boot_id: str
    synced: bool | None
    maxerror_us: int | None


def op_name(profiling_name: str | None) -> str:
    """'nccl:all_reduce' → 'all_reduce': the backend prefix is the communicator's, not the operation's."""
    name = profiling_name or "unknown"
    backend = backend_of(name)
    return name[len(backend) + 1 :] if backend else name


def backend_of(profiling_name: str | None) -> str:
    """'nccl:all_reduce' → 'nccl'; '' where the name carries no backend."""
    name = profiling_name or ""
    return next((prefix[:-1] for prefix in _BACKENDS if name.startswith(prefix)), "")


def _optional_int(value: Any) -> int | None:
    if value in (None, "", 0, "0", "-1", -1):
        return None
    return int(value)


def _collective(job: str, node: str, c: Mapping[str, Any], comm_ranks: Mapping[tuple[int, str], str]) -> CollectiveSeen:
    rank = int(c["rank"])
    exec_ms = c.get("ms")
    return CollectiveSeen(
        job=job, node=node, rank=rank, communicator=str(c["pg"]), op=op_name(c.get("op")), seq=int(c["seq"]),
        enqueue_ns=int(c["created"]), source=Signal.FLIGHT_RECORDER.value, completed=bool(c.get("retired")),
        start_ns=_optional_int(c.get("started")), complete_ns=_optional_int(c.get("completed")),
        exec_ms=float(exec_ms) if exec_ms is not None else None, size_bytes=_optional_int(c.get("bytes")),
        comm_ranks=comm_ranks.get((rank, str(c["pg"]).split(":", 1)[0]), ""), backend=backend_of(c.get("op")),
    )  # fmt: skip


def _rank(job: str, node: str, r: Mapping[str, Any], node_ns: int, clock: tuple[int, int]) -> RankSeen:
    return RankSeen(
        job=job, node=node, rank=int(r["rank"]), local_rank=int(r["local_rank"]), pid=int(r["pid"]),
        state=RankState(str(r["state"])), read_ns=node_ns, clock_offset_ns=clock[0], clock_error_ns=clock[1],
        gpu=r.get("gpu"), hostname=str(r.get("hostname", "")), started_ns=int(r.get("started_ns", 0)),
        answered=bool(r.get("answered")), last_enqueued_seq=_optional_int(r.get("last_enqueued")),
        last_completed_seq=_optional_int(r.get("last_completed")), detail=str(r.get("detail") or ""),
        cpu_run_ns=_count(r.get("cpu_run_ns")), cpu_wait_ns=_count(r.get("cpu_wait_ns")),
    )  # fmt: skip


def _count(value: Any) -> int | None:
    """A cumulative count the reader gave (0 included), or None; never a count of another type."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def rank_problem(said: Mapping[str, Any]) -> str:
    """A rank whose file the reader refused, named by its rank where the file's name gives it:
    ``rank 3 unreadable (rank3.json): a FIFO, not a regular file``."""
    detail = str(said.get("detail") or "no detail")
    why = detail.removeprefix("unreadable: ")
    rank = said.get("rank")
    if isinstance(rank, int) and not isinstance(rank, bool):
        return f"rank {rank} unreadable ({said.get('file')}): {why}"
    return f"rank file {said.get('file')} unreadable: {why}"


def clock_estimate(node_ns: int, window: ReadWindow) -> tuple[int, int]:
    """(offset, error) of the node's clock against the watcher's, both in ns."""
    midpoint = (window.sent_ns + window.received_ns) // 2
    return node_ns - midpoint, max(0, (window.received_ns - window.sent_ns) // 2)


def parse_node_read(text: str, job: str, node: str, window: ReadWindow) -> NodeRead:
    """The reader's JSON lines as rows of ``job`` on ``node``."""
    read = NodeRead(node)
    lines: list[Mapping[str, Any]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                read.problems.append(f"line {number} is not JSON: {line[:120]!r}")
    head = next((entry["read"] for entry in lines if "read" in entry), None)
    if head is None:
        read.problems.append("no 'read' line: the reader did not run")
        return read
    read.node_ns = int(head["node_ns"])
    said = head.get("clock") or {}
    read.clock = NodeClock(str(said.get("boot_id", "")), said.get("synced"), said.get("maxerror_us"))
    clock = clock_estimate(read.node_ns, window)
    groups = [entry["pg"] for entry in lines if "pg" in entry]
    comm_ranks = {(int(g["rank"]), str(g["name"] or "0")): str(g["ranks"]) for g in groups}
    for entry in lines:
        try:
            if "c" in entry:
                read.collectives.append(_collective(job, node, entry["c"], comm_ranks))
            elif "rank" in entry:
                read.ranks.append(_rank(job, node, entry["rank"], read.node_ns, clock))
            elif "rank_error" in entry:
                read.problems.append(rank_problem(entry["rank_error"]))
            elif "job_dir" in entry:
                read.job_uid = int(entry["job_dir"]["uid"])
            elif "inspector_dir" in entry:
                read.inspector_dir = (str(entry["inspector_dir"]["path"]), int(entry["inspector_dir"]["uid"]))
            elif "dir_error" in entry:
                read.problems.append(f"job directory: {entry['dir_error']['detail']}")
        except (KeyError, TypeError, ValueError) as exc:
            read.problems.append(f"{type(exc).__name__}: {exc} in {json.dumps(entry)[:160]}")
    gpus = {r.rank: r.gpu for r in read.ranks}  # a collective is on its rank's GPU
    read.collectives = [replace(c, gpu=gpus.get(c.rank)) for c in read.collectives]
    read.coverage = coverage(job, node, read)
    return read


def coverage(job: str, node: str, read: NodeRead) -> list[SignalCoverage]:
    """One row per signal this read can speak for: what the node's ranks gave, and why not."""
    live = [r for r in read.ranks if r.state == RankState.RUNNING]
    answered = [r for r in live if r.answered]
    timed = [c for c in read.collectives if c.exec_ms is not None]
    if not read.ranks:
        said = "no armed rank on this node: the job was not armed here, or has not started"
        return [SignalCoverage(job, node, s.value, False, said) for s in (Signal.WORKER_SERVER, Signal.FLIGHT_RECORDER)]
    silent = "; ".join(f"rank {r.rank}: {r.detail}" for r in live if not r.answered and r.detail)
    server = SignalCoverage(
        job, node, Signal.WORKER_SERVER.value, bool(answered),
        f"{len(answered)} of {len(live)} running ranks answer" + (f" ({silent})" if silent else ""),
    )  # fmt: skip
    recorded = SignalCoverage(
        job, node, Signal.FLIGHT_RECORDER.value, bool(read.collectives) or not answered,
        f"{len(read.collectives)} collective records" if read.collectives or not answered
        else "the ranks answer with no collectives: TORCH_FR_BUFFER_SIZE is 0 or unset",
    )  # fmt: skip
    unread = "no Inspector files of the job on this node (cluster-accept arm --inspector arms it)"
    if read.inspector_dir is not None:
        unread = f"{read.inspector_dir[0]}: read from the next round on"
    rows = [server, recorded, SignalCoverage(job, node, Signal.INSPECTOR.value, False, unread)]
    if read.collectives:
        said = (
            f"{len(timed)} records with their own execution time"
            if timed
            else "no execution times: gloo records none, or TORCH_NCCL_ENABLE_TIMING is off"
        )
        rows.append(SignalCoverage(job, node, Signal.NCCL_TIMING.value, bool(timed), said))
    return rows


def settle_clocks(reads: Sequence[NodeRead]) -> list[NodeRead]:
    """Each rank's clock offset and error against the others, from the best the nodes say.

    One boot id for every node: one machine, one clock (offset and error 0). A node whose kernel says NTP/PTP
    keeps it synchronised: offset 0, error its kernel's maximum error (its clock is true time within that). Any
    other node keeps the estimate of its read's round trip, which is as wide as SSH is slow."""
    boots = {r.clock.boot_id for r in reads if r.clock is not None and r.clock.boot_id}
    one_machine = len(boots) == 1 and all(r.clock is not None for r in reads)
    for read in reads:
        known = read.clock
        if one_machine:
            offset_error: tuple[int, int] | None = (0, 0)
        elif known is not None and known.synced and known.maxerror_us is not None:
            offset_error = (0, int(known.maxerror_us) * 1000)
        else:
            offset_error = None
        if offset_error is not None:
            offset, error = offset_error
            read.ranks = [replace(r, clock_offset_ns=offset, clock_error_ns=error) for r in read.ranks]
    return list(reads)
