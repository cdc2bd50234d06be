"""Per-rail verdicts: each rail's all-reduce across nodes (one rank per node on that rail's GPU and NIC)
against the profile's minimum and against the node set's other rails. Pure.

Rails of one node set cross the same switches with the same NICs, so they should run alike: a rail far below its
siblings carries a slow NIC, transceiver or cable on some node, which isolation on that rail then names. With a
single rail there is nothing to compare with, so only the profile's ``rail_busbw_gbps_min`` (and a failed run)
can find it slow.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RailJudgement:
    rail: str
    busbw_gbps: float | None
    ok: bool
    reason: str  # ok, run_failed, below_min, below_other_rails
    expected: str | None
    floor_gbps: float | None  # the figure under which a group on this rail is slow (isolation's floor)


def judge_rails(
    figures: Mapping[str, float | None], minimum_gbps: float | None, straggler_pct: float
) -> list[RailJudgement]:
    """One judgement per rail, in the order given. The relative floor is the median of the rails that ran,
    less ``straggler_pct``; the profile's minimum applies on its own; the higher bound wins."""
    measured = [v for v in figures.values() if v is not None]
    relative = statistics.median(measured) * (1 - straggler_pct / 100) if len(measured) >= 2 else None
    bounds = [b for b in (minimum_gbps, relative) if b is not None]
    floor = max(bounds) if bounds else None
    out = []
    for rail, value in figures.items():
        expected = _expected(minimum_gbps, relative, straggler_pct)
        if value is None:
            out.append(RailJudgement(rail, None, False, "run_failed", expected, floor))
        elif minimum_gbps is not None and value < minimum_gbps:
            out.append(RailJudgement(rail, value, False, "below_min", expected, floor))
        elif relative is not None and value < relative:
            out.append(RailJudgement(rail, value, False, "below_other_rails", expected, floor))
        else:
            out.append(RailJudgement(rail, value, True, "ok", expected, floor))
    return out


def _expected(minimum: float | None, relative: float | None, straggler_pct: float) -> str | None:
    parts = []
    if minimum is not None:
        parts.append(f">= {minimum:g} GB/s")
    if relative is not None:
        parts.append(f">= {relative:.3g} GB/s (rails' median - {straggler_pct:g}%)")
    return " and ".join(parts) or None
