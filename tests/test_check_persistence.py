"""checks/persistence.py on the real captures of both machines and on faulty variants derived from them."""

from __future__ import annotations

import re

import pytest

import checks.persistence as persistence
from checks.base import CheckRow, ClusterView
from inventory.model import Profile
from tests.capture import captured, every_field_block

pytestmark = pytest.mark.pure

ENABLED = Profile(persistence_mode="enabled")
DISABLED = Profile(persistence_mode="disabled")
NO_CLUSTER = ClusterView(majority={}, nodes_compared=0)
DRIVER_FAILURE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


def noheader(machine: str, fields: list[str]) -> str:
    """What ``--query-gpu=<fields> --format=csv,noheader,nounits`` prints, from the machine's query-gpu.txt."""
    stdout, code = captured(machine, "query-gpu.txt")
    assert code == 0
    header, *lines = stdout.splitlines()
    heads = [re.fullmatch(r"(.*?)(?: \[(.+)\])?", cell) for cell in header.split(", ")]
    names = [m.group(1) for m in heads if m]
    units = [m.group(2) for m in heads if m]
    out = []
    for line in lines:
        cells = line.split(", ")
        assert len(cells) == len(names) == len(units)
        picked = []
        for f in fields:
            value, unit = cells[names.index(f)], units[names.index(f)]
            picked.append(value.removesuffix(f" {unit}") if unit else value)
        out.append(", ".join(picked) + "\n")
    return "".join(out)


def cut_mid_line(text: str) -> str:
    """The output cut in its middle, not on a line end (as when the tool dies while writing)."""
    cut = len(text) // 2
    return text[: cut - 1 if text[cut - 1] == "\n" else cut]


def table(rows: list[CheckRow]) -> list[tuple[object, ...]]:
    return [(r.item, r.gpu, r.status.value, r.reason, r.observed, r.expected) for r in rows]


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
