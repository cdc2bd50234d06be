"""checks/clock_events.py on the real captures of both machines and on faulty variants derived from them."""

from __future__ import annotations

import pytest

import cluster_accept.checks.clock_events as clock_events
from cluster_accept.inventory.model import Profile
from tests.capture import DRIVER_FAILURE, NO_CLUSTER, captured, cut_mid_line, every_field_block, noheader, table

NO_PROFILE = Profile()
EXPECTED = "none of hw_slowdown, sw_thermal, hw_thermal, hw_power_brake"


def one_gpu(mask: str) -> list[tuple[object, ...]]:
    return table(clock_events.evaluate(clock_events.parse(f"0, {mask}\n", 0), NO_PROFILE, NO_CLUSTER))


def test_command_and_field_names() -> None:
    # today's name first; the older one only after a refusal (tests/test_check_driver_fallback.py)
    assert clock_events.COMMAND == clock_events.QUERY.command
    assert clock_events.COMMAND.startswith("q0=clocks_event_reasons.active; ")
    assert 'nvidia-smi --query-gpu="$q" --format=csv,noheader,nounits' in clock_events.COMMAND
    assert dict(clock_events.QUERY.older) == {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}
    help_text, _ = captured("h200x4", "help-query-gpu.txt")
    assert '"clocks_event_reasons.active" or "clocks_throttle_reasons.active"' in help_text


def test_h200x4_capture_idle_gpus_pass() -> None:
    stdout = noheader("h200x4", clock_events.FIELDS)
    assert stdout == "".join(f"{i}, 0x0000000000000001\n" for i in range(4))
    model = clock_events.parse(stdout, 0)
    assert [(g.index, g.mask, g.names) for g in model.gpus] == [(i, 1, ["gpu_idle"]) for i in range(4)]
    assert table(clock_events.evaluate(model, NO_PROFILE, NO_CLUSTER)) == [
        ("event_reasons", i, "pass", "ok", "gpu_idle", EXPECTED) for i in range(4)
    ]


def test_h200x4_every_field_capture_reads_the_same() -> None:
    columns = [every_field_block(f)[1:] for f in clock_events.FIELDS]
    stdout = "".join(", ".join(cells) + "\n" for cells in zip(*columns, strict=True))
    assert stdout == noheader("h200x4", clock_events.FIELDS)
    # every reason the check decodes is one this GPU supports
    assert every_field_block("clocks_event_reasons.supported")[1:] == ["0x00000000000001FF"] * 4
    assert sum(clock_events.EVENT_BITS) == 0x1FF


def test_h100x1_capture() -> None:
    stdout = noheader("h100x1", clock_events.FIELDS)
    assert stdout == "0, 0x0000000000000001\n"
    rows = clock_events.evaluate(clock_events.parse(stdout, 0), NO_PROFILE, NO_CLUSTER)
    assert table(rows) == [("event_reasons", 0, "pass", "ok", "gpu_idle", EXPECTED)]
    assert rows[0].detail == "clocks_event_reasons.active=0x0000000000000001"


def test_hw_slowdown_fails() -> None:
    assert one_gpu("0x0000000000000008") == [
        ("event_reasons", 0, "fail", "throttle_hw_slowdown", "hw_slowdown", EXPECTED)
    ]


def test_idle_and_hw_thermal_fails_and_lists_both() -> None:
    stdout = noheader("h200x4", clock_events.FIELDS).replace("2, 0x0000000000000001", "2, 0x0000000000000041")
    rows = clock_events.evaluate(clock_events.parse(stdout, 0), NO_PROFILE, NO_CLUSTER)
    assert table(rows) == [
        ("event_reasons", 0, "pass", "ok", "gpu_idle", EXPECTED),
        ("event_reasons", 1, "pass", "ok", "gpu_idle", EXPECTED),
        ("event_reasons", 2, "fail", "throttle_hw_thermal", "gpu_idle, hw_thermal", EXPECTED),
        ("event_reasons", 3, "pass", "ok", "gpu_idle", EXPECTED),
    ]


def test_every_failing_reason_has_its_row() -> None:
    observed = "hw_slowdown, sw_thermal, hw_power_brake"
    assert one_gpu("0x00000000000000A8") == [
        ("event_reasons", 0, "fail", "throttle_hw_slowdown", observed, EXPECTED),
        ("event_reasons", 0, "fail", "throttle_sw_thermal", observed, EXPECTED),
        ("event_reasons", 0, "fail", "throttle_hw_power_brake", observed, EXPECTED),
    ]


def test_sw_power_cap_warns() -> None:
    assert one_gpu("0x0000000000000004") == [
        ("event_reasons", 0, "warn", "throttle_sw_power_cap", "sw_power_cap", "no sw_power_cap")
    ]
    assert one_gpu("0x0000000000000044") == [
        ("event_reasons", 0, "fail", "throttle_hw_thermal", "sw_power_cap, hw_thermal", EXPECTED),
        ("event_reasons", 0, "warn", "throttle_sw_power_cap", "sw_power_cap, hw_thermal", "no sw_power_cap"),
    ]


def test_benign_reasons_pass_and_are_listed() -> None:
    assert one_gpu("0x0000000000000112") == [
        ("event_reasons", 0, "pass", "ok", "applications_clocks_setting, sync_boost, display_clock_setting", EXPECTED)
    ]
    assert one_gpu("0x0000000000000000") == [("event_reasons", 0, "pass", "ok", "none", EXPECTED)]


def test_unknown_bit_warns_with_its_value() -> None:
    assert one_gpu("0x0000000000000201") == [
        ("event_reasons", 0, "warn", "unknown_event_reason", "gpu_idle, 0x200", "known NVML reasons")
    ]


def test_not_available_is_skipped() -> None:
    assert one_gpu("[Not Supported]") == [("event_reasons", 0, "skip", "not_available", "[Not Supported]", EXPECTED)]


def test_driver_failure_is_one_skip_row() -> None:
    rows = clock_events.evaluate(clock_events.parse(DRIVER_FAILURE, 9), NO_PROFILE, NO_CLUSTER)
    assert table(rows) == [("nvidia-smi", None, "skip", "nvidia_smi_failed", DRIVER_FAILURE.strip(), None)]


@pytest.mark.parametrize(
    "stdout, code",
    [
        (cut_mid_line(noheader("h200x4", clock_events.FIELDS)), 0),  # '...\n2, 0x00000'
        ("0, 0x0000000000000001\n1, 0x0000000000000001", 0),  # no line end: the mask may be cut
        ("\x00\x7f#!garbage ~~~ 42\n", 0),
        ("0, 0x00000000000000zz\n", 0),
        ("0, 0x00000000000000001\n", 0),  # 17 hex digits: not a 64-bit mask
        ("0, 8\n", 0),
        ("", 0),
        ("x" * 200_000 + "\n", 0),
        ('Field "clocks_event_reasons.active" is not a valid field to query.\n\n', 2),
    ],
)
def test_truncated_and_garbage_output_is_an_error_row_with_the_raw_text(stdout: str, code: int) -> None:
    rows = clock_events.evaluate(clock_events.parse(stdout, code), NO_PROFILE, NO_CLUSTER)
    assert [(r.item, r.status.value, r.reason) for r in rows] == [("output", "error", "unparsable_output")]
    assert stdout[:40] in rows[0].detail
