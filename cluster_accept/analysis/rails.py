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

from cluster_accept.analysis.noise import INCONCLUSIVE, NOISE_K, call, robust_cv


@dataclass(frozen=True)
class RailJudgement:
    rail: str
    busbw_gbps: float | None
    ok: bool
    reason: str  # ok, run_failed, below_min, below_other_rails
    expected: str | None
    floor_gbps: float | None  # the figure under which a group on this rail is slow (isolation's floor)


def judge_rails(
    figures: Mapping[str, float | None], minimum_gbps: float | None, straggler_pct: float, noise_k: float = NOISE_K
) -> list[RailJudgement]:
    """One judgement per rail, in the order given. The relative floor is the median of the rails that ran,
    less the larger of ``straggler_pct`` and ``noise_k`` times the rails' own spread (three rails or more); a
    rail below ``straggler_pct`` but inside that spread is ``inconclusive`` (kept, not isolated). The
    profile's minimum applies on its own; the higher bound is the floor isolation uses."""
    measured = [v for v in figures.values() if v is not None]
    median = statistics.median(measured) if len(measured) >= 2 else None
    spread = robust_cv(measured, f"the {len(measured)} rails' spread")
    margin = max(straggler_pct, 100 * noise_k * spread.cv) if spread is not None else straggler_pct
    relative = median * (1 - margin / 100) if median is not None else None
    bounds = [b for b in (minimum_gbps, relative) if b is not None]
    floor = max(bounds) if bounds else None
    expected = _expected(minimum_gbps, relative, margin)
    out = []
    for rail, value in figures.items():
        if value is None:
            out.append(RailJudgement(rail, None, False, "run_failed", expected, floor))
        elif minimum_gbps is not None and value < minimum_gbps:
            out.append(RailJudgement(rail, value, False, "below_min", expected, floor))
        elif median is None:
            out.append(RailJudgement(rail, value, True, "ok", expected, floor))
        else:
            judged = call(value, median, straggler_pct, [spread], noise_k)
            reason = {"ok": "ok", "below": "below_other_rails", "inconclusive": INCONCLUSIVE}[judged.outcome]
            out.append(RailJudgement(rail, value, judged.outcome != "below", reason, expected, floor))
    return out


def _expected(minimum: float | None, relative: float | None, margin_pct: float) -> str | None:
    parts = []
    if minimum is not None:
        parts.append(f">= {minimum:g} GB/s")
    if relative is not None:
        parts.append(f">= {relative:.3g} GB/s (rails' median - {margin_pct:.3g}%)")
    return " and ".join(parts) or None
