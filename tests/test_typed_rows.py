"""The run's typed rows against the tables they are written to: each row's ``record()`` holds exactly its table's
columns (a field the table lacks, or a column no field fills, would be lost or null at the Parquet edge), and a
row read back with ``from_record`` is the row written."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import pyarrow as pa
import pytest

import cluster_accept
from cluster_accept.analysis.history import Trend
from cluster_accept.analysis.isolation import IsolationRow
from cluster_accept.analysis.scaling import ScalingRow, TrainingScalingRow
from cluster_accept.analysis.schemas import TABLES, WATCH_TABLES
from cluster_accept.probes.burn import BurnPoint
from cluster_accept.vocabulary.codec import ShapeError, from_data, to_data
from cluster_accept.vocabulary.figures import Figure
from cluster_accept.vocabulary.rows import (
    Measurement,
    NcclFact,
    NodeRow,
    NodeValue,
    Record,
    SettingRow,
    StatusRecord,
    ValueKind,
)
from cluster_accept.vocabulary.status import Status
from cluster_accept.watch.ras_diagnostics import NcclDiagnostic
from cluster_accept.watch.words import CollectiveSeen, RankSeen, SignalCoverage, WatchFinding

FIGURE = Figure("gemm_bf16_tflops", 692.3, gpu=0, sm_clock_mhz=1980.0)
TRAINED = TrainingScalingRow(2, 16, "n[1-2]", 1e6, 62500.0, 31.0, 300.0, 0.3, 0.96, False, "NET/IB", "gpt", "r1", "c")
ROWS: dict[str, Any] = {
    "checks": NodeRow("r1", "c", "preflight", "n1", "driver", "version", Status.PASS, "ok", "580", "580"),
    "measurements": Measurement.of(FIGURE, "r1", "c", "single-node", "n1", "p"),
    "node_values": NodeValue("r1", "c", "n1", "nvlink", "gpu0.link3.crc", "4", ValueKind.COUNTER),
    "isolation": IsolationRow(0, "screen", 0, "screen", "n[1-2]", 2, 41.5, False, 30.0, "allreduce", "r1", "c"),
    "scaling": ScalingRow(2, 16, 41.5, 22.1, 177.1, 0.5, 1.0, False, "r1", "c"),
    "training_scaling": TRAINED,
    "burn": BurnPoint("r1", "c", "n1", 0, "throughput", 1.0, 692.3, "TFLOP/s"),
    "nccl": NcclFact("r1", "c", "multi-node", "n1", "allreduce", "version", "version", "2.28.9", "n[1-2]", 0),
    "settings": SettingRow("r1", "c", "single-node", "n1", "gpu_bench", "MKL_CBWR", "COMPATIBLE", "env"),
    "watch_ranks": RankSeen("j1", "n1", 3, 1, 4242, "running", 1795785364396224756, gpu=1, last_enqueued_seq=17),
    "watch_collectives": CollectiveSeen("j1", "n1", 3, "0:default_pg", "all_reduce", 17, 1795785364396224756,
                                        "flight_recorder", True, exec_ms=1.5, size_bytes=4096, gpu=1),
    "watch_coverage": SignalCoverage("j1", "n1", "inspector", False, "NCCL 2.21 has no Inspector"),
    "watch_findings": WatchFinding("j1", "compute_straggler", "n1", Status.FAIL, "arrives_last", "180 ms", "< 5 ms",
                                   "ranks 0-3", "27 of 30", rank=3, gpu=1, confirmed=True),
    "watch_nccl_diagnostics": NcclDiagnostic("j1", "n1", "NCCL environment", False,
                                             "NCCL environment: NCCL_SOCKET_IFNAME=eth1 on rank(s) {3}", "0x1234",
                                             4, "3", variable="NCCL_SOCKET_IFNAME", value="eth1", nodes="n2"),
}  # fmt: skip
ALL_TABLES = {**TABLES, **WATCH_TABLES}


# Typed rows that are no table's: a trend is read from the history's frame (its own test below); a row with a
# status is the base of the tables' rows that have one.
NOT_A_TABLE: frozenset[type[Record]] = frozenset({Trend, StatusRecord})


def _typed_rows() -> set[type[Record]]:
    """Every typed row class the package defines (each of its modules imported; the test-bed's and the
    node-side scripts aside)."""
    for module in pkgutil.walk_packages(cluster_accept.__path__, "cluster_accept."):
        parts = module.name.split(".")
        if parts[1] != "testbed" and "node" not in parts:  # node-side scripts import as the node runs them
            importlib.import_module(module.name)
    found, todo = set(), [Record]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.add(sub)
            todo.append(sub)
    return found


def test_every_typed_table_row_has_a_row_here_and_every_table_is_known() -> None:
    """A typed row added (a new table's, or a table's new row class) is held by the test below with a line in
    ``ROWS``: this fails until it has one."""
    assert _typed_rows() - NOT_A_TABLE == {type(row) for row in ROWS.values()}
    assert set(ROWS) <= set(ALL_TABLES)


@pytest.mark.parametrize("table", sorted(ROWS))
def test_a_typed_rows_record_holds_exactly_its_tables_columns_and_reads_back(table: str) -> None:
    row = ROWS[table]
    schema: pa.Schema = ALL_TABLES[table]
    assert sorted(row.record()) == sorted(schema.names)
    assert type(row).from_record(row.record()) == row
    pa.Table.from_pylist([row.record()], schema=schema)  # each value of its column's type


def test_a_node_values_kind_is_a_field_and_the_tables_key_prefix_only_at_the_edge() -> None:
    counter, mark = ROWS["node_values"], NodeValue("r1", "c", "n1", "xid", "boot_id", "b1", ValueKind.MARK)
    assert (counter.key, counter.record()["key"]) == ("gpu0.link3.crc", "counter:gpu0.link3.crc")
    assert NodeValue.from_record(mark.record()).kind is ValueKind.MARK and mark.record()["key"] == "mark:boot_id"
    compared = NodeValue.from_record({"node": "n1", "check": "driver", "key": "driver_version", "value": 580})
    assert (compared.kind, compared.value, compared.run_id) == (ValueKind.COMPARED, "580", "")


def test_a_trend_row_reads_from_the_frame_the_history_gives() -> None:
    trend = Trend("n1", "gemm_bf16_tflops", "TFLOP/s", "r1", "2026-11-01", 692.3, True)
    assert Trend.from_record({**trend.record(), "other": 1}) == trend


def test_the_codec_holds_every_member_to_its_fields_type() -> None:
    row = ROWS["isolation"]
    assert from_data(IsolationRow, to_data(row)) == row
    for key, value in (("bad", 1), ("round", True), ("round", 0.0), ("busbw_gbps", "41.5"), ("signal", None)):
        with pytest.raises(ShapeError, match=f"IsolationRow.{key}"):
            from_data(IsolationRow, {**to_data(row), key: value})
    with pytest.raises(ShapeError, match="unknown key rack"):
        from_data(IsolationRow, {**to_data(row), "rack": "a"})
    with pytest.raises(ShapeError, match="no round"):
        from_data(IsolationRow, {k: v for k, v in to_data(row).items() if k != "round"})
    assert from_data(IsolationRow, {**to_data(row), "busbw_gbps": 41}).busbw_gbps == 41.0  # an integer is a float
