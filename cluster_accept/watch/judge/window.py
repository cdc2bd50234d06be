"""The rows of one job's window put on one clock: each rank's reads and each collective's records, with times on
the watcher's clock (a node's time less its measured offset), so that arrivals on different nodes compare.

A collective read several times (the Flight Recorder is a ring read at every round) is kept once per rank,
communicator and sequence number: the earliest enqueue, and completion or figures from whichever read had them."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import pandas as pd

from cluster_accept.vocabulary.status import Status
from cluster_accept.watch.judge.rules import REASONS, WatchRules
from cluster_accept.watch.ras import RasRank, RasSeen, on_job_ranks
from cluster_accept.watch.words import CollectiveSeen, FindingKind, RankSeen, RankState, WatchFinding

NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000
DEAD_STATES = frozenset({RankState.DEAD, RankState.ZOMBIE})
ALIVE_STATES = frozenset({RankState.RUNNING, RankState.STOPPED})
_COLUMNS = ["node", "rank", "communicator", "op", "seq", "enqueue_ns", "completed", "complete_ns", "exec_ms"]
_COLUMNS += ["busbw_gbps", "size_bytes", "gpu", "backend"]


@dataclass(frozen=True)
class Clock:
    """A node's clock against the watcher's: offset (node minus watcher) and how far it can be off."""

    offset_ns: int = 0
    error_ns: int = 0


@dataclass(frozen=True)
class Window:
    """One job's rows on the watcher's clock."""

    job: str
    now_ns: int
    rules: WatchRules
    nodes: tuple[str, ...]
    reads: tuple[RankSeen, ...]  # every read of every rank, oldest first (watcher's clock)
    clocks: dict[str, Clock]
    collectives: pd.DataFrame  # one row per (rank, communicator, seq); arrival_ns and done_ns: watcher's clock
    latest: dict[int, RankSeen] = field(default_factory=dict)  # each rank's latest read
    ras: RasSeen | None = None  # NCCL RAS's latest report of the job, where it was asked

    @cached_property
    def ras_ranks(self) -> dict[int, RasRank]:
        """What RAS's report said of each of the job's ranks (:func:`watch.ras.on_job_ranks`), put on them once."""
        if self.ras is None:
            return {}
        return on_job_ranks(self.ras.status, {rank: seen.pid for rank, seen in self.latest.items()})

    def seen_ns(self, read: RankSeen) -> int:
        """A read's time on the watcher's clock."""
        return read.read_ns - read.clock_offset_ns

    @property
    def ranks(self) -> list[int]:
        """Every rank of the job: listed by a read or with a record."""
        return sorted(set(self.latest) | {int(r) for r in self.collectives["rank"]})

    def node_of(self, rank: int) -> str:
        if rank in self.latest:
            return self.latest[rank].node
        hit = self.collectives[self.collectives["rank"] == rank]
        return str(hit["node"].iloc[0]) if not hit.empty else ""

    def gpu_of(self, rank: int) -> int | None:
        if rank in self.latest and self.latest[rank].gpu is not None:
            return self.latest[rank].gpu
        hit = self.collectives[self.collectives["rank"] == rank]["gpu"].dropna()
        return int(hit.iloc[0]) if not hit.empty else None

    def in_window(self) -> pd.DataFrame:
        """The collectives entered within ``window_s`` before now."""
        return entered_since(self.collectives, span_ns(self.rules, self.now_ns)[0])

    def finding(
        self,
        kind: FindingKind,
        node: str,
        status: Status,
        reason: str,
        observed: str,
        expected: str = "",
        evidence: str = "",
        persistence: str = "",
        rank: int | None = None,
        involves: str = "",
    ) -> WatchFinding:
        """A row of this job; ``named_ns`` is now where it fails (the node is named). ``reason``: a code of
        :data:`REASONS` (an undeclared one is refused)."""
        gpu = self.gpu_of(rank) if rank is not None else None
        named = self.now_ns if status is Status.FAIL else 0
        code = REASONS[reason].code
        return WatchFinding(
            self.job,
            kind.value,
            node,
            status,
            code,
            observed,
            expected,
            evidence,
            persistence,
            rank,
            gpu,
            named,
            involves=involves,
        )


def span_ns(rules: WatchRules, now_ns: int) -> tuple[int, int]:
    """(start, end) of the window judged at ``now_ns``, on the watcher's clock: ``window_s`` before now, to now."""
    return now_ns - int(rules.window_s * NS_PER_S), now_ns


def entered_since(frame: pd.DataFrame, since_ns: int) -> pd.DataFrame:
    """The records of collectives entered (watcher's clock) at ``since_ns`` or later."""
    return frame[frame["arrival_ns"] >= since_ns]


@dataclass(frozen=True)
class Rows:
    """One job's rows on the watcher's clock, before any judgement: its reads, oldest first, each rank's latest,
    each node's clock, and one record per (rank, communicator, seq)."""

    reads: tuple[RankSeen, ...]
    latest: dict[int, RankSeen]
    clocks: dict[str, Clock]
    collectives: pd.DataFrame


def on_watcher_clock(job: str, ranks: Sequence[RankSeen], collectives: Sequence[CollectiveSeen]) -> Rows:
    """The job's rows (others left out) on the watcher's clock: each node's clock from its ranks' latest reads,
    each collective once per rank (:func:`_frame`)."""
    mine = [r for r in ranks if r.job == job]
    reads = tuple(sorted(mine, key=lambda r: (r.read_ns - r.clock_offset_ns, r.rank)))
    latest = {r.rank: r for r in reads}
    clocks = _clocks(latest.values())
    return Rows(reads, latest, clocks, _frame([c for c in collectives if c.job == job], clocks))


def build(
    job: str,
    ranks: Sequence[RankSeen],
    collectives: Sequence[CollectiveSeen],
    rules: WatchRules,
    now_ns: int,
    ras: RasSeen | None = None,
) -> Window:
    """The job's rows (others left out) on the watcher's clock, judged at ``now_ns`` by ``rules``, with RAS's
    latest report of it."""
    rows = on_watcher_clock(job, ranks, collectives)
    nodes = tuple(sorted({r.node for r in rows.reads} | set(rows.collectives["node"])))
    return Window(job, now_ns, rules, nodes, rows.reads, rows.clocks, rows.collectives, rows.latest, ras)


def _clocks(latest: Iterable[RankSeen]) -> dict[str, Clock]:
    """Each node's clock at its ranks' latest reads: the median offset, the largest error."""
    by_node: dict[str, list[RankSeen]] = {}
    for read in latest:
        by_node.setdefault(read.node, []).append(read)
    return {
        node: Clock(int(statistics.median(r.clock_offset_ns for r in reads)), max(r.clock_error_ns for r in reads))
        for node, reads in by_node.items()
    }


def _frame(rows: Sequence[CollectiveSeen], clocks: dict[str, Clock]) -> pd.DataFrame:
    """One row per (rank, communicator, seq), times on the watcher's clock."""
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in [*_COLUMNS, "arrival_ns", "done_ns"]})
    raw = pd.DataFrame([{c: getattr(row, c) for c in _COLUMNS} for row in rows])
    for column in ("complete_ns", "exec_ms", "busbw_gbps", "size_bytes", "gpu"):
        raw[column] = pd.to_numeric(raw[column], errors="coerce").astype("float64")
    frame = (
        raw.groupby(["rank", "communicator", "seq"], as_index=False, sort=True).agg(
            node=("node", "first"),
            op=("op", "first"),
            enqueue_ns=("enqueue_ns", "min"),
            completed=("completed", "max"),
            complete_ns=("complete_ns", "max"),
            exec_ms=("exec_ms", "max"),
            busbw_gbps=("busbw_gbps", "max"),
            size_bytes=("size_bytes", "max"),
            gpu=("gpu", "first"),
            backend=("backend", "first"),
        )  # fmt: skip
    )
    offset = frame["node"].map(lambda node: clocks.get(node, Clock()).offset_ns).astype("int64")
    frame["arrival_ns"] = frame["enqueue_ns"].astype("int64") - offset
    frame["done_ns"] = frame["complete_ns"] - offset.astype("float64")
    return frame


def default_communicator(frame: pd.DataFrame) -> str | None:
    """The job's default process group: the one named so, else the one with the most ranks (then the lowest
    name). Rank-level sequence numbers (:class:`RankSeen`) count its collectives."""
    if frame.empty:
        return None
    names = sorted(str(c) for c in frame["communicator"].unique())
    named = [n for n in names if "default_pg" in n]
    if named:
        return named[0]
    sizes = frame.groupby("communicator")["rank"].nunique()
    return min(names, key=lambda n: (-int(sizes[n]), n))


def ranks_said(ranks: Iterable[int]) -> str:
    return ",".join(str(r) for r in sorted(ranks))


def ago(window: Window, at_ns: float) -> str:
    """A watcher time as seconds before now."""
    return f"{(window.now_ns - at_ns) / NS_PER_S:.1f} s ago"


def last_entered(window: Window) -> dict[int, int | None]:
    """Each rank's last collective entered on the default communicator: the larger of what its latest read said
    and its newest record there (None: neither says)."""
    default = default_communicator(window.collectives)
    frame = window.collectives
    newest = frame[frame["communicator"] == default].groupby("rank")["seq"].max() if default is not None else None
    out: dict[int, int | None] = {}
    for rank in window.ranks:
        said = window.latest[rank].last_enqueued_seq if rank in window.latest else None
        recorded = int(newest[rank]) if newest is not None and rank in newest.index else None
        known = [s for s in (said, recorded) if s is not None]
        out[rank] = max(known) if known else None
    return out


def op_of(window: Window, seq: int) -> str:
    """The operation of a default-communicator collective, as its records name it ('collective' when none)."""
    default = default_communicator(window.collectives)
    frame = window.collectives
    hit = frame[(frame["communicator"] == default) & (frame["seq"] == seq)]["op"]
    return str(hit.iloc[0]) if not hit.empty else "collective"
