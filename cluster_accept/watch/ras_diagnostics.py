"""NCCL's RAS diagnostics (NCCL 2.31 on), asked on demand of a running job's RAS (``DIAGNOSTICS``, as
``ncclras -D`` asks), as typed rows.

RAS compares what every rank of every live communicator reports — GPU inventory, CUDA driver, volatile ECC
counters, NVLink links, ``NCCL_*`` environment, IOMMU and ATS state, paths — and answers with text lines
``<host>:<pid> NCCL DIAG [OK]   <check>: …`` or ``[INFO] <check>: …`` (a condition to review: a mismatch, an error
counter, an inactive link, or data it could not gather), then ``RAS diagnostics completed in … across N RAS
peers``. A rank list is ``{0,1,2}``, or ``{0,1,2,...} (N=9)`` when cut. The formats are NCCL's own
(``src/ras/diagnostics_*.cc``; the strings of the 2.32.3 library): every line is kept, the ranks, the
communicator and, for the environment, the variable and value read from it where the line has them.

A communicator's ranks are its own numbering: they are the job's ranks only in a communicator of every rank
(``across N ranks`` with N the job's rank count), where :func:`place_on_nodes` puts them on their nodes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from cluster_accept.vocabulary.rows import Record
from cluster_accept.vocabulary.status import Status
from cluster_accept.watch.ras import reader_answer
from cluster_accept.watch.words import WatchFinding

SIGNAL = "ras_diagnostics"  # the coverage row's signal: RAS's diagnostics beside its status
_LINE = re.compile(r"^(?P<host>\S+):(?P<pid>\d+) NCCL DIAG (?P<rest>.*)$")
_TAGGED = re.compile(r"^\[(?P<tag>OK|INFO)\]\s+(?P<text>.*)$")
_DONE = re.compile(r"^(?:RAS|NCCL) diagnostics completed in (?P<ms>[\d.]+) ms across (?P<n>\d+) (?P<what>.+)$")
_RANK_LIST = r"rank\(s\) \{(?P<ranks>[\d,]*?)(?P<cut>,?\.\.\.)?\}(?: \(N=(?P<total>\d+)\))?"
_RANKS = re.compile(_RANK_LIST)
_COMM = re.compile(r"in comm (0x[0-9a-fA-F]+)")
_ACROSS = re.compile(r"across (\d+) ranks")
_REFERENCE = re.compile(r"differ from rank (\d+) \(")
# the value is the job's user's: nothing is read from it, the ranks only from the end of the line
_ENV_VALUE = re.compile(r"^NCCL environment: (?P<var>NCCL_\w+)=(?P<value>.*) on " + _RANK_LIST + "$")
_ENV_MISMATCH = re.compile(r"^NCCL environment: mismatch across \d+ ranks in comm \S+ for (?P<var>NCCL_\w+)$")
MAX_DETAIL = 400


@dataclass(frozen=True)
class NcclDiagnostic(Record):
    """One line of RAS's diagnostics report: its check, whether it is to review (``ok`` False: NCCL's ``[INFO]``),
    the communicator and ranks it names, and the nodes of those ranks where they are the job's."""

    job: str
    asked_on: str  # the node whose RAS was asked
    check: str  # 'GPU inventory', 'CUDA driver version', 'ECC', 'NVLink', 'NCCL environment', 'IOMMU mode', ...
    ok: bool
    detail: str  # the line after its tag, as NCCL wrote it
    comm: str = ""  # the communicator's hash
    comm_ranks: int | None = None  # how many ranks the communicator has, where the line says
    ranks: str = ""  # the ranks the line names, comma-separated
    reference_rank: int | None = None  # a mismatch: the rank the named ones differ from (the other side)
    ranks_cut: bool = False  # NCCL listed only some of them
    ranks_total: int | None = None  # how many it named, where it cut the list
    variable: str = ""  # NCCL environment: the variable
    value: str = ""  # NCCL environment: its value on those ranks
    nodes: str = ""  # the nodes of the named ranks and of a mismatch's reference rank, where they are the job's


@dataclass(frozen=True)
class DiagnosticsReport:
    rows: tuple[NcclDiagnostic, ...]
    completed: str = ""  # NCCL's completion line, empty when the report did not end with one
    reporter: str = ""  # host:pid of the process that ran it
    error: str = ""  # NCCL's ``ERROR: …`` line (a summary that failed): the report is not whole


def parse_diagnostics_answer(line: str, job: str, asked_on: str) -> tuple[DiagnosticsReport | None, str]:
    """The node reader's line (``ras_read.py --diagnostics``): the report, or None and why there is none."""
    answer, why = reader_answer(line)
    if answer is None:
        return None, why[:MAX_DETAIL]
    if answer.get("format") != "diagnostics":
        return None, "no diagnostics in the answer"
    return parse_diagnostics(str(answer.get("body", "")), job, asked_on), ""


def parse_diagnostics(text: str, job: str, asked_on: str) -> DiagnosticsReport:
    """The report's tagged lines as rows (other lines: the header, the completion line, anything else, are not
    rows); lines without NCCL's prefix are ignored."""
    rows: list[NcclDiagnostic] = []
    completed = reporter = error = ""
    for line in text.splitlines():
        match = _LINE.match(line.strip())
        if match is None:
            continue
        reporter = reporter or f"{match['host']}:{match['pid']}"
        rest = match["rest"].strip()
        if _DONE.match(rest):
            completed = rest[:MAX_DETAIL]
        elif rest.upper().startswith("ERROR"):
            error = rest[:MAX_DETAIL]
        elif tagged := _TAGGED.match(rest):
            rows.append(_in_context(_row(tagged["text"], tagged["tag"] == "OK", job, asked_on), rows))
    return DiagnosticsReport(tuple(rows), completed, reporter, error)


def _in_context(row: NcclDiagnostic, before: list[NcclDiagnostic]) -> NcclDiagnostic:
    """An environment value's line (``NCCL_X=V on rank(s) {…}``) names no communicator: it is the one of the
    mismatch line of the same variable just before it."""
    if row.comm or not row.variable or not before:
        return row
    last = before[-1]
    if last.variable == row.variable and last.comm:
        return replace(row, comm=last.comm, comm_ranks=last.comm_ranks)
    return row


def _row(text: str, ok: bool, job: str, asked_on: str) -> NcclDiagnostic:
    check = text.split(": ", 1)[0] if ": " in text else ""
    value = _ENV_VALUE.match(text)
    env = value or _ENV_MISMATCH.match(text)
    ranks = value or _RANKS.search(text)
    comm, across = (None, None) if value else (_COMM.search(text), _ACROSS.search(text))
    reference = None if value else _REFERENCE.search(text)
    return NcclDiagnostic(
        job=job,
        asked_on=asked_on,
        check=check[:80],
        ok=ok,
        detail=text[:MAX_DETAIL],
        comm=comm[1] if comm else "",
        comm_ranks=int(across[1]) if across else None,
        ranks=ranks["ranks"].strip(",") if ranks else "",
        ranks_cut=bool(ranks and ranks["cut"]),
        ranks_total=int(ranks["total"]) if ranks and ranks["total"] else None,
        reference_rank=int(reference[1]) if reference else None,
        variable=env["var"] if env else "",
        value=(env.groupdict().get("value") or "")[:200] if env else "",
    )


def place_on_nodes(rows: tuple[NcclDiagnostic, ...], rank_nodes: Mapping[int, str]) -> tuple[NcclDiagnostic, ...]:
    """Each row's ranks put on their nodes where they are the job's own: the line's communicator holds every rank
    of the job (``comm_ranks`` the job's rank count); in a smaller one its rank numbers are its own. A mismatch
    names the ranks that differ from one reference rank, which may itself be the odd one: both sides' nodes."""
    placed = []
    for row in rows:
        if row.ranks and row.comm_ranks == len(rank_nodes):
            ranks = [*map(int, row.ranks.split(",")), *([] if row.reference_rank is None else [row.reference_rank])]
            row = replace(row, nodes=",".join(sorted({rank_nodes[r] for r in ranks if r in rank_nodes})))
        placed.append(row)
    return tuple(placed)


def summary(report: DiagnosticsReport) -> str:
    """The coverage row's detail: how many checks, and each line to review (a mismatch's nodes are both sides)."""
    review = [row for row in report.rows if not row.ok]
    head = f"{len(report.rows)} results, {len(review)} to review"
    if report.error:
        head += f" ({report.error})"
    elif not report.completed:
        head += " (the report did not complete)"
    shown = "; ".join(f"{r.detail}{f' [{r.nodes}]' if r.nodes else ''}" for r in review[:6])
    more = f"; and {len(review) - 6} more" if len(review) > 6 else ""
    return f"{head}: {shown}{more}" if review else head


def with_diagnostics(findings: Sequence[WatchFinding], rows: Sequence[NcclDiagnostic]) -> list[WatchFinding]:
    """Each named finding's evidence with what RAS's diagnostics put on its node to review (a setting that differs
    there, an ECC error, an inactive link): what the operator looks at first, beside the figures."""
    out = []
    for finding in findings:
        said = [r.detail for r in rows if not r.ok and finding.node in r.nodes.split(",")]
        if said and finding.status in (Status.FAIL, Status.WARN):
            shown = "; ".join(said[:3]) + (f"; and {len(said) - 3} more" if len(said) > 3 else "")
            finding = replace(finding, evidence=f"{finding.evidence}; RAS diagnostics on {finding.node}: {shown}")
        out.append(finding)
    return out
