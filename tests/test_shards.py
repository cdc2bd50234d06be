"""Sharded runs without Prefect: the split by label, and the shards' run directories read back and merged."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from cluster_accept.analysis.schemas import CHECKS, MEASUREMENTS, write_table
from cluster_accept.checks.base import NodeRow, Status
from cluster_accept.flows import shard_results
from cluster_accept.flows.progress import Silent
from cluster_accept.flows.shard_results import (
    drift_across_shards,
    merge_shard,
    not_finished_rows,
    read_shard,
    series_dirs,
    shard_key,
    shard_plan,
)
from cluster_accept.inventory.load import load_inventory
from cluster_accept.inventory.model import Inventory
from cluster_accept.probes import burn
from cluster_accept.rundir.checkpoints import Checkpoints
from cluster_accept.rundir.outputs import RunDir
from cluster_accept.tasks.stage import RunState, RunTables
from cluster_accept.vocabulary.rows import NodeValue, ValueKind

RECORDING = Path(__file__).resolve().parent.parent / "bench" / "sim" / "testbed-h200x4.json"


def _inventory(tmp_path: Path, nodes: str) -> Inventory:
    path = tmp_path / "racks.yaml"
    path.write_text(
        "cluster: racks\ndefaults: {profile: p}\nprofiles: {p: {gpu: {model: NVIDIA H200, count: 4}}}\n"
        f"simulation: {{recording: {RECORDING}}}\nnodes:\n{nodes}"
    )
    return load_inventory(path)


def test_nodes_split_by_their_label_value_in_key_order(tmp_path: Path) -> None:
    inventory = _inventory(
        tmp_path,
        "  - {hosts: 'gpu[01-03]', labels: {rack: 'r2'}}\n  - {hosts: 'gpu[04-05]', labels: {rack: 'r1/top'}}\n"
        "  - {hosts: gpu06, labels: {rack: 'r2'}}\nexclude: [gpu06]\n",
    )
    assert shard_plan(inventory, "rack") == {"r1-top": ["gpu04", "gpu05"], "r2": ["gpu01", "gpu02", "gpu03"]}


@pytest.mark.parametrize(
    ("nodes", "said"),
    [
        (
            "  - {hosts: 'gpu[01-02]', labels: {rack: a}}\n  - {hosts: 'gpu[03-04]'}\n",
            "--shard-by rack: nodes gpu[03-04] have no label 'rack' in the inventory",
        ),
        (
            "  - {hosts: gpu01, labels: {rack: 'a b'}}\n  - {hosts: gpu02, labels: {rack: 'a/b'}}\n",
            "--shard-by rack: values 'a b', 'a/b' would share the shard 'a-b'",
        ),
    ],
)
def test_a_split_that_cannot_run_as_asked_is_refused(tmp_path: Path, nodes: str, said: str) -> None:
    with pytest.raises(ValueError) as raised:
        shard_plan(_inventory(tmp_path, nodes), "rack")
    assert str(raised.value) == said


def test_shard_keys_are_directory_and_queue_names() -> None:
    keys = [shard_key(v) for v in ("pod-7", "row 3/rack 12", "..", "ü")]
    assert keys == ["pod-7", "row-3-rack-12", "unnamed", "unnamed"]


def _row(node: str, run_id: str, status: Status = Status.PASS, gpu: int | None = None) -> NodeRow:
    return NodeRow(run_id, "racks", "preflight", node, "driver", "version", status, "ok", "580.159.04", "580", gpu=gpu)


def _state(tmp_path: Path, inventory: Inventory) -> RunState:
    run_dir = RunDir(tmp_path / "parent", "parent-run")
    run_dir.path.mkdir(exist_ok=True)
    return RunState(run_dir, inventory, Checkpoints(run_dir.path), Silent())


def test_a_finished_shard_is_merged_under_the_parents_run_id_with_its_types_kept(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path, "  - {hosts: 'gpu[01-02]', labels: {rack: a}}\n")
    shard_dir = tmp_path / "parent" / "shards" / "a"
    (shard_dir / "burn").mkdir(parents=True)
    (shard_dir / "burn" / "gpu01.parquet").write_bytes(b"series")
    rows = [_row("gpu01", "a"), _row("gpu02", "a", Status.FAIL, gpu=3)]
    write_table(shard_dir / "checks.parquet", rows, CHECKS)
    figure = {"run_id": "a", "cluster": "racks", "node": "gpu01", "probe": "gemm", "metric": "tflops", "value": 612.5}
    write_table(shard_dir / "measurements.parquet", [figure], MEASUREMENTS)
    (shard_dir / "run.json").write_text(json.dumps({"run_id": "a", "ended": "2026-11-23T10:00:00+00:00"}))
    state = _state(tmp_path, inventory)
    found = read_shard(shard_dir)
    assert not isinstance(found, str)
    merge_shard(state, found, shard_dir)
    assert state.rows == [_row("gpu01", "parent-run"), _row("gpu02", "parent-run", Status.FAIL, gpu=3)]
    assert [(m.run_id, m.node, m.value) for m in state.measurements] == [("parent-run", "gpu01", 612.5)]
    assert state.tables == RunTables()
    assert (tmp_path / "parent" / "burn" / "gpu01.parquet").read_bytes() == b"series"


def test_every_probes_declared_series_is_merged_from_a_shard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert series_dirs() == ("burn",)  # the burn's, as its probe declares it
    assert burn.PROBE.series is not None
    other = replace(burn.PROBE, name="pcie_watch", series=replace(burn.PROBE.series, table="pcie_watch"))
    monkeypatch.setattr(shard_results, "discover", lambda: [burn.PROBE, other])
    inventory = _inventory(tmp_path, "  - {hosts: 'gpu[01-02]', labels: {rack: a}}\n")
    shard_dir = tmp_path / "parent" / "shards" / "a"
    for table in ("burn", "pcie_watch"):
        (shard_dir / table).mkdir(parents=True)
        (shard_dir / table / "gpu01.parquet").write_bytes(table.encode())
    write_table(shard_dir / "checks.parquet", [_row("gpu01", "a")], CHECKS)
    (shard_dir / "run.json").write_text(json.dumps({"run_id": "a", "ended": "2026-11-23T10:00:00+00:00"}))
    found = read_shard(shard_dir)
    assert not isinstance(found, str)
    merge_shard(_state(tmp_path, inventory), found, shard_dir)
    for table in ("burn", "pcie_watch"):
        assert (tmp_path / "parent" / table / "gpu01.parquet").read_bytes() == table.encode()


def test_a_shard_without_results_says_why_and_its_nodes_get_a_tool_row(tmp_path: Path) -> None:
    missing = read_shard(tmp_path / "nowhere")
    assert isinstance(missing, str) and missing.startswith(f"its run directory {tmp_path / 'nowhere'} is not readable")
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "run.json").write_text(json.dumps({"started": "2026-11-23T10:00:00+00:00", "ended": None}))
    assert read_shard(unfinished) == (
        f"its run {unfinished} did not end (started 2026-11-23T10:00:00+00:00, no 'ended' in run.json)"
    )
    state = _state(tmp_path, _inventory(tmp_path, "  - {hosts: 'gpu[01-02]', labels: {rack: a}}\n"))
    rows = not_finished_rows(state, ["gpu01", "gpu02"], "a", "flow run x Crashed")
    assert [(r.node, r.code, r.status, r.observed) for r in rows] == [
        ("gpu01", "tool:shard_not_finished", Status.ERROR, "flow run x Crashed"),
        ("gpu02", "tool:shard_not_finished", Status.ERROR, "flow run x Crashed"),
    ]
    assert rows[0].detail == "shard a (gpu[01-02]): flow run x Crashed" and rows[0].run_id == "parent-run"


def test_a_shard_whose_files_are_of_another_shape_says_why_instead_of_stopping_the_run(tmp_path: Path) -> None:
    shard_dir = tmp_path / "a"
    shard_dir.mkdir()
    (shard_dir / "run.json").write_text("null")
    assert read_shard(shard_dir) == f"its run.json in {shard_dir} holds a JSON NoneType, not an object"
    (shard_dir / "run.json").write_text(json.dumps({"run_id": "a", "ended": "2026-11-23T10:00:00+00:00"}))
    write_table(shard_dir / "checks.parquet", [_row("gpu01", "a")], CHECKS)
    whole = (shard_dir / "checks.parquet").read_bytes()
    (shard_dir / "checks.parquet").write_bytes(whole[: len(whole) // 2])  # cut short
    found = read_shard(shard_dir)
    said = f"its table checks.parquet in {shard_dir}: cannot be read as a Parquet file of checks ("
    assert isinstance(found, str) and found.startswith(said + "ArrowInvalid: "), found


def test_a_value_a_whole_shard_agrees_on_is_drift_only_the_parent_sees(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path, "  - {hosts: 'gpu[01-06]', labels: {rack: a}}\n")
    state = _state(tmp_path, inventory)
    drivers = {"gpu01": "580", "gpu02": "580", "gpu03": "570", "gpu04": "570", "gpu05": "570", "gpu06": "580"}
    state.values = [NodeValue("r", "c", n, "driver", "driver_version", v) for n, v in drivers.items()]
    state.values += [NodeValue("r", "c", n, "xid", "xid_79", str(i), ValueKind.COUNTER) for i, n in enumerate(drivers)]
    plan = {"a": ["gpu01", "gpu02", "gpu06"], "b": ["gpu03", "gpu04"], "c": ["gpu05"]}
    state.values.append(NodeValue("r", "c", "gpu07", "driver", "driver_version", "580"))
    rows = drift_across_shards(state, {**plan, "a": [*plan["a"], "gpu07"]})
    assert [(r.node, r.code, r.status, r.item, r.observed, r.expected, r.detail) for r in rows] == [
        ("gpu03", "shards:drift", Status.WARN, "driver.driver_version", "570", "580 (cluster majority)",
         "shard b agrees on 570"),
        ("gpu04", "shards:drift", Status.WARN, "driver.driver_version", "570", "580 (cluster majority)",
         "shard b agrees on 570"),
        ("gpu05", "shards:drift", Status.WARN, "driver.driver_version", "570", "580 (cluster majority)",
         "shard c agrees on 570"),
    ]  # fmt: skip
    assert drift_across_shards(state, {"all": [*drivers, "gpu07"]}) == []  # one shard: its own drift rows say it
