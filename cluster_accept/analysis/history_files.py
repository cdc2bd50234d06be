"""The history's files as one reader sees them: which runs it holds, each file read only as far as its run makes
it plausible, and a file that cannot be read as its table set aside rather than stopping the reader.

A run is in the history by its row in ``runs`` (``HISTORY/runs/date=…/<run_id>.parquet``, one row): the row says
the run's cluster, when it started and how many nodes it had, which is what bounds its other files (one verdict
per node, :data:`table_files.ROWS_PER_NODE` rows per node elsewhere). A file cut short, not Parquet, of another
schema or with more rows than its run can have is skipped with a warning naming it and the problem, and moved to
``HISTORY/_set_aside/`` under its own path, beside a ``.why`` file saying why and when (never deleted; the history's
globs, ``HISTORY/<table>/*/*.parquet``, no longer see it). A file written with another schema version is skipped
and left where it is, for the version that wrote it.

A run is the run its rows name, and counts once: a file named by one run that holds another's rows (a copy under
another name) is set aside, and so is a second file of a run in another date partition (a copy under another
date): of each table a run's file is the one in its row's partition (``runs/date=D/<run_id>.parquet``, the date
the run started, where the run appends every table), its rows read once.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster_accept.analysis.table_files import UnfitTable, read_table_file, row_limit
from cluster_accept.inventory.hostlist import MAX_NODES
from cluster_accept.vocabulary.own_files import replace_whole

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

SET_ASIDE = "_set_aside"  # HISTORY/_set_aside/<table>/date=…/<file>: files the history's readers could not use
_INDEX_COLUMNS = ["run_id", "cluster", "started", "nodes_tested", "skipped"]


@dataclass(frozen=True)
class HistoryRun:
    """One run of the history, from its row in ``runs``."""

    run_id: str
    cluster: str
    started: str  # as the row has it; the run id where the row has none
    nodes: int | None  # nodes tested and skipped, as the row counts them; None where it does not
    partition: str = ""  # the date partition its row is in (``date=YYYY-MM-DD``), where its other files are


@dataclass(frozen=True)
class SetAside:
    """A history file a reader skipped: where it was, why, and where it went (None: left where it is, ``left``
    saying why)."""

    file: Path
    problem: str
    moved_to: Path | None
    left: str = ""

    @property
    def said(self) -> str:
        where = f"moved to {self.moved_to}" if self.moved_to is not None else f"left where it is {self.left}"
        return f"history file {self.file} skipped: {self.problem}; {where}"

    def record(self) -> dict[str, Any]:
        return {"file": str(self.file), "problem": self.problem, "moved_to": str(self.moved_to or "") or None}


def move_aside(root: Path, path: Path, problem: str) -> Path:
    """Move ``path`` (under ``root``) to ``root/_set_aside/`` under its own relative path, never over a file
    already there (``<name>.1.parquet`` …), with ``<name>.why`` beside it, written through a new file of a random
    name (the history may be shared: a link planted there is never written through). Raises OSError when it
    cannot."""
    target = root / SET_ASIDE / path.relative_to(root)
    count = 0
    while os.path.lexists(target) or os.path.lexists(target.with_name(target.name + ".why")):  # a link is taken
        count += 1
        target = target.with_name(f"{path.stem}.{count}{path.suffix}")
    target.parent.mkdir(parents=True, exist_ok=True)
    path.rename(target)
    when = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    replace_whole(target.with_name(target.name + ".why"), f"{problem}\nset aside at {when} from {path}\n")
    return target


@dataclass
class HistoryFiles:
    """The history at ``root`` for one reader: its runs (read once), its files by table, and what was set aside.

    A run whose row cannot be read is set aside whole (its files of every table, beside the row's file), as no
    file of it can be read without the row; a file of a run with no row at all is skipped and left where it is."""

    root: Path
    set_aside: list[SetAside] = field(default_factory=list)
    _skipped: set[Path] = field(default_factory=set, init=False, repr=False)
    _paths: dict[str, dict[str, list[Path]]] = field(default_factory=dict, init=False, repr=False)

    def paths(self, table: str) -> dict[str, list[Path]]:
        """run id -> the run's files of ``table`` (by their names), oldest partition first; of a table other than
        ``runs``, only runs with a row (:attr:`runs`)."""
        if table not in self._paths:
            found: dict[str, list[Path]] = {}
            for path in self._glob(table, "*"):
                found.setdefault(path.stem, []).append(path)
            if table != "runs":
                found = {run_id: paths for run_id, paths in found.items() if self._recorded(run_id, paths)}
                found = {run_id: self._one_file(table, run_id, paths) for run_id, paths in found.items()}
            self._paths[table] = found
        return self._paths[table]

    def _one_file(self, table: str, run_id: str, paths: list[Path]) -> list[Path]:
        """The run's one file of ``table``: the one in its row's partition, else the oldest; any other is a copy
        (its rows would count the run twice), set aside."""
        home = self.runs[run_id].partition
        kept = next((path for path in paths if path.parent.name == home), paths[0])
        for path in paths:
            if path != kept:
                self.skip(UnfitTable(path, f"a second file of run {run_id!r} (its file is {kept}): a copy"))
        return [kept]

    def _glob(self, table: str, run_id: str) -> list[Path]:
        folder = self.root / table
        paths = sorted(folder.glob(f"date=*/{run_id}.parquet")) if folder.is_dir() else []
        return [path for path in paths if path not in self._skipped]

    def _recorded(self, run_id: str, paths: list[Path]) -> bool:
        """Whether the run has a row; its files are skipped (left where they are) where it has none and none
        appeared since the runs were read (a run appending its tables meanwhile is only not seen)."""
        if run_id in self.runs or self._glob("runs", run_id):
            return run_id in self.runs
        problem = f"no row for run {run_id!r} in {self.root / 'runs'}"
        for path in paths:
            self.skip(UnfitTable(path, problem, left="(its run has no row to read it by)"))
        return False

    @cached_property
    def runs(self) -> dict[str, HistoryRun]:
        """run id -> the run, for every run whose row in ``runs`` reads (one row, the runs schema)."""
        found: dict[str, HistoryRun] = {}
        for run_id, paths in self.paths("runs").items():
            rows: dict[Path, HistoryRun] = {}
            for path in paths:
                read = self.read("runs", path, _INDEX_COLUMNS)
                if read is not None and read.num_rows == 0:
                    self.skip(UnfitTable(path, "no run's row in it"))
                elif read is not None:
                    rows[path] = _history_run(run_id, read.to_pylist()[0], path.parent.name)
            if rows:
                found[run_id] = rows[self._row_file(run_id, rows)]
        return found

    def _row_file(self, run_id: str, rows: dict[Path, HistoryRun]) -> Path:
        """Of a run's row files, the one in the partition of the day it started (where the run appended it), else
        the oldest; any other is a copy (the run would count twice), set aside."""
        kept = next((p for p, run in rows.items() if p.parent.name == f"date={run.started[:10]}"), next(iter(rows)))
        for path in rows:
            if path != kept:
                self.skip(UnfitTable(path, f"a second row of run {run_id!r} (its row is {kept}): a copy"), False)
        return kept

    def cluster_runs(self, cluster: str | None = None) -> list[HistoryRun]:
        """The runs of ``cluster`` (every cluster's when None), by run id: run ids start with the UTC start."""
        return [r for _, r in sorted(self.runs.items()) if cluster is None or r.cluster == cluster]

    def nodes(self, run_id: str) -> int:
        """How many nodes the run had: its row's count, else its verdicts file's rows (one per node, at most
        MAX_NODES), else one."""
        run = self.runs.get(run_id)
        if run is not None and run.nodes is not None:
            return run.nodes
        for path in self.paths("verdicts").get(run_id, []):
            read = self.read("verdicts", path, ["run_id"], row_limit("verdicts", MAX_NODES))
            return 1 if read is None else read.num_rows
        return 1

    def read(self, table: str, path: Path, columns: list[str], max_rows: int | None = None) -> pa.Table | None:
        """``columns`` of ``table``'s file at ``path``, at most ``max_rows`` rows (default: as many as its run can
        have); None when it was skipped (:meth:`skip`), now or before."""
        if path in self._skipped:
            return None
        if max_rows is None:
            max_rows = row_limit(table, 1 if table == "runs" else self.nodes(path.stem))
        try:
            wanted = list(dict.fromkeys([*columns, "run_id"]))
            return _of_its_run(path, read_table_file(path, table, wanted, max_rows), columns)
        except UnfitTable as exc:
            if path.exists():
                self.skip(exc)
            else:  # gone since it was listed: another reader set it aside meanwhile, and said so
                self._skipped.add(path)
            return None

    def skip(self, unfit: UnfitTable, whole_run: bool = True) -> None:
        """Skip a file for the rest of this reader's life and warn; move it aside unless it is to be left (and with
        a run's row, the run's other files, unless ``whole_run`` is False: a copy of a row the run keeps)."""
        self._skipped.add(unfit.path)
        moved, left = None, unfit.left
        if not left:
            try:
                moved = move_aside(self.root, unfit.path, unfit.problem)
            except (OSError, ValueError) as exc:  # read-only, not this user's, moved by another reader meanwhile
                left = f"(it could not be moved aside: {exc})"
        record = SetAside(unfit.path, unfit.problem, moved, left)
        self.set_aside.append(record)
        log.warning(record.said)
        if whole_run and moved is not None and unfit.path.parent.parent == self.root / "runs":
            self._set_run_aside(unfit.path.stem, unfit.path)

    def _set_run_aside(self, run_id: str, row_file: Path) -> None:
        """Set aside the files of a run whose row was set aside: none of them can be read without it."""
        for table in sorted(p.name for p in self.root.iterdir() if p.is_dir() and p.name not in ("runs", SET_ASIDE)):
            for path in self._glob(table, run_id):
                self.skip(UnfitTable(path, f"its run's row ({row_file.name} in runs) was set aside"))


def _of_its_run(path: Path, read: pa.Table, columns: list[str]) -> pa.Table:
    """``columns`` of ``read``, the rows of ``path``, once every row is of the run the file is named by; UnfitTable
    where one is another run's (a copy of its file under another run's name would count that run twice)."""
    others = sorted(str(run) for run in read.column("run_id").unique().to_pylist() if run != path.stem)
    if others:
        raise UnfitTable(path, f"rows of run {others[0]!r}, not of run {path.stem!r} it is named by: a copy")
    return read.select([name for name in dict.fromkeys(columns) if name in read.column_names])


def _history_run(run_id: str, row: dict[str, Any], partition: str) -> HistoryRun:
    tested, skipped = row.get("nodes_tested"), row.get("skipped")
    nodes = tested + skipped if tested is not None and skipped is not None else None
    started = str(row["started"]) if row.get("started") is not None else run_id
    return HistoryRun(run_id, str(row.get("cluster") or ""), started, nodes, partition)
