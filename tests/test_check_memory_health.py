"""checks/memory_health.py on the real captures of both machines and on faulty variants derived from them."""

from __future__ import annotations

import pytest

import cluster_accept.checks.memory_health as memory
from cluster_accept.inventory.model import Profile
from tests.capture import DRIVER_FAILURE, NO_CLUSTER, captured, cut_mid_line, every_field_block, noheader, table

NO_PROFILE = Profile()


def healthy(gpu: int) -> list[tuple[object, ...]]:
    return [
        ("ecc_mode", gpu, "pass", "ok", "Enabled", "Enabled"),
        ("uncorrected_ecc", gpu, "pass", "ok", "0", "0"),
        ("remapped_rows_pending", gpu, "pass", "ok", "No", "No"),
        ("remapped_rows_failure", gpu, "pass", "ok", "No", "No"),
        # H100/H200 use row remapping, not page retirement: [N/A] is not a failure
        ("retired_pages_pending", gpu, "skip", "not_available", "[N/A]", "No"),
    ]


def test_command_and_field_names() -> None:
    assert memory.NAME == "memory"
    assert memory.COMMAND == memory.QUERY.command
    assert memory.QUERY.fields == (
        "index",
        "ecc.mode.current",
        "ecc.errors.uncorrected.volatile.total",
        "remapped_rows.pending",
        "remapped_rows.failure",
        "retired_pages.pending",
    )
    # the remapped_rows fields are recent in --query-gpu: dropped (not judged) where the driver refuses them
    assert dict(memory.QUERY.older) == {"remapped_rows.pending": None, "remapped_rows.failure": None}
    for machine in ("h200x4", "h100x1"):
        help_text, _ = captured(machine, "help-query-gpu.txt")
        for name in memory.FIELDS:
            assert f'"{name}"' in help_text


def test_h200x4_capture() -> None:
    stdout = noheader("h200x4", memory.FIELDS)
    assert stdout == "".join(f"{i}, Enabled, 0, No, No, [N/A]\n" for i in range(4))
    model = memory.parse(stdout, 0)
    assert [g.index for g in model.gpus] == [0, 1, 2, 3]
    assert table(memory.evaluate(model, NO_PROFILE, NO_CLUSTER)) == [row for i in range(4) for row in healthy(i)]


def test_h200x4_every_field_capture_reads_the_same() -> None:
    columns = [every_field_block(f)[1:] for f in memory.FIELDS]
    stdout = "".join(", ".join(cells) + "\n" for cells in zip(*columns, strict=True))
    assert stdout == noheader("h200x4", memory.FIELDS)


def test_h100x1_capture() -> None:
    stdout = noheader("h100x1", memory.FIELDS)
    assert stdout == "0, Enabled, 0, No, No, [N/A]\n"
    assert table(memory.evaluate(memory.parse(stdout, 0), NO_PROFILE, NO_CLUSTER)) == healthy(0)


def _h200_with(gpu: int, values: str) -> list[tuple[object, ...]]:
    lines = noheader("h200x4", memory.FIELDS).splitlines(keepends=True)
    lines[gpu] = f"{gpu}, {values}\n"
    rows = memory.evaluate(memory.parse("".join(lines), 0), NO_PROFILE, NO_CLUSTER)
    assert {r.status.value for r in rows if r.gpu != gpu} == {"pass", "skip"}
    assert [r.reason for r in rows if r.gpu != gpu and r.status.value == "skip"] == ["not_available"] * 3
    return [row for row in table(rows) if row[1] == gpu]


def test_uncorrected_ecc_count_2_fails() -> None:
    rows = _h200_with(0, "Enabled, 2, No, No, [N/A]")
    assert rows[1] == ("uncorrected_ecc", 0, "fail", "uncorrected_ecc", "2", "0")
    assert [r for r in rows if r[2] == "fail"] == [rows[1]]


def test_remapped_rows_pending_fails() -> None:
    rows = _h200_with(3, "Enabled, 0, Yes, No, [N/A]")
    assert [r for r in rows if r[2] != "pass"] == [
        ("remapped_rows_pending", 3, "fail", "remap_pending", "Yes", "No"),
        ("retired_pages_pending", 3, "skip", "not_available", "[N/A]", "No"),
    ]


def test_remap_failure_fails() -> None:
    rows = _h200_with(1, "Enabled, 0, No, Yes, [N/A]")
    assert [r for r in rows if r[2] == "fail"] == [("remapped_rows_failure", 1, "fail", "remap_failed", "Yes", "No")]


def test_ecc_disabled_fails_and_its_unreadable_counter_is_skipped() -> None:
    rows = _h200_with(2, "Disabled, [N/A], No, No, [N/A]")
    assert rows == [
        ("ecc_mode", 2, "fail", "ecc_disabled", "Disabled", "Enabled"),
        ("uncorrected_ecc", 2, "skip", "not_available", "[N/A]", "0"),
        ("remapped_rows_pending", 2, "pass", "ok", "No", "No"),
        ("remapped_rows_failure", 2, "pass", "ok", "No", "No"),
        ("retired_pages_pending", 2, "skip", "not_available", "[N/A]", "No"),
    ]


def test_retired_pages_pending_on_a_page_retirement_gpu_fails() -> None:
    rows = memory.evaluate(memory.parse("0, Enabled, 0, [N/A], [N/A], Yes\n", 0), NO_PROFILE, NO_CLUSTER)
    assert table(rows) == [
        ("ecc_mode", 0, "pass", "ok", "Enabled", "Enabled"),
        ("uncorrected_ecc", 0, "pass", "ok", "0", "0"),
        ("remapped_rows_pending", 0, "skip", "not_available", "[N/A]", "No"),
        ("remapped_rows_failure", 0, "skip", "not_available", "[N/A]", "No"),
        ("retired_pages_pending", 0, "fail", "retired_pages_pending", "Yes", "No"),
    ]


def test_driver_failure_is_one_skip_row() -> None:
    rows = memory.evaluate(memory.parse(DRIVER_FAILURE, 9), NO_PROFILE, NO_CLUSTER)
    assert table(rows) == [("nvidia-smi", None, "skip", "nvidia_smi_failed", DRIVER_FAILURE.strip(), None)]


@pytest.mark.parametrize(
    "stdout, code",
    [
        (cut_mid_line(noheader("h200x4", memory.FIELDS)), 0),
        ("0, Enabled, 0, No, No, [N/A]\n1, Enabled, 0, No, No, [N/", 0),
        ("0, Enabled, 0, No, No, [N/A]\n1, Enabled, 0, No, No, No", 0),  # whole-looking, but no line end
        ("\x00\x7f#!garbage ~~~ 42\n", 0),
        ("0, Enabled, 0, Maybe, No, [N/A]\n", 0),
        ("0, Enabled, -1, No, No, [N/A]\n", 0),
        ("0, Enabled, 0, No, No\n", 0),
        ("", 0),
        ("x" * 200_000 + "\n", 0),
        ('Field "remapped_rows.pending" is not a valid field to query.\n\n', 2),
    ],
)
def test_truncated_and_garbage_output_is_an_error_row_with_the_raw_text(stdout: str, code: int) -> None:
    rows = memory.evaluate(memory.parse(stdout, code), NO_PROFILE, NO_CLUSTER)
    assert [(r.item, r.status.value, r.reason) for r in rows] == [("output", "error", "unparsable_output")]
    assert stdout[:40] in rows[0].detail
