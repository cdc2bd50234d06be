"""A run counts once, as the run its own record names: a copy of a run's directory (``cp -a RUN RUN.bak``) or of
its history files is the same run, and a directory the tool did not make (no ``run.json`` naming a run) is no run:
it neither counts toward a drain nor breaks a node's streak, and the fleet's lemons count each run once too."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import pandas as pd

from cluster_accept.analysis.fleet import DRIFT_COLUMNS, read_fleet
from cluster_accept.analysis.history import append_run
from cluster_accept.analysis.history_files import SET_ASIDE, HistoryFiles
from cluster_accept.analysis.lemons import lemons
from cluster_accept.analysis.schemas import TABLES, VERDICTS, write_table
from cluster_accept.analysis.verdicts import Verdict, VerdictRow
from cluster_accept.checks.reasons import FindingKind, Reason, catalog, declare
from cluster_accept.ops.after_run import Operations
from cluster_accept.ops.repeats import RepeatRule, holds_for_run, read_past_verdicts
from cluster_accept.rundir.run_record import RunRecord
from cluster_accept.vocabulary.status import Status

STRAGGLER = ["gemm:straggler"]
CATALOG = catalog(
    [("gemm", declare(Reason("straggler", Status.FAIL, "slower than its peers", kind=FindingKind.RELATIVE)))]
)
RULE = RepeatRule(streak=3, share=1.0, window=6)  # the streak alone drains: three runs in a row


def _record(run_id: str, cluster: str = "c") -> dict[str, object]:
    """``run.json`` as a run writes it (the typed record's own keys)."""
    record = RunRecord(
        run_id=run_id, cluster=cluster, inventory="i.yaml", started="2026-11-01T00:00:00+00:00", stages=["preflight"]
    )
    return record.saved()


def _run(out: Path, run_id: str, verdict: str, record: bool = True) -> Path:
    """A run directory under ``out`` where ``n1`` had ``verdict`` (rejected: a straggler)."""
    run_dir = out / run_id
    run_dir.mkdir(parents=True)
    if record:
        (run_dir / "run.json").write_text(json.dumps(_record(run_id)))
    reasons = STRAGGLER if verdict == "rejected" else []
    write_table(run_dir / "verdicts.parquet", [VerdictRow(run_id, "c", "n1", "p", Verdict(verdict), reasons)], VERDICTS)
    return run_dir


def _this(out: Path, run_id: str) -> tuple[Path, list[VerdictRow]]:
    this = out / run_id
    this.mkdir()
    (this / "run.json").write_text(json.dumps(_record(run_id)))
    return this, [VerdictRow(run_id, "c", "n1", "p", Verdict.REJECTED, STRAGGLER)]


def test_a_backup_copy_of_a_run_counts_once(tmp_path: Path) -> None:
    """n1 failed in two real runs (one earlier, this one); the earlier run's directory was copied: 2 of 3, held."""
    out = tmp_path / "runs"
    earlier = _run(out, "20261101T000000Z-a", "rejected")
    shutil.copytree(earlier, out / "20261101T000000Z-a.bak")  # cp -a RUN RUN.bak
    this, verdicts = _this(out, "20261102T000000Z-b")
    held, unread = holds_for_run(this, "c", verdicts, RULE, CATALOG)
    assert held["n1"].repeats.streak == 2 and unread == ()
    records, _ = read_past_verdicts(out, this, "c", ["n1"], 5)
    assert records == [("20261101T000000Z-a", "n1", "rejected")]


def test_a_bare_directory_of_verdicts_neither_counts_nor_breaks_the_streak(tmp_path: Path) -> None:
    """Two earlier failures, and between them a directory holding only a passing verdicts.parquet: no run's, so
    this third failure in a row drains (nothing held), and the directory is named as not counted."""
    out = tmp_path / "runs"
    _run(out, "20261101T000000Z-a", "rejected")
    _run(out, "20261102T000000Z-x", "accepted", record=False)
    _run(out, "20261103T000000Z-c", "rejected")
    this, verdicts = _this(out, "20261104T000000Z-d")
    held, unread = holds_for_run(this, "c", verdicts, RULE, CATALOG)
    assert held == {}
    assert len(unread) == 1 and unread[0].startswith("20261102T000000Z-x/verdicts.parquet (not a run's: no run.json")


def test_a_run_json_that_names_no_run_and_verdicts_of_another_run_are_not_counted(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    _run(out, "20261101T000000Z-a", "rejected")
    odd = _run(out, "20261102T000000Z-x", "accepted", record=False)
    (odd / "run.json").write_text(json.dumps({"run_id": 7, "cluster": "c"}))
    other = _run(out, "20261102T000000Z-y", "accepted", record=False)  # its run.json names it, its rows run a
    (other / "run.json").write_text(json.dumps(_record("20261102T000000Z-y")))
    write_table(other / "verdicts.parquet", [VerdictRow("20261101T000000Z-a", "c", "n1", "p", Verdict.ACCEPTED, [])],
                VERDICTS)  # fmt: skip
    _run(out, "20261103T000000Z-c", "rejected")
    this, verdicts = _this(out, "20261104T000000Z-d")
    held, unread = holds_for_run(this, "c", verdicts, RULE, CATALOG)
    assert held == {}
    said = "20261102T000000Z-x/verdicts.parquet (not a run's: run.json names no run: run_id"
    assert any(u.startswith(said) for u in unread), unread
    assert (
        "20261102T000000Z-y/verdicts.parquet (rows of run '20261101T000000Z-a', not of '20261102T000000Z-y')" in unread
    )


RUNS = [f"2026110{d}T000000Z-cccccc" for d in range(1, 5)]


def _history(tmp_path: Path) -> Path:
    """Four runs: n1 rejected in the first only, n2 accepted in all."""
    history = tmp_path / "history"
    for i, run in enumerate(RUNS):
        run_dir = tmp_path / "out" / run
        run_dir.mkdir(parents=True)
        started = dt.datetime(2026, 11, int(run[7]), tzinfo=dt.timezone.utc)
        write_table(run_dir / "runs.parquet", [{"run_id": run, "cluster": "c", "started": started}], TABLES["runs"])
        tag = {"run_id": run, "cluster": "c", "profile": "p"}
        rows = [
            {
                **tag,
                "node": "n1",
                "verdict": "rejected" if i == 0 else "accepted",
                "reasons": ["x:y"] if i == 0 else [],
            },
            {**tag, "node": "n2", "verdict": "accepted", "reasons": []},
        ]
        write_table(run_dir / "verdicts.parquet", rows, TABLES["verdicts"])
        append_run(history, run_dir, run, f"2026-11-0{run[7]}")
    return history


def _lemons(history: Path) -> tuple[list[str], HistoryFiles]:
    files = HistoryFiles(history)
    fleet = read_fleet(files, "c", {}, last_runs=10, min_bad=3)
    return fleet.lemons["node"].tolist(), files


def test_a_copy_of_a_runs_history_files_under_another_name_counts_once(tmp_path: Path) -> None:
    """n1 failed once; its run's files copied under another name (the same rows inside) would make it fail
    twice, a lemon. The copies are set aside and n1 is none."""
    history = _history(tmp_path)
    for table in ("runs", "verdicts"):
        source = history / table / "date=2026-11-01" / f"{RUNS[0]}.parquet"
        shutil.copy(source, source.with_name(f"{RUNS[0]}-copy.parquet"))
    found, files = _lemons(history)
    assert found == [] and [r.run_id for r in files.cluster_runs("c")] == RUNS
    aside = sorted(p.relative_to(history / SET_ASIDE).as_posix() for p in (history / SET_ASIDE).rglob("*.parquet"))
    assert aside == [f"{t}/date=2026-11-01/{RUNS[0]}-copy.parquet" for t in ("runs", "verdicts")]
    assert any("not of run" in s.problem and "a copy" in s.problem for s in files.set_aside)


def test_a_copy_of_a_runs_history_files_in_another_partition_counts_once(tmp_path: Path) -> None:
    history = _history(tmp_path)
    for table in ("runs", "verdicts"):
        source = history / table / "date=2026-11-01" / f"{RUNS[0]}.parquet"
        target = history / table / "date=2026-10-31" / source.name  # an earlier date: it sorts first
        target.parent.mkdir()
        shutil.copy(source, target)
    found, files = _lemons(history)
    assert found == [] and files.runs[RUNS[0]].partition == "date=2026-11-01"
    aside = sorted(p.relative_to(history / SET_ASIDE).as_posix() for p in (history / SET_ASIDE).rglob("*.parquet"))
    assert aside == [f"{t}/date=2026-10-31/{RUNS[0]}.parquet" for t in ("runs", "verdicts")]


def test_the_breaker_counts_a_copied_runs_drains_once(tmp_path: Path) -> None:
    """Two earlier runs each drained a node within the window; one of them was copied (``cp -a``): two drains in
    the window, not three. A copy of this run is none of its window either."""
    out = tmp_path / "runs"
    for run_id in ("20261101T000000Z-a", "20261102T000000Z-b"):
        run_dir = _run(out, run_id, "rejected")
        drained = {"actions": [{"node": "n1", "action": "drain", "applied": True}]}
        (run_dir / "slurm.json").write_text(json.dumps(drained))
    shutil.copytree(out / "20261101T000000Z-a", out / "20261101T000000Z-a.bak")
    this, _ = _this(out, "20261103T000000Z-c")
    shutil.copytree(out / "20261102T000000Z-b", out / "20261103T000000Z-c.bak")
    (out / "20261103T000000Z-c.bak" / "run.json").write_text(json.dumps(_record("20261103T000000Z-c")))
    limits = Operations(drain=True, drain_window_h=24.0).drain_limits(this)
    assert (limits.drained_in_window, limits.unknown_in_window) == (2, ())


def test_a_runs_rows_of_one_node_count_once_among_the_lemons() -> None:
    """A verdicts file holding a node's row twice (within its run's row count) is one run of the node, not two."""
    frame = pd.DataFrame(
        [(RUNS[0], "n1", "rejected", ["x:y"]), (RUNS[0], "n1", "rejected", ["x:y"]), (RUNS[1], "n1", "accepted", [])],
        columns=["run_id", "node", "verdict", "reasons"],
    )
    assert lemons(frame, pd.DataFrame(columns=DRIFT_COLUMNS)).empty
