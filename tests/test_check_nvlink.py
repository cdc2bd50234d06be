"""The nvlink check on the real ``nvlink -s``/``-e`` captures (exact values) and on faulty variants derived from
them, in the same text form the test-bed plants (``testbed/nodedata.py``), and through the stand-in itself."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import cluster_accept.checks.nvlink as nvlink
from cluster_accept.checks.base import CheckRow, discover
from cluster_accept.inventory.model import GpuSpec, NvlinkSpec, Profile
from cluster_accept.testbed import textops
from cluster_accept.testbed.faults import parse_fault
from cluster_accept.testbed.nodedata import build_node, write_node_data
from cluster_accept.testbed.standins import write_standins
from tests.capture import DRIVER_FAILURE, NO_CLUSTER, captured

H200 = Profile(gpu=GpuSpec(model="NVIDIA H200", count=4), nvlink=NvlinkSpec(links_per_gpu=18, link_speed_gbps=26.562))
NO_NVLINK = Profile(
    gpu=GpuSpec(model="NVIDIA H100 80GB HBM3", count=1), nvlink=NvlinkSpec(links_per_gpu=0, link_speed_gbps=1)
)
NO_KEY = Profile(gpu=GpuSpec(model="NVIDIA H200", count=4))
MARK = "### nvidia-smi nvlink -s rc="
ALL_OK = [("links", "pass", "ok", g, "18 x 26.562 GB/s", "18 x 26.562 GB/s") for g in range(4)]


def rows_of(rows: list[CheckRow]) -> list[tuple[str, str, str, int | None, str | None, str | None]]:
    return [(r.item, r.status.value, r.reason, r.gpu, r.observed, r.expected) for r in rows]


def output(
    machine: str = "h200x4",
    status: Callable[[str], str] = lambda t: t,
    errors: Callable[[str], str] = lambda t: t,
) -> tuple[str, int]:
    """What COMMAND prints on ``machine``, with ``status``/``errors`` applied to the two captured outputs."""
    s, s_rc = captured(machine, "nvlink-s.txt")
    e, e_rc = captured(machine, "nvlink-e.txt")
    return f"{status(s)}{MARK}{s_rc}\n{errors(e)}", e_rc


def on_gpu(gpu: int, change: Callable[[str], str]) -> Callable[[str], str]:
    """Edit only GPU ``gpu``'s block, the way the test-bed's faults do."""
    return lambda text: textops.nvlink_blocks(text).edit(str(gpu), change).join()


def replace_once(old: str, new: str) -> Callable[[str], str]:
    def change(text: str) -> str:
        assert text.count(old) == 1, old
        return text.replace(old, new)

    return change


def evaluate(stdout: str, code: int | None, profile: Profile = H200) -> list[CheckRow]:
    return nvlink.evaluate(nvlink.parse(stdout, code), profile, NO_CLUSTER)


def test_discovered_with_its_command() -> None:
    check = next(c for c in discover() if c.name == "nvlink")
    assert (
        check.command == 'nvidia-smi nvlink -s 2>&1; echo "### nvidia-smi nvlink -s rc=$?"; nvidia-smi nvlink -e 2>&1'
    )


def test_h200x4_capture_exact() -> None:
    model = nvlink.parse(*output())
    assert model.failure is None and model.error is None
    assert [g.index for g in model.gpus] == [0, 1, 2, 3]
    assert model.gpus[0].name == "NVIDIA H200 (UUID: GPU-33f7137f-2577-6408-7f45-fd57dff161bc)"
    for gpu in model.gpus:
        assert [(link.index, link.speed_gbps, link.speed_text) for link in gpu.links] == [
            (i, 26.562, "26.562") for i in range(18)
        ]
        assert gpu.counters == {i: {"Replay": 0, "Recovery": 0, "CRC": 0} for i in range(18)}
        assert not gpu.all_inactive
    assert rows_of(nvlink.evaluate(model, H200, NO_CLUSTER)) == ALL_OK
    assert nvlink.cluster_values(model) == {"nvlink_links": "18x26.562"}


def test_h100x1_capture_has_no_nvlink() -> None:
    stdout, code = output("h100x1")
    assert stdout == f"{MARK}0\n" and code == 0
    model = nvlink.parse(stdout, code)
    assert (model.gpus, model.error, model.failure) == ([], None, None)
    assert nvlink.cluster_values(model) == {"nvlink_links": "none"}
    assert rows_of(evaluate(stdout, code, NO_NVLINK)) == [("links", "pass", "ok", None, "no NVLink", "no NVLink")]
    rows = evaluate(stdout, code, H200)
    assert rows_of(rows) == [
        ("links", "fail", "no_nvlink", None, "no NVLink", "18 x 26.562 GB/s per GPU"),
    ]
    assert rows[0].detail == "nvidia-smi nvlink -s listed no GPU with NVLinks"


def test_no_nvlink_key_in_profile_skips_but_shows_what_was_seen() -> None:
    rows = evaluate(*output(), NO_KEY)
    assert rows_of(rows) == [("links", "skip", "not_in_profile", None, "18x26.562", None)]
    assert rows_of(evaluate(*output("h100x1"), NO_KEY)) == [("links", "skip", "not_in_profile", None, "none", None)]


def test_inactive_link_as_the_testbed_plants_it() -> None:
    stdout, code = output(status=on_gpu(2, replace_once("\t Link 7: 26.562 GB/s\n", "\t Link 7: <inactive>\n")))
    assert "\t Link 7: <inactive>\n" in stdout
    model = nvlink.parse(stdout, code)
    assert [(link.index, link.active) for link in model.gpus[2].links if not link.active] == [(7, False)]
    assert rows_of(nvlink.evaluate(model, H200, NO_CLUSTER)) == [
        ALL_OK[0],
        ALL_OK[1],
        ("link7", "fail", "link_inactive", 2, "<inactive>", "26.562 GB/s"),
        ALL_OK[3],
    ]
    assert nvlink.cluster_values(model) == {"nvlink_links": "0:18x26.562/1:18x26.562/2:17x26.562+1inactive/3:18x26.562"}


def test_gpu_with_17_links_fails_links_missing() -> None:
    stdout, code = output(status=on_gpu(1, replace_once("\t Link 17: 26.562 GB/s\n", "")))
    rows = evaluate(stdout, code)
    assert rows_of(rows) == [
        ALL_OK[0],
        ("links", "fail", "links_missing", 1, "17", "18"),
        ALL_OK[2],
        ALL_OK[3],
    ]
    assert rows[1].detail == "links shown: " + ", ".join(str(i) for i in range(17))


def test_slow_link_fails_and_a_link_within_tolerance_passes() -> None:
    slow = output(status=on_gpu(3, replace_once("\t Link 5: 26.562 GB/s", "\t Link 5: 25.781 GB/s")))
    assert rows_of(evaluate(*slow))[3] == ("link5", "fail", "link_slow", 3, "25.781 GB/s", "26.562 GB/s")
    assert len(evaluate(*slow)) == 4
    # 26.5 is 0.23% under 26.562: inside the 0.5% tolerance, and the evidence shows both speeds.
    close = output(status=on_gpu(3, replace_once("\t Link 5: 26.562 GB/s", "\t Link 5: 26.5 GB/s")))
    assert rows_of(evaluate(*close))[3] == (
        "links",
        "pass",
        "ok",
        3,
        "17 x 26.562 GB/s + 1 x 26.5 GB/s",
        "18 x 26.562 GB/s",
    )


def test_nonzero_crc_counter_warns_with_the_counts() -> None:
    stdout, code = output(errors=on_gpu(0, replace_once("\t Link 3: CRC Errors: 0\n", "\t Link 3: CRC Errors: 12\n")))
    model = nvlink.parse(stdout, code)
    assert model.gpus[0].counters[3] == {"Replay": 0, "Recovery": 0, "CRC": 12}
    assert rows_of(nvlink.evaluate(model, H200, NO_CLUSTER)) == [
        ALL_OK[0],
        ("link3", "warn", "link_errors", 0, "replay=0 recovery=0 crc=12", "0"),
        *ALL_OK[1:],
    ]


def test_gpu_missing_leaves_three_gpus() -> None:
    drop3 = lambda text: textops.nvlink_blocks(text).keep(lambda k: k != "3").join()  # noqa: E731
    model = nvlink.parse(*output(status=drop3, errors=drop3))
    assert [g.index for g in model.gpus] == [0, 1, 2]
    assert rows_of(nvlink.evaluate(model, H200, NO_CLUSTER)) == ALL_OK[:3]  # gpu_count fails the node for it


def test_all_links_inactive_message() -> None:
    message = "\t NVML: Unable to retrieve NVLink information as all links are inActive\n"

    def dead(text: str) -> str:
        return text.splitlines(keepends=True)[0] + message

    rows = evaluate(*output(status=on_gpu(1, dead), errors=on_gpu(1, dead)))
    assert rows_of(rows) == [
        ALL_OK[0],
        ("links", "fail", "link_inactive", 1, "all links inactive", "18 x 26.562 GB/s"),
        *ALL_OK[2:],
    ]


def test_profile_without_nvlink_on_a_node_with_links_warns() -> None:
    rows = evaluate(*output(), NO_NVLINK)
    assert rows_of(rows) == [("links", "warn", "links_extra", g, "18", "0") for g in range(4)]


@pytest.mark.parametrize(
    "stdout, code",
    [
        (DRIVER_FAILURE + MARK + "9\n" + DRIVER_FAILURE, 9),  # what COMMAND prints with a dead driver
        (DRIVER_FAILURE, 9),  # the batch cut off after the first command
    ],
)
def test_driver_failure_is_a_skip(stdout: str, code: int) -> None:
    rows = evaluate(stdout, code)
    assert rows_of(rows) == [("nvidia-smi", "skip", "nvidia_smi_failed", None, DRIVER_FAILURE.strip(), None)]
    assert nvlink.cluster_values(nvlink.parse(stdout, code)) == {}


def _cut_mid_line(text: str) -> str:
    cut = len(text) // 2
    while text[cut - 1] == "\n" or text[cut] == "\n":
        cut += 1
    return text[:cut]


@pytest.mark.parametrize(
    "variant, error",
    [
        ("status_cut", "nvlink -s output cut mid-line"),
        ("errors_cut", "nvlink -e output cut mid-line"),
        ("whole_cut", "output truncated before the nvlink -e section"),
        ("garbage", "unexpected line before the first GPU in nvlink -s: '#!garbage ~~~ 42'"),
        ("errors_missing_gpu", "nvlink -s lists GPUs [0, 1, 2, 3] but nvlink -e lists GPUs [0, 1]"),
        ("status_rc", "nvidia-smi nvlink -s exited '2'"),
        ("errors_rc", "nvidia-smi nvlink -e exited 2"),
        ("duplicate_link", "GPU 0 link 1 listed twice in nvlink -s"),
    ],
)
def test_unreadable_output_is_an_error_row_keeping_the_raw_text(variant: str, error: str) -> None:
    stdout, code = output()
    s, _ = captured("h200x4", "nvlink-s.txt")
    e, _ = captured("h200x4", "nvlink-e.txt")
    if variant == "status_cut":
        stdout = f"{_cut_mid_line(s)}{MARK}0\n{e}"
    elif variant == "errors_cut":
        stdout = f"{s}{MARK}0\n{_cut_mid_line(e)}"
    elif variant == "whole_cut":
        stdout = _cut_mid_line(s)
    elif variant == "garbage":
        junk = "#!garbage ~~~ 42\n\x00\x7f\n"
        stdout, code = f"{junk}{MARK}0\n{junk}", 0
    elif variant == "errors_missing_gpu":
        stdout = f"{s}{MARK}0\n{e[: e.index('GPU 2: ')]}"
    elif variant == "status_rc":
        stdout = f"{s}{MARK}2\n{e}"
    elif variant == "errors_rc":
        code = 2
    elif variant == "duplicate_link":
        stdout = stdout.replace("\t Link 1: 26.562 GB/s\n", "\t Link 1: 26.562 GB/s\n\t Link 1: 26.562 GB/s\n", 1)
    model = nvlink.parse(stdout, code)
    assert model.error == error
    assert nvlink.cluster_values(model) == {}
    rows = nvlink.evaluate(model, H200, NO_CLUSTER)
    assert rows_of(rows) == [("output", "error", "unparsable_output", None, None, None)]
    assert rows[0].detail.startswith(error + "\n" + stdout[:40])


def test_parser_never_raises_on_any_prefix() -> None:
    stdout, code = output()
    stdout = stdout.replace("\t Link 7: 26.562 GB/s", "\t Link 7: <inactive>", 1)
    for cut in range(0, len(stdout), 7):
        model = nvlink.parse(stdout[:cut], code)
        if cut and not stdout[:cut].endswith("\n"):
            assert model.error is not None, cut
        nvlink.evaluate(model, H200, NO_CLUSTER)
        nvlink.cluster_values(model)


# Through the test-bed's own stand-in: the exact bytes a simulated node prints for COMMAND.


def run_on_standin(tmp_path: Path, faults: list[object], base: str = "h200x4") -> tuple[str, int]:
    data = tmp_path / "data"
    node = build_node(base, [parse_fault(f, "test") for f in faults], {})
    write_node_data(node, data, seed="seed")
    tools = write_standins(tmp_path / "bin", data)
    env = {**os.environ, "PATH": f"{tools['nvidia-smi'].parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(  # noqa: S603 - our own COMMAND on our own stand-in
        ["/bin/sh", "-c", nvlink.COMMAND], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.stderr == ""
    return done.stdout, done.returncode


@pytest.mark.integration
def test_standin_clean_node_matches_the_capture(tmp_path: Path) -> None:
    assert run_on_standin(tmp_path, []) == output()
    assert rows_of(evaluate(*run_on_standin(tmp_path, []))) == ALL_OK


@pytest.mark.integration
def test_standin_planted_nvlink_faults(tmp_path: Path) -> None:
    stdout, code = run_on_standin(
        tmp_path,
        [{"nvlink_inactive": {"gpu": 1, "link": 7}}, {"nvlink_errors": {"gpu": 3, "link": 2, "crc": 5, "replay": 1}}],
    )
    assert rows_of(evaluate(stdout, code)) == [
        ALL_OK[0],
        ("link7", "fail", "link_inactive", 1, "<inactive>", "26.562 GB/s"),
        ALL_OK[2],
        ALL_OK[3],
        ("link2", "warn", "link_errors", 3, "replay=1 recovery=0 crc=5", "0"),
    ]


@pytest.mark.integration
@pytest.mark.parametrize(
    "fault, expected",
    [
        ("nvidia_smi_fail", [("nvidia-smi", "skip", "nvidia_smi_failed", None, DRIVER_FAILURE.strip(), None)]),
        ("garbage", [("output", "error", "unparsable_output", None, None, None)]),
        ("truncated", [("output", "error", "unparsable_output", None, None, None)]),
        ("gpu_missing", ALL_OK[:3]),
    ],
)
def test_standin_modes(tmp_path: Path, fault: str, expected: list[tuple[object, ...]]) -> None:
    assert rows_of(evaluate(*run_on_standin(tmp_path, [fault]))) == expected


@pytest.mark.integration
def test_standin_h100_node_against_an_18_link_profile(tmp_path: Path) -> None:
    rows = evaluate(*run_on_standin(tmp_path, [], base="h100x1"))
    assert rows_of(rows) == [("links", "fail", "no_nvlink", None, "no NVLink", "18 x 26.562 GB/s per GPU")]
