"""The fabric between nodes read from the nodes' ports (the ``infiniband`` check's output), the cluster's majority,
and what ``profile: auto`` expects of it: transport, ports at their rate, an all-reduce floor, a training minimum."""

from __future__ import annotations

import pytest

from cluster_accept.checks import gpu_count
from cluster_accept.checks import infiniband as ib
from cluster_accept.checks.base import Status, majority_values
from cluster_accept.inventory.fabric import (
    INTER_NODE_FRACTION,
    TRAINING_SCALING_MIN,
    NodeFabric,
    cluster_fabric,
    fabric_data,
)
from cluster_accept.inventory.model import Inventory, Node, Profile, SshSettings, TrainingSettings
from cluster_accept.tasks.preflight.auto_profile import resolve_auto_nodes
from tests.capture import captured

NDR = "400 Gb/sec (4X NDR)"
HALF = "200 Gb/sec (4X HDR)"


def ports_output(ports: list[tuple[str, str, str, str, str]], net: tuple[str, ...] = (), peermem: bool = True) -> str:
    """The check's output for ``(device, state, rate, link layer, driver)`` ports and ``name speed state`` links."""
    lines = [f"/sys/class/infiniband/{d}/ports/1 {s} {r} {layer} driver={drv}" for d, s, r, layer, drv in ports]
    body = "".join(line + "\n" for line in lines)
    links = "".join(line + "\n" for line in net)
    return f"### ports\n{body}### net\n{links}### peermem {'loaded' if peermem else 'absent'}\n### end\n"


def ib_node(count: int = 8, rate: str = NDR, down: int | None = None, peermem: bool = True) -> str:
    ports = [
        (f"mlx5_{i}", "1: DOWN" if i == down else "4: ACTIVE", rate, "InfiniBand", "mlx5_core") for i in range(count)
    ]
    return ports_output(ports, ("eno1 25000 up",), peermem)


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        (ib_node(), NodeFabric("infiniband", 8, 400.0, "4X", peermem=True)),
        (
            ib_node(down=3),
            NodeFabric("infiniband", 8, 400.0, "4X", peermem=True),
        ),  # a down port still counts as hardware
        (  # RoCE: HCAs whose link layer is Ethernet (a bond's netdev included)
            ports_output([(f"mlx5_{i}", "4: ACTIVE", HALF, "Ethernet", "mlx5_core") for i in range(2)]),
            NodeFabric("roce", 2, 200.0, "4X", peermem=True),
        ),
        (  # EFA: told by its driver, whatever the device is called and its link layer says
            ports_output([(f"rdmap{i}s27", "4: ACTIVE", "100 Gb/sec (4X EDR)", "Unknown", "efa") for i in range(4)]),
            NodeFabric("efa", 4, 100.0, "4X", peermem=True),
        ),
        (
            ports_output([], ("eth0 100000 up", "eth1 10000 up", "eth2 400000 down")),
            NodeFabric("ethernet", 1, 100.0),
        ),
        (ports_output([], ("eth0 -1 up",)), NodeFabric("none")),  # a virtual NIC says no speed
    ],
)
def test_a_nodes_fabric_from_its_ports_and_links(stdout: str, expected: NodeFabric) -> None:
    assert ib.fabric_of(ib.parse(stdout, 0)) == expected


def test_the_cluster_fabric_is_what_most_nodes_have_and_ties_go_to_the_higher() -> None:
    healthy, half = NodeFabric("infiniband", 8, 400.0, "4X"), NodeFabric("infiniband", 8, 200.0, "4X")
    assert cluster_fabric([healthy, healthy, half]) == healthy
    assert cluster_fabric([half, healthy]) == healthy  # two nodes: the slower one is the fault
    assert cluster_fabric([NodeFabric("ethernet", 1, 100.0), healthy, healthy]) == healthy
    assert cluster_fabric([]) is None


def test_what_each_fabric_implies_between_nodes() -> None:
    ndr = fabric_data(NodeFabric("infiniband", 8, 400.0, "4X"), training=True)
    assert ndr == {
        "probes": {"expected_transport": {"inter_node": "NET/IB"}},
        "infiniband": {"ports": 8, "rate_gbps": 400.0, "width": "4X", "peermem": False},
        "thresholds": {
            "allreduce_inter_busbw_gbps_min": 8 * 400 / 8 * INTER_NODE_FRACTION,
            "training_scaling_efficiency_min": TRAINING_SCALING_MIN,
        },
    }
    efa = fabric_data(NodeFabric("efa", 32, 100.0, "4X"), training=False)
    assert efa["probes"]["expected_transport"]["inter_node"] == "NET/Libfabric"
    assert efa["infiniband"] == {"ports": 32, "rate_gbps": 100.0}  # EFA reports no lanes worth judging
    assert efa["thresholds"] == {"allreduce_inter_busbw_gbps_min": 200.0}
    sockets = fabric_data(NodeFabric("ethernet", 1, 100.0), training=False)
    assert sockets == {"probes": {"expected_transport": {"inter_node": "NET/Socket"}}}


def _gpus(n: int) -> object:
    return gpu_count.parse("".join(f"{i}, NVIDIA H100 80GB HBM3, 580.159.04, Enabled, 16, 16\n" for i in range(n)), 0)


def _resolved(outputs: dict[str, str], training: bool = False) -> tuple[Inventory, dict[str, object]]:
    auto = Profile(base="auto", training=TrainingSettings(enabled=training))
    nodes = [Node(n, SshSettings(), "auto", auto) for n in outputs]
    inventory = Inventory("c", nodes, {"auto": auto}, "inv.yaml", "x")
    nic_models = {n: ib.parse(out, 0) for n, out in outputs.items()}
    gpu_models = {n: _gpus(8) for n in outputs}
    resolved, rows = resolve_auto_nodes("r", inventory, gpu_models, list(outputs), nic_models)
    return resolved, {row.node: row for row in rows if row.item == "fabric"}


def test_auto_expects_the_majoritys_fabric_and_fails_a_node_with_a_port_down_or_at_half_rate() -> None:
    outputs = {"n1": ib_node(), "n2": ib_node(), "n3": ib_node(down=5), "n4": ib_node(rate=HALF)}
    resolved, rows = _resolved(outputs, training=True)
    profile = resolved.node("n1").profile
    assert profile.probes.expected_transport.inter_node == "NET/IB"
    assert profile.thresholds.allreduce_inter_busbw_gbps_min == 200.0
    assert profile.thresholds.training_scaling_efficiency_min == TRAINING_SCALING_MIN
    assert profile.thresholds.gemm_bf16_tflops_min is not None  # the GPU model's profile is still there
    assert (rows["n1"].status, rows["n1"].reason, rows["n1"].expected) == (
        Status.PASS,
        "fabric_derived",
        "8 × 400 Gb/s InfiniBand ports (4X)",
    )
    assert "all-reduce floor 200 GB/s (0.5 of 400 GB/s line rate)" in (rows["n1"].detail or "")
    models = {n: ib.parse(out, 0) for n, out in outputs.items()}
    view = majority_values({n: ib.cluster_values(m) for n, m in models.items()})
    failed = {
        n: {(r.item, r.reason) for r in ib.evaluate(models[n], resolved.node(n).profile, view) if r.status == "fail"}
        for n in outputs
    }
    assert failed["n1"] == failed["n2"] == set()
    assert failed["n3"] == {("mlx5_5/1", "port_down"), ("active_ports", "ports_missing")}
    assert {item for item, reason in failed["n4"] if reason == "rate_low"} == {f"mlx5_{i}/1 rate" for i in range(8)}


def test_own_keys_go_over_the_derived_ones() -> None:
    auto = Profile.model_validate(
        {"base": "auto", "training": {"enabled": False}, "probes": {"expected_transport": {"inter_node": "NET/Socket"}}}
    )
    node = Node("n1", SshSettings(), "auto", auto)
    inventory = Inventory("c", [node], {"auto": auto}, "inv.yaml", "x")
    resolved, _ = resolve_auto_nodes("r", inventory, {"n1": _gpus(8)}, ["n1"], {"n1": ib.parse(ib_node(), 0)})
    profile = resolved.node("n1").profile
    assert profile.probes.expected_transport.inter_node == "NET/Socket"
    assert profile.infiniband is not None and profile.infiniband.ports == 8


def test_a_cluster_without_rdma_is_warned_on_every_node() -> None:
    outputs = {n: ports_output([], ("eth0 100000 up",)) for n in ("n1", "n2")}
    resolved, rows = _resolved(outputs)
    assert resolved.node("n1").profile.probes.expected_transport.inter_node == "NET/Socket"
    assert {(n, r.status, r.reason) for n, r in rows.items()} == {
        ("n1", Status.WARN, "no_rdma_fabric"),
        ("n2", Status.WARN, "no_rdma_fabric"),
    }


def test_no_port_read_anywhere_derives_nothing_and_says_so() -> None:
    resolved, rows = _resolved({"n1": "garbage", "n2": "garbage"})
    assert resolved.node("n1").profile.probes.expected_transport.inter_node is None
    assert {r.reason for r in rows.values()} == {"fabric_unreadable"}


def _peermem_rows(outputs: dict[str, str]) -> dict[str, tuple[str, str]]:
    resolved, _ = _resolved(outputs)
    models = {n: ib.parse(out, 0) for n, out in outputs.items()}
    view = majority_values({n: ib.cluster_values(m) for n, m in models.items()})
    return {
        n: (row.status.value, row.reason)
        for n in outputs
        for row in ib.evaluate(models[n], resolved.node(n).profile, view)
        if row.item == "nvidia_peermem"
    }


def test_nvidia_peermem_is_required_where_most_nodes_load_it_and_recorded_where_they_reach_gpus_by_dma_buf() -> None:
    most_load = {"n1": ib_node(), "n2": ib_node(), "n3": ib_node(peermem=False)}
    assert _peermem_rows(most_load) == {"n1": ("pass", "ok"), "n2": ("pass", "ok"), "n3": ("fail", "peermem_missing")}
    none_load = {n: ib_node(peermem=False) for n in ("n1", "n2")}
    assert _peermem_rows(none_load) == {"n1": ("pass", "recorded"), "n2": ("pass", "recorded")}


def _dmabuf_line(machine: str) -> str:
    """The check's dma-buf line for a captured machine: its kernel release and whether its driver is the open
    kernel module, both read from the captures (``uname -a``, ``/proc/driver/nvidia/version``)."""
    uname, _ = captured(machine, "uname.txt")
    version, _ = captured(machine, "proc-driver-version.txt")
    module = "open" if "Open Kernel Module" in version else "closed"
    return f"### dmabuf {uname.split()[2]} {module}"


def test_a_node_reaching_gpu_memory_through_dma_buf_passes_without_nvidia_peermem() -> None:
    dmabuf = _dmabuf_line("h100x1")
    assert dmabuf == "### dmabuf 6.18.44-fc-v657-gpu open"  # the lent H100: open module, Linux 6.18
    with_dmabuf = ib_node(peermem=False).replace("### end", f"{dmabuf}\n### end")
    closed = ib_node(peermem=False).replace("### end", "### dmabuf 6.8.0-45-generic closed\n### end")
    old_kernel = ib_node(peermem=False).replace("### end", "### dmabuf 5.4.0-150-generic open\n### end")
    assert ib.parse(with_dmabuf, 0).dmabuf and not ib.parse(closed, 0).dmabuf and not ib.parse(old_kernel, 0).dmabuf
    # GPUDirect RDMA on 3 of 5 nodes (2 through nvidia_peermem, 1 through dma-buf): expected of every node
    rows = _peermem_rows({"n1": ib_node(), "n2": ib_node(), "n3": with_dmabuf, "n4": closed, "n5": old_kernel})
    assert rows == {
        "n1": ("pass", "ok"),
        "n2": ("pass", "ok"),
        "n3": ("pass", "dmabuf"),
        "n4": ("fail", "peermem_missing"),
        "n5": ("fail", "peermem_missing"),
    }
    assert ib.parse(ib_node().replace("### end", "### dmabuf six open\n### end"), 0).error
