"""Lemon nodes: the nodes a scheduler leaves out of a large job, ranked from the fleet's history. Pure.

A job on many nodes fails when any one of them does, so before a large job the nodes likeliest to fail it are
worth leaving out even while they pass today. Over each node's last runs (the cluster's last ``last_runs``):

- how often it was not accepted (rejected or unreachable), as a share of the runs that judged it;
- the reasons that came back: a reason code in two of its runs or more (the same fault again, not bad luck);
- its figures sliding down (:func:`analysis.fleet.drifting_figures`), before any threshold is crossed.

``score = 0.6 × share not accepted + 0.15 × reasons that came back (at most 2) + 0.05 × figures sliding down (at
most 2)``, from 0 to 1. A node is a lemon when it was not accepted in two of its runs or more, or a figure of it
slides down: one bad run is the drain's business (:mod:`ops.repeats`), not a history. Ranked by score, then runs
not accepted, then name: the same history gives the same list.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from cluster_accept.analysis.verdicts import NOT_ACCEPTED, Verdict
from cluster_accept.vocabulary.lazy import pandas as pd

LEMON_COLUMNS = ["node", "score", "runs_seen", "not_accepted", "repeat_reasons", "sliding_figures", "why"]
SHARE_WEIGHT = 0.6  # the share of its runs not accepted
REPEAT_WEIGHT = 0.15  # each reason code that came back, at most REPEATS_COUNTED
SLIDING_WEIGHT = 0.05  # each figure sliding down, at most SLIDING_COUNTED
REPEATS_COUNTED = 2
SLIDING_COUNTED = 2
MIN_NOT_ACCEPTED = 2  # a lemon came back at least this often, unless a figure of it slides
_BAD = frozenset(v.value for v in NOT_ACCEPTED)
_UNJUDGED = frozenset({Verdict.SKIPPED.value, Verdict.TOOL_ERROR.value})


def lemon_score(share_not_accepted: float, repeated: int, sliding: int) -> float:
    """The score of one node, 0 to 1 (module docstring), rounded to three places."""
    score = (
        SHARE_WEIGHT * share_not_accepted
        + REPEAT_WEIGHT * min(repeated, REPEATS_COUNTED)
        + SLIDING_WEIGHT * min(sliding, SLIDING_COUNTED)
    )
    return round(score, 3)


def lemons(verdicts: pd.DataFrame, drifting: pd.DataFrame, last_runs: int = 10) -> pd.DataFrame:
    """One row per lemon, worst first (:data:`LEMON_COLUMNS`). ``verdicts``: run_id, node, verdict, reasons (the
    history's); ``drifting``: :func:`analysis.fleet.drifting_figures`'s frame (node, metric, drop_pct)."""
    runs = _judged(verdicts)
    sliding = _sliding(drifting)
    rows, none = [], pd.DataFrame(columns=["verdict", "reasons"])
    for node in sorted(set(runs) | set(sliding)):
        row = _lemon_row(node, runs.get(node, none).tail(last_runs), sliding)
        if row is not None:
            rows.append(row)
    found = pd.DataFrame(rows, columns=LEMON_COLUMNS)
    return found.sort_values(["score", "not_accepted", "node"], ascending=[False, False, True], ignore_index=True)


def _judged(verdicts: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """node -> the runs that judged it (not skipped, not failed by the tool on the controller), oldest first."""
    if verdicts.empty:
        return {}
    kept = verdicts[~verdicts["verdict"].astype(str).isin(_UNJUDGED)].sort_values(["run_id", "node"])
    return {str(node): part for node, part in kept.groupby("node", sort=True)}


def _sliding(drifting: pd.DataFrame) -> dict[str, list[tuple[str, float]]]:
    """node -> (metric, drop %) of its figures sliding down, steepest first, each metric once."""
    found: dict[str, dict[str, float]] = {}
    if drifting.empty:
        return {}
    for node, metric, drop in zip(drifting["node"], drifting["metric"], drifting["drop_pct"], strict=True):
        mine = found.setdefault(str(node), {})
        mine[str(metric)] = max(float(drop), mine.get(str(metric), float("-inf")))
    return {node: sorted(m.items(), key=lambda item: (-item[1], item[0])) for node, m in found.items()}


def _lemon_row(node: str, runs: pd.DataFrame, sliding: dict[str, list[tuple[str, float]]]) -> list[Any] | None:
    """The node's row, or None when it is no lemon (not accepted under twice, nothing sliding)."""
    bad = runs[runs["verdict"].astype(str).isin(_BAD)]
    slid = sliding.get(node, [])
    if len(bad) < MIN_NOT_ACCEPTED and not slid:
        return None
    counted = Counter(code for reasons in bad["reasons"] for code in dict.fromkeys(_codes(reasons)))
    repeated = sorted(((code, n) for code, n in counted.items() if n >= 2), key=lambda item: (-item[1], item[0]))
    share = len(bad) / len(runs) if len(runs) else 0.0
    score = lemon_score(share, len(repeated), len(slid))
    said_repeats = ", ".join(f"{code} x{n}" for code, n in repeated)
    said_sliding = ", ".join(f"{metric} -{drop:.1f}%" for metric, drop in slid)
    return [node, score, len(runs), len(bad), said_repeats, said_sliding, _why(len(bad), len(runs), repeated, slid)]


def _codes(reasons: object) -> list[str]:
    if reasons is None or isinstance(reasons, float):
        return []
    return [str(r) for r in list(reasons)]  # type: ignore[call-overload]


def _why(bad: int, seen: int, repeated: list[tuple[str, int]], slid: list[tuple[str, float]]) -> str:
    """One sentence: what made the node a lemon, worst first."""
    parts = [f"not accepted in {bad} of its last {seen} runs"] if bad else []
    if repeated:
        code, n = repeated[0]
        more = f" (and {len(repeated) - 1} more reason(s) that came back)" if len(repeated) > 1 else ""
        parts.append(f"{code} came back in {n} runs{more}")
    if slid:
        metric, drop = slid[0]
        more = f" (and {len(slid) - 1} more figure(s))" if len(slid) > 1 else ""
        parts.append(f"{metric} slid {drop:.1f}% down over its recent runs{more}")
    return "; ".join(parts) + "."
