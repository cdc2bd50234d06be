"""checks/pcie.py on the real captures of both machines and on faulty variants derived from them."""

from __future__ import annotations

import pytest

import cluster_accept.checks.pcie as pcie
from cluster_accept.inventory.model import PcieSpec, Profile
from tests.capture import DRIVER_FAILURE, NO_CLUSTER, captured, cut_mid_line, every_field_block, noheader, table

GEN5_X16 = Profile(pcie=PcieSpec(gen=5, width=16))


def healthy(gpu: int, profile: bool = True) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = [
        ("width", gpu, "pass", "ok", "x16", "x16"),
        ("gen", gpu, "pass", "ok", "gen5", "gen5"),
    ]
    if profile:
        rows += [("width_profile", gpu, "pass", "ok", "x16", "x16"), ("gen_profile", gpu, "pass", "ok", "gen5", "gen5")]
    return rows


def test_command_and_field_names() -> None:
    assert pcie.COMMAND == (
        "nvidia-smi --query-gpu=index,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,"
        "pcie.link.width.max --format=csv,noheader,nounits"
    )
    help_text, _ = captured("h200x4", "help-query-gpu.txt")
    for name in pcie.FIELDS:
        assert f'"{name}"' in help_text


def test_h200x4_capture() -> None:
    stdout = noheader("h200x4", pcie.FIELDS)
    assert stdout == "".join(f"{i}, 5, 5, 16, 16\n" for i in range(4))
    model = pcie.parse(stdout, 0)
    assert [(g.index, g.gen_current, g.gen_max, g.width_current, g.width_max) for g in model.gpus] == [
        (i, 5, 5, 16, 16) for i in range(4)
    ]
    assert table(pcie.evaluate(model, GEN5_X16, NO_CLUSTER)) == [row for i in range(4) for row in healthy(i)]
    assert pcie.cluster_values(model) == {"pcie_link": "gen5 x16"}


def test_h200x4_every_field_capture_reads_the_same() -> None:
    columns = [every_field_block(f)[1:] for f in pcie.FIELDS]
    stdout = "".join(", ".join(cells) + "\n" for cells in zip(*columns, strict=True))
    assert stdout == noheader("h200x4", pcie.FIELDS)
    # on this machine the GPU's own maximum equals the GPU-and-system maximum the check reads
    assert every_field_block("pcie.link.gen.gpumax")[1:] == every_field_block("pcie.link.gen.max")[1:]


def test_h100x1_capture_without_profile_key() -> None:
    model = pcie.parse(noheader("h100x1", pcie.FIELDS), 0)
    assert table(pcie.evaluate(model, Profile(), NO_CLUSTER)) == healthy(0, profile=False)
    assert pcie.cluster_values(model) == {"pcie_link": "gen5 x16"}


def test_width_8_of_max_16_fails_degraded_and_below_profile() -> None:
    stdout = noheader("h200x4", pcie.FIELDS).replace("2, 5, 5, 16, 16", "2, 5, 5, 8, 16")
    model = pcie.parse(stdout, 0)
    rows = pcie.evaluate(model, GEN5_X16, NO_CLUSTER)
    assert table(rows) == healthy(0) + healthy(1) + [
        ("width", 2, "fail", "width_degraded", "x8", "x16"),
        ("gen", 2, "pass", "ok", "gen5", "gen5"),
        ("width_profile", 2, "fail", "width_below_profile", "x8", "x16"),
        ("gen_profile", 2, "pass", "ok", "gen5", "gen5"),
    ] + healthy(3)
    assert pcie.cluster_values(model) == {}
    without_profile = pcie.evaluate(model, Profile(), NO_CLUSTER)
    assert [(r.gpu, r.reason) for r in without_profile if r.status.value != "pass"] == [(2, "width_degraded")]


def test_x8_slot_is_not_degraded_but_below_a_x16_profile() -> None:
    rows = pcie.evaluate(pcie.parse("0, 5, 5, 8, 8\n", 0), GEN5_X16, NO_CLUSTER)
    assert table(rows) == [
        ("width", 0, "pass", "ok", "x8", "x8"),
        ("gen", 0, "pass", "ok", "gen5", "gen5"),
        ("width_profile", 0, "fail", "width_below_profile", "x8", "x16"),
        ("gen_profile", 0, "pass", "ok", "gen5", "gen5"),
    ]


def test_gen_max_4_against_profile_5_fails() -> None:
    stdout = noheader("h100x1", pcie.FIELDS).replace("0, 5, 5,", "0, 4, 4,")
    assert stdout == "0, 4, 4, 16, 16\n"
    model = pcie.parse(stdout, 0)
    assert table(pcie.evaluate(model, GEN5_X16, NO_CLUSTER)) == [
        ("width", 0, "pass", "ok", "x16", "x16"),
        ("gen", 0, "pass", "ok", "gen4", "gen4"),
        ("width_profile", 0, "pass", "ok", "x16", "x16"),
        ("gen_profile", 0, "fail", "gen_below_profile", "gen4", "gen5"),
    ]
    assert pcie.cluster_values(model) == {"pcie_link": "gen4 x16"}


def test_idle_gen_downshift_only_warns() -> None:
    stdout = noheader("h200x4", pcie.FIELDS).replace("1, 5, 5,", "1, 1, 5,")
    rows = pcie.evaluate(pcie.parse(stdout, 0), GEN5_X16, NO_CLUSTER)
    assert [(r.item, r.gpu, r.status.value, r.reason, r.observed, r.expected) for r in rows if r.gpu == 1] == [
        ("width", 1, "pass", "ok", "x16", "x16"),
        ("gen", 1, "warn", "gen_downshifted", "gen1", "gen5"),
        ("width_profile", 1, "pass", "ok", "x16", "x16"),
        ("gen_profile", 1, "pass", "ok", "gen5", "gen5"),
    ]
    assert {r.status.value for r in rows if r.gpu != 1} == {"pass"}


def test_not_available_values_are_skipped() -> None:
    rows = pcie.evaluate(pcie.parse("0, [N/A], [N/A], 16, 16\n", 0), GEN5_X16, NO_CLUSTER)
    assert table(rows) == [
        ("width", 0, "pass", "ok", "x16", "x16"),
        ("gen", 0, "skip", "not_available", "[N/A]", "[N/A]"),
        ("width_profile", 0, "pass", "ok", "x16", "x16"),
        ("gen_profile", 0, "skip", "not_available", "[N/A]", "gen5"),
    ]


def test_driver_failure_is_one_skip_row() -> None:
    model = pcie.parse(DRIVER_FAILURE, 9)
    assert table(pcie.evaluate(model, GEN5_X16, NO_CLUSTER)) == [
        ("nvidia-smi", None, "skip", "nvidia_smi_failed", DRIVER_FAILURE.strip(), None)
    ]
    assert pcie.cluster_values(model) == {}


@pytest.mark.parametrize(
    "stdout, code",
    [
        (cut_mid_line(noheader("h200x4", pcie.FIELDS)), 0),  # '...\n2, 5' : a short line
        ("0, 5, 5, 16, 16\n1, 5, 5, 16, 1", 0),  # the same shape as a whole line, but no line end
        ("\x00\x7f#!garbage ~~~ 42\n", 0),
        ("0, 5, 5, 16, sixteen\n", 0),
        ("0, 5, 5, 16, 16, 16\n", 0),
        ("", 0),
        ("x" * 200_000 + "\n", 0),
        ('Field "pcie.link.gen.gpumax" is not a valid field to query.\n\n', 2),
    ],
)
def test_truncated_and_garbage_output_is_an_error_row_with_the_raw_text(stdout: str, code: int) -> None:
    model = pcie.parse(stdout, code)
    rows = pcie.evaluate(model, GEN5_X16, NO_CLUSTER)
    assert [(r.item, r.status.value, r.reason) for r in rows] == [("output", "error", "unparsable_output")]
    assert stdout[:40] in rows[0].detail
    assert pcie.cluster_values(model) == {}
