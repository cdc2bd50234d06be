"""The rows of a watched job: what each node's reader saw of the job's ranks and collectives, which signals a
node could give, and what the watcher concluded. Typed from the parse of the node's answer to the Parquet edge.

Times are nanoseconds of the node's wall clock (``time.time_ns()``, as PyTorch's Flight Recorder and NCCL's
Inspector stamp them); a node's clock offset from the watcher's is measured at each read and carried in
:class:`RankSeen`, so figures that compare nodes can say how sure they are."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Self

from cluster_accept.vocabulary.rows import Record, StatusRecord
from cluster_accept.vocabulary.status import Status


class RankState(StrEnum):
    """A rank's process as its node saw it at a read."""

    RUNNING = "running"
    STOPPED = "stopped"  # SIGSTOP or a debugger: state T in /proc; it cannot take part in a collective
    DEAD = "dead"  # its process is gone and it never said it ended (killed, crashed, OOM-killed)
    EXITED = "exited"  # it ended through the interpreter's exit (the job finished or failed in Python)
    ZOMBIE = "zombie"
    UNKNOWN = "unknown"  # in another pid namespace than the reader: its process cannot be looked up


class Signal(StrEnum):
    """A source of live telemetry a job can be armed with."""

    FLIGHT_RECORDER = "flight_recorder"  # PyTorch: per-rank record of every collective
    WORKER_SERVER = "worker_server"  # PyTorch: a per-rank socket that dumps the Flight Recorder on request
    NCCL_TIMING = "nccl_timing"  # PyTorch: each NCCL collective's own GPU execution time
    INSPECTOR = "inspector"  # NCCL's profiler plugin: per-collective execution time and bus bandwidth
    RAS = "ras"  # NCCL's reliability service: ranks alive, missing or dead, job-wide
    NCCL_DIAGNOSTICS = "nccl_diagnostics"  # NCCL 2.31 on: its checks at each communicator's creation


class FindingKind(StrEnum):
    DEAD_RANK = "dead_rank"
    HANG = "hang"
    COMPUTE_STRAGGLER = "compute_straggler"
    COMM_STRAGGLER = "comm_straggler"


@dataclass(frozen=True)
class RankSeen(Record):
    """One rank of the job at one read of its node."""

    job: str
    node: str
    rank: int
    local_rank: int
    pid: int
    state: RankState
    read_ns: int  # the node's clock at the read
    clock_offset_ns: int = 0  # node clock minus the watcher's clock, measured at this read
    clock_error_ns: int = 0  # how far that offset can be off (half the read's round trip)
    gpu: int | None = None
    hostname: str = ""
    started_ns: int = 0
    answered: bool = True  # its Flight Recorder answered this read
    last_enqueued_seq: int | None = None  # default communicator: the last collective it entered
    last_completed_seq: int | None = None
    detail: str = ""
    cpu_run_ns: int | None = None  # its threads' time on a CPU, summed (/proc schedstat), since they started
    cpu_wait_ns: int | None = None  # ... and waiting in a run queue for one

    def record(self) -> dict[str, Any]:
        """The Parquet row: the state as its word (a :class:`RankState`'s ``str`` is its value)."""
        return {**super().record(), "state": str(self.state)}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Self:
        """A row read back: the state a :class:`RankState` again."""
        return super().from_record({**record, "state": RankState(str(record["state"]))})


@dataclass(frozen=True)
class CollectiveSeen(Record):
    """One rank's record of one collective (Flight Recorder or Inspector)."""

    job: str
    node: str
    rank: int
    communicator: str  # process group id and name as the rank knows it, e.g. '0:default_pg'
    op: str  # 'all_reduce', 'all_gather', ...
    seq: int  # collective sequence number within the communicator
    enqueue_ns: int  # when the rank entered it (its arrival)
    source: str  # a Signal value
    completed: bool = False
    start_ns: int | None = None
    complete_ns: int | None = None
    exec_ms: float | None = None  # the collective's own execution time on this rank
    size_bytes: int | None = None
    busbw_gbps: float | None = None
    gpu: int | None = None
    comm_ranks: str = ""  # the communicator's ranks, e.g. '[0, 1, 2, 3]'
    backend: str = ""  # 'nccl', 'gloo', ...: the recorder's prefix of the operation's name


@dataclass(frozen=True)
class SignalCoverage(Record):
    """Whether a node could give a signal to this job, and why not: never silence."""

    job: str
    node: str
    signal: str  # a Signal value
    available: bool
    detail: str  # 'NCCL 2.21 has no Inspector', 'armed: 4 ranks answer', ...


@dataclass(frozen=True)
class WatchFinding(StatusRecord):
    """What the watcher concluded about one node of the job, with its evidence and what was done about it."""

    job: str
    kind: str  # a FindingKind value
    node: str
    status: Status
    reason: str  # 'rank_dead', 'rank_stopped', 'hang_wavefront', 'arrives_last', 'slow_communicators', ...
    observed: str
    expected: str
    evidence: str  # the collectives, ranks and figures the conclusion rests on
    persistence: str  # the streak or change-point over the window that made it more than one noisy sample
    rank: int | None = None
    gpu: int | None = None
    named_ns: int = 0  # the watcher's clock when the finding was first named
    confirmed: bool | None = None  # the targeted re-test: True confirmed, False not, None not run
    retest: str = ""  # which probes were run and their figures against the peers
    action: str = ""  # 'drained', 'not drained: breaker open', 'job-level straggler, hardware not confirmed'
    owner_line: str = ""  # one line for the job's owner: which node to exclude and why
    involves: str = ""  # other nodes the finding implicates (a late rank's ring neighbours), folded
