"""The fabric between nodes, as the nodes' own hardware shows it, and what a built-in profile expects of it.

The built-in GPU profiles (:mod:`inventory.gpus`) say what a GPU model must reach inside a node; what it must
reach between nodes depends on the network the cluster was built with, so ``profile: auto`` reads it from the
nodes, as it reads the GPU model: preflight lists every node's RDMA ports (InfiniBand, RoCE, AWS EFA) and
physical Ethernet links, each node's fabric is summed up (:class:`NodeFabric`), and the cluster's majority
(:func:`cluster_fabric`) becomes the expectation every node is judged by (:func:`fabric_data`):

- the inter-node transport NCCL must use: ``NET/IB`` over InfiniBand or RoCE HCAs, ``NET/Libfabric`` over EFA
  (aws-ofi-nccl), ``NET/Socket`` only where the nodes have no RDMA port at all;
- the RDMA port count, rate and width per node (``infiniband``), so that a node with a port fewer, one down or one
  trained at half rate fails naming the port;
- an inter-node all-reduce bus-bandwidth floor of :data:`INTER_NODE_FRACTION` of a node's line rate, judged from
  the sweep's first multi-node step;
- whenever the training sweep runs, a training scaling efficiency minimum of :data:`TRAINING_SCALING_MIN`.

A profile says where this comes from with ``fabric``: ``auto`` (the default on a built-in base) derives it from
the nodes at run time; a built-in fabric by name (:data:`BUILTIN_FABRICS`: InfiniBand NDR/HDR, Spectrum-X RoCE,
AWS EFA p4d/p5/p5en, plain Ethernet) states it when the inventory loads, whatever the nodes show; ``none`` states
nothing between nodes (a cluster of one node). Pure: plain values in, profile data out. The inventory's own keys
are laid over this data, key by key.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

FabricKind = Literal["infiniband", "roce", "efa", "ethernet", "none"]
TRANSPORT = {
    "infiniband": "NET/IB",
    "roce": "NET/IB",
    "efa": "NET/Libfabric",
    "ethernet": "NET/Socket",
    "none": "NET/Socket",
}
NAMES = {"infiniband": "InfiniBand", "roce": "RoCE", "efa": "EFA", "ethernet": "Ethernet", "none": "no network"}

# Inter-node all-reduce bus bandwidth over a node's RDMA line rate (ports × rate). A ring all-reduce across nodes
# moves each byte through the node's NICs about once per busbw byte, so nccl-tests report 0.85–0.95 of the line
# rate at 1 GiB on healthy InfiniBand (NVIDIA's DGX H100 reference: about 370 GB/s of 8 × 400 Gb/s = 400 GB/s).
# Half of it leaves room for the probe's smaller messages, adaptive routing and busy spines, and still fails a
# fall-back to sockets by far (bench/results/h200x4-multinode: NET/Socket 4.6 GB/s) and a cluster-wide fabric at
# half rate on the nodes that show it. Not yet checked against a measurement on RDMA hardware.
INTER_NODE_FRACTION = 0.5
# Per-GPU training throughput at n nodes over one node's. A data-parallel step that overlaps its gradient
# all-reduce keeps 90 % or more on a healthy fabric (bench/results/h200x2-training: 95.6 %); the failures the
# field reports keep a fifth of it (seed 002: 21 % at 16 GPUs; NCCL forced onto sockets: 23.3 %). 60 % is far from
# both, and leaves room for slower fabrics (EFA p4d, 4 × 100 Gb/s) and larger steps.
TRAINING_SCALING_MIN = 0.6


@dataclass(frozen=True)
class RdmaPort:
    """One RDMA port as preflight read it."""

    name: str  # mlx5_0/1
    kind: FabricKind  # infiniband, roce or efa
    active: bool
    rate_gbps: float | None
    width: str | None  # 4X


@dataclass(frozen=True)
class NodeFabric:
    """A node's fabric: its RDMA kind and ports, or its fastest physical Ethernet link when it has no RDMA port."""

    kind: FabricKind
    ports: int = 0  # RDMA ports of that kind, active or not; 1 for plain Ethernet
    rate_gbps: float | None = None  # per port: the most common among the active ones
    width: str | None = None
    peermem: bool = False  # GPUDirect RDMA: nvidia_peermem loaded, or dma-buf (open kernel module, Linux 5.12+)

    @property
    def transport(self) -> str:
        return TRANSPORT[self.kind]

    @property
    def rdma(self) -> bool:
        return self.kind in ("infiniband", "roce", "efa")

    def describe(self) -> str:
        """``8 × 400 Gb/s InfiniBand ports (4X)``; ``a 100 Gb/s Ethernet link, no RDMA port``."""
        rate = f"{self.rate_gbps:g} Gb/s " if self.rate_gbps else ""
        if self.kind == "none":
            return "no RDMA port (and no Ethernet link speed read)"
        if not self.rdma:
            return f"a {rate}Ethernet link, no RDMA port"
        width = f" ({self.width})" if self.width and self.kind != "efa" else ""  # EFA's lanes say nothing
        return f"{self.ports} × {rate}{NAMES[self.kind]} port{'s' if self.ports != 1 else ''}{width}"


def rdma_kind(link_layer: str, driver: str, device: str) -> FabricKind | None:
    """What an RDMA port is: EFA by its driver (its devices are named ``efa_0`` or ``rdmap16s27``; its link layer
    reads ``Unknown``), else InfiniBand or RoCE by its link layer; None when it says nothing readable."""
    if driver == "efa" or device.startswith("efa"):
        return "efa"
    if link_layer == "InfiniBand":
        return "infiniband"
    if link_layer == "Ethernet":
        return "roce"
    return None


def _most_common(values: Sequence[Any]) -> Any:
    """The value most of ``values`` hold; the largest of those tied (a fault lowers a count or a rate, so the
    higher one is what the hardware does elsewhere); None for no value."""
    counted = Counter(v for v in values if v is not None)
    if not counted:
        return None
    top = max(counted.values())
    return max(v for v, n in counted.items() if n == top)


def node_fabric(ports: Sequence[RdmaPort], ethernet_gbps: Sequence[float], peermem: bool = False) -> NodeFabric:
    """A node's fabric from its RDMA ports (the kind most of them are) or, without any, its Ethernet links' speeds
    (Gb/s, of links that are up); ``peermem``: nvidia_peermem is loaded."""
    kinds = [p.kind for p in ports]
    if kinds:
        kind = _most_common(kinds)
        own = [p for p in ports if p.kind == kind]
        active = [p for p in own if p.active]
        rate, width = _most_common([p.rate_gbps for p in active]), _most_common([p.width for p in active])
        return NodeFabric(kind, len(own), rate, width, peermem)
    if ethernet_gbps:
        return NodeFabric("ethernet", 1, max(ethernet_gbps))
    return NodeFabric("none")


def cluster_fabric(fabrics: Sequence[NodeFabric]) -> NodeFabric | None:
    """What the cluster's nodes have, by majority: the kind most nodes have, then among those nodes the port
    count, rate, width and nvidia_peermem most of them show (ties: the higher). None when no node was read."""
    if not fabrics:
        return None
    kind = _most_common([f.kind for f in fabrics])
    same = [f for f in fabrics if f.kind == kind]
    return NodeFabric(
        kind,
        _most_common([f.ports for f in same]) or 0,
        _most_common([f.rate_gbps for f in same]),
        _most_common([f.width for f in same]),
        bool(_most_common([f.peermem for f in same])),
    )


AUTO_FABRIC, NO_FABRIC = "auto", "none"


@dataclass(frozen=True)
class BuiltinFabric:
    """A fabric as its vendor documents it, for clusters whose network is known before any node is read."""

    fabric: NodeFabric
    source: str  # where the figures come from


# Per-node ports and rates from the vendors' documentation; GPUDirect RDMA expected over InfiniBand and RoCE
# (nvidia_peermem, or dma-buf with the open kernel module).
BUILTIN_FABRICS = {
    "infiniband-ndr": BuiltinFabric(
        NodeFabric("infiniband", 8, 400.0, "4X", peermem=True),
        "DGX H100/H200: 8 ConnectX-7 ports at 400 Gb/s NDR for compute",
    ),
    "infiniband-hdr": BuiltinFabric(
        NodeFabric("infiniband", 8, 200.0, "4X", peermem=True),
        "DGX A100: 8 ConnectX-6 ports at 200 Gb/s HDR for compute",
    ),
    "spectrum-x-roce": BuiltinFabric(
        NodeFabric("roce", 8, 400.0, peermem=True),
        "Spectrum-X reference: 8 BlueField-3 SuperNIC ports at 400 Gb/s RoCE v2",
    ),
    "aws-p4d": BuiltinFabric(NodeFabric("efa", 4, 100.0), "AWS p4d/p4de.24xlarge: 4 EFA devices, 400 Gb/s"),
    "aws-p5": BuiltinFabric(NodeFabric("efa", 32, 100.0), "AWS p5/p5e.48xlarge: 32 EFA devices, 3200 Gb/s"),
    "aws-p5en": BuiltinFabric(NodeFabric("efa", 16, 200.0), "AWS p5en.48xlarge: 16 EFA devices, 3200 Gb/s"),
    "ethernet": BuiltinFabric(NodeFabric("ethernet", 1), "plain Ethernet: NCCL over sockets, no RDMA port"),
}


def fabric_names() -> list[str]:
    return [AUTO_FABRIC, *BUILTIN_FABRICS, NO_FABRIC]


def line_rate_gbytes(fabric: NodeFabric) -> float | None:
    """A node's RDMA line rate in GB/s (ports × rate / 8); None without RDMA ports or a rate."""
    if not fabric.rdma or not fabric.rate_gbps or not fabric.ports:
        return None
    return fabric.ports * fabric.rate_gbps / 8


def inter_node_floor(fabric: NodeFabric) -> float | None:
    """The inter-node all-reduce bus-bandwidth floor (GB/s) a fabric implies; None where it implies none."""
    rate = line_rate_gbytes(fabric)
    return None if rate is None else round(rate * INTER_NODE_FRACTION, 3)


def fabric_data(fabric: NodeFabric, training: bool) -> dict[str, Any]:
    """Profile data for what ``fabric`` implies between nodes (the inventory's own keys go over it)."""
    data: dict[str, Any] = {}
    thresholds: dict[str, Any] = {}
    data["probes"] = {"expected_transport": {"inter_node": fabric.transport}}
    if fabric.rdma and fabric.ports:
        spec: dict[str, Any] = {"ports": fabric.ports}
        if fabric.rate_gbps:
            spec["rate_gbps"] = fabric.rate_gbps
        if fabric.width and fabric.kind != "efa":
            spec["width"] = fabric.width
        if fabric.kind != "efa":  # required where most nodes load it; else GPUDirect comes through dma-buf, or not
            spec["peermem"] = fabric.peermem
        data["infiniband"] = spec
    floor = inter_node_floor(fabric)
    if floor:
        thresholds["allreduce_inter_busbw_gbps_min"] = floor
    if training:
        thresholds["training_scaling_efficiency_min"] = TRAINING_SCALING_MIN
    if thresholds:
        data["thresholds"] = thresholds
    return data


def derivation(fabric: NodeFabric, nodes: int, of: int) -> str:
    """How the expectations were derived, for the row that states them and for ``profile suggest``."""
    said = [f"{fabric.describe()} on {nodes} of {of} nodes"]
    said.append(f"inter-node transport {fabric.transport}")
    floor, rate = inter_node_floor(fabric), line_rate_gbytes(fabric)
    if floor and rate:
        said.append(f"all-reduce floor {floor:g} GB/s ({INTER_NODE_FRACTION:g} of {rate:g} GB/s line rate)")
    return "; ".join(said)
