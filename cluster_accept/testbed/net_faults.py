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
    libfabric's efa provider (an ``fi_info`` that lists it); either one missing. ``instance``: the instance type
    DMI names (none by default; one whose EFA does RDMA reads makes ``FI_EFA_USE_DEVICE_RDMA=0`` a fault)."""

    kind: Literal["efa_software"] = "efa_software"
    plugin: bool = True
    provider: bool = True
    instance: Annotated[str, Field(pattern=r"^[a-z0-9.-]{0,40}$")] = ""


class RoceQos(_Fault):
    """A RoCE port's lossless settings (``ib_port`` with link layer Ethernet makes the port): its netdev's MTU, the
    port's traffic class, PFC as ``mlnx_qos`` prints it and ECN per priority (8 digits, priority 0 first), and
    RoCE ``hw_counters`` values (planting a higher one between two runs is a counter that grew)."""

    kind: Literal["roce_qos"] = "roce_qos"
    rail: Annotated[int, Field(ge=0, le=15)] = 0
    mtu: Annotated[int, Field(ge=576, le=9216)] = 9000
    traffic_class: Annotated[int, Field(ge=0, le=255)] | None = 106
    pfc: Annotated[str, Field(pattern="^[01]{8}$")] = "00010000"
    ecn: Annotated[str, Field(pattern="^[01]{8}$")] = "00010000"
    hw_counters: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)


class HcaFirmware(_Fault):
    """HCA ``mlx5_<rail>`` runs another firmware (sysfs ``fw_ver``) than the test-bed's others (28.39.1002)."""

    kind: Literal["hca_firmware"] = "hca_firmware"
    rail: Annotated[int, Field(ge=0, le=15)] = 0
    fw_ver: Annotated[str, Field(pattern=r"^[0-9.]{1,32}$")] = "28.35.2000"
