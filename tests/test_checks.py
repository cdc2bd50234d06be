"""Check parsers on real captured outputs (exact values) and on faulty variants derived from them."""

from __future__ import annotations

import pytest

import cluster_accept.checks.driver as driver
import cluster_accept.checks.gpu_count as gpu_count
from cluster_accept.checks.base import Status, discover, majority_values
from cluster_accept.inventory.model import GpuSpec, MinVersion, Profile
from tests.capture import DRIVER_FAILURE, NO_CLUSTER, captured, every_field_block

H200 = Profile(gpu=GpuSpec(model="NVIDIA H200", count=4), driver_version="580.159.04")
H100 = Profile(gpu=GpuSpec(model="NVIDIA H100 80GB HBM3", count=1), driver_version=MinVersion(min="570.0"))


def statuses(rows: list) -> list[tuple[str, str, str]]:
    return [(r.item, r.status.value, r.reason) for r in rows]


def test_discovery_finds_check_modules_without_a_list() -> None:
    names = [c.name for c in discover()]
    assert "driver" in names and "gpu_count" in names
    assert all(c.command for c in discover())


def test_gpu_count_on_h200x4_capture() -> None:
    stdout, code = captured("h200x4", "query-gpu-noheader.txt")
    model = gpu_count.parse(stdout, code)
    assert [(g.index, g.name, g.driver_version) for g in model.gpus] == [
        (i, "NVIDIA H200", "580.159.04") for i in range(4)
    ]
    assert statuses(gpu_count.evaluate(model, H200, NO_CLUSTER)) == [("count", "pass", "ok")]
    assert gpu_count.cluster_values(model) == {"gpu_count": "4", "gpu_model": "NVIDIA H200"}


def test_gpu_count_on_h100_capture_against_the_h200_profile() -> None:
    stdout, code = captured("h100x1", "query-gpu-noheader.txt")
    model = gpu_count.parse(stdout, code)
    assert [(g.index, g.name) for g in model.gpus] == [(0, "NVIDIA H100 80GB HBM3")]
    rows = gpu_count.evaluate(model, H200, NO_CLUSTER)
    assert statuses(rows) == [("count", "fail", "count_low"), ("model", "fail", "model_mismatch")]
    assert (rows[0].observed, rows[0].expected) == ("1", "4")
    assert (rows[1].observed, rows[1].expected, rows[1].gpu) == ("NVIDIA H100 80GB HBM3", "NVIDIA H200", 0)


def test_gpu_missing_variant_fails_with_count_low() -> None:
    stdout, code = captured("h200x4", "query-gpu-noheader.txt")
    three = "".join(stdout.splitlines(keepends=True)[:3])
    rows = gpu_count.evaluate(gpu_count.parse(three, code), H200, NO_CLUSTER)
    assert statuses(rows) == [("count", "fail", "count_low")]
    assert (rows[0].observed, rows[0].expected) == ("3", "4")


def test_gpu_count_without_profile_uses_cluster_majority() -> None:
    stdout, code = captured("h200x4", "query-gpu-noheader.txt")
    three = gpu_count.parse("".join(stdout.splitlines(keepends=True)[:3]), code)
    four = gpu_count.parse(stdout, code)
    view = majority_values(
        {"a": gpu_count.cluster_values(four), "b": gpu_count.cluster_values(four), "c": gpu_count.cluster_values(three)}
    )
    assert statuses(gpu_count.evaluate(three, Profile(), view)) == [("count", "fail", "drift")]
    assert statuses(gpu_count.evaluate(four, Profile(), view)) == [("count", "pass", "ok")]


@pytest.mark.parametrize(
    "stdout, code, reason",
    [
        (DRIVER_FAILURE, 9, "nvidia_smi_failed"),
        ("sh: 1: nvidia-smi: command not found\n", 127, "nvidia_smi_failed"),
        ("0, NVIDIA H200, 580.159.04, Enab", 0, "unparsable_output"),  # truncated
        ("\x00\x7f#!garbage ~~~ 42\n", 0, "unparsable_output"),
    ],
)
def test_gpu_count_failures_are_rows_not_exceptions(stdout: str, code: int, reason: str) -> None:
    rows = gpu_count.evaluate(gpu_count.parse(stdout, code), H200, NO_CLUSTER)
    assert len(rows) == 1 and rows[0].reason == reason
    assert rows[0].status in (Status.FAIL, Status.ERROR)
    if reason == "unparsable_output":
        assert stdout[:10] in rows[0].detail  # the raw text is kept as evidence


def _driver_output(versions: list[str], proc: str) -> str:
    return "\n".join(versions) + "\n### /proc/driver/nvidia/version rc=0\n" + proc


def test_driver_on_h200x4_captures() -> None:
    versions = every_field_block("driver_version")[1:]
    proc, _ = captured("h200x4", "proc-driver-version.txt")
    model = driver.parse(_driver_output(versions, proc), 0)
    assert model.smi_versions == ["580.159.04"] * 4
    assert model.kernel_module == "580.159.04"
    assert statuses(driver.evaluate(model, H200, NO_CLUSTER)) == [
        ("kernel_module", "pass", "ok"),
        ("version", "pass", "ok"),
    ]


def test_driver_variants() -> None:
    proc, _ = captured("h200x4", "proc-driver-version.txt")
    other = driver.parse(_driver_output(["570.86.15"] * 4, proc.replace("580.159.04", "570.86.15")), 0)
    assert statuses(driver.evaluate(other, H200, NO_CLUSTER)) == [
        ("kernel_module", "pass", "ok"),
        ("version", "fail", "version_mismatch"),
    ]
    assert statuses(driver.evaluate(other, H100, NO_CLUSTER))[1] == ("version", "pass", "ok")
    mismatch = driver.parse(_driver_output(["580.159.04"] * 4, proc.replace("580.159.04", "570.86.15")), 0)
    rows = driver.evaluate(mismatch, H200, NO_CLUSTER)
    assert statuses(rows)[0] == ("kernel_module", "fail", "kernel_module_mismatch")
    assert (rows[0].observed, rows[0].expected) == ("570.86.15", "580.159.04")
    view = majority_values(
        {
            "a": {"driver_version": "570.86.15"},
            "b": {"driver_version": "570.86.15"},
            "c": {"driver_version": "580.159.04"},
        }
    )
    good = driver.parse(_driver_output(["580.159.04"] * 4, proc), 0)
    assert statuses(driver.evaluate(good, H200, view))[-1] == ("drift", "warn", "drift")
    assert statuses(driver.evaluate(good, H100, view))[-1] == ("drift", "fail", "drift")
    failed = driver.parse(DRIVER_FAILURE + "### /proc/driver/nvidia/version rc=9\n" + proc, 9)
    assert statuses(driver.evaluate(failed, H200, NO_CLUSTER)) == [("nvidia-smi", "fail", "nvidia_smi_failed")]
    truncated = driver.parse("580.159.04\n580.1", 0)
    assert statuses(driver.evaluate(truncated, H200, NO_CLUSTER)) == [("output", "error", "unparsable_output")]


def test_csv_shape_errors_are_none_not_exceptions() -> None:
    from cluster_accept.checks.sections import csv_rows

    assert csv_rows('0, "' + "x" * 200_000 + '"\n', 2) is None
    assert csv_rows("0, a\n1, b\n", 2) == [["0", "a"], ["1", "b"]]
