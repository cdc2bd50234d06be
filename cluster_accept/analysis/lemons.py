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

The list is read from the history, a set of files anyone who can write there can add a row to; its hostlist goes
into a scheduler's command line (``sbatch --exclude=…``). So only a name that is a host name (RFC 1123: labels of
letters, digits and inner dashes joined by dots) and, where an inventory is given, a node of it, is folded into
that line (:func:`scheduler_line`); any other name is listed apart with why, never folded into a range
(``gpu[001-999]`` would exclude 999 nodes) and never stopping the line of the others.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from cluster_accept.analysis.verdicts import NOT_ACCEPTED, Verdict
from cluster_accept.inventory.hostlist import HostlistError, expand, fold
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
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")  # RFC 1123: at most 63 characters
HOST_NAME_CHARS = 253  # a host name's most characters, its labels and the dots between them


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
    """node -> the runs that judged it (not skipped, not failed by the tool on the controller), oldest first; a run
    once, whatever rows it has of the node."""
    if verdicts.empty:
        return {}
    kept = verdicts[~verdicts["verdict"].astype(str).isin(_UNJUDGED)].sort_values(["run_id", "node"])
    kept = kept.drop_duplicates(["run_id", "node"], keep="first")
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


def host_name_problem(name: str) -> str | None:
    """Why ``name`` is no host name a scheduler can be handed as it is (RFC 1123), or None."""
    if not name:
        return "it is empty"
    if len(name) > HOST_NAME_CHARS:
        return f"it is longer than a host name can be ({len(name)} characters, at most {HOST_NAME_CHARS})"
    if not all(_LABEL.fullmatch(label) for label in name.split(".")):
        return "it is no host name (letters, digits and '-' in labels of at most 63 joined by '.')"
    return None


@dataclass(frozen=True)
class SchedulerLine:
    """The lemons as a scheduler takes them: ``line``, the folded hostlist of the names that are nodes; ``apart``,
    each other name with why it was left out of the line."""

    line: str
    kept: tuple[str, ...]
    apart: tuple[tuple[str, str], ...]


def scheduler_line(names: Iterable[str], inventory: Collection[str] | None = None) -> SchedulerLine:
    """Fold the ``names`` that are host names, or with an ``inventory`` its nodes, into one hostlist; list every
    other name apart with why. A name is folded only as the literal it is: a host name holds no bracket or
    operator, so it cannot stand for a range of nodes; an inventory's node name (which may hold a '_') is held to
    name itself alone."""
    kept: list[str] = []
    apart: list[tuple[str, str]] = []
    for name in dict.fromkeys(str(n) for n in names):
        problem = host_name_problem(name)
        if inventory is not None:
            known = name in inventory and _names_itself(name)
            problem = None if known else problem or "it is no node of the inventory"
        if problem is None:
            kept.append(name)
        else:
            apart.append((name, problem))
    return SchedulerLine(fold(kept), tuple(kept), tuple(apart))


def _names_itself(name: str) -> bool:
    """Whether ``name``, read as a hostlist, is that one node and nothing more."""
    try:
        return expand(name) == [name]
    except HostlistError:
        return False
