"""The history dataset: every run's tables appended to one directory, partitioned by date.

Layout: ``HISTORY/<table>/date=YYYY-MM-DD/<run_id>.parquet`` for each table of :data:`analysis.schemas.TABLES`.
One file per run and table, named by the run, so appending the same run again replaces its own files and
never duplicates rows (a resumed run appends once). Each table directory is a hive-partitioned dataset:

- pandas: ``pd.read_parquet("HISTORY/measurements")`` (``date`` comes back as a column);
- DuckDB: ``SELECT * FROM read_parquet('HISTORY/measurements/*/*.parquet', hive_partitioning=true)``.

Scheduled runs accumulate here; the report's trends and the regression checks read it back.
"""

from __future__ import annotations

import shutil
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from cluster_accept.analysis.probe_verdicts import MetricRule, judged_figures
from cluster_accept.analysis.schemas import TABLES
from cluster_accept.vocabulary.lazy import pandas as pd
from cluster_accept.vocabulary.lazy import parquet as pq


def partition_dir(history: Path, table: str, date: str) -> Path:
    return history / table / f"date={date}"


def append_run(history: Path, run_dir: Path, run_id: str, date: str) -> list[Path]:
    """Copy the run's Parquet tables into the history under ``date`` (``YYYY-MM-DD``). Idempotent per run."""
    written = []
    for table in TABLES:
        source = run_dir / f"{table}.parquet"
        if not source.exists():
            continue
        target_dir = partition_dir(history, table, date)
        target_dir.mkdir(parents=True, exist_ok=True)
        target = target_dir / f"{run_id}.parquet"
        tmp = target.with_name(target.name + ".tmp")
        shutil.copyfile(source, tmp)
        tmp.replace(target)
        written.append(target)
    return written


def load(
    history: Path,
    table: str,
    cluster: str | None = None,
    runs: Collection[str] | None = None,
    columns: Sequence[str] | None = None,
) -> pd.DataFrame:
    """One table of the history as a frame (empty when none was written), optionally one cluster's rows, only
    the files of ``runs`` (each run's file is named by its id: the others are never read) and only ``columns``
    (``cluster`` is read too when a cluster is asked for)."""
    root = history / table
    files = sorted(root.glob("date=*/*.parquet")) if root.is_dir() else []
    if runs is not None:
        files = [path for path in files if path.stem in set(runs)]
    wanted = None if columns is None else list(dict.fromkeys([*columns, *(["cluster"] if cluster else [])]))
    if not files:
        return pd.DataFrame(columns=(wanted or list(TABLES[table].names)) + ["date"])
    frames = []
    for path in files:
        frame = pq.read_table(path, columns=wanted).to_pandas()
        frame["date"] = path.parent.name.removeprefix("date=")
        frames.append(frame)
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
    history: Path, cluster: str, rules: Mapping[str, MetricRule], exclude_run: str | None = None
) -> pd.DataFrame:
    """Key figures of the earlier runs in the history (see :func:`key_figures`), each with its run's start
    (``started``), oldest first: what the current run's nodes are compared with. Read once per run."""
    runs = load(history, "runs", cluster)
    past = key_figures(load(history, "measurements", cluster), rules)
    if exclude_run is not None:
        past = past[past["run_id"] != exclude_run]
    started = dict(zip(runs["run_id"], runs["started"], strict=False)) if not runs.empty else {}
    past = past.assign(started=[str(started.get(r, r)) for r in past["run_id"]])
    return past.sort_values(["started", "run_id"]).reset_index(drop=True)


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


@dataclass
class RunHistory:
    """The history as one run sees it: each table read at most once, on first use, and handed to whatever
    needs it (regressions, counters that grew, the report's trends). Earlier runs only: this run is left out
    (a resumed run may have appended before)."""

    path: Path
    cluster: str
    run_id: str
    rules: Mapping[str, MetricRule]

    @cached_property
    def figures(self) -> pd.DataFrame:
        """Key figures of earlier runs, oldest first (see :func:`past_figures`)."""
        return past_figures(self.path, self.cluster, self.rules, exclude_run=self.run_id)

    @cached_property
    def node_values(self) -> pd.DataFrame:
        """``node_values`` rows of earlier runs."""
        past = load(self.path, "node_values", self.cluster)
        return past[past["run_id"] != self.run_id]
