"""What ``profile suggest`` writes between nodes: the keys a profile on a built-in base derives from the fabric
most nodes show (:mod:`inventory.fabric`, ``fabric: auto``), as values with how many nodes gave them, so that the
profile written down holds them whatever a later run's nodes show (and a profile without a base has them): the
RDMA ports (``infiniband``), the inter-node transport and the all-reduce floor of the NICs' line rate."""

from __future__ import annotations

from typing import Any

from cluster_accept.checks.infiniband import FLOOR_KEY as FLOOR
from cluster_accept.checks.infiniband import TRANSPORT_KEY as TRANSPORT
from cluster_accept.inventory.fabric import INTER_NODE_FRACTION

_PORT_KEYS = (("ports", int), ("rate_gbps", float), ("width", str))


def write_infiniband(out: Any) -> None:
    """The ``infiniband`` block (ports every node must show active, their rate and width, nvidia_peermem)."""
    fabric = out.found.get("fabric")
    if fabric is None:
        return
    out.prose(
        f"between nodes: {fabric.value or 'no fabric most nodes share'} ({fabric.comment()}); a built-in base derives "
        "the same keys at run time (fabric: auto); written here, they hold whatever the nodes show"
    )
    if not out.ready("infiniband.ports", int):
        return
    out.raw("infiniband:")
    for key, kind in _PORT_KEYS:
        out.value(f"infiniband.{key}", kind, indent=1)
    peermem = out.found.get("infiniband.peermem")
    if peermem is not None and peermem.value in ("true", "false"):
        out.raw(f"  peermem: {peermem.value}  # GPUDirect RDMA (nvidia_peermem or dma-buf); {peermem.comment()}")


def write_transport(out: Any) -> None:
    """``expected_transport.inter_node`` under ``probes:``."""
    if out.ready(TRANSPORT):
        out.raw("  expected_transport:")
        out.value(TRANSPORT, str, indent=2)


def write_floor(out: Any, opened: bool) -> None:
    """The inter-node all-reduce floor under ``thresholds:`` (opened here unless ``opened``)."""
    if not out.ready(FLOOR, float):
        return
    if not opened:
        out.raw("thresholds:")
    out.prose(f"{INTER_NODE_FRACTION:g} of the line rate of the nodes' RDMA ports, as profile: auto derives it", 1)
    out.value(FLOOR, float, indent=1)
