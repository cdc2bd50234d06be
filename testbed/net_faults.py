"""Faults of a node's simulated HCAs beyond their counters: a port down, at another rate, or a RoCE port. Kept
beside :mod:`testbed.faults`, which lists them in its plan; :mod:`testbed.ibsys` writes them into sysfs."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from cluster_accept.testbed.fault_base import _Fault


class IbPort(_Fault):
    """HCA ``mlx5_<rail>`` port 1 in another state (``1: DOWN``), at another rate, or a RoCE port (link layer
    Ethernet, with a GID table: RoCE v1 and v2 entries for its link-local and IPv4 addresses)."""

    kind: Literal["ib_port"] = "ib_port"
    rail: Annotated[int, Field(ge=0, le=15)] = 0
    state: Literal["4: ACTIVE", "1: DOWN", "2: INIT"] = "4: ACTIVE"
    rate: str | None = None  # as sysfs writes it: '0.25 Gb/sec (1X SDR)'
    link_layer: Literal["InfiniBand", "Ethernet", "Unknown"] = "InfiniBand"  # EFA's reads Unknown
    driver: Literal["mlx5_core", "efa"] = "mlx5_core"


class EfaSoftware(_Fault):
    """What NCCL needs to reach a node's EFA devices: the aws-ofi-nccl plugin on its LD_LIBRARY_PATH and
    libfabric's efa provider (an ``fi_info`` that lists it); either one missing."""

    kind: Literal["efa_software"] = "efa_software"
    plugin: bool = True
    provider: bool = True
