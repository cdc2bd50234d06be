"""The history dataset: appended per run, idempotent, readable by pandas and DuckDB; node trends."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import duckdb
import pandas as pd

from cluster_accept.analysis.history import append_run, key_figures, load, node_trends, past_figures
from cluster_accept.analysis.schemas import MEASUREMENTS, RUNS, VERDICTS, write_table
from cluster_accept.probes.base import discover
from cluster_accept.tasks.probe_stage import judged_rules

RULES = judged_rules(discover())  # every figure the built-in probes judge


def _figure(run: str, node: str, metric: str, value: float, gpu: int | None = None, size: int | None = None) -> dict:
    return {
        "run_id": run,
        "cluster": "c1",
        "stage": "single-node",
        "node": node,
        "profile": "p",
        "gpu": gpu,
        "metric": metric,
        "value": value,
        "unit": "TFLOP/s" if metric.startswith("gemm") else "GB/s",
        "size": size,
    }


def _write_run(root: Path, run: str, started: str, figures: list[dict]) -> Path:
    run_dir = root / run
    run_dir.mkdir(parents=True)
    write_table(run_dir / "measurements.parquet", figures, MEASUREMENTS)
    nodes = sorted({f["node"] for f in figures})
    write_table(
        run_dir / "verdicts.parquet",
        [{"run_id": run, "cluster": "c1", "node": n, "verdict": "accepted", "reasons": []} for n in nodes],
        VERDICTS,
    )
    when = dt.datetime.fromisoformat(started)
    write_table(run_dir / "runs.parquet", [{"run_id": run, "cluster": "c1", "started": when}], RUNS)
    return run_dir


def test_append_is_partitioned_by_date_idempotent_and_loads_in_pandas_and_duckdb(tmp_path: Path) -> None:
    history = tmp_path / "history"
    a = _write_run(tmp_path, "r1", "2026-11-01T10:00:00+00:00", [_figure("r1", "n1", "gemm_bf16_tflops", 700, 0)])
    b = _write_run(tmp_path, "r2", "2026-11-02T10:00:00+00:00", [_figure("r2", "n1", "gemm_bf16_tflops", 690, 0)])
    append_run(history, a, "r1", "2026-11-01")
    written = append_run(history, b, "r2", "2026-11-02")
    again = append_run(history, b, "r2", "2026-11-02")  # a resumed or repeated append replaces, never duplicates
    assert written == again
    assert sorted(p.relative_to(history).as_posix() for p in history.rglob("*.parquet")) == [
        "measurements/date=2026-11-01/r1.parquet",
        "measurements/date=2026-11-02/r2.parquet",
        "runs/date=2026-11-01/r1.parquet",
        "runs/date=2026-11-02/r2.parquet",
        "verdicts/date=2026-11-01/r1.parquet",
        "verdicts/date=2026-11-02/r2.parquet",
    ]
    frame = pd.read_parquet(history / "measurements")
    assert sorted(zip(frame.run_id, frame.value, frame.date.astype(str), strict=True)) == [
        ("r1", 700.0, "2026-11-01"),
        ("r2", 690.0, "2026-11-02"),
    ]
    glob = str(history / "measurements" / "*" / "*.parquet")
    rows = duckdb.sql(
        f"SELECT run_id, value, CAST(date AS VARCHAR) FROM read_parquet('{glob}', hive_partitioning=true) ORDER BY 1"
    ).fetchall()
    assert rows == [("r1", 700.0, "2026-11-01"), ("r2", 690.0, "2026-11-02")]
    assert list(load(history, "measurements").run_id) == ["r1", "r2"]
    assert load(history, "measurements", cluster="other").empty


def test_load_of_an_empty_history_has_the_schema_columns(tmp_path: Path) -> None:
    frame = load(tmp_path / "nothing", "verdicts")
    assert frame.empty and list(frame.columns) == [*VERDICTS.names, "date"]


def test_key_figures_take_the_median_gpu_and_the_largest_all_reduce() -> None:
    figures = pd.DataFrame(
        [_figure("r1", "n1", "gemm_bf16_tflops", v, gpu) for gpu, v in enumerate([700, 650, 710])]
        + [_figure("r1", "n1", "allreduce_busbw_gbps", v, None, s) for s, v in [(1 << 20, 50), (1 << 30, 360)]]
        + [{**_figure("r1", "n1", "allreduce_busbw_gbps", 40, None, 1 << 30), "stage": "multi-node"}]
    )
    got = key_figures(figures, RULES).sort_values("metric").to_dict("records")
    assert got == [
        {"run_id": "r1", "node": "n1", "metric": "allreduce_busbw_gbps", "unit": "GB/s", "model": "", "value": 360.0},
        {"run_id": "r1", "node": "n1", "metric": "gemm_bf16_tflops", "unit": "TFLOP/s", "model": "", "value": 700.0},
    ]


def test_a_training_figure_is_compared_only_with_the_same_models_history() -> None:
    from cluster_accept.analysis.probe_verdicts import MetricRule
    from cluster_accept.analysis.regressions import figure_regressions
    from cluster_accept.inventory.model import Thresholds

    rules = {"training_tokens_per_s_per_gpu": MetricRule("training", None, False)}

    def figure(run: str, model: str, value: float) -> dict[str, object]:
        return {**_figure(run, "n1", "training_tokens_per_s_per_gpu", value, None), "model": model, "unit": "tokens/s"}

    light = [figure(f"r{i}", "gpt 125.2M", 324_000.0) for i in range(3)]
    past = key_figures(pd.DataFrame(light), rules)
    current = key_figures(pd.DataFrame([figure("now", "gpt 355.7M", 150_000.0)]), rules)
    assert figure_regressions(current, past, {"n1": Thresholds()}, rules) == []  # no 355.7M history yet
    slow = key_figures(pd.DataFrame([figure("now", "gpt 125.2M", 150_000.0)]), rules)
    found = figure_regressions(slow, past, {"n1": Thresholds()}, rules)
    assert [(n, r.reason) for n, r in found] == [("n1", "regression")]


def test_node_trends_hold_the_last_k_past_runs_and_the_current_one(tmp_path: Path) -> None:
    history = tmp_path / "history"
    for day, value in [(1, 700.0), (2, 705.0), (3, 698.0)]:
        run = f"r{day}"
        run_dir = _write_run(
            tmp_path, run, f"2026-11-0{day}T10:00:00+00:00", [_figure(run, "n1", "gemm_bf16_tflops", value, 0)]
        )
        append_run(history, run_dir, run, f"2026-11-0{day}")
    current = pd.DataFrame(
        [_figure("r4", "n1", "gemm_bf16_tflops", 600.0, 0), _figure("r4", "n2", "gemm_bf16_tflops", 1, 0)]
    )
    trends = node_trends(past_figures(history, "c1", RULES, exclude_run="r4"), current, ["n1"], RULES, last_k=2)
    assert list(zip(trends.run_id, trends.value, trends.current, strict=True)) == [
        ("r2", 705.0, False),
        ("r3", 698.0, False),
        ("r4", 600.0, True),
    ]
    assert node_trends(past_figures(tmp_path / "empty", "c1", RULES), pd.DataFrame(), ["n1"], RULES).empty


def test_docs_data_md_documents_every_column_of_every_table() -> None:
    from cluster_accept.analysis.schemas import TABLES

    doc = (Path(__file__).resolve().parent.parent / "docs" / "data.md").read_text()
    for table, schema in TABLES.items():
        assert f"## {table}\n" in doc, f"docs/data.md has no section for {table}"
        section = doc.split(f"## {table}\n", 1)[1].split("\n## ", 1)[0]
        missing = [name for name in schema.names if f"`{name}`" not in section]
        assert not missing, f"docs/data.md, section {table}, does not document {missing}"


def test_every_table_is_written_with_its_schema_name_and_version(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from cluster_accept.analysis.schemas import SCHEMA_VERSION, TABLES

    for name, schema in TABLES.items():
        path = write_table(tmp_path / f"{name}.parquet", [], schema)
        written = pq.read_schema(path)
        assert written.metadata[b"cluster_accept_schema"] == name.encode()
        assert written.metadata[b"version"] == SCHEMA_VERSION.encode()
        assert written.names == schema.names
