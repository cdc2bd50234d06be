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
from cluster_accept.checks.base import Status
from cluster_accept.inventory.model import Profile
from tests.capture import NO_CLUSTER

TWO_PORTS = (Path(__file__).parent / "data" / "ib_counters" / "two_ports.txt").read_text()


def rows_of(text: str) -> list[tuple[str, Status, str, str | None]]:
    return [(r.item, r.status, r.reason, r.observed) for r in ibc.evaluate(ibc.parse(text), Profile(), NO_CLUSTER)]


def test_two_ports_parse_with_every_counter_and_the_one_with_errors_is_named() -> None:
    model = ibc.parse(TWO_PORTS)
    assert model.error is None and [p.name for p in model.ports] == ["mlx5_0/1", "mlx5_1/1"]
    assert len(model.ports[0].values) == 11 and len(model.ports[1].values) == 12  # a counter the port lacks is left out
    assert rows_of(TWO_PORTS) == [
        ("mlx5_0/1", Status.PASS, "ok", "0"),
        ("mlx5_1/1", Status.WARN, "errors_since_reset", "link_downed 1, link_error_recovery 1, symbol_error 3"),
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
    clock, _, counted = out.stdout.partition("\n")
    assert clock.startswith("### now=") and abs(int(clock[8:]) - time.time()) < 60  # the node's clock, for flaps
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


NOW = 1_795_000_000  # the node's clock (epoch seconds) at the run under test


def _at(clock: int, downed: int = 1) -> ibc.IbCounters:
    """The two ports at ``clock``, mlx5_1 having gone down ``downed`` times since its counters were cleared."""
    text = TWO_PORTS.replace("mlx5_1/ports/1 link_downed 1", f"mlx5_1/ports/1 link_downed {downed}")
    return ibc.parse(f"### now={clock}\n{text}")


def _flaps(model: ibc.IbCounters, clear_h: float = 24.0) -> list[tuple[str, str, str, str | None, str]]:
    profile = Profile.model_validate({"thresholds": {"link_flap_clear_h": clear_h}})
    rows = ibc.evaluate(model, profile, NO_CLUSTER)
    return [(r.item, r.status.value, r.reason, r.observed, r.detail) for r in rows if r.item.endswith(" flaps")]


def test_a_port_that_went_down_since_the_previous_run_flaps_until_it_stays_up_long_enough() -> None:
    first = ibc.since(_at(NOW - 3600), {})  # no previous run: nothing is known of flaps
    assert _flaps(first) == [] and ibc.marks(first)["mlx5_1/1.link_downed"] == "1"

    second = ibc.since(_at(NOW, downed=3), ibc.marks(first))  # it went down twice in the hour between
    went = "went down between 2026-11-18 10:06 UTC and 2026-11-18 11:06 UTC; clears after 24 h up"
    assert _flaps(second) == [("mlx5_1/1 flaps", "fail", "link_flapping", "link_downed 1 -> 3", went)]
    assert ibc.marks(second)["mlx5_1/1.last_flap_s"] == str(NOW)

    third = ibc.since(_at(NOW + 6 * 3600, downed=3), ibc.marks(second))  # stable for 6 h: not yet cleared
    seen = "last flapped 2026-11-18 11:06 UTC (6.0 h ago)"
    assert _flaps(third) == [("mlx5_1/1 flaps", "fail", "flapped_recently", seen, "clears at 2026-11-19 11:06 UTC")]
    assert ibc.marks(third)["mlx5_1/1.last_flap_s"] == str(NOW)  # carried from run to run

    later = ibc.since(_at(NOW + 25 * 3600, downed=3), ibc.marks(third))  # up for 25 h: cleared by itself
    assert [f[1:4] for f in _flaps(later)] == [
        ("pass", "flap_cleared", "last flapped 2026-11-18 11:06 UTC (25.0 h ago)")
    ]
    assert [f[1:3] for f in _flaps(third, clear_h=4)] == [("pass", "flap_cleared")]  # the profile sets the window


def test_a_cleared_counter_is_no_flap_and_a_healthy_port_has_no_flap_row() -> None:
    before = ibc.marks(ibc.since(_at(NOW - 60, downed=5), {}))
    rebooted = ibc.since(_at(NOW, downed=0), before)  # counters cleared by a reboot: not a flap
    assert _flaps(rebooted) == []
    assert not ibc.REASONS["link_flapping"].severity.value == "pass"
    assert ibc.REASONS["link_flapping"].action.value == "reseat cable"
