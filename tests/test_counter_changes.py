"""Error counters compared with the node's previous run (the preflight's counter comparison): a counter that
went down was cleared in between, one held at its ceiling stopped counting, a value no counter holds is no count;
none of them reads as "it did not grow". And which earlier run each node's counters and marks come from."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pandas as pd

import cluster_accept.checks.pcie_aer as aer
from cluster_accept.analysis.history import RunHistory, append_run, past_node_values
from cluster_accept.analysis.regressions import counter_growth
from cluster_accept.analysis.schemas import TABLES, write_table
from cluster_accept.checks.base import Status
from cluster_accept.checks.reasons import COMMON
from cluster_accept.tasks.preflight.stage import earlier, previous_values

U32, U64 = 2**32 - 1, 2**64 - 1


def _changes(before: str, now: str, key: str = "roce_qos.counter:mlx5_0/1.out_of_sequence") -> list[tuple[Any, ...]]:
    found = counter_growth({"n1": {key: now}}, {"n1": {key: before}})
    return [(node, r.check, r.item, r.status, r.reason, r.observed, r.expected, r.detail) for node, r in found]


def test_a_counter_that_went_down_was_cleared_and_cannot_tell_whether_it_grew() -> None:
    assert _changes("4", "2", "ib_counters.counter:mlx5_1/1.link_downed") == [
        ("n1", "ib_counters", "counter:mlx5_1/1.link_downed", Status.WARN, "counter_reset", "2", ">= 4",
         "mlx5_1/1.link_downed went down from 4 to 2 since the previous run: it was cleared since (a reboot, a "
         "driver reload, a counter reset), so whether it grew before the clear cannot be told"),
    ]  # fmt: skip
    assert COMMON["counter_reset"].severity is Status.WARN


def test_a_counter_held_at_a_32_or_64_bit_ceiling_cannot_tell_whether_it_grew() -> None:
    assert _changes(str(U32), str(U32)) == [
        ("n1", "roce_qos", "counter:mlx5_0/1.out_of_sequence", Status.WARN, "counter_saturated", str(U32),
         f"< {U32}", f"mlx5_0/1.out_of_sequence reads {U32} at both runs, the most a 32-bit counter holds: it "
         "stopped counting there, so whether it grew cannot be told until it is cleared"),
    ]  # fmt: skip
    assert [c[4:7] for c in _changes(str(U64), str(U64))] == [("counter_saturated", str(U64), f"< {U64}")]
    assert [c[4:6] for c in _changes(str(U32 - 1), str(U32))] == [("counter_grew", str(U32))]  # it grew: said so
    assert _changes("255", "255") + _changes("0", "0") == []  # a wide counter at 255 has simply stayed


def test_a_value_no_counter_holds_is_named_not_skipped() -> None:
    for before, now in (("9", "-3"), ("abc", "7"), (str(U64 + 1), str(U64 + 1)), ("5", "²")):
        ((*_, status, reason, _observed, expected, detail),) = _changes(before, now)
        assert (status, reason, expected) == (Status.WARN, "counter_impossible", "a count"), (before, now)
        assert detail.startswith(f"mlx5_0/1.out_of_sequence read {before!r} at the previous run and {now!r} now: ")
    assert _changes("1" * 5000, "3")[0][7].count("1") < 100  # a huge value from the history is quoted cut


def test_each_check_compares_with_the_latest_earlier_run_that_recorded_it() -> None:
    rows = [
        ("20260101T000000Z-aaaaaa", "n1", "ib_counters", "mark:mlx5_0/1.last_flap_at_s", "1767225600"),
        ("20260101T000000Z-aaaaaa", "n1", "nvlink", "counter:gpu0.link0.crc", "1"),
        ("20260102T000000Z-bbbbbb", "n1", "nvlink", "counter:gpu0.link0.crc", "2"),  # ib_counters errored here
        ("20260110T000000Z-cccccc", "n1", "nvlink", "counter:gpu0.link0.crc", "7"),  # after this run: not its past
    ]
    past = pd.DataFrame(rows, columns=["run_id", "node", "check", "key", "value"])
    state = SimpleNamespace(history=SimpleNamespace(node_values=past), run_id="20260105T000000Z-dddddd")
    found = sorted((r.run_id, r.check, r.value) for r in previous_values(cast(Any, state)))
    assert found == [
        ("20260101T000000Z-aaaaaa", "ib_counters", "1767225600"),  # the flap is still known
        ("20260102T000000Z-bbbbbb", "nvlink", "2"),
    ]
    shard = SimpleNamespace(history=state.history, run_id="rack01")  # a shard's run, named by its key: now
    assert {r.run_id for r in previous_values(cast(Any, shard))} == {"20260110T000000Z-cccccc",
                                                                       "20260101T000000Z-aaaaaa"}  # fmt: skip
    assert list(earlier(pd.Series(["29991231T000000Z-ffffff", "r1"]), "rack01")) == [False, False]


def test_a_64_bit_aer_count_is_read_and_compared_not_dropped() -> None:
    device = "D|0000:00:06.0|0x030200|16|16|32.0 GT/s PCIe|32.0 GT/s PCIe\n"
    counted = [aer.counters(aer.parse(f"{device}A|0000:00:06.0|correctable|TOTAL_ERR_COR|{n}\n### end\n", 0))
               for n in (U64, U64)]  # fmt: skip
    assert counted[0] == {"0000:00:06.0.aer_correctable": U64}
    keyed = [{f"pcie_aer.counter:{k}": str(v) for k, v in c.items()} for c in counted]
    assert [r.reason for _, r in counter_growth({"n1": keyed[1]}, {"n1": keyed[0]})] == ["counter_saturated"]


def test_runs_started_after_this_one_never_hide_its_past(tmp_path: Path) -> None:
    """A resumed run (or one after a controller's clock ran fast) has later runs in the history: its past is the
    latest runs that started before it, not the latest two of all."""
    history = tmp_path / "history"
    runs = ["20261101T000000Z-aaaaaa", "20261103T000000Z-aaaaaa", "20261104T000000Z-aaaaaa"]
    for day, run in zip((1, 3, 4), runs, strict=True):
        run_dir = tmp_path / "runs" / run
        run_dir.mkdir(parents=True)
        started = dt.datetime(2026, 11, day, tzinfo=dt.timezone.utc)
        row = {"run_id": run, "cluster": "c", "started": started, "nodes_tested": 1, "skipped": 0}
        write_table(run_dir / "runs.parquet", [row], TABLES["runs"])
        mark = {"run_id": run, "cluster": "c", "node": "n1", "check": "ib_counters",
                "key": "mark:mlx5_0/1.last_flap_at_s", "value": str(day)}  # fmt: skip
        write_table(run_dir / "node_values.parquet", [mark], TABLES["node_values"])
        append_run(history, run_dir, run, f"2026-11-0{day}")
    this = "20261102T000000Z-bbbbbb"  # started before the two latest
    past = past_node_values(history, "c", exclude_run=this)
    assert past["run_id"].tolist() == [runs[0]]
    state = SimpleNamespace(history=RunHistory(history, "c", this, {}), run_id=this)
    assert [(r.run_id, r.value) for r in previous_values(cast(Any, state))] == [(runs[0], "1")]
