"""checks/persistence.py on the real captures of both machines and on faulty variants derived from them."""

from __future__ import annotations

import pytest

import cluster_accept.checks.persistence as persistence
from cluster_accept.inventory.model import Profile
from tests.capture import DRIVER_FAILURE, NO_CLUSTER, cut_mid_line, every_field_block, noheader, table

ENABLED = Profile(persistence_mode="enabled")
DISABLED = Profile(persistence_mode="disabled")


def test_command_queries_index_and_persistence_mode() -> None:
    assert persistence.COMMAND == "nvidia-smi --query-gpu=index,persistence_mode --format=csv,noheader,nounits"


def test_h200x4_capture() -> None:
    stdout = noheader("h200x4", persistence.FIELDS)
    assert stdout == "0, Enabled\n1, Enabled\n2, Enabled\n3, Enabled\n"
    model = persistence.parse(stdout, 0)
    assert [(g.index, g.mode) for g in model.gpus] == [(i, "Enabled") for i in range(4)]
    assert table(persistence.evaluate(model, ENABLED, NO_CLUSTER)) == [
        ("mode", i, "pass", "ok", "Enabled", "Enabled") for i in range(4)
    ]
    assert persistence.cluster_values(model) == {"persistence_mode": "Enabled"}


def test_h200x4_every_field_capture_reads_the_same() -> None:
    indexes, modes = every_field_block("index")[1:], every_field_block("persistence_mode")[1:]
    stdout = "".join(f"{i}, {m}\n" for i, m in zip(indexes, modes, strict=True))
    model = persistence.parse(stdout, 0)
    assert [(g.index, g.mode) for g in model.gpus] == [(i, "Enabled") for i in range(4)]


def test_h100x1_capture_against_both_profiles() -> None:
    model = persistence.parse(noheader("h100x1", persistence.FIELDS), 0)
    assert [(g.index, g.mode) for g in model.gpus] == [(0, "Enabled")]
    assert table(persistence.evaluate(model, ENABLED, NO_CLUSTER)) == [("mode", 0, "pass", "ok", "Enabled", "Enabled")]
    assert table(persistence.evaluate(model, DISABLED, NO_CLUSTER)) == [
        ("mode", 0, "fail", "persistence_enabled", "Enabled", "Disabled")
    ]


def test_disabled_on_one_gpu_fails_that_gpu_only() -> None:
    stdout = noheader("h200x4", persistence.FIELDS).replace("1, Enabled", "1, Disabled")
    model = persistence.parse(stdout, 0)
    assert table(persistence.evaluate(model, ENABLED, NO_CLUSTER)) == [
        ("mode", 0, "pass", "ok", "Enabled", "Enabled"),
        ("mode", 1, "fail", "persistence_disabled", "Disabled", "Enabled"),
        ("mode", 2, "pass", "ok", "Enabled", "Enabled"),
        ("mode", 3, "pass", "ok", "Enabled", "Enabled"),
    ]
    assert persistence.cluster_values(model) == {}  # not uniform: no node-level value


def test_without_profile_key_the_modes_are_recorded() -> None:
    stdout = noheader("h200x4", persistence.FIELDS).replace("3, Enabled", "3, Disabled")
    rows = persistence.evaluate(persistence.parse(stdout, 0), Profile(), NO_CLUSTER)
    assert table(rows) == [("mode", i, "pass", "recorded", "Enabled", None) for i in range(3)] + [
        ("mode", 3, "pass", "recorded", "Disabled", None)
    ]


def test_not_available_mode_is_skipped() -> None:
    rows = persistence.evaluate(persistence.parse("0, [N/A]\n", 0), ENABLED, NO_CLUSTER)
    assert table(rows) == [("mode", 0, "skip", "not_available", "[N/A]", "Enabled")]


def test_driver_failure_is_one_skip_row() -> None:
    model = persistence.parse(DRIVER_FAILURE, 9)
    assert table(persistence.evaluate(model, ENABLED, NO_CLUSTER)) == [
        ("nvidia-smi", None, "skip", "nvidia_smi_failed", DRIVER_FAILURE.strip(), None)
    ]
    assert persistence.cluster_values(model) == {}


@pytest.mark.parametrize(
    "stdout, code",
    [
        (cut_mid_line(noheader("h200x4", persistence.FIELDS)), 0),  # '...\n2, Ena'
        (noheader("h200x4", persistence.FIELDS)[:-1], 0),  # the last line lost its end: can't tell it is whole
        ("\x00\x7f#!garbage ~~~ 42\n", 0),
        ("0, Enabled, extra\n", 0),
        ("0, Maybe\n", 0),
        ("x, Enabled\n", 0),
        ("", 0),
        ("x" * 200_000 + "\n", 0),  # csv raises on a field this long: still a model, not an exception
        ("0, Ena\rbled\n", 0),  # csv raises on a bare CR inside a field
        ('Field "persistence_mode" is not a valid field to query.\n\n', 2),
    ],
)
def test_truncated_and_garbage_output_is_an_error_row_with_the_raw_text(stdout: str, code: int) -> None:
    model = persistence.parse(stdout, code)
    rows = persistence.evaluate(model, ENABLED, NO_CLUSTER)
    assert [(r.item, r.status.value, r.reason) for r in rows] == [("output", "error", "unparsable_output")]
    assert stdout[:40] in rows[0].detail
    assert persistence.cluster_values(model) == {}


def test_truncated_output_names_the_cut() -> None:
    model = persistence.parse(cut_mid_line(noheader("h200x4", persistence.FIELDS)), 0)
    assert model.error == "output ends mid-line (truncated)" and model.gpus == []
