"""A simulated node's InfiniBand ports: a sysfs-shaped tree (``class/infiniband/mlx5_<k>/ports/1``) with the
state, rate, link layer and error counters a real HCA exposes, one HCA per rail.

The checks read ``$CLUSTER_ACCEPT_SYSFS`` (default ``/sys``); a test-bed with rails points it at this tree in
each node's sshd environment. Counter values come from the node's ``ib_counter`` faults, so planting a higher
value between two runs is a counter that grew.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from cluster_accept.checks.efa import HW_COUNTERS as EFA_COUNTERS
from cluster_accept.checks.ib_counters import ERROR_COUNTERS
from cluster_accept.checks.roce_qos import HW_COUNTERS as ROCE_COUNTERS
from cluster_accept.testbed.faults import IbCounter, _Fault
from cluster_accept.testbed.net_faults import EfaSoftware, HcaFirmware, IbPort, RoceQos

# A port's rate in sysfs's own format, scaled to what gloo moves over the test-bed's veths (0.1-0.4 GB/s per
# rank): the all-reduce floor ``profile: auto`` derives from it (half of 0.5 Gb/s: 0.031 GB/s) sits where the
# test-bed profile's own floor does, so that a healthy test-bed reaches it and a slowed one does not.
RATE = "0.5 Gb/sec (1X SDR)"
FW_VER = "28.39.1002"  # every simulated HCA's firmware unless an ``hca_firmware`` fault says otherwise


def hca_name(rail: int) -> str:
    return f"mlx5_{rail}"


# A RoCE port's GID table as mlx5 fills it for a netdev with a link-local and an IPv4 address: each address
# once as RoCE v1 and once as v2 (so index 2 is v1 and index 3 is v2, the entry seed 002 pins with
# NCCL_IB_GID_INDEX=3); the other slots read as zeros.
_GIDS = (
    ("fe80:0000:0000:0000:0000:0000:0000:00{rail:02x}", "IB/RoCE v1"),
    ("fe80:0000:0000:0000:0000:0000:0000:00{rail:02x}", "RoCE v2"),
    ("0000:0000:0000:0000:0000:ffff:0afe:{rail:02x}01", "IB/RoCE v1"),
    ("0000:0000:0000:0000:0000:ffff:0afe:{rail:02x}01", "RoCE v2"),
)
_GID_SLOTS = 8


def _write_gids(port: Path, rail: int) -> None:
    for folder in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / folder).mkdir(parents=True, exist_ok=True)
    for index in range(_GID_SLOTS):
        gid, kind = _GIDS[index] if index < len(_GIDS) else ("0000:0000:0000:0000:0000:0000:0000:0000", "")
        (port / "gids" / str(index)).write_text(gid.format(rail=rail) + "\n")
        if kind:
            (port / "gid_attrs" / "types" / str(index)).write_text(kind + "\n")
            (port / "gid_attrs" / "ndevs" / str(index)).write_text(f"rail{rail}\n")


def write_ib_sysfs(root: Path, bin_dir: Path, rails: int, faults: Sequence[_Fault]) -> dict[str, str]:
    """``root/class/infiniband``, rebuilt: one active port per rail at :data:`RATE` (unless an ``ib_port`` fault
    says otherwise), every counter 0 unless a fault sets it; the node's environment for it (none without rails).
    EFA devices (``ib_port`` with driver ``efa``) come with their software (:func:`_write_efa_software`)."""
    if not rails:
        return {}
    base = root / "class" / "infiniband"
    shutil.rmtree(base, ignore_errors=True)
    (root / "module" / "nvidia_peermem").mkdir(parents=True, exist_ok=True)  # GPUDirect RDMA, as HCA nodes load it
    planted: dict[tuple[int, str], int] = {(f.rail, f.counter): f.value for f in faults if isinstance(f, IbCounter)}
    ports = {f.rail: f for f in faults if isinstance(f, IbPort)}
    firmware = {f.rail: f.fw_ver for f in faults if isinstance(f, HcaFirmware)}
    for rail in range(rails):
        port = base / hca_name(rail) / "ports" / "1"
        (port / "counters").mkdir(parents=True)
        _write_identity(base / hca_name(rail), firmware.get(rail, FW_VER))
        fault = ports.get(rail, IbPort(rail=rail))
        (port / "state").write_text(f"{fault.state}\n")
        (port / "rate").write_text(f"{fault.rate or RATE}\n")
        (port / "link_layer").write_text(f"{fault.link_layer}\n")
        _bind(root, base / hca_name(rail), fault.driver)
        if fault.driver == "efa":
            _write_counters(port / "hw_counters", EFA_COUNTERS, {})
        if fault.link_layer == "Ethernet":
            _write_gids(port, rail)
            _write_roce_qos(root, rail, next((f for f in faults if isinstance(f, RoceQos) and f.rail == rail), None))
        for counter in ERROR_COUNTERS:
            (port / "counters" / counter).write_text(f"{planted.get((rail, counter), 0)}\n")
    env = {"CLUSTER_ACCEPT_SYSFS": str(root)}
    _write_mlnx_qos(root, bin_dir)
    if any(f.driver == "efa" for f in ports.values()):
        software = next((f for f in faults if isinstance(f, EfaSoftware)), EfaSoftware())
        env.update(_write_efa_software(root, bin_dir, software))
    return env


def _write_identity(hca: Path, fw_ver: str) -> None:
    """What identifies the HCA's board and firmware (a ConnectX-7's, as sysfs reads them)."""
    for name, text in (("fw_ver", fw_ver), ("hca_type", "MT4129"), ("board_id", "MT_0000000838")):
        (hca / name).write_text(f"{text}\n")


def _write_roce_qos(root: Path, rail: int, qos: RoceQos | None) -> None:
    """A RoCE port's netdev (``rail<k>``: MTU, ECN per priority), its traffic class, its RoCE ``hw_counters``,
    and the PFC line the ``mlnx_qos`` stand-in prints for it: 9000 bytes, class 106, PFC and ECN on priority 3
    unless ``qos`` says otherwise."""
    qos = qos or RoceQos(rail=rail)
    netdev = root / "class" / "net" / f"rail{rail}"
    shutil.rmtree(netdev, ignore_errors=True)
    for point in ("np", "rp"):
        enable = netdev / "ecn" / f"roce_{point}" / "enable"
        enable.mkdir(parents=True)
        for priority, on in enumerate(qos.ecn):
            (enable / str(priority)).write_text(f"{on}\n")
    (netdev / "mtu").write_text(f"{qos.mtu}\n")
    (netdev / "pfc").write_text("".join(f"{on:>4}" for on in qos.pfc) + "\n")  # read by the stand-in
    hca = root / "class" / "infiniband" / hca_name(rail)
    if qos.traffic_class is not None:
        (hca / "tc" / "1").mkdir(parents=True, exist_ok=True)
        (hca / "tc" / "1" / "traffic_class").write_text(f"Global tclass={qos.traffic_class}\n")
    _write_counters(hca / "ports" / "1" / "hw_counters", ROCE_COUNTERS, qos.hw_counters)


def _write_counters(folder: Path, names: Sequence[str], planted: Mapping[str, int]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text(f"{planted.get(name, 0)}\n")


def _write_mlnx_qos(root: Path, bin_dir: Path) -> None:
    """A ``mlnx_qos -i <netdev>`` stand-in printing the PFC section in MLNX_OFED's format from the netdev's
    planted settings (and failing, as the tool does, for a netdev it does not know)."""
    script = bin_dir / "mlnx_qos"
    script.write_text(
        "#!/bin/sh\n"
        f'f="{root}/class/net/$2/pfc"; [ "$1" = -i ] && [ -r "$f" ] || exit 1\n'
        "echo 'DCBX mode: OS controlled'; echo 'Priority trust state: dscp'; echo 'PFC configuration:'\n"
        'printf \'\\tpriority    0   1   2   3   4   5   6   7\\n\\tenabled  %s\\n\' "$(cat "$f")"\n'
    )
    script.chmod(0o755)


def _bind(root: Path, device: Path, driver: str) -> None:
    """``device/device/driver``: the link to the PCI driver the device is bound to, as sysfs has it."""
    target = root / "bus" / "pci" / "drivers" / driver
    target.mkdir(parents=True, exist_ok=True)
    (device / "device").mkdir(parents=True, exist_ok=True)
    (device / "device" / "driver").symlink_to(target)


def _write_efa_software(root: Path, bin_dir: Path, software: EfaSoftware) -> dict[str, str]:
    """An ``fi_info`` that lists the efa provider (or fails as libfabric does without it) and the aws-ofi-nccl
    plugin in a library directory on the node's LD_LIBRARY_PATH (or an empty one)."""
    lib = root / "opt" / "amazon" / "ofi-nccl" / "lib"
    shutil.rmtree(lib, ignore_errors=True)
    lib.mkdir(parents=True)
    if software.plugin:
        (lib / "libnccl-net-ofi.so").write_text("")
    fi_info = bin_dir / "fi_info"
    fi_info.write_text("#!/bin/sh\n" + ("echo 'provider: efa'\nexit 0\n" if software.provider else "exit 61\n"))
    fi_info.chmod(0o755)
    dmi = root / "devices" / "virtual" / "dmi" / "id"
    dmi.mkdir(parents=True, exist_ok=True)
    (dmi / "product_name").write_text(f"{software.instance}\n")
    return {"LD_LIBRARY_PATH": str(lib)}
