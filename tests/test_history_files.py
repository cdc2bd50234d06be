"""One bad file never stops a reader of the history: a file cut short, of another schema or holding more rows than
its run can have is skipped with a warning naming it and the problem, and set aside under HISTORY/_set_aside/
(never deleted); the rest of the history is read as before, and what is held stays bounded by the rows needed."""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cluster_accept.analysis.fleet import read_fleet
from cluster_accept.analysis.history import append_run, load, past_figures
from cluster_accept.analysis.probe_verdicts import MetricRule
from cluster_accept.analysis.schemas import TABLES, write_table
from tests.processes import run_cli

# The readers' entry points (read_fleet, load, past_figures, the CLI) are those of before; the modules that hold a
# file to its table (analysis.history_files, analysis.table_files) are imported by the tests that name them.

RUNS = [f"2026110{d}T000000Z-aaaaaa" for d in range(1, 6)]  # five runs, oldest first
NODES = ["node01", "node02"]
RULES = {"gemm_bf16_tflops": MetricRule("gemm", "gemm_bf16_tflops_min", True)}
LOGGER = "cluster_accept.analysis.history_files"
SET_ASIDE = "_set_aside"  # history_files.SET_ASIDE


def _tables(run: str, day: int) -> dict[str, list[dict[str, object]]]:
    """One run's rows of every table the history's readers read: node02 rejected in every run."""
    tag = {"run_id": run, "cluster": "c"}
    started = dt.datetime(2026, 11, day, tzinfo=dt.timezone.utc)
    bad = {"node02"}
    return {
        "runs": [{**tag, "started": started, "nodes_tested": len(NODES), "skipped": 0}],
        "verdicts": [
            {
                **tag,
                "node": n,
                "profile": "p",
                "verdict": "rejected" if n in bad else "accepted",
                "reasons": ["nvlink:inactive"] if n in bad else [],
            }
            for n in NODES
        ],  # fmt: skip
        "checks": [
            {
                **tag,
                "stage": "preflight",
                "node": n,
                "check": "nvlink",
                "item": "",
                "status": "fail" if n in bad else "pass",
                "reason": "inactive" if n in bad else "ok",
            }
            for n in NODES
        ],  # fmt: skip
        "node_values": [
            {**tag, "node": n, "check": "nvlink", "key": key, "value": str(day)}
            for n in NODES
            for key in ("driver_version", "counter:gpu0.link0.crc", "mark:boot_id")
        ],
        "measurements": [
            {
                **tag,
                "stage": "single-node",
                "node": n,
                "gpu": 0,
                "metric": "gemm_bf16_tflops",
                "value": 700.0 + day,
                "unit": "TFLOP/s",
            }
            for n in NODES
        ],  # fmt: skip
    }


def _history(tmp_path: Path) -> Path:
    """Five runs of two nodes, each appended as a run appends its tables."""
    history = tmp_path / "history"
    for day, run in enumerate(RUNS, start=1):
        run_dir = tmp_path / "runs" / run
        run_dir.mkdir(parents=True)
        for table, rows in _tables(run, day).items():
            write_table(run_dir / f"{table}.parquet", rows, TABLES[table])
        append_run(history, run_dir, run, f"2026-11-0{day}")
    return history


def _file(history: Path, table: str, run: str) -> Path:
    return next((history / table).glob(f"date=*/{run}.parquet"))


def _cut(path: Path) -> None:
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])


def _aside(history: Path, path: Path) -> Path:
    return history / SET_ASIDE / path.relative_to(history)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def test_a_history_file_cut_short_is_skipped_named_and_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    history = _history(tmp_path)
    cut = _file(history, "checks", RUNS[1])
    _cut(cut)
    kept = cut.read_bytes()
    caplog.set_level(logging.WARNING, LOGGER)
    fleet = read_fleet(history, "c", RULES, last_runs=5, min_bad=3)
    assert fleet.runs == 5
    assert fleet.offenders[["node", "not_accepted", "runs"]].values.tolist() == [["node02", 5, 5]]
    [said] = _warnings(caplog)
    assert said.startswith(
        f"history file {cut} skipped: cannot be read as a Parquet file of checks (ArrowInvalid: Parquet magic bytes "
        "not found in footer."
    )
    assert said.endswith(f"; moved to {_aside(history, cut)}")
    assert not cut.exists() and _aside(history, cut).read_bytes() == kept  # moved as it was, never deleted
    why = _aside(history, cut).with_name(cut.name + ".why").read_text().splitlines()
    assert why[0].startswith("cannot be read as a Parquet file of checks (ArrowInvalid: ")
    assert why[1].startswith("set aside at ") and why[1].endswith(f" from {cut}")
    caplog.clear()
    assert read_fleet(history, "c", RULES, last_runs=5).runs == 5 and _warnings(caplog) == []  # aside: not met again


def test_a_history_file_of_another_schema_is_skipped_naming_the_problem(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A measurements file whose run ids are numbers stopped the fleet with ``TypeError: '<' not supported``."""
    history = _history(tmp_path)
    other = _file(history, "measurements", RUNS[2])
    figure = {"run_id": [20261103], "cluster": ["c"], "stage": ["single-node"], "node": ["node02"],
              "metric": ["gemm_bf16_tflops"], "value": [703.0], "unit": ["TFLOP/s"]}  # fmt: skip
    pq.write_table(pa.table(figure), other)
    caplog.set_level(logging.WARNING, LOGGER)
    fleet = read_fleet(history, "c", RULES, last_runs=5, min_bad=3)
    assert fleet.offenders[["node", "not_accepted", "runs"]].values.tolist() == [["node02", 5, 5]]
    assert _warnings(caplog) == [
        f"history file {other} skipped: another schema: run_id holds an integer, not text; "
        f"moved to {_aside(history, other)}"
    ]
    assert _aside(history, other).is_file() and not other.exists()
    assert past_figures(history, "c", RULES)["run_id"].drop_duplicates().tolist() == [*RUNS[:2], *RUNS[3:]]


def test_a_file_with_more_rows_than_its_run_can_have_is_set_aside_before_it_is_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The runs' row says two nodes: at most two verdicts and 40,000 checks (20,000 a node); a file of a few KB
    can hold millions of identical rows, each an object once read."""
    history = _history(tmp_path)
    checks, verdicts = _file(history, "checks", RUNS[3]), _file(history, "verdicts", RUNS[4])
    for path, rows in ((checks, 40_001), (verdicts, 3)):
        first = pq.read_table(path).slice(0, 1)
        pq.write_table(first.take(pa.array([0] * rows)), path, compression="zstd")
    caplog.set_level(logging.WARNING, LOGGER)
    fleet = read_fleet(history, "c", RULES, last_runs=5, min_bad=3)
    assert fleet.offenders[["node", "not_accepted", "runs"]].values.tolist() == [["node02", 4, 4]]
    assert _warnings(caplog) == [
        f"history file {verdicts} skipped: 3 rows, more than its run can have (2); "
        f"moved to {_aside(history, verdicts)}",
        f"history file {checks} skipped: 40,001 rows, more than its run can have (40,000); "
        f"moved to {_aside(history, checks)}",
    ]


def test_a_run_whose_row_cannot_be_read_is_set_aside_whole(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    history = _history(tmp_path)
    row = _file(history, "runs", RUNS[0])
    _cut(row)
    caplog.set_level(logging.WARNING, LOGGER)
    assert read_fleet(history, "c", RULES).runs == 4
    said = _warnings(caplog)
    assert said[0].startswith(f"history file {row} skipped: cannot be read as a Parquet file of runs (ArrowInvalid: ")
    moved = sorted(p.relative_to(history / SET_ASIDE).as_posix() for p in (history / SET_ASIDE).rglob("*.parquet"))
    assert moved == [f"{t}/date=2026-11-01/{RUNS[0]}.parquet" for t in ("checks", "measurements", "node_values",
                                                                          "runs", "verdicts")]  # fmt: skip
    assert said[1:] == [
        f"history file {history / t / 'date=2026-11-01' / row.name} skipped: its run's row ({row.name} in runs) was "
        f"set aside; moved to {history / SET_ASIDE / t / 'date=2026-11-01' / row.name}"
        for t in ("checks", "measurements", "node_values", "verdicts")
    ]


def test_files_of_no_recorded_run_and_of_another_version_are_skipped_and_left(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    history = _history(tmp_path)
    orphan = history / "verdicts" / "date=2026-10-01" / "20261001T000000Z-ffffff.parquet"
    orphan.parent.mkdir()
    write_table(orphan, [{"run_id": "20261001T000000Z-ffffff", "cluster": "c", "node": "node02"}], TABLES["verdicts"])
    newer = _file(history, "verdicts", RUNS[0])
    schema = TABLES["verdicts"].with_metadata({"cluster_accept_schema": "verdicts", "version": "2"})
    pq.write_table(pq.read_table(newer).cast(schema), newer)
    caplog.set_level(logging.WARNING, LOGGER)
    assert load(history, "verdicts", "c")["run_id"].drop_duplicates().tolist() == RUNS[1:]
    assert _warnings(caplog) == [
        f"history file {orphan} skipped: no row for run '20261001T000000Z-ffffff' in {history / 'runs'}; left where "
        "it is (its run has no row to read it by)",
        f"history file {newer} skipped: written with schema version '2', this version reads '1'; left where it is "
        "for the version that wrote it",
    ]
    assert orphan.is_file() and newer.is_file() and not (history / SET_ASIDE).exists()


def test_a_file_that_cannot_be_moved_aside_is_skipped_in_place(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cluster_accept.analysis import history_files

    history = _history(tmp_path)
    cut = _file(history, "measurements", RUNS[4])
    _cut(cut)

    def read_only(root: Path, path: Path, problem: str) -> Path:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(history_files, "move_aside", read_only)
    caplog.set_level(logging.WARNING, LOGGER)
    past = past_figures(history, "c", RULES)
    assert past["run_id"].drop_duplicates().tolist() == RUNS[:4]
    [said] = _warnings(caplog)
    assert said.endswith(f"; left where it is (it could not be moved aside: [Errno 13] Permission denied: '{cut}')")
    assert cut.is_file()


def test_a_nodes_past_is_read_one_run_at_a_time_and_kept_to_what_is_compared(tmp_path: Path) -> None:
    """Figures: each node's last K; counters and marks: each node's and check's latest two runs, nothing else."""
    from cluster_accept.analysis.history import past_node_values

    history = _history(tmp_path)
    past = past_figures(history, "c", RULES, exclude_run=RUNS[4], last_k=2)
    assert past[["run_id", "node", "value"]].values.tolist() == [
        [RUNS[2], "node01", 703.0], [RUNS[2], "node02", 703.0], [RUNS[3], "node01", 704.0], [RUNS[3], "node02", 704.0]
    ]  # fmt: skip
    values = past_node_values(history, "c", exclude_run=RUNS[4])
    assert sorted(set(zip(values["run_id"], values["key"], strict=True))) == [
        (run, key) for run in RUNS[2:4] for key in ("counter:gpu0.link0.crc", "mark:boot_id")
    ]


def test_a_table_file_is_held_to_its_schema_from_its_footer(tmp_path: Path) -> None:
    from cluster_accept.analysis.table_files import UnfitTable, read_table_file, schema_problem

    verdicts = TABLES["verdicts"]
    assert schema_problem(verdicts, "verdicts") is None
    assert schema_problem(TABLES["checks"], "verdicts") == "another schema: it holds the 'checks' table, not verdicts"
    assert schema_problem(pa.schema([("node", pa.string())]), "verdicts") == "another schema: no run_id column"
    twice = pa.schema([("run_id", pa.string()), ("run_id", pa.string())])
    assert schema_problem(twice, "verdicts") == "another schema: columns named twice: run_id"
    wide = pa.schema([("run_id", pa.large_string()), ("nodes_tested", pa.int64()), ("started", pa.timestamp("ns"))])
    assert schema_problem(wide, "runs") is None  # stored wider: read back as this version's types
    path = tmp_path / "runs.parquet"
    pq.write_table(pa.table({"run_id": ["r1"], "nodes_tested": [4]}, schema=wide.remove(2)), path)
    read = read_table_file(path, "runs", ["run_id", "nodes_tested", "skipped"], max_rows=1)
    assert read.schema.types == [pa.string(), pa.int32(), pa.int32()]
    assert read.to_pylist() == [{"run_id": "r1", "nodes_tested": 4, "skipped": None}]  # added later: null
    assert read_table_file(path, "runs").column_names == ["run_id", "nodes_tested"]  # by default the file's own
    pq.write_table(pa.table({"run_id": ["r1"], "nodes_tested": [2**40]}), path)
    with pytest.raises(UnfitTable, match=r"cannot be read as a Parquet file of runs \(ArrowInvalid: Integer value"):
        read_table_file(path, "runs")  # too wide for its column


def _local_inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text("cluster: c\ndefaults: {profile: p}\nnodes: [{hosts: here, address: local}]\nprofiles: {p: {}}\n")
    return path


def _spoil(history: Path) -> tuple[Path, Path]:
    """A history of earlier runs of cluster c, with one file cut short and one of another schema."""
    cut, other = _file(history, "node_values", RUNS[3]), _file(history, "verdicts", RUNS[4])
    _cut(cut)
    pq.write_table(pa.table({"run_id": [RUNS[4]], "cluster": ["c"], "node": ["here"], "verdict": [1]}), other)
    return cut, other


def _finished_despite(out: Path, said: str, cut: Path, other: Path) -> dict[str, object]:
    """The run's files are all there, both bad files were named and set aside; the run's run.json."""
    history = out / "history"
    for path, problem in ((cut, "cannot be read as a Parquet file of node_values"),
                          (other, "another schema: verdict holds an integer, not text")):  # fmt: skip
        assert f"history file {path} skipped: {problem}" in " ".join(said.split()), said
        assert _aside(history, path).is_file() and not path.exists()
    [run_dir] = [p for p in out.iterdir() if (p / "run.json").is_file()]
    assert {"verdicts.parquet", "runs.parquet", "report.html", "report.md"} <= {p.name for p in run_dir.iterdir()}
    info = json.loads((run_dir / "run.json").read_text())
    assert info["ended"] and {s["file"] for s in info["history_set_aside"]} == {str(cut), str(other)}
    assert {p.stem for p in (history / "verdicts").rglob("*.parquet")} == {*RUNS[:4], run_dir.name}
    return info


@pytest.mark.integration
def test_a_run_over_a_history_with_bad_files_finishes_and_sets_them_aside(tmp_path: Path) -> None:
    """Before, the run exited 3 after checking the nodes (no verdicts, no report, no summary)."""
    out = tmp_path / "out"
    cut, other = _spoil(_history(out))
    proc = run_cli("run", "--inventory", str(_local_inventory(tmp_path)), "--out", str(out), "--stages", "preflight")
    said = proc.stdout + proc.stderr
    assert proc.returncode == 1, said  # this machine is no GPU node: rejected, judged
    assert "accepted 0 / rejected 1 / unreachable 0 / skipped 0" in said
    _finished_despite(out, said, cut, other)


@pytest.mark.integration
def test_a_resumed_run_over_a_history_with_bad_files_finishes(tmp_path: Path) -> None:
    from tests.test_exit_codes import interrupted_run

    out = tmp_path / "out"
    cut, other = _spoil(_history(out))
    run_dir = interrupted_run(out, _local_inventory(tmp_path), "20261106T000000Z-bbbbbb")
    info = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**info, "started": "2026-11-06T00:00:00+00:00"}))
    proc = run_cli("run", "--resume", run_dir.name, "--out", str(out))
    said = proc.stdout + proc.stderr
    assert proc.returncode == 1, said
    assert _finished_despite(out, said, cut, other)["resumed"]


def test_a_shard_table_with_more_rows_than_its_nodes_can_have_is_refused_naming_it(tmp_path: Path) -> None:
    """A sharded run's parent reads each shard's tables back: the same bound and schema hold there, and the shard's
    nodes get a row saying why instead of the parent holding millions of rows."""
    from cluster_accept.flows.shard_results import read_shard

    shard_dir = tmp_path / "a"
    shard_dir.mkdir()
    info = {"run_id": "a", "ended": "2026-11-23T10:00:00+00:00", "nodes_tested": ["gpu01"]}
    (shard_dir / "run.json").write_text(json.dumps(info))
    row = {"run_id": "a", "cluster": "c", "stage": "preflight", "node": "gpu01", "check": "driver", "item": "",
           "status": "pass", "reason": "ok"}  # fmt: skip
    path = write_table(shard_dir / "checks.parquet", [row], TABLES["checks"])
    pq.write_table(pq.read_table(path).take(pa.array([0] * 20_001)), path, compression="zstd")
    assert read_shard(shard_dir) == (
        f"its table checks.parquet in {shard_dir}: 20,001 rows, more than its run can have (20,000)"
    )
    write_table(path, [row], TABLES["checks"])
    measured = {"run_id": ["a"], "cluster": ["c"], "node": ["gpu01"], "metric": ["gemm"], "value": ["fast"]}
    pq.write_table(pa.table(measured), shard_dir / "measurements.parquet")
    assert read_shard(shard_dir) == (
        f"its table measurements.parquet in {shard_dir}: another schema: value holds text, not a number"
    )


def test_a_file_of_a_newer_schema_version_is_left_where_it_is_even_where_a_column_changed_type(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its schema is its own version's to judge: a later version storing ``value`` as text is not another schema."""
    history = _history(tmp_path)
    newer = _file(history, "measurements", RUNS[4])
    table = pq.read_table(newer)
    table = table.set_column(table.column_names.index("value"), "value", pa.array(["705.0", "705.0"]))
    pq.write_table(table.replace_schema_metadata({"cluster_accept_schema": "measurements", "version": "2"}), newer)
    kept = newer.read_bytes()
    caplog.set_level(logging.WARNING, LOGGER)
    assert past_figures(history, "c", RULES)["run_id"].drop_duplicates().tolist() == RUNS[:4]
    assert _warnings(caplog) == [
        f"history file {newer} skipped: written with schema version '2', this version reads '1'; left where it is "
        "for the version that wrote it"
    ]
    assert newer.read_bytes() == kept and not (history / SET_ASIDE).exists()


def test_a_file_whose_footer_says_it_unpacks_past_the_budget_is_set_aside_before_it_is_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runs' row claims 100 nodes (2,000,000 rows a table): the rows are plausible, what they unpack to is not.
    What one file may take is a constant, whatever the row says (here 100,000 bytes)."""
    from cluster_accept.analysis import table_files

    history = _history(tmp_path)
    row = _file(history, "runs", RUNS[4])
    runs = pq.read_table(row)
    pq.write_table(runs.set_column(runs.column_names.index("nodes_tested"), "nodes_tested", pa.array([100])), row)
    path = _file(history, "measurements", RUNS[4])
    pq.write_table(pq.read_table(path).slice(0, 1).take(pa.array([0] * 5_000)), path, compression="zstd")
    monkeypatch.setattr(table_files, "FILE_BUDGET_BYTES", 100_000, raising=False)
    monkeypatch.setattr(table_files, "ROW_BUDGET_BYTES", 0, raising=False)
    read_rows: list[int] = []  # the row count of each file whose columns were read
    real_read = pq.ParquetFile.read

    def read(self: pq.ParquetFile, *args: object, **kwargs: object) -> pa.Table:
        read_rows.append(self.metadata.num_rows)
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read", read)
    caplog.set_level(logging.WARNING, LOGGER)
    assert past_figures(history, "c", RULES)["run_id"].drop_duplicates().tolist() == RUNS[:4]
    [said] = _warnings(caplog)
    assert said.startswith(f"history file {path} skipped: it unpacks to ")  # 5,000 rows x 9 values x 64 bytes and more
    assert said.endswith(f" bytes, more than a file may take here (100,000); moved to {_aside(history, path)}")
    assert int(said.split("it unpacks to ")[1].split(" bytes")[0].replace(",", "")) > 5_000 * 9 * 64
    assert 5_000 not in read_rows and read_rows.count(2) == 4  # the four other runs' measurements, never this file


def test_appending_a_run_never_writes_through_a_link_planted_in_the_history(tmp_path: Path) -> None:
    """The history may be shared: a link planted at a fixed temporary name (``<run>.parquet.tmp``) is never
    followed; the link's target stays as it was."""
    history = _history(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("theirs\n")
    target = _file(history, "checks", RUNS[4])
    target.with_name(target.name + ".tmp").symlink_to(victim)
    assert target in append_run(history, tmp_path / "runs" / RUNS[4], RUNS[4], "2026-11-05")
    assert victim.read_bytes() == b"theirs\n"
    assert target.read_bytes() == (tmp_path / "runs" / RUNS[4] / "checks.parquet").read_bytes()


def test_setting_a_file_aside_never_writes_its_why_through_a_link_planted_in_the_history(tmp_path: Path) -> None:
    """A dangling link planted at ``<file>.why`` (the name looks free) is never written through."""
    from cluster_accept.analysis.history_files import move_aside

    history = _history(tmp_path)
    absent, target = tmp_path / "absent", _file(history, "checks", RUNS[4])
    aside = _aside(history, target)
    aside.parent.mkdir(parents=True)
    aside.with_name(aside.name + ".why").symlink_to(absent)
    moved = move_aside(history, target, "cut short")
    assert not absent.exists()
    assert moved.is_file() and moved.with_name(moved.name + ".why").read_text().startswith("cut short\nset aside at ")
