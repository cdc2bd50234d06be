"""The infiniband check: the captured machines (no /sys/class/infiniband entries), derived nodes with
ACTIVE/DOWN ports, rate and port-count drift, the COMMAND against a fake sysfs tree, and broken outputs."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import pytest

import cluster_accept.checks.infiniband as ib
from cluster_accept.checks.base import Status, majority_values
from cluster_accept.checks.infiniband import IbPort, NetLink
from cluster_accept.inventory.model import ExpectedTransport, ProbeSettings, Profile
from tests.capture import CAPTURES, NO_CLUSTER, captured

IB = Profile(probes=ProbeSettings(expected_transport=ExpectedTransport(intra_node="NVL", inter_node="NET/IB")))
SOCKET = Profile(probes=ProbeSettings(expected_transport=ExpectedTransport(intra_node="SHM", inter_node="NET/Socket")))
NDR = "400 Gb/sec (4X NDR)"
HDR = "200 Gb/sec (4X HDR)"


def port_line(device: str, port: int = 1, state: str = "4: ACTIVE", rate: str = NDR, layer: str = "InfiniBand") -> str:
    return f"/sys/class/infiniband/{device}/ports/{port} {state} {rate} {layer}"


def output(lines: list[str], peermem: bool = True) -> str:
    body = "".join(line + "\n" for line in lines)
    return f"### ports\n{body}### peermem {'loaded' if peermem else 'absent'}\n### end\n"


def rows_of(rows: list) -> list[tuple[str, str, str, str | None, str | None]]:
    return [(r.item, r.status.value, r.reason, r.observed, r.expected) for r in rows]


def from_captures(base: str) -> str:
    """What COMMAND prints on a captured machine: one line per port entry of the ``ls -la`` listing and the
    peermem line from the captured /sys/module names (h100x1 has no such capture: peermem absent there too,
    the machine has no NIC drivers at all)."""
    stdout, code = captured(base, "ib.txt")
    assert code == 0
    listing = stdout.split("bash: line 1:")[0].splitlines()
    assert listing[0] == "total 0"
    entries = [line.split()[-1] for line in listing[1:]]
    assert entries[:2] == [".", ".."]
    devices = entries[2:]
    modules_file = CAPTURES / base / "sys-module-gpu-nic.txt"
    modules = modules_file.read_text().split() if modules_file.exists() else []
    lines = [port_line(d) for d in devices]  # none on these machines
    return output(lines, peermem="nvidia_peermem" in modules)


@pytest.mark.parametrize("base", ["h200x4", "h100x1"])
def test_captured_machines_have_no_ports(base: str) -> None:
    stdout = from_captures(base)
    assert stdout == "### ports\n### peermem absent\n### end\n"
    model = ib.parse(stdout, 0)
    assert (model.error, model.ports, model.peermem) == (None, [], False)
    assert ib.cluster_values(model) == {"ports": "0"}
    ib_rows = ib.evaluate(model, IB, NO_CLUSTER)
    assert rows_of(ib_rows) == [
        ("ports", "fail", "no_ib_ports", "0 ports", "ports under /sys/class/infiniband"),
        ("nvidia_peermem", "fail", "peermem_missing", "not loaded", "loaded"),
    ]
    assert ib_rows[1].detail == "GPUDirect RDMA is off: NCCL stages inter-node transfers through host memory"
    socket_rows = ib.evaluate(model, SOCKET, NO_CLUSTER)
    assert rows_of(socket_rows) == [("ports", "skip", "no_ib_expected", "0 ports", None)]
    assert socket_rows[0].detail == "expected inter-node transport: NET/Socket"
    assert rows_of(ib.evaluate(model, Profile(), NO_CLUSTER)) == [("ports", "skip", "no_ib_expected", "0 ports", None)]


def test_active_ports_pass_and_record_their_rate() -> None:
    stdout = output([port_line("mlx5_1"), port_line("mlx5_0"), port_line("mlx5_2", layer="Ethernet")])
    model = ib.parse(stdout, 0)
    assert model.ports == [
        IbPort("mlx5_0", 1, "4: ACTIVE", NDR, "InfiniBand"),
        IbPort("mlx5_1", 1, "4: ACTIVE", NDR, "InfiniBand"),
        IbPort("mlx5_2", 1, "4: ACTIVE", NDR, "Ethernet"),
    ]
    rows = ib.evaluate(model, IB, NO_CLUSTER)
    assert rows_of(rows) == [
        ("mlx5_0/1", "pass", "ok", "4: ACTIVE", "4: ACTIVE"),
        ("mlx5_1/1", "pass", "ok", "4: ACTIVE", "4: ACTIVE"),
        ("mlx5_2/1", "pass", "ok", "4: ACTIVE", "4: ACTIVE"),
        ("nvidia_peermem", "pass", "ok", "loaded", "loaded"),
    ]
    assert rows[0].detail == "state 4: ACTIVE, rate 400 Gb/sec (4X NDR), link layer InfiniBand"
    assert ib.cluster_values(model) == {
        "rate:mlx5_0/1": NDR,
        "rate:mlx5_1/1": NDR,
        "rate:mlx5_2/1": NDR,
        "ports": "3",
    }


def test_down_port_and_missing_peermem_fail() -> None:
    stdout = output(
        [port_line("mlx5_0"), port_line("mlx5_1", state="1: DOWN", rate="10 Gb/sec (4X SDR)")], peermem=False
    )
    rows = ib.evaluate(ib.parse(stdout, 0), IB, NO_CLUSTER)
    assert rows_of(rows) == [
        ("mlx5_0/1", "pass", "ok", "4: ACTIVE", "4: ACTIVE"),
        ("mlx5_1/1", "fail", "port_down", "1: DOWN", "4: ACTIVE"),
        ("nvidia_peermem", "fail", "peermem_missing", "not loaded", "loaded"),
    ]
    assert rows[1].detail == "state 1: DOWN, rate 10 Gb/sec (4X SDR), link layer InfiniBand"
    assert ib.cluster_values(ib.parse(stdout, 0)) == {"rate:mlx5_0/1": NDR, "ports": "2"}  # down ports: no rate


def test_port_with_unreadable_files_is_down() -> None:
    model = ib.parse(output(["/sys/class/infiniband/mlx5_3/ports/1   "]), 0)
    assert model.ports == [IbPort("mlx5_3", 1, "", "", "")]
    assert rows_of(ib.evaluate(model, IB, NO_CLUSTER))[0] == ("mlx5_3/1", "fail", "port_down", None, "4: ACTIVE")


def test_rate_and_port_count_drift_against_the_majority() -> None:
    full = [port_line("mlx5_0"), port_line("mlx5_1")]
    nodes = {
        "a": ib.parse(output(full), 0),
        "b": ib.parse(output(full), 0),
        "c": ib.parse(output(full), 0),
        "slow": ib.parse(output([port_line("mlx5_0"), port_line("mlx5_1", rate=HDR)]), 0),
        "short": ib.parse(output([port_line("mlx5_0")]), 0),
    }
    view = majority_values({name: ib.cluster_values(m) for name, m in nodes.items()})
    assert rows_of(ib.evaluate(nodes["a"], IB, view)) == [
        ("mlx5_0/1", "pass", "ok", "4: ACTIVE", "4: ACTIVE"),
        ("mlx5_1/1", "pass", "ok", "4: ACTIVE", "4: ACTIVE"),
        ("nvidia_peermem", "pass", "ok", "loaded", "loaded"),
    ]
    assert rows_of(ib.evaluate(nodes["slow"], IB, view)) == [
        ("mlx5_0/1", "pass", "ok", "4: ACTIVE", "4: ACTIVE"),
        ("mlx5_1/1", "pass", "ok", "4: ACTIVE", "4: ACTIVE"),
        ("mlx5_1/1", "fail", "drift", HDR, f"{NDR} (majority)"),
        ("nvidia_peermem", "pass", "ok", "loaded", "loaded"),
    ]
    short = ib.evaluate(nodes["short"], IB, view)
    assert rows_of(short)[0] == ("ports", "fail", "drift", "1", "2 (majority)")
    assert short[0].detail == "mlx5_0/1"
    assert len(short) == 3


def test_ports_present_but_not_expected_are_recorded() -> None:
    stdout = output([port_line("mlx5_0", layer="Ethernet", rate="100 Gb/sec (4X EDR)")], peermem=False)
    rows = ib.evaluate(ib.parse(stdout, 0), SOCKET, NO_CLUSTER)
    assert rows_of(rows) == [
        ("mlx5_0/1", "pass", "recorded", "4: ACTIVE", None),
        ("nvidia_peermem", "pass", "recorded", "not loaded", None),
    ]
    assert rows[0].detail == "state 4: ACTIVE, rate 100 Gb/sec (4X EDR), link layer Ethernet"


@pytest.mark.integration
def test_command_against_a_fake_sysfs_tree(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys" / "class" / "infiniband"  # read under $CLUSTER_ACCEPT_SYSFS (a container's /host/sys)
    for device, port, state, rate, layer in [
        ("mlx5_0", 1, "4: ACTIVE", NDR, "InfiniBand"),
        ("mlx5_1", 1, "1: DOWN", "10 Gb/sec (4X SDR)", "InfiniBand"),
        ("mlx5_bond_0", 1, "4: ACTIVE", HDR, None),  # no link_layer file
    ]:
        folder = sysfs / device / "ports" / str(port)
        folder.mkdir(parents=True)
        (folder / "state").write_text(state + "\n")
        (folder / "rate").write_text(rate + "\n")
        if layer:
            (folder / "link_layer").write_text(layer + "\n")
    drivers = tmp_path / "sys" / "bus" / "pci" / "drivers"
    (drivers / "mlx5_core").mkdir(parents=True)
    (sysfs / "mlx5_0" / "device").mkdir()
    (sysfs / "mlx5_0" / "device" / "driver").symlink_to(drivers / "mlx5_core")
    net = tmp_path / "sys" / "class" / "net"
    for name, speed, state, physical in [("eth0", "100000", "up", True), ("lo", "", "unknown", False)]:
        (net / name).mkdir(parents=True)
        (net / name / "operstate").write_text(state + "\n")
        if speed:
            (net / name / "speed").write_text(speed + "\n")
        if physical:
            (net / name / "device").mkdir()
    (tmp_path / "sys" / "module" / "nvidia_peermem").mkdir(parents=True)
    env = {**os.environ, "CLUSTER_ACCEPT_SYSFS": str(tmp_path / "sys")}
    proc = subprocess.run(["sh", "-c", ib.COMMAND], capture_output=True, text=True, timeout=30, check=False, env=env)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout == (
        f"### ports\n{sysfs}/mlx5_0/ports/1 4: ACTIVE {NDR} InfiniBand driver=mlx5_core\n"
        f"{sysfs}/mlx5_1/ports/1 1: DOWN 10 Gb/sec (4X SDR) InfiniBand driver=\n"
        f"{sysfs}/mlx5_bond_0/ports/1 4: ACTIVE {HDR}  driver=\n"
        f"### net\neth0 100000 up\n### peermem loaded\n{_dmabuf()}### end\n"
    )
    model = ib.parse(proc.stdout, 0)
    assert model.peermem is True and model.net == [NetLink("eth0", 100000, True)]
    assert model.ports == [
        IbPort("mlx5_0", 1, "4: ACTIVE", NDR, "InfiniBand", "mlx5_core"),
        IbPort("mlx5_1", 1, "1: DOWN", "10 Gb/sec (4X SDR)", "InfiniBand"),
        IbPort("mlx5_bond_0", 1, "4: ACTIVE", HDR, ""),
    ]


def _dmabuf() -> str:
    """The dma-buf line this machine prints: its kernel release, and whether an open NVIDIA module is loaded."""
    version = Path("/proc/driver/nvidia/version")
    module = "open" if version.exists() and "Open Kernel Module" in version.read_text() else "closed"
    return f"### dmabuf {platform.release()} {module}\n"


@pytest.mark.integration
def test_command_without_any_device(tmp_path: Path) -> None:
    command = ib.COMMAND.replace("/proc/modules", str(tmp_path / "modules"))
    env = {**os.environ, "CLUSTER_ACCEPT_SYSFS": str(tmp_path / "sys")}
    (tmp_path / "modules").write_text("nvidia_uvm 1810432 0 - Live 0x0000000000000000\n")
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30, check=False, env=env)
    assert proc.stdout == f"### ports\n### net\n### peermem absent\n{_dmabuf()}### end\n"
    (tmp_path / "modules").write_text("nvidia_peermem 16384 0 - Live 0x0000000000000000\n")
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30, check=False, env=env)
    assert proc.stdout == f"### ports\n### net\n### peermem loaded\n{_dmabuf()}### end\n"


GOOD = output([port_line("mlx5_0")])


@pytest.mark.parametrize(
    "stdout",
    [
        "",
        "\x00\x7f#!garbage ~~~ 42\n",
        GOOD[: GOOD.index("### end")],  # truncated before the end marker
        GOOD[:40],  # truncated inside a port line
        "### ports\nmlx5_0 port 1 is up\n### peermem loaded\n### end\n",
        "### ports\n" + port_line("mlx5_0") + "\n### end\n",  # no peermem line
        "### ports\n### peermem maybe\n### end\n",
    ],
)
def test_garbage_and_truncated_output_are_error_rows(stdout: str) -> None:
    model = ib.parse(stdout, 0)
    assert model.error is not None and model.raw == stdout
    assert ib.cluster_values(model) == {}
    rows = ib.evaluate(model, IB, NO_CLUSTER)
    assert [(r.item, r.status, r.reason) for r in rows] == [("output", Status.ERROR, "unparsable_output")]
    assert stdout[:10] in rows[0].detail


def test_the_profiles_rate_width_and_port_count_are_judged_on_active_ports() -> None:
    spec = Profile.model_validate({"infiniband": {"ports": 3, "rate_gbps": 400, "width": "4X"}})
    text = output([port_line("mlx5_0"), port_line("mlx5_1", rate="200 Gb/sec (4X HDR)"),
                   port_line("mlx5_2", rate="100 Gb/sec (1X NDR)"), port_line("mlx5_3", state="1: DOWN")])  # fmt: skip
    rows = [(r.item, r.status.value, r.reason, r.observed) for r in ib.evaluate(ib.parse(text, 0), spec, NO_CLUSTER)]
    assert rows[:4] == [
        ("active_ports", "pass", "ok", "3"),
        ("mlx5_1/1 rate", "fail", "rate_low", "200 Gb/sec (4X HDR)"),
        ("mlx5_2/1 rate", "fail", "rate_low", "100 Gb/sec (1X NDR)"),
        ("mlx5_2/1 width", "fail", "width_low", "1X"),
    ]
    assert ("mlx5_3/1", "fail", "port_down", "1: DOWN") in rows  # the usual port rows follow
    healthy = output([port_line(f"mlx5_{i}") for i in range(3)])
    got = [(r.item, r.reason) for r in ib.evaluate(ib.parse(healthy, 0), spec, NO_CLUSTER)][:2]
    assert got == [("active_ports", "ok"), ("rate_width", "ok")]
    none = [(r.status.value, r.reason) for r in ib.evaluate(ib.parse(output([]), 0), spec, NO_CLUSTER)]
    assert none == [("fail", "no_ib_ports")]  # stated, nothing to look at: a failure, never a pass
