"""Parse what the node-side probes print: JSON measurement lines, and NCCL's ``NCCL_DEBUG=INFO`` log.

Pure functions; a malformed line is kept as an error, never raised: a figure line with a key no node script
declares, or a value of another type (:class:`~cluster_accept.vocabulary.figures.Figure`), is an error too.
NCCL's log is read by :mod:`cluster_accept.analysis.nccl_log`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from cluster_accept.vocabulary.codec import ShapeError
from cluster_accept.vocabulary.figures import NOTHING_UNKEPT, Figure
from cluster_accept.vocabulary.text import keep_head


@dataclass(frozen=True)
class InfoLine:
    """A line a node script prints about its run rather than a figure (``{"info": kind, …}``: a skip, the run's
    settings, a burn window, a training rank …): its ``kind`` and the rest of its members, read-only; the probe
    that printed it reads them."""

    kind: str
    members: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", MappingProxyType(dict(self.members)))  # a copy no one can change

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> InfoLine:
        """The line as the node printed it (its ``info`` member the kind)."""
        return cls(str(record["info"]), {key: value for key, value in record.items() if key != "info"})

    def get(self, key: str, default: Any = None) -> Any:
        """One of its members, or ``default``."""
        return self.members.get(key, default)


@dataclass
class ProbeOutput:
    measurements: list[Figure] = field(default_factory=list)
    info: list[InfoLine] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    transports: dict[str, int] = field(default_factory=dict)  # NCCL's channel connections per transport
    nccl_version: str | None = None

    def skip_reason(self) -> str | None:
        """Why the probe did not measure (``{"info": "skip", "reason": …}``), if it said so; a skip naming one
        ``collective`` is that collective's, not the run's."""
        return next(
            (str(i.get("reason")) for i in self.info if i.kind == "skip" and "collective" not in i.members), None
        )


def parse_json_lines(text: str, unkept: Mapping[str, tuple[type, ...]] = NOTHING_UNKEPT) -> ProbeOutput:
    """Figures (objects with ``metric`` and a numeric ``value``, held to :class:`Figure`; ``unkept``: what the
    script declares beside them that is not kept), info objects (the probe's own, read by its parse) and errors."""
    out = ProbeOutput()
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):  # JSONDecodeError, an int over 4300 digits, nesting too deep
            out.errors.append(f"unreadable probe line: {keep_head(line, 200)}")
            continue
        if not isinstance(record, dict):
            continue
        if "error" in record:
            out.errors.append(f"gpu {record.get('gpu')}: {record['error']}")
        elif "info" in record:
            out.info.append(InfoLine.of(record))
        elif isinstance(record.get("metric"), str) and isinstance(record.get("value"), (int, float)):
            _add_figure(out, record, line, unkept)
        else:
            out.errors.append(f"probe line without metric/value: {keep_head(line, 200)}")
    return out


def _add_figure(out: ProbeOutput, record: dict[str, Any], line: str, unkept: Mapping[str, tuple[type, ...]]) -> None:
    try:
        out.measurements.append(Figure.from_node(record, unkept))
    except ShapeError as error:
        out.errors.append(f"probe line of another shape ({error}): {keep_head(line, 200)}")


_NCCL_TESTS_ROW = re.compile(
    r"^\s*(\d{1,20})\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)\s+(\d+(?:\.\d+)?)\s+(\d+(?:\.\d+)?)\s+(\d+(?:\.\d+)?)\s+(\S+)"
)


def parse_nccl_tests(text: str, world_size: int | None = None) -> ProbeOutput:
    """nccl-tests ``all_reduce_perf`` table → the same figures our all-reduce probe prints
    (out-of-place columns; ``#wrong`` other than 0 or N/A is reported as an error)."""
    out = ProbeOutput()
    gpus = re.search(r"nGpus (\d{1,9})(?!\d)", text)
    ranks = len(re.findall(r"^#\s+Rank\s+\d+", text, flags=re.MULTILINE))
    world = world_size or ranks or (int(gpus.group(1)) if gpus else None)
    for line in text.splitlines():
        match = _NCCL_TESTS_ROW.match(line)
        if not match:
            continue
        size, _, dtype, _, _, time_us, algbw, busbw, wrong = match.groups()
        if wrong not in ("0", "N/A"):
            out.errors.append(f"all_reduce_perf reports {wrong} wrong values at {size} B")
        out.measurements.append(
            Figure(
                probe="allreduce",
                metric="allreduce_busbw_gbps",
                label="intra_node",
                value=float(busbw),
                unit="GB/s",
                algbw_gbps=float(algbw),
                size=int(size),
                dtype=dtype,
                world_size=world,
            )
        )
    if not out.measurements:
        out.errors.append("no all_reduce_perf result rows in the output")
    return out
