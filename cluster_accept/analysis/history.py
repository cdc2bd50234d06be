"""The history dataset: every run's tables appended to one directory, partitioned by date.

Layout: ``HISTORY/<table>/date=YYYY-MM-DD/<run_id>.parquet`` for each table of :data:`analysis.schemas.TABLES`.
One file per run and table, named by the run, so appending the same run again replaces its own files and
never duplicates rows (a resumed run appends once). Each table directory is a hive-partitioned dataset:

- pandas: ``pd.read_parquet("HISTORY/measurements")`` (``date`` comes back as a column);
- DuckDB: ``SELECT * FROM read_parquet('HISTORY/measurements/*/*.parquet', hive_partitioning=true)``.

Scheduled runs accumulate here; the report's trends and the regression checks read it back, through
:class:`analysis.history_files.HistoryFiles`: a run's files only as far as its row in ``runs`` makes them
plausible, a file that cannot be read as its table set aside with a warning, and of a node's past only what a
run compares with (its last figures, its latest counters and marks), so that neither a bad file nor a long
history stops a run or grows its memory without bound.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from cluster_accept.analysis.calibration import NoiseTable, latest_table
from cluster_accept.analysis.history_files import HistoryFiles
from cluster_accept.analysis.probe_verdicts import MetricRule, judged_figures
from cluster_accept.analysis.schemas import TABLES
from cluster_accept.analysis.verdicts import COUNTER, MARK, Verdict
from cluster_accept.vocabulary.lazy import pandas as pd
from cluster_accept.vocabulary.own_files import copy_whole
from cluster_accept.vocabulary.rows import Record

PAST_RUNS = 10  # a node's figures are compared with its last K runs' (regressions, the report's trends)
RUNS_READ = 200  # the cluster's latest runs a run reads its nodes' past from: older ones are not its past
VALUE_RUNS = 2  # a node's counters and marks, per check, of its latest runs started before the run reading them:
# the previous one, and the one before it should a check have read nothing of the node in the latest
STAMP_CHARS = 16  # how many characters of a run id are its UTC start (rundir.outputs.new_run_id)
_STAMP = re.compile(r"^\d{8}T\d{6}Z")
_STAMP_FORMAT = "%Y%m%dT%H%M%SZ"
MEASURED = ["run_id", "stage", "node", "metric", "unit", "model", "value", "size"]  # what a key figure needs


def partition_dir(history: Path, table: str, date: str) -> Path:
    return history / table / f"date={date}"


def append_run(
    history: Path, run_dir: Path, run_id: str, date: str, tables: Collection[str] = tuple(TABLES)
) -> list[Path]:
    """Copy the run's Parquet ``tables`` into the history under ``date`` (``YYYY-MM-DD``). Idempotent per run.
    The history may be shared: each file is written through a new file of a random name, never through a link."""
    written = []
    for table in tables:
        source = run_dir / f"{table}.parquet"
        if not source.exists():
            continue
        target_dir = partition_dir(history, table, date)
        target_dir.mkdir(parents=True, exist_ok=True)
        target = target_dir / f"{run_id}.parquet"
        copy_whole(source, target)  # a random new name, never a fixed one a link may have been planted at
        written.append(target)
    return written


def _files(history: Path | HistoryFiles) -> HistoryFiles:
    return history if isinstance(history, HistoryFiles) else HistoryFiles(history)


def load(
    history: Path | HistoryFiles,
    table: str,
    cluster: str | None = None,
    runs: Collection[str] | None = None,
    columns: Sequence[str] | None = None,
) -> pd.DataFrame:
    """One table of the history as a frame (empty when none was written), optionally one cluster's rows, only
    the files of ``runs`` (each run's file is named by its id: the others are never read) and only ``columns``
    (``cluster`` is read too when a cluster is asked for). Only runs with a row in ``runs`` are read (a file of
    no recorded run has nothing to bound it), and a file that does not read as its table is skipped and set
    aside (:class:`~analysis.history_files.HistoryFiles`)."""
    files = _files(history)
    asked = TABLES[table].names if columns is None else [*columns, *(["cluster"] if cluster else [])]
    wanted = list(dict.fromkeys(asked))
    found = files.paths(table)
    frames = []
    for path in [path for run in sorted(found if runs is None else set(runs)) for path in found.get(run, [])]:
        read = files.read(table, path, wanted)
        if read is not None:
            frames.append(read.to_pandas().assign(date=path.parent.name.removeprefix("date=")))
    if not frames:
        return pd.DataFrame(columns=[*wanted, "date"])
    df = pd.concat(frames, ignore_index=True)
    if cluster is not None:
        df = df[df["cluster"] == cluster]
    return df.reset_index(drop=True)


def key_figures(measurements: pd.DataFrame, rules: Mapping[str, MetricRule]) -> pd.DataFrame:
    """Per run, node and judged metric: the node's figure (median over its GPUs; all-reduce at its largest
    size). Columns: run_id, node, metric, unit, model, value; ``model`` is the model a training figure was
    measured on ("" for other figures): a figure is only compared with figures of the same model. Multi-node
    runs are left out (they belong to groups)."""
    columns = ["run_id", "node", "metric", "unit", "model", "value"]
    if measurements.empty:
        return pd.DataFrame(columns=columns)
    df = measurements[measurements["stage"] == "single-node"] if "stage" in measurements else measurements
    parts = [judged_figures(group, rules) for _, group in df.groupby("run_id")]
    df = pd.concat(parts) if parts else pd.DataFrame(columns=list(measurements.columns))
    if df.empty:
        return pd.DataFrame(columns=columns)
    model = df["model"].fillna("").astype(str) if "model" in df.columns else ""
    df = df.assign(model=model)
    grouped = df.groupby(["run_id", "node", "metric", "unit", "model"])["value"].median().reset_index()
    return grouped[columns]


def past_figures(
    history: Path | HistoryFiles,
    cluster: str,
    rules: Mapping[str, MetricRule],
    exclude_run: str | None = None,
    last_k: int = PAST_RUNS,
) -> pd.DataFrame:
    """Key figures of the earlier runs in the history (see :func:`key_figures`), each with its run's start
    (``started``), oldest first: what the current run's nodes are compared with. Read once per run, one run's
    file at a time, newest first, keeping of each node's figure only its ``last_k`` latest (of the cluster's
    last :data:`RUNS_READ` runs): what is held grows with the nodes, not with the history."""
    files = _files(history)
    chosen = sorted((r for r in files.cluster_runs(cluster) if r.run_id != exclude_run), key=lambda r: r.started)
    kept: Counter[tuple[str, str, str, str]] = Counter()
    parts = []
    for run in reversed(chosen[-RUNS_READ:]):
        figures = key_figures(load(files, "measurements", cluster, [run.run_id], MEASURED), rules)
        groups = list(zip(figures["node"], figures["metric"], figures["unit"], figures["model"], strict=True))
        wanted = [kept[group] < last_k for group in groups]
        kept.update(group for group, keep in zip(groups, wanted, strict=True) if keep)
        parts.append(figures[wanted].assign(started=run.started))
    found = [p for p in parts if not p.empty]
    columns = ["run_id", "node", "metric", "unit", "model", "value", "started"]
    past = pd.concat(found) if found else pd.DataFrame(columns=columns)
    return past.sort_values(["started", "run_id"]).reset_index(drop=True)


def run_start(run_id: str) -> str:
    """When ``run_id`` started, as the UTC stamp its id starts with (``20261118T110600Z``), to compare with other
    ids' first :data:`STAMP_CHARS`; a run not named so (a shard's, named by its key) starts now, by this clock."""
    return run_id[:STAMP_CHARS] if _STAMP.match(run_id) else time.strftime(_STAMP_FORMAT, time.gmtime())


def past_node_values(history: Path | HistoryFiles, cluster: str, exclude_run: str | None = None) -> pd.DataFrame:
    """The error counters and marks (``counter:``, ``mark:`` keys of ``node_values``) of each node and check, of
    its :data:`VALUE_RUNS` latest runs in the history (of the cluster's last :data:`RUNS_READ`) that started before
    ``exclude_run`` (:func:`run_start`): what a run compares its counters with and judges its kernel-log events
    since. Runs dated at or after it (it was resumed after later runs, or a controller's clock ran fast) are left
    out before the latest are kept, so that they never push its past out. One run's file at a time, newest first."""
    files = _files(history)
    start = None if exclude_run is None else run_start(exclude_run)
    runs = [r.run_id for r in files.cluster_runs(cluster) if r.run_id != exclude_run]
    chosen = [run for run in runs if start is None or run[:STAMP_CHARS] <= start][-RUNS_READ:]
    columns = ["run_id", "cluster", "node", "check", "key", "value"]
    seen: Counter[tuple[str, str]] = Counter()
    parts = []
    for run_id in reversed(chosen):
        values = load(files, "node_values", cluster, [run_id], columns)
        values = values[values["key"].astype(str).str.startswith((COUNTER, MARK))]
        pairs = list(zip(values["node"].astype(str), values["check"].astype(str), strict=True))
        keep = [seen[pair] < VALUE_RUNS for pair in pairs]
        seen.update({pair for pair, kept in zip(pairs, keep, strict=True) if kept})
        parts.append(values[keep])
    found = [p for p in parts if not p.empty]
    return pd.concat(found, ignore_index=True) if found else pd.DataFrame(columns=[*columns, "date"])


SETTING_COLUMNS = ["run_id", "node", "probe", "name", "value", "source", "also"]


def accepted_settings(history: Path | HistoryFiles, cluster: str, exclude_run: str | None = None) -> pd.DataFrame:
    """What each node ran with at its latest accepted run that recorded its settings (of the cluster's last
    :data:`RUNS_READ` runs started before ``exclude_run``): the known-good reference a failing figure's settings
    are compared with. Columns :data:`SETTING_COLUMNS`; one run's files at a time, newest first, each node taken
    from the first run that accepted it."""
    files = _files(history)
    start = None if exclude_run is None else run_start(exclude_run)
    runs = [r.run_id for r in files.cluster_runs(cluster) if r.run_id != exclude_run]
    chosen = [run for run in runs if start is None or run[:STAMP_CHARS] <= start][-RUNS_READ:]
    found: set[str] = set()
    parts = []
    for run_id in reversed(chosen):
        verdicts = load(files, "verdicts", cluster, [run_id], ["node", "verdict"])
        accepted = set(verdicts[verdicts["verdict"] == Verdict.ACCEPTED.value]["node"].astype(str)) - found
        if not accepted:
            continue
        settings = load(files, "settings", cluster, [run_id], SETTING_COLUMNS)
        mine = settings[settings["node"].astype(str).isin(accepted)]
        found |= set(mine["node"].astype(str))
        parts.append(mine)
    kept = [p for p in parts if not p.empty]
    return pd.concat(kept, ignore_index=True) if kept else pd.DataFrame(columns=SETTING_COLUMNS)


def node_trends(
    past: pd.DataFrame,
    current: pd.DataFrame,
    nodes: Iterable[str],
    rules: Mapping[str, MetricRule],
    last_k: int = 10,
) -> pd.DataFrame:
    """Each node's key figures over its last ``last_k`` earlier runs (``past``, from :func:`past_figures`)
    plus the current run's (``current``: the run's measurements).

    Columns: node, metric, unit, run_id, started, value, current (bool); per node and metric, past runs
    by start, then the current run.
    """
    columns = ["node", "metric", "unit", "run_id", "started", "value", "current"]
    wanted = set(nodes)
    now = key_figures(current, rules)
    now = now[now["node"].isin(wanted)]
    now = now.assign(started=now["run_id"].astype(str))
    before = past[past["node"].isin(wanted)] if not past.empty else past
    if not before.empty and "model" in before.columns:  # past figures of another model are not this figure's
        same = before.merge(now[["node", "metric", "model"]].drop_duplicates(), on=["node", "metric", "model"])
        before = same
    frames = [frame.assign(current=flag) for frame, flag in ((before, False), (now, True)) if not frame.empty]
    if not frames:
        return pd.DataFrame(columns=columns)
    df = pd.concat(frames, ignore_index=True)
    order = ["node", "metric", "current", "started", "run_id"]  # the current run last, past runs by start
    df = df.sort_values(order)
    # Keep the last ``last_k`` past runs of each node and metric, plus the current one.
    keep = df[~df["current"]].groupby(["node", "metric"]).tail(last_k)
    out = pd.concat([keep, df[df["current"]]]).sort_values(order)
    return out[columns].reset_index(drop=True)


@dataclass(frozen=True)
class Trend(Record):
    """One node's key figure in one run, past or this one: a row of the report's history table."""

    node: str
    metric: str
    unit: str | None
    run_id: str
    started: str
    value: float
    current: bool  # this run's figure, not an earlier run's

    @classmethod
    def of_frame(cls, trends: pd.DataFrame) -> list[Trend]:
        """The rows of :func:`node_trends`' frame."""
        return [cls.from_record({str(k): v for k, v in r.items()}) for r in trends.to_dict("records")]


@dataclass
class RunHistory:
    """The history as one run sees it: each table read at most once, on first use, and handed to whatever
    needs it (regressions, counters that grew, the report's trends). Earlier runs only: this run is left out
    (a resumed run may have appended before). ``files`` says what was set aside reading it."""

    path: Path
    cluster: str
    run_id: str
    rules: Mapping[str, MetricRule]

    @cached_property
    def files(self) -> HistoryFiles:
        return HistoryFiles(self.path)

    @cached_property
    def figures(self) -> pd.DataFrame:
        """Key figures of earlier runs, oldest first (see :func:`past_figures`)."""
        return past_figures(self.files, self.cluster, self.rules, exclude_run=self.run_id)

    @cached_property
    def noise(self) -> NoiseTable | None:
        """The cluster's latest calibration (``cluster-accept calibrate``) that holds up as data, or None; a file
        that does not is set aside as the history's other files are (``files``)."""
        return latest_table(self.path, self.cluster, self.files)

    @cached_property
    def settings(self) -> pd.DataFrame:
        """What each node ran with at its latest accepted run (see :func:`accepted_settings`)."""
        return accepted_settings(self.files, self.cluster, exclude_run=self.run_id)

    @cached_property
    def node_values(self) -> pd.DataFrame:
        """Counters and marks of earlier runs (see :func:`past_node_values`)."""
        return past_node_values(self.files, self.cluster, exclude_run=self.run_id)
