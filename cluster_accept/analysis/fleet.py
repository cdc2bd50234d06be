"""The fleet over time, read from the history: nodes that keep coming back, checks that flip with nothing
changed, and nodes whose figures slide down run after run before any threshold is crossed.

Pure functions over the history's frames (:mod:`analysis.history`); runs are ordered by their id, which starts
with the run's UTC start time.

- **Repeat offenders**: nodes not accepted (rejected or unreachable) in at least ``min_bad`` of their last
  ``last_runs`` runs, with the reasons they were sent back for, most frequent first.
- **Flaky checks**: a check whose worst status on a node flips between good (pass, warn, skip) and bad (fail,
  error, timeout) from one run of the node to its next while nothing recorded about the node changed: the
  values its checks compare (driver, firmware, NCCL settings, links …; error counters left out, since they
  only grow) are the same in both runs. The flake rate of a check: such flips over the pairs of consecutive
  runs it was judged in.
- **Drifting figures**: a node's key figure (its median per run of a judged metric) falling over its last
  runs: at least ``min_runs`` runs, mostly falling from one to the next, the fitted line down by at least
  ``min_drop_pct`` across them.
- **Lemon nodes** (:mod:`analysis.lemons`): the three read together into one ranked list a scheduler can leave
  out of a large job.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cluster_accept.analysis.history import MEASURED, key_figures, load
from cluster_accept.analysis.history_files import HistoryFiles
from cluster_accept.analysis.lemons import LEMON_COLUMNS, lemons
from cluster_accept.analysis.noise import NOISE_K
from cluster_accept.analysis.probe_verdicts import MetricRule
from cluster_accept.analysis.verdicts import COUNTER, MARK, NOT_ACCEPTED
from cluster_accept.vocabulary.lazy import pandas as pd
from cluster_accept.vocabulary.status import BAD_STATUSES

BAD = frozenset(s.value for s in BAD_STATUSES)
NOT_ACCEPTED_VALUES = frozenset(v.value for v in NOT_ACCEPTED)
OFFENDER_COLUMNS = ["node", "not_accepted", "runs", "last_run", "reasons"]
FLAKY_COLUMNS = ["check", "flips", "pairs", "flake_rate", "nodes"]
DRIFT_COLUMNS = ["node", "metric", "runs", "first", "last", "drop_pct", "unit"]


def repeat_offenders(verdicts: pd.DataFrame, last_runs: int = 10, min_bad: int = 3) -> pd.DataFrame:
    """One row per node not accepted in at least ``min_bad`` of its last ``last_runs`` runs, worst first."""
    if verdicts.empty:
        return pd.DataFrame(columns=OFFENDER_COLUMNS)
    rows = []
    for node, runs in verdicts.sort_values("run_id").groupby("node", sort=True):
        recent = runs.tail(last_runs)
        bad = recent[recent["verdict"].isin(NOT_ACCEPTED_VALUES)]
        if len(bad) < min_bad:
            continue
        counted = Counter(str(code) for reasons in bad["reasons"] for code in _codes(reasons))
        said = ", ".join(f"{code} x{n}" for code, n in counted.most_common(5)) or "no reason recorded"
        rows.append([str(node), len(bad), len(recent), str(recent["run_id"].iloc[-1]), said])
    found = pd.DataFrame(rows, columns=OFFENDER_COLUMNS)
    return found.sort_values(["not_accepted", "node"], ascending=[False, True], ignore_index=True)


def _codes(reasons: object) -> list[str]:
    if reasons is None or isinstance(reasons, float):
        return []
    return [str(r) for r in list(reasons)]  # type: ignore[call-overload]


def _node_state(node_values: pd.DataFrame) -> dict[tuple[str, str], frozenset[tuple[str, str, str]]]:
    """(run, node) -> what was recorded about the node in that run, error counters and marks (where a reading
    ended, which moves every run) left out."""
    if node_values.empty:
        return {}
    kept = node_values[~node_values["key"].astype(str).str.startswith((COUNTER, MARK))]
    return {
        (str(run), str(node)): frozenset(zip(part["check"], part["key"], part["value"].astype(str), strict=True))
        for (run, node), part in kept.groupby(["run_id", "node"], sort=False)
    }


def _worst(statuses: pd.Series) -> str:
    """``bad`` when any row of the check failed, errored or timed out in the run, else ``good``."""
    return "bad" if statuses.astype(str).isin(BAD).any() else "good"


def flaky_checks(checks: pd.DataFrame, node_values: pd.DataFrame) -> pd.DataFrame:
    """Per check: flips between good and bad on a node from one run to its next with nothing recorded about the
    node changed, over the pairs of consecutive runs the check was judged in; checks that flipped, worst first."""
    if checks.empty:
        return pd.DataFrame(columns=FLAKY_COLUMNS)
    state = _node_state(node_values)
    judged = checks.groupby(["check", "node", "run_id"], sort=True)["status"].agg(_worst).reset_index()
    counts: dict[str, list[int]] = {}
    flipped_on: dict[str, set[str]] = {}
    for (check, node), runs in judged.groupby(["check", "node"], sort=True):
        outcomes = list(zip(runs["run_id"].astype(str), runs["status"], strict=True))
        for (before, was), (after, now) in zip(outcomes, outcomes[1:], strict=False):
            tally = counts.setdefault(str(check), [0, 0])
            tally[1] += 1
            same = state.get((before, str(node))) == state.get((after, str(node)))
            if was != now and same:
                tally[0] += 1
                flipped_on.setdefault(str(check), set()).add(str(node))
    rows = [
        [check, flips, pairs, round(flips / pairs, 4), ",".join(sorted(flipped_on.get(check, set())))]
        for check, (flips, pairs) in counts.items()
        if flips
    ]
    found = pd.DataFrame(rows, columns=FLAKY_COLUMNS)
    return found.sort_values(["flake_rate", "check"], ascending=[False, True], ignore_index=True)


def drifting_figures(
    measurements: pd.DataFrame,
    rules: Mapping[str, MetricRule],
    min_runs: int = 4,
    min_drop_pct: float = 5.0,
    last_runs: int = 10,
    noise_k: float = NOISE_K,
) -> pd.DataFrame:
    """Per node and judged metric, over its last ``last_runs`` runs: a figure falling run after run (at least
    ``min_runs`` runs, three steps in four or more falling, the fitted line down ``min_drop_pct`` % or more, and
    by ``noise_k`` times the fit's own uncertainty: a figure that wobbles by more than it slid has not slid)."""
    if measurements.empty:
        return pd.DataFrame(columns=DRIFT_COLUMNS)
    figures = key_figures(measurements, rules)  # per run: a figure is compared only with the same model's
    rows = []
    for (node, metric, _), series in figures.groupby(["node", "metric", "model"], sort=True):
        values = [float(v) for v in series.sort_values("run_id")["value"].tail(last_runs)]
        fitted = _fitted_drop_pct(values)
        if len(values) < min_runs or fitted is None:
            continue
        drop, uncertainty = fitted
        if drop < max(min_drop_pct, noise_k * uncertainty):
            continue
        falling = sum(1 for a, b in zip(values, values[1:], strict=False) if b < a)
        if falling * 4 < 3 * (len(values) - 1):
            continue
        unit = str(series["unit"].iloc[-1])
        rows.append([str(node), str(metric), len(values), values[0], values[-1], round(drop, 2), unit])
    found = pd.DataFrame(rows, columns=DRIFT_COLUMNS)
    return found.sort_values(["drop_pct", "node"], ascending=[False, True], ignore_index=True)


def _fitted_drop_pct(values: list[float]) -> tuple[float, float] | None:
    """How far the least-squares line through ``values`` falls from its first point to its last, in % of its
    first point, and that drop's standard error (from the points' scatter about the line; 0 with two points);
    None when it cannot say (one value, or a line starting at zero or below)."""
    n = len(values)
    if n < 2:
        return None
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    spread = sum((i - mean_x) ** 2 for i in range(n))
    slope = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values)) / spread
    start = mean_y - slope * mean_x
    if start <= 0:
        return None
    residuals = [v - (start + slope * i) for i, v in enumerate(values)]
    scatter = math.sqrt(sum(r * r for r in residuals) / (n - 2)) if n > 2 else 0.0
    slope_error = scatter / math.sqrt(spread)
    return -100.0 * slope * (n - 1) / start, 100.0 * slope_error * (n - 1) / start


@dataclass(frozen=True)
class FleetView:
    """The readings of the fleet from its history, each a frame (empty when the history says nothing)."""

    offenders: pd.DataFrame
    flaky: pd.DataFrame
    drifting: pd.DataFrame
    runs: int  # the runs read
    lemons: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=LEMON_COLUMNS))  # ranked, worst first

    @property
    def empty(self) -> bool:
        return self.offenders.empty and self.flaky.empty and self.drifting.empty and self.lemons.empty


def read_fleet(
    history: Path | HistoryFiles, cluster: str, rules: Mapping[str, MetricRule], last_runs: int = 10, min_bad: int = 3
) -> FleetView:
    """The fleet over the cluster's last ``last_runs`` runs in the history at ``history`` (its runs by their
    rows in ``runs``; a file that does not read as its table is skipped and set aside, see
    :class:`~analysis.history_files.HistoryFiles`)."""
    files = history if isinstance(history, HistoryFiles) else HistoryFiles(history)
    runs = [run.run_id for run in files.cluster_runs(cluster)][-last_runs:]
    # only the last runs' files, and of each only the columns read here: at 16,384 nodes a run holds ~10^6 checks
    verdicts = load(files, "verdicts", cluster, runs, ["run_id", "node", "verdict", "reasons"])
    checks = load(files, "checks", cluster, runs, ["run_id", "node", "check", "status"])
    values = load(files, "node_values", cluster, runs, ["run_id", "node", "check", "key", "value"])
    measured = load(files, "measurements", cluster, runs, MEASURED)
    drifting = drifting_figures(measured, rules, last_runs=last_runs)
    return FleetView(
        repeat_offenders(verdicts, last_runs, min_bad),
        flaky_checks(checks, values),
        drifting,
        len(runs),
        lemons(verdicts, drifting, last_runs),
    )
