"""The InfiniBand error-counter check: its command over a sysfs tree shaped as the kernel's ABI documents it
(the captured machines have no HCA), the counters of two ports with exact values, growth since the previous run,
and broken outputs."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

import cluster_accept.checks.ib_counters as ibc
from cluster_accept.analysis.regressions import counter_growth
from cluster_accept.analysis.verdicts import marks_by_node
from cluster_accept.checks.base import Status
from cluster_accept.checks.samples import SAMPLES_DIR
from cluster_accept.inventory.model import Profile
from cluster_accept.remote.result import NodeResult, NodeStatus
from cluster_accept.tasks.preflight.check_batch import NodePreflight
from cluster_accept.tasks.preflight.evaluate import node_values, since_previous
from cluster_accept.vocabulary.rows import NodeValue
from tests.capture import NO_CLUSTER

TWO_PORTS = (SAMPLES_DIR / "ib_counters" / "two_ports.txt").read_text()


def rows_of(text: str) -> list[tuple[str, Status, str, str | None]]:
    return [(r.item, r.status, r.reason, r.observed) for r in ibc.evaluate(ibc.parse(text), Profile(), NO_CLUSTER)]


def test_two_ports_parse_with_every_counter_and_the_one_with_errors_is_named() -> None:
    model = ibc.parse(TWO_PORTS)
    assert model.error is None and [p.name for p in model.ports] == ["mlx5_0/1", "mlx5_1/1"]
    assert len(model.ports[0].values) == 11 and len(model.ports[1].values) == 12  # a counter the port lacks is left out
    assert rows_of(TWO_PORTS) == [
        ("mlx5_0/1", Status.PASS, "ok", "0"),
        ("mlx5_0/1 flaps", Status.PASS, "first_reading", "link_downed 0"),  # no previous run: nothing to compare
        ("mlx5_1/1", Status.WARN, "errors_since_reset", "link_downed 1, link_error_recovery 1, symbol_error 3"),
        ("mlx5_1/1 flaps", Status.PASS, "first_reading", "link_downed 1"),
    ]
    counters = ibc.counters(model)
    assert counters["mlx5_1/1.symbol_error"] == 3 and counters["mlx5_0/1.link_downed"] == 0 and len(counters) == 23


def test_a_counter_that_grew_since_the_previous_run_is_flagged_on_its_port() -> None:
    before = {f"ib_counters.counter:{k}": str(v) for k, v in ibc.counters(ibc.parse(TWO_PORTS)).items()}
    now = dict(before, **{"ib_counters.counter:mlx5_0/1.symbol_error": "41"})
    found = counter_growth({"n1": now}, {"n1": before})
    assert [(n, r.check, r.item, r.reason, r.observed, r.expected) for n, r in found] == [
        ("n1", "ib_counters", "counter:mlx5_0/1.symbol_error", "counter_grew", "41", "<= 0")
    ]


@pytest.mark.integration
def test_the_command_reads_the_sysfs_root_a_node_names(tmp_path: Path) -> None:
    port = tmp_path / "class" / "infiniband" / "mlx5_4" / "ports" / "1" / "counters"
    port.mkdir(parents=True)
    (port / "symbol_error").write_text("7\n")
    (port / "link_downed").write_text("2\n")
    (port / "unicast_rcv_packets").write_text("123456\n")  # a traffic counter, not an error: not read
    env = {**os.environ, "CLUSTER_ACCEPT_SYSFS": str(tmp_path)}
    out = subprocess.run(["sh", "-c", ibc.COMMAND], capture_output=True, text=True, env=env, timeout=30, check=True)
    boot, _, counted = out.stdout.partition("\n")
    assert boot.startswith("### boot=")  # the node's boot id: a reboot between runs clears the counters
    assert ibc.parse(out.stdout).boot == (Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None)
    assert counted == "### ib counters\nmlx5_4/ports/1 symbol_error 7\nmlx5_4/ports/1 link_downed 2\n### end\n"
    bare = subprocess.run(
        ["sh", "-c", ibc.COMMAND.replace("/sys}", f"{tmp_path}/none}}")],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert rows_of(bare.stdout) == [("ports", Status.SKIP, "no_ports", "0 ports")]


@pytest.mark.parametrize(
    "text, error",
    [
        (TWO_PORTS.replace("### end\n", ""), "output truncated before the end marker"),
        ("mlx5_0/ports/1 symbol_error 0\n### end\n", "no counters section in the output"),
        (TWO_PORTS.replace("symbol_error 3", "symbol_error many"), "unexpected counter line"),
        (TWO_PORTS.replace("VL15_dropped 0", "port_rcv_packets 9"), "unexpected counter line"),
    ],
)
def test_broken_outputs_are_errors_naming_what_is_wrong(text: str, error: str) -> None:
    rows = ibc.evaluate(ibc.parse(text), Profile(), NO_CLUSTER)
    assert [(r.status, r.reason) for r in rows] == [(Status.ERROR, "unparsable_output")] and error in (
        rows[0].detail or ""
    )


NOW = 1_795_000_000  # the controller's clock (epoch seconds) at the run under test: 2026-11-18 11:06 UTC
BOOT = "270d5218-095e-4095-b1fc-07407e3ff100"
DAY_S = 24 * 3600


def _output(node_clock: int, downed: int = 1, boot: str = BOOT) -> str:
    """The two ports as a node prints them, with its own clock and boot id, mlx5_1 having gone down ``downed``
    times since its counters were cleared. (The node's clock is printed as an earlier version read it.)"""
    text = TWO_PORTS.replace("mlx5_1/ports/1 link_downed 1", f"mlx5_1/ports/1 link_downed {downed}")
    return f"### now={node_clock}\n### boot={boot}\n{text}"


class Node:
    """One node's runs as the preflight judges them: each run's marks kept in ``node_values`` rows (what the
    history stores) and read back by the next run (:func:`since_previous`), the controller's clock
    ``time.time()`` at the run."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.records: list[NodeValue] = []

    def run(self, output: str, controller_s: int) -> ibc.IbCounters:
        outcome = NodePreflight("n1", NodeResult("n1", NodeStatus.OK), {"ib_counters": ibc.parse(output)})
        with self.monkeypatch.context() as patched:
            patched.setattr(time, "time", lambda: float(controller_s))
            since_previous([outcome], [ibc.CHECK], marks_by_node(self.records))
            self.records = node_values(f"r{controller_s}", "c", [outcome], [ibc.CHECK])
        model: ibc.IbCounters = outcome.models["ib_counters"]
        return model

    def marks(self) -> dict[str, str]:
        """The marks the last run kept in the history for the next."""
        return marks_by_node(self.records)["n1"]["ib_counters"]


def _flaps(model: ibc.IbCounters, clear_h: float = 24.0) -> list[tuple[str, str, str, str | None, str]]:
    profile = Profile.model_validate({"thresholds": {"link_flap_clear_h": clear_h}})
    rows = ibc.evaluate(model, profile, NO_CLUSTER)
    return [(r.item, r.status.value, r.reason, r.observed, r.detail) for r in rows if r.item.endswith(" flaps")]


def _flapped(node: Node) -> None:
    """mlx5_1 read once an hour before NOW, then found to have gone down twice since, at NOW."""
    first = [f[2] for f in _flaps(node.run(_output(NOW - 3600), NOW - 3600))]
    assert first == ["first_reading", "first_reading"]  # no previous run: nothing is known of flaps, and said so
    assert [f[1:4] for f in _flaps(node.run(_output(NOW, downed=3), NOW))] == [
        ("fail", "link_flapping", "link_downed 1 -> 3")
    ]


def test_a_port_that_went_down_since_the_previous_run_flaps_until_it_stays_up_long_enough(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = Node(monkeypatch)
    node.run(_output(NOW - 3600), NOW - 3600)
    assert node.marks() == {"at_s": str(NOW - 3600), "boot": BOOT, "mlx5_0/1.link_downed": "0",
                                "mlx5_1/1.link_downed": "1"}  # fmt: skip

    second = node.run(_output(NOW, downed=3), NOW)  # it went down twice in the hour between
    went = "went down between 2026-11-18 10:06 UTC and 2026-11-18 11:06 UTC; clears after 24 h up"
    assert _flaps(second) == [("mlx5_1/1 flaps", "fail", "link_flapping", "link_downed 1 -> 3", went)]
    assert node.marks()["mlx5_1/1.last_flap_at_s"] == str(NOW) and node.marks()["at_s"] == str(NOW)

    third = node.run(_output(NOW + 6 * 3600, downed=3), NOW + 6 * 3600)  # stable for 6 h: not yet cleared
    seen = "last flapped 2026-11-18 11:06 UTC (6.0 h ago)"
    assert _flaps(third) == [("mlx5_1/1 flaps", "fail", "flapped_recently", seen, "clears at 2026-11-19 11:06 UTC")]
    assert node.marks()["mlx5_1/1.last_flap_at_s"] == str(NOW)  # carried from run to run

    later = node.run(_output(NOW + 25 * 3600, downed=3), NOW + 25 * 3600)  # up for 25 h: cleared by itself
    assert [f[1:4] for f in _flaps(later)] == [
        ("pass", "flap_cleared", "last flapped 2026-11-18 11:06 UTC (25.0 h ago)")
    ]
    assert [f[1:3] for f in _flaps(third, clear_h=4)] == [("pass", "flap_cleared")]  # the profile sets the window
    assert ibc.REASONS["link_flapping"].action.value == "reseat cable"


def test_a_node_clock_three_days_fast_does_not_clear_a_flap_an_hour_old(monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(monkeypatch)
    _flapped(node)
    fast = node.run(_output(NOW + 3600 + 3 * DAY_S, downed=3), NOW + 3600)  # an hour on, the node 3 days ahead
    seen = "last flapped 2026-11-18 11:06 UTC (1.0 h ago)"
    assert _flaps(fast) == [("mlx5_1/1 flaps", "fail", "flapped_recently", seen, "clears at 2026-11-19 11:06 UTC")]


def test_a_node_clock_thirty_days_slow_does_not_keep_a_cleared_flap_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(monkeypatch)
    _flapped(node)
    slow = node.run(_output(NOW + 25 * 3600 - 30 * DAY_S, downed=3), NOW + 25 * 3600)  # 25 h on, 30 days behind
    assert [f[1:4] for f in _flaps(slow)] == [
        ("pass", "flap_cleared", "last flapped 2026-11-18 11:06 UTC (25.0 h ago)")
    ]


def test_a_flap_recorded_after_this_runs_clock_is_named_and_dated_at_this_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = Node(monkeypatch)
    _flapped(node)
    back = NOW - 30 * DAY_S  # the controller's clock went back 30 days (or the history was edited)
    ((item, status, reason, observed, detail),) = _flaps(node.run(_output(back, downed=3), back))
    assert (item, status, reason, observed) == ("mlx5_1/1 flaps", "fail", "flap_time_impossible", "after this run")
    assert detail.startswith(f"mlx5_1/1.last_flap_at_s='{NOW}' is after this reading")
    assert detail.endswith(": dated at this run instead; clears at 2026-10-20 11:06 UTC")  # 24 h, not 30 days
    hour = node.run(_output(back + 3600, downed=3), back + 3600)
    seen = "last flapped 2026-10-19 11:06 UTC (1.0 h ago)"
    assert _flaps(hour) == [("mlx5_1/1 flaps", "fail", "flapped_recently", seen, "clears at 2026-10-20 11:06 UTC")]


def test_a_counter_reset_between_runs_cannot_tell_whether_the_port_flapped(monkeypatch: pytest.MonkeyPatch) -> None:
    before = {"at_s": str(NOW - 3600), "boot": BOOT, "mlx5_0/1.link_downed": "0", "mlx5_1/1.link_downed": "4"}
    reset = ibc.since(ibc.parse(_output(NOW, downed=0)), before, now_s=NOW)  # 4 -> 0 on the same boot: cleared
    why = (
        "link_downed went down 4 -> 2: cleared since the previous run (a driver reload or a counter reset), so a "
        "flap before the clear is not counted"
    )
    assert _flaps(reset) == [("mlx5_1/1 flaps", "warn", "flap_unknown", "link_downed 4 -> 0", why.replace("2", "0"))]
    node = Node(monkeypatch)
    node.run(_output(NOW, downed=2), NOW)
    other = "0b8f1d6c-1111-4222-8333-944455556666"
    rebooted = node.run(_output(NOW + 3600, downed=1, boot=other), NOW + 3600)
    after_reboot = why.replace("4 -> 2", "2 -> 1").replace(
        "a driver reload or a counter reset", "the node rebooted: its boot id changed"
    )
    assert [f[2:5] for f in _flaps(rebooted)] == [("flap_unknown", "link_downed 2 -> 1", after_reboot)]
    again = node.run(_output(NOW + 7200, downed=1, boot=BOOT), NOW + 7200)  # rebooted again, the count as before
    assert [f[2:5] for f in _flaps(again)] == [("flap_unknown", "link_downed 1 -> 1",
        "the node rebooted since the previous run (its boot id changed) and link_downed reads 1 as before: cleared "
        "and counted again, or kept, cannot be told")]  # fmt: skip
    steady = node.run(_output(NOW + 3 * 3600, downed=1, boot=BOOT), NOW + 3 * 3600)  # same boot, same count
    assert _flaps(steady) == []
    unread = node.run(_output(NOW + 4 * 3600, downed=1).replace("mlx5_1/ports/1 link_downed 1\n", ""), NOW + 4 * 3600)
    assert [f[1:5] for f in _flaps(unread)] == [("warn", "flap_unknown", "link_downed 1 -> None",
        "link_downed could not be read this run, so whether the port flapped cannot be told")]  # fmt: skip


def test_a_link_downed_stuck_at_its_8_bit_maximum_is_never_read_as_no_flap(monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(monkeypatch)
    node.run(_output(NOW - 3600, downed=254), NOW - 3600)
    assert [f[2:4] for f in _flaps(node.run(_output(NOW, downed=255), NOW))] == [
        ("link_flapping", "link_downed 254 -> 255")  # it grew: a flap, whatever it stops at
    ]
    stuck = node.run(_output(NOW + 25 * 3600, downed=255), NOW + 25 * 3600)  # the flap's window is over, but
    why = (
        "link_downed sits at 255, the most its 8-bit counter holds: it stopped counting, so a flap since is not "
        "counted; clear the port's counters"
    )
    assert _flaps(stuck) == [("mlx5_1/1 flaps", "warn", "flap_unknown", "link_downed 255 -> 255", why)]  # no pass
    rows = ibc.evaluate(stuck, Profile(), NO_CLUSTER)
    assert [(r.item, r.status, r.reason, r.observed, r.expected) for r in rows if r.reason == "counter_saturated"] == [
        ("mlx5_1/1.link_downed", Status.WARN, "counter_saturated", "link_downed 255", "< 255")
    ]


def test_every_counter_at_its_maximum_is_named_and_one_above_it_is_impossible() -> None:
    text = TWO_PORTS.replace("mlx5_0/ports/1 symbol_error 0", "mlx5_0/ports/1 symbol_error 65535").replace(
        "mlx5_0/ports/1 local_link_integrity_errors 0", "mlx5_0/ports/1 local_link_integrity_errors 16"
    )
    rows = ibc.evaluate(ibc.parse(text), Profile(), NO_CLUSTER)
    named = [(r.item, r.status, r.reason, r.observed, r.expected, r.detail) for r in rows if "." in r.item]
    assert named == [
        ("mlx5_0/1.local_link_integrity_errors", Status.WARN, "counter_impossible", "local_link_integrity_errors 16",
         "<= 15", "local_link_integrity_errors reads 16, above the most its 4-bit counter holds (15)"),
        ("mlx5_0/1.symbol_error", Status.WARN, "counter_saturated", "symbol_error 65535", "< 65535",
         "symbol_error sits at 65535, the most its 16-bit counter holds: errors since are not counted"),
    ]  # fmt: skip
    assert set(ibc.COUNTER_BITS) == set(ibc.ERROR_COUNTERS)


def test_marks_of_an_earlier_version_in_the_nodes_clock_are_carried_by_their_age() -> None:
    earlier = {"now_s": "1000000000", "mlx5_1/1.link_downed": "3", "mlx5_1/1.last_flap_s": str(1000000000 - 7200)}
    model = ibc.since(ibc.parse(_output(0, downed=3)), earlier, now_s=NOW)  # two hours old then: at least that now
    assert [f[2:4] for f in _flaps(model)] == [
        ("first_reading", "link_downed 0"),  # the earlier version kept no mark of this port
        ("flapped_recently", "last flapped 2026-11-18 09:06 UTC (2.0 h ago)"),
    ]
    wrong = dict(earlier, **{"mlx5_1/1.last_flap_s": "1000009999"})  # after its own reading: cannot be dated
    assert [f[1:4] for f in _flaps(ibc.since(ibc.parse(_output(0, downed=3)), wrong, now_s=NOW))] == [
        ("pass", "first_reading", "link_downed 0"),
        ("fail", "flap_time_impossible", "after this run"),
    ]


def test_a_first_reading_is_said_and_never_counts_as_a_retest_of_a_flap(monkeypatch: pytest.MonkeyPatch) -> None:
    """No earlier reading (no marks: the node's file missing or replaced): nothing to compare link_downed with,
    so a drain for a flap is not lifted on this check's word."""
    from cluster_accept.checks.base import retested

    rows = ibc.evaluate(ibc.parse(_output(NOW)), Profile(), NO_CLUSTER)
    assert [(r.item, r.status, r.reason) for r in rows if r.item.endswith(" flaps")] == [
        ("mlx5_0/1 flaps", Status.PASS, "first_reading"),
        ("mlx5_1/1 flaps", Status.PASS, "first_reading"),
    ]
    assert "ib_counters" not in retested(rows)
    replaced = ibc.since(ibc.parse(_output(NOW)), {"at_s": str(NOW - 60)}, now_s=NOW)  # marks without the ports
    assert "ib_counters" not in retested(ibc.evaluate(replaced, Profile(), NO_CLUSTER))
    node = Node(monkeypatch)
    node.run(_output(NOW - 3600), NOW - 3600)
    compared = ibc.evaluate(node.run(_output(NOW), NOW), Profile(), NO_CLUSTER)
    assert "ib_counters" in retested(compared)  # compared with the previous reading: looked at again


def test_a_counter_that_went_down_and_counts_again_on_the_same_boot_is_a_flap(monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(monkeypatch)
    node.run(_output(NOW - 3600, downed=4), NOW - 3600)
    reset = node.run(_output(NOW, downed=2), NOW)  # 4 -> 2, same boot: cleared, then down twice since
    ((item, status, reason, observed, detail),) = _flaps(reset)
    assert (item, status, reason, observed) == ("mlx5_1/1 flaps", "fail", "link_flapping", "link_downed 4 -> 2")
    assert detail == (
        "went down between 2026-11-18 10:06 UTC and 2026-11-18 11:06 UTC; clears after 24 h up; link_downed went "
        "down 4 -> 2 on the same boot: cleared since the previous run (a driver reload or a counter reset) and down "
        "at least 2 times since, a lower bound"
    )
    assert node.marks()["mlx5_1/1.last_flap_at_s"] == str(NOW)
