"""The topology check on the real ``nvidia-smi topo -m`` captures (exact values) and on faulty variants derived
from them with the test-bed's own text edits (``testbed/textops.py``), and through the stand-in itself."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import cluster_accept.checks.topology as topology
from cluster_accept.checks.base import CheckRow, Status, discover
from cluster_accept.checks.samples import SAMPLES_DIR
from cluster_accept.inventory.model import GpuSpec, NvlinkSpec, Profile
from cluster_accept.testbed import textops
from cluster_accept.testbed.faults import parse_fault
from cluster_accept.testbed.nodedata import build_node, write_node_data
from cluster_accept.testbed.standins import write_standins
from tests.capture import DRIVER_FAILURE, NO_CLUSTER, captured

H200 = Profile(gpu=GpuSpec(model="NVIDIA H200", count=4), nvlink=NvlinkSpec(links_per_gpu=18, link_speed_gbps=26.562))
NO_KEY = Profile(gpu=GpuSpec(model="NVIDIA H200", count=4))
MATRIX = (
    "GPU0: X NV18 NV18 NV18 cpu=0-63 numa=0; GPU1: NV18 X NV18 NV18 cpu=0-63 numa=0; "
    "GPU2: NV18 NV18 X NV18 cpu=0-63 numa=0; GPU3: NV18 NV18 NV18 X cpu=0-63 numa=0"
)


def rows_of(rows: list[CheckRow]) -> list[tuple[str, str, str, int | None, str | None, str | None]]:
    return [(r.item, r.status.value, r.reason, r.gpu, r.observed, r.expected) for r in rows]


def h200() -> tuple[str, int]:
    return captured("h200x4", "topo-m.txt")


def evaluate(stdout: str, code: int | None, profile: Profile = H200) -> list[CheckRow]:
    return topology.evaluate(topology.parse(stdout, code), profile, NO_CLUSTER)


def test_discovered_with_its_command() -> None:
    assert next(c for c in discover() if c.name == "topology").command == "nvidia-smi topo -m 2>&1"


def test_h200x4_capture_exact() -> None:
    stdout, code = h200()
    assert "\x1b[4mGPU0" in stdout and "GPU NUMA ID\x1b[0m" in stdout  # the escape codes are really there
    model = topology.parse(stdout, code)
    assert (model.error, model.failure) == (None, None)
    assert [
        (g.index, [g.peers[p] for p in range(4)], g.cpu_affinity, g.numa_affinity, g.gpu_numa_id) for g in model.gpus
    ] == [
        (0, ["X", "NV18", "NV18", "NV18"], "0-63", "0", "N/A"),
        (1, ["NV18", "X", "NV18", "NV18"], "0-63", "0", "N/A"),
        (2, ["NV18", "NV18", "X", "NV18"], "0-63", "0", "N/A"),
        (3, ["NV18", "NV18", "NV18", "X"], "0-63", "0", "N/A"),
    ]
    assert model.pairs() == [
        (0, 1, "NV18"),
        (0, 2, "NV18"),
        (0, 3, "NV18"),
        (1, 2, "NV18"),
        (1, 3, "NV18"),
        (2, 3, "NV18"),
    ]
    rows = topology.evaluate(model, H200, NO_CLUSTER)
    assert rows_of(rows) == [("pairs", "pass", "ok", None, "6 x NV18", "6 x NV18")]
    assert rows[0].detail == MATRIX
    assert rows_of(topology.evaluate(model, NO_KEY, NO_CLUSTER)) == [("matrix", "pass", "recorded", None, MATRIX, None)]
    assert topology.cluster_values(model) == {"topology": "4xNV18", "gpu_cpu_affinity": "0-63"}


def test_h100x1_capture_is_a_single_gpu() -> None:
    model = topology.parse(*captured("h100x1", "topo-m.txt"))
    assert [(g.index, g.peers, g.cpu_affinity, g.numa_affinity) for g in model.gpus] == [(0, {0: "X"}, "0-15", "0")]
    assert model.pairs() == []
    for profile in (H200, NO_KEY):
        rows = topology.evaluate(model, profile, NO_CLUSTER)
        assert rows_of(rows) == [("matrix", "pass", "single_gpu", 0, "GPU0: X cpu=0-15 numa=0", None)]
    assert topology.cluster_values(model) == {"topology": "1xGPU", "gpu_cpu_affinity": "0-15"}


def test_inactive_link_on_gpu2_makes_its_pairs_nv17() -> None:
    stdout, code = h200()
    model = topology.parse(textops.topo_links(stdout, 2, -1), code)  # what the test-bed's nvlink_inactive does
    rows = topology.evaluate(model, H200, NO_CLUSTER)
    assert rows_of(rows) == [
        ("GPU0-GPU2", "fail", "nvlink_pairs", None, "NV17", "NV18"),
        ("GPU1-GPU2", "fail", "nvlink_pairs", None, "NV17", "NV18"),
        ("GPU2-GPU3", "fail", "nvlink_pairs", None, "NV17", "NV18"),
    ]
    assert rows[0].detail.startswith("GPU0: X NV18 NV17 NV18 cpu=0-63 numa=0; GPU1: NV18 X NV17 NV18")
    assert topology.cluster_values(model)["topology"] == "4x(NV17*3,NV18*3)"
    # without NVLink in the profile the matrix is only recorded
    assert [r.reason for r in topology.evaluate(model, NO_KEY, NO_CLUSTER)] == ["recorded"]


def _set_cell(text: str, row: int, column: int, value: str) -> str:
    lines = text.splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if line.startswith(f"GPU{row}\t"))
    cells = lines[index].split("\t")
    assert cells[column + 1].startswith("NV")
    cells[column + 1] = value
    lines[index] = "\t".join(cells)
    return "".join(lines)


def test_sys_pair_fails() -> None:
    stdout, code = h200()
    rows = evaluate(_set_cell(_set_cell(stdout, 0, 1, "SYS"), 1, 0, "SYS"), code)
    assert rows_of(rows) == [("GPU0-GPU1", "fail", "nvlink_pairs", None, "SYS", "NV18")]
    one_sided = evaluate(_set_cell(stdout, 1, 3, "PHB"), code)
    assert rows_of(one_sided) == [("GPU1-GPU3", "fail", "nvlink_pairs", None, "PHB/NV18", "NV18")]


def test_gpu_missing_leaves_a_3x3_matrix() -> None:
    stdout, code = h200()
    model = topology.parse(textops.drop_topo_gpu(stdout, 3), code)  # what the test-bed's gpu_missing does
    assert [g.index for g in model.gpus] == [0, 1, 2]
    assert rows_of(topology.evaluate(model, H200, NO_CLUSTER)) == [
        ("pairs", "pass", "ok", None, "3 x NV18", "3 x NV18")
    ]
    assert topology.cluster_values(model) == {"topology": "3xNV18", "gpu_cpu_affinity": "0-63"}


def test_nic_columns_are_read_beside_the_gpu_pairs() -> None:
    stdout, code = h200()
    lines = stdout.splitlines(keepends=True)
    lines[0] = lines[0].replace("GPU3\t", "GPU3\tNIC0\t")
    for i in range(1, 5):
        cells = lines[i].split("\t")
        lines[i] = "\t".join(cells[:5] + ["PIX" if i == 1 else "SYS"] + cells[5:])
    lines.insert(5, "NIC0\tPIX\tSYS\tSYS\tSYS\t X \n")
    with_nic = "".join(lines) + "\nNIC Legend:\n\n  NIC0: mlx5_0\n\n"
    model = topology.parse(with_nic, code)
    assert model.error is None
    assert [(g.index, g.peers[(g.index + 1) % 4], g.cpu_affinity, g.gpu_numa_id) for g in model.gpus] == [
        (i, "NV18", "0-63", "N/A") for i in range(4)
    ]
    assert rows_of(topology.evaluate(model, H200, NO_CLUSTER)) == [
        ("pairs", "pass", "ok", None, "6 x NV18", "6 x NV18"),
        ("GPU0 NIC", "pass", "recorded", 0, "mlx5_0 PIX", None),
        # one NIC, on GPU0's side: the other GPUs' inter-node traffic crosses the CPU interconnect
        *[(f"GPU{i} NIC", "fail", "nic_across_cpu", i, "mlx5_0 SYS", "PIX, PXB, PHB or NODE") for i in (1, 2, 3)],
    ]


def test_driver_failure_is_a_skip() -> None:
    rows = evaluate(DRIVER_FAILURE, 9)
    assert rows_of(rows) == [("nvidia-smi", "skip", "nvidia_smi_failed", None, DRIVER_FAILURE.strip(), None)]
    assert topology.cluster_values(topology.parse(DRIVER_FAILURE, 9)) == {}


def _cut_mid_line(text: str, at: int) -> str:
    while text[at - 1] == "\n" or text[at] == "\n":
        at += 1
    return text[:at]


@pytest.mark.parametrize(
    "variant, error",
    [
        ("cut_in_matrix", "output cut mid-line"),
        ("cut_in_legend", "output cut mid-line"),
        ("no_legend", "no Legend after the matrix (output truncated?)"),
        ("garbage", "no GPU0.. header: '#!garbage ~~~ 42'"),
        ("empty", "empty output"),
        ("short_row", "matrix row with 3 cells, header has 7: 'GPU2\\tNV18\\tNV18\\t X '"),
        ("unknown_cell", "unknown connection in 'GPU0\\t X \\tNV18\\t???\\tNV18\\t0-63\\t0\\t\\tN/A'"),
        ("self_not_x", "a GPU's own cell is not X"),
        ("exit_code", "nvidia-smi topo -m exited 2"),
    ],
)
def test_unreadable_output_is_an_error_row_keeping_the_raw_text(variant: str, error: str) -> None:
    stdout, code = h200()
    if variant == "cut_in_matrix":
        stdout = _cut_mid_line(stdout, stdout.index("GPU2\t") + 10)
    elif variant == "cut_in_legend":
        stdout = _cut_mid_line(stdout, stdout.index("PHB  = ") + 10)
    elif variant == "no_legend":
        stdout = stdout[: stdout.index("Legend:")]
    elif variant == "garbage":
        stdout = "#!garbage ~~~ 42\n\x00\x7f\n"
    elif variant == "empty":
        stdout = "\n"
    elif variant == "short_row":
        stdout = stdout.replace("GPU2\tNV18\tNV18\t X \tNV18\t0-63\t0\t\tN/A\n", "GPU2\tNV18\tNV18\t X \n")
    elif variant == "unknown_cell":
        stdout = _set_cell(stdout, 0, 2, "???")
    elif variant == "self_not_x":
        stdout = stdout.replace("GPU1\tNV18\t X \t", "GPU1\tNV18\tNV18\t")
    elif variant == "exit_code":
        code = 2
    model = topology.parse(stdout, code)
    assert model.error == error
    assert topology.cluster_values(model) == {}
    rows = topology.evaluate(model, H200, NO_CLUSTER)
    assert rows_of(rows) == [("output", "error", "unparsable_output", None, None, None)]
    assert rows[0].detail.startswith(error + "\n" + stdout[:20])


def test_parser_never_raises_on_any_prefix() -> None:
    stdout, code = h200()
    legend_end = stdout.index("Legend:\n") + len("Legend:\n")
    for cut in range(len(stdout)):
        model = topology.parse(stdout[:cut], code)
        if cut < legend_end:  # a cut anywhere before the legend begins is noticed
            assert model.error is not None, cut
        else:  # past it the matrix is whole: the rest is only the legend's text
            assert model.error == (None if stdout[:cut].endswith("\n") else "output cut mid-line"), cut
        topology.evaluate(model, H200, NO_CLUSTER)
        topology.cluster_values(model)
    assert topology.parse(stdout, code).error is None


# Through the test-bed's own stand-in: the exact bytes a simulated node prints for COMMAND.


def run_on_standin(tmp_path: Path, faults: list[object], base: str = "h200x4") -> tuple[str, int]:
    data = tmp_path / "data"
    write_node_data(build_node(base, [parse_fault(f, "test") for f in faults], {}), data, seed="seed")
    tools = write_standins(tmp_path / "bin", data)
    env = {**os.environ, "PATH": f"{tools['nvidia-smi'].parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(  # noqa: S603 - our own COMMAND on our own stand-in
        ["/bin/sh", "-c", topology.COMMAND], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.stderr == ""
    return done.stdout, done.returncode


@pytest.mark.integration
def test_standin_clean_node_matches_the_capture(tmp_path: Path) -> None:
    assert run_on_standin(tmp_path, []) == h200()


@pytest.mark.integration
@pytest.mark.parametrize(
    "fault, expected",
    [
        (
            {"nvlink_inactive": {"gpu": 0, "link": 4}},
            [(f"GPU0-GPU{p}", "fail", "nvlink_pairs", None, "NV17", "NV18") for p in (1, 2, 3)],
        ),
        ("gpu_missing", [("pairs", "pass", "ok", None, "3 x NV18", "3 x NV18")]),
        ("nvidia_smi_fail", [("nvidia-smi", "skip", "nvidia_smi_failed", None, DRIVER_FAILURE.strip(), None)]),
        ("garbage", [("output", "error", "unparsable_output", None, None, None)]),
        ("truncated", [("output", "error", "unparsable_output", None, None, None)]),
    ],
)
def test_standin_faults(tmp_path: Path, fault: object, expected: list[tuple[object, ...]]) -> None:
    assert rows_of(evaluate(*run_on_standin(tmp_path, [fault]))) == expected


@pytest.mark.integration
def test_standin_h100_node(tmp_path: Path) -> None:
    rows = evaluate(*run_on_standin(tmp_path, [], base="h100x1"))
    assert rows_of(rows) == [("matrix", "pass", "single_gpu", 0, "GPU0: X cpu=0-15 numa=0", None)]


NIC_DATA = SAMPLES_DIR / "topology"
RAIL1_ON_MLX5_1 = Profile.model_validate(
    {
        "nvlink": {"links_per_gpu": 18, "link_speed_gbps": 26.562},
        "probes": {"rails": [{"gpu": 2, "nic": "mlx5_1"}, {"gpu": 1, "nic": "mlx5_1"}]},
    }
)


def test_each_gpus_nearest_nic_is_recorded_and_a_rail_on_a_farther_nic_is_named() -> None:
    """Derived from the 4 x H200 capture: two NICs as nvidia-smi prints them on HGX boards (NIC columns, NIC
    rows, the NIC Legend)."""
    model = topology.parse((NIC_DATA / "h200x4_two_nics.txt").read_text(), 0)
    assert model.error is None and model.nic_names == {0: "mlx5_0", 1: "mlx5_1"}
    assert model.gpus[1].nics == {0: "PXB", 1: "SYS"}
    rows = [(r.item, r.status, r.reason, r.observed) for r in topology.evaluate(model, RAIL1_ON_MLX5_1, NO_CLUSTER)]
    assert rows == [
        ("pairs", Status.PASS, "ok", "6 x NV18"),
        ("GPU0 NIC", Status.PASS, "recorded", "mlx5_0 PIX"),
        ("GPU1 NIC", Status.PASS, "recorded", "mlx5_0 PXB"),
        ("rail1", Status.WARN, "rail_nic_not_nearest", "mlx5_1"),  # GPU1's rail names the NIC across the sockets
        ("GPU2 NIC", Status.PASS, "recorded", "mlx5_1 PIX"),
        ("GPU3 NIC", Status.PASS, "recorded", "mlx5_1 PXB"),
    ]


def test_a_gpu_whose_every_nic_is_across_the_cpu_interconnect_fails() -> None:
    model = topology.parse((NIC_DATA / "h200x4_nic_across_cpu.txt").read_text(), 0)
    failed = [
        (r.item, r.observed, r.gpu) for r in topology.evaluate(model, Profile(), NO_CLUSTER) if r.status == Status.FAIL
    ]
    assert failed == [("GPU2 NIC", "mlx5_0/mlx5_1 SYS", 2), ("GPU3 NIC", "mlx5_0/mlx5_1 SYS", 3)]
    # the captured machines have no NIC: nothing is said about NICs there
    plain = topology.parse(captured("h200x4", "topo-m.txt")[0], 0)
    assert not [r for r in topology.evaluate(plain, Profile(), NO_CLUSTER) if "NIC" in r.item]
