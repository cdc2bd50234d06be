"""NCCL RAS status as typed rows: which processes and ranks of a job RAS found dead, missing or out of step.

Read from the line ``watch/node/ras_read.py`` prints: its ``body`` is NCCL's report, JSON from 2.28.7 (a dump of
every communicator's ranks with their collective counts, and of its missing ranks) or text before (a summary
that lists only the outlying ranks; formats in NCCL's ``src/ras/client_support.cc``). JSON written by 2.28.7
and 2.28.9 lacks the comma after a missing rank's ``nvml_dev``: it is repaired before it is read.

A rank is ``behind`` on an operation when it launched fewer of that collective than the communicator's most:
RAS's text names the smaller group, which may be the ranks ahead (NCCL #1911), so the count is kept with the
communicator's peak and the reader of the row decides. Hosts are as RAS gives them, addresses of the nodes'
bootstrap interface.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class RasRankState(StrEnum):
    DEAD = "dead"  # RAS gave up reaching its process (60 s without an answer)
    UNRESPONSIVE = "unresponsive"  # its process did not answer this query
    MISSING = "missing"  # its process answered, but not for this communicator (init or teardown)
    BEHIND = "behind"  # launched fewer of a collective than the communicator's most
    AHEAD = "ahead"  # listed by RAS at the communicator's most while others are behind
    STATUS = "status"  # a status other than its peers' (INIT, FINALIZE, ABORT, NOCOMM)
    ERROR = "error"  # an initialization or asynchronous NCCL error, or an abort


@dataclass(frozen=True)
class RasProcess:
    """A job process RAS names on its own (text: the DEAD and INCOMPLETE lists)."""

    host: str
    pid: int
    gpus: str  # '1', '0,1' or '5 (NVML 3)'
    state: str  # 'dead' or 'unresponsive'


@dataclass(frozen=True)
class RasRank:
    communicator: str  # the communicator's hash, '0x27a079b828ff1a75'
    rank: int  # in that communicator
    state: str  # a RasRankState value
    host: str = ""
    pid: int | None = None
    gpu: int | None = None  # CUDA device number in its process
    op: str = ""  # for BEHIND/AHEAD: 'AllReduce', ...
    count: int | None = None  # how many of ``op`` it launched
    peak: int | None = None  # the most any rank of the communicator launched
    detail: str = ""


@dataclass(frozen=True)
class RasStatus:
    available: bool
    detail: str = ""
    form: str = ""  # 'json' or 'text'
    nccl_version: str = ""
    communicators: int = 0
    timeouts: int = 0  # RAS's own timeouts while gathering: a slow or stopped process
    collection_s: float | None = None
    processes: tuple[RasProcess, ...] = ()
    ranks: tuple[RasRank, ...] = field(default=())

    def of_state(self, state: RasRankState) -> list[RasRank]:
        return [rank for rank in self.ranks if rank.state == state.value]


@dataclass(frozen=True)
class RasSeen:
    """One RAS report of the whole job, as the NCCL of one of its nodes gave it, received at ``seen_ns`` (the
    watcher's clock)."""

    node: str
    seen_ns: int
    status: RasStatus

    def summary(self) -> str:
        """What the report says in a line: the coverage's detail."""
        s = self.status
        if not s.available:
            return f"asked on {self.node}: {s.detail}"
        named = sorted({f"{p.pid} on {p.host} ({p.state})" for p in s.processes})
        out = f"asked on {self.node}: NCCL {s.nccl_version} ({s.form}), {s.communicators} communicator(s)"
        return out + (f"; processes {', '.join(named)}" if named else "; every process answered")


def on_job_ranks(status: RasStatus, pids: Mapping[int, int]) -> dict[int, RasRank]:
    """What RAS said of each of the job's ranks (``pids``: the job's rank -> its process as the watch read it): a
    RAS rank is the job's rank of the same pid; among several of one pid (machines reuse pids), the one of RAS's
    communicator rank; a process no read listed is never guessed onto a rank. Where RAS says several things of one
    rank, the first of :class:`RasRankState`'s order (dead, unresponsive, ...) is kept."""
    if not status.available:
        return {}
    by_pid: dict[int, list[int]] = {}
    for rank, pid in pids.items():
        by_pid.setdefault(pid, []).append(rank)
    order = [state.value for state in RasRankState]
    out: dict[int, RasRank] = {}
    for said in sorted(status.ranks, key=lambda r: order.index(r.state)):
        same = by_pid.get(said.pid, []) if said.pid is not None else []
        if len(same) != 1 and said.rank not in same:
            continue
        rank = same[0] if len(same) == 1 else said.rank
        if rank not in out:
            out[rank] = said
    return out


def comm_hash(text: str) -> str:
    """JSON's ``0x27a0...`` and text's zero-padded ``27a0...`` as one form."""
    return f"0x{int(text, 16):x}"


def reader_answer(line: str) -> tuple[dict[str, Any] | None, str]:
    """The RAS reader's line (``watch/node/ras_read.py``) as its object where RAS answered; else None and why."""
    try:
        answer = json.loads(line)
    except ValueError:
        return None, f"not the RAS reader's line: {line[:200]!r}"
    if not isinstance(answer, dict) or answer.get("ras") != "ok":
        detail = answer.get("detail", "") if isinstance(answer, dict) else ""
        return None, str(detail) or "no answer"
    return answer, ""


def parse_ras_answer(line: str) -> RasStatus:
    """The node reader's line: unavailable (with its detail) or the report parsed in its format."""
    answer, why = reader_answer(line)
    if answer is None:
        return RasStatus(False, why)
    body = str(answer.get("body", ""))
    return parse_ras_json(body) if answer.get("format") == "json" else parse_ras_text(body)


# JSON (2.28.7 on) -------------------------------------------------------------------------------------------

_MISSING_COMMA = re.compile(r'("nvml_dev": -?\d+)(\s*\n\s*"status")')


def parse_ras_json(text: str) -> RasStatus:
    try:
        data = json.loads(_MISSING_COMMA.sub(r"\1,\2", text))
    except ValueError as exc:
        return RasStatus(False, f"RAS JSON not readable: {exc}", "json")
    ranks: list[RasRank] = []
    for comm in data.get("communicators", []):
        ranks.extend(_json_missing(comm))
        ranks.extend(_json_counts(comm))
        ranks.extend(_json_errors(comm))
    ras = data.get("ras", {})
    return RasStatus(
        available=True,
        form="json",
        nccl_version=str(data.get("nccl_version", "")),
        communicators=int(data.get("communicators_count", 0)),
        timeouts=int(ras.get("timeouts_count", 0)),
        collection_s=ras.get("collection_time_sec"),
        processes=_processes_of(ranks),
        ranks=tuple(ranks),
    )


def _where(rank: dict[str, Any]) -> dict[str, Any]:
    pid = int(rank.get("pid", -1))
    return {"host": str(rank.get("host", "")), "pid": pid if pid >= 0 else None, "gpu": rank.get("cuda_dev")}


def _json_missing(comm: dict[str, Any]) -> list[RasRank]:
    found = []
    for rank in comm.get("missing_ranks", []):
        status = rank.get("status", {})
        if status.get("considered_dead"):
            state = RasRankState.DEAD
        elif status.get("unresponsive"):
            state = RasRankState.UNRESPONSIVE
        else:
            state = RasRankState.MISSING
        found.append(RasRank(comm_hash(comm["hash"]), int(rank["rank"]), state.value, **_where(rank)))
    return found


def _json_counts(comm: dict[str, Any]) -> list[RasRank]:
    """Every rank below the communicator's most of some collective."""
    ranks = comm.get("ranks", [])
    ops = sorted({op for rank in ranks for op in rank.get("collective_counts", {})})
    found = []
    for op in ops:
        counts = [int(rank.get("collective_counts", {}).get(op, 0)) for rank in ranks]
        peak = max(counts, default=0)
        for rank, count in zip(ranks, counts, strict=True):
            if count < peak:
                behind = RasRankState.BEHIND.value
                where = _where(rank)
                found.append(
                    RasRank(comm_hash(comm["hash"]), int(rank["rank"]), behind, op=op, count=count, peak=peak, **where)
                )
    return found


def _json_errors(comm: dict[str, Any]) -> list[RasRank]:
    found = []
    for rank in comm.get("ranks", []):
        status = rank.get("status", {})
        init, asynchronous = int(status.get("init_state", 0)), int(status.get("async_error", 0))
        if init not in (0, 7) or asynchronous not in (0, 7) or status.get("abort_flag"):
            detail = f"init_state {init}, async_error {asynchronous}, abort {bool(status.get('abort_flag'))}"
            error = RasRankState.ERROR.value
            found.append(RasRank(comm_hash(comm["hash"]), int(rank["rank"]), error, detail=detail, **_where(rank)))
    return found


def _processes_of(ranks: list[RasRank]) -> tuple[RasProcess, ...]:
    """The processes of the dead and unresponsive ranks, once each."""
    seen: dict[tuple[str, int], RasProcess] = {}
    for rank in ranks:
        if rank.state in (RasRankState.DEAD, RasRankState.UNRESPONSIVE) and rank.pid is not None:
            key = (rank.host, rank.pid)
            gpus = "" if rank.gpu is None else str(rank.gpu)
            previous = seen.get(key)
            if previous is not None and gpus and gpus not in previous.gpus.split(","):
                gpus = f"{previous.gpus},{gpus}"
            seen[key] = RasProcess(rank.host, rank.pid, gpus, rank.state)
    return tuple(seen.values())


# Text (2.24 on) ---------------------------------------------------------------------------------------------

_COMM = re.compile(r"#\d+-\d+ \(([0-9a-fA-F]+)\) (INCOMPLETE|ERROR|MISMATCH)")
_PROCESS = re.compile(r"Process (\d+) on node (\S+) managing GPUs? (.+)")
_RANK = re.compile(
    r"Rank (\d+)(?: has launched up to operation (\d+)| (has not launched any operations)| has status (\w+)"
    r"| reported (.+?))? -- (?:GPU (\d+)(?: \(NVML \d+\))? managed by process (\d+) on node (\S+)"
    r"|\[process information not found\])"
)
_GROUP = re.compile(
    r"\d+ ranks (?:have launched up to operation (\d+)|(have not launched any operations)|have status (\w+))"
)
_OPS_DIFFER = re.compile(r"Communicator ranks have different (\w+) operation counts")
_TABLE_ROW = re.compile(r"\s*\d+\s+(\d+)\s+\d+\s+\S+\s+\d+\s+\d+\s+[A-Z]+\s+[A-Z,]+")


def _blocks(lines: list[str]) -> list[tuple[str, list[str]]]:
    """The Errors and Warnings sections as (header, its indented lines)."""
    blocks: list[tuple[str, list[str]]] = []
    inside = False
    for line in lines:
        if line in ("Errors", "Warnings"):
            inside = True
        elif not inside or not line.strip() or set(line) == {"="}:
            continue
        elif line.startswith(" "):
            if blocks:
                blocks[-1][1].append(line.strip())
        else:
            blocks.append((line.strip(), []))
    return blocks


def parse_ras_text(text: str) -> RasStatus:
    lines = text.splitlines()
    version = next((m.group(1) for m in map(re.compile(r"NCCL version (\S+)").match, lines) if m), "")
    if not version and "Job summary" not in text:
        return RasStatus(False, f"not a RAS report: {text[:200]!r}", "text")
    blocks = _blocks(lines)
    processes = [
        p for header, body in blocks if header in ("DEAD", "INCOMPLETE") for p in _text_processes(header, body)
    ]
    dead = {(p.host, p.pid) for p in processes if p.state == RasRankState.DEAD}
    ranks: list[RasRank] = []
    timeouts = 0
    for header, body in blocks:
        match = _COMM.fullmatch(header)
        if header == "TIMEOUT" and body:
            timeouts = int(re.findall(r"\d+", body[0])[0])
        elif match:
            ranks.extend(_text_comm(comm_hash(match.group(1)), match.group(2), body, dead))
    took = re.search(r"Communicators\.\.\. \((\d+\.\d+)s\)", text)
    return RasStatus(
        available=True,
        form="text",
        nccl_version=version,
        communicators=sum(int(m.group(1)) for m in map(_TABLE_ROW.fullmatch, lines) if m),
        timeouts=timeouts,
        collection_s=float(took.group(1)) if took else None,
        processes=tuple(processes),
        ranks=tuple(ranks),
    )


def _text_processes(header: str, body: list[str]) -> list[RasProcess]:
    state = RasRankState.DEAD if header == "DEAD" else RasRankState.UNRESPONSIVE
    return [
        RasProcess(match.group(2), int(match.group(1)), match.group(3), state.value)
        for match in map(_PROCESS.fullmatch, body)
        if match
    ]


def _text_comm(comm: str, kind: str, body: list[str], dead: set[tuple[str, int]]) -> list[RasRank]:
    """One communicator's block: its missing, erring or out-of-step ranks. A MISMATCH block holds a part per
    difference: one for the ranks' status, one per collective whose counts differ."""
    parts: list[tuple[str, list[str]]] = [(kind, [])]
    for line in body:
        differ = _OPS_DIFFER.fullmatch(line)
        if differ or line == "Communicator ranks have different status":
            parts.append((differ.group(1) if differ else "status", []))
        else:
            parts[-1][1].append(line)
    found: list[RasRank] = []
    for part, lines in parts:
        if part in ("INCOMPLETE", "ERROR", "MISMATCH", "status"):
            found.extend(_text_ranks(comm, part, lines, dead))
        else:
            found.extend(_text_counts(comm, part, lines))
    return found


def _place(match: re.Match[str]) -> dict[str, Any]:
    pid = int(match.group(7)) if match.group(7) else None
    return {"host": match.group(8) or "", "pid": pid, "gpu": int(match.group(6)) if match.group(6) else None}


def _text_ranks(comm: str, part: str, lines: list[str], dead: set[tuple[str, int]]) -> list[RasRank]:
    """Missing ranks (INCOMPLETE), ranks with NCCL errors (ERROR), ranks of another status (status)."""
    found: list[RasRank] = []
    detail = ""
    for line in lines:
        group, match = _GROUP.fullmatch(line), _RANK.fullmatch(line)
        if line.startswith("The missing rank"):  # 2.24: rank numbers only
            missing = RasRankState.UNRESPONSIVE.value
            found.extend(RasRank(comm, int(r), missing) for r in re.findall(r"\d+", line.split(":", 1)[1]))
        elif group and group.group(3):
            detail = group.group(3)
        elif re.fullmatch(r"\d+ ranks reported .+|.+ errors? on \d+ ranks?", line):
            detail = line.split(" reported ", 1)[-1]
        elif match and part == "INCOMPLETE":
            place = _place(match)
            state = RasRankState.DEAD if (place["host"], place["pid"]) in dead else RasRankState.UNRESPONSIVE
            found.append(RasRank(comm, int(match.group(1)), state.value, **place))
        elif match:
            state = RasRankState.ERROR if part == "ERROR" else RasRankState.STATUS
            said = match.group(5) or match.group(4) or detail
            found.append(RasRank(comm, int(match.group(1)), state.value, detail=said, **_place(match)))
    return found


def _text_counts(comm: str, op: str, lines: list[str]) -> list[RasRank]:
    """The ranks RAS lists for one collective whose counts differ, each set against the most any group
    launched: RAS lists a group's ranks only when the group is small, at the most or below it."""
    counts: list[int] = []
    listed: list[tuple[re.Match[str], int]] = []
    value = 0
    for line in lines:
        group, match = _GROUP.fullmatch(line), _RANK.fullmatch(line)
        if group and group.group(3) is None:
            value = int(group.group(1) or 0)
            counts.append(value)
        elif match:
            count = int(match.group(2)) if match.group(2) else 0 if match.group(3) else value
            counts.append(count)
            listed.append((match, count))
    peak = max(counts, default=0)
    return [
        RasRank(comm, int(m.group(1)), _side(count, peak), op=op, count=count, peak=peak, **_place(m))
        for m, count in listed
    ]


def _side(count: int, peak: int) -> str:
    return RasRankState.AHEAD.value if count >= peak else RasRankState.BEHIND.value
