"""GPU-to-GPU connections and CPU/NUMA affinity, from ``nvidia-smi topo -m``.

``nvlink -s`` says how each GPU's own links are; the topology matrix says how every *pair* of GPUs is
joined, which is what NCCL uses to pick its transport. On NVSwitch systems (HGX H100/H200) every pair must
show ``NV<links per GPU>``: a pair showing fewer bonded links (``NV17``) or a PCIe path (``SYS``, ``PHB``…)
means a link or switch port is down and collectives between those GPUs run slower. The affinity columns
are recorded so that nodes wired or configured differently (BIOS, SMT) show up as drift.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from cluster_accept.checks.contract import (
    Action,
    Check,
    CheckRow,
    ClusterView,
    Link,
    Profile,
    Reason,
    Status,
    declare,
    driver_unreachable,
    error_row,
    fault,
    healthy,
)
from cluster_accept.checks.nvswitch import FABRIC_DOWN
from cluster_accept.checks.nvswitch import NAME as NVSWITCH
from cluster_accept.checks.sections import NVIDIA_SMI_SKIPPED, driver_failure

NAME = "topology"
COMMAND = "nvidia-smi topo -m 2>&1"

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_DEVICE = re.compile(r"^(GPU|NIC)(\d{1,9})$")
_CELL = re.compile(r"^(X|NV\d+|[A-Z][A-Z0-9]{1,7})$")  # X, NV18, SYS, NODE, PHB, PXB, PIX, ...
_NIC_NAME = re.compile(r"^NIC(\d{1,4}):\s*(\S{1,64})$")
# nvidia-smi's path kinds from nearest to farthest; SYS crosses the CPUs' interconnect (QPI/UPI/xGMI).
NEAREST_FIRST = ("PIX", "PXB", "PHB", "NODE", "SYS")
_AFFINITY_HEADERS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
REASONS = declare(
    NVIDIA_SMI_SKIPPED,
    Reason("single_gpu", Status.PASS, "one GPU: no GPU pairs to judge"),
    Reason(
        "nic_across_cpu",
        Status.FAIL,
        "every NIC of this GPU is across the CPU interconnect (SYS): its inter-node traffic crosses the other socket; "
        "check the NIC slots, the BIOS and NCCL_IB_HCA",
        Action.FIX_CONFIG,
    ),
    Reason(
        "rail_nic_not_nearest",
        Status.WARN,
        "the NIC the profile's rail gives this GPU is farther than another NIC: check probes.rails and NCCL_IB_HCA",
        Action.FIX_CONFIG,
    ),
    Reason(
        "nvlink_pairs",
        Status.FAIL,
        "a GPU pair is joined by fewer NVLinks than the profile (or over PCIe): reseat the GPU/baseboard",
        Action.RESEAT_CABLE,
    ),
)


@dataclass(frozen=True)
class GpuTopo:
    index: int
    peers: dict[int, str] = field(default_factory=dict)  # GPU index -> connection ("X" for itself)
    cpu_affinity: str = ""
    numa_affinity: str = ""
    gpu_numa_id: str = ""
    nics: dict[int, str] = field(default_factory=dict)  # NIC index -> connection (PIX, PXB, PHB, NODE, SYS)


@dataclass(frozen=True)
class Topology:
    gpus: list[GpuTopo] = field(default_factory=list)
    nic_names: dict[int, str] = field(default_factory=dict)  # NIC index -> device (the "NIC Legend")
    failure: str | None = None  # nvidia-smi could not talk to the driver
    error: str | None = None  # output we could not read
    raw: str = ""

    def pairs(self) -> list[tuple[int, int, str]]:
        """Every GPU pair once (lower index first) with its connection; ``NV18/NV17`` if the two cells differ."""
        found: list[tuple[int, int, str]] = []
        for gpu in self.gpus:
            for peer in self.gpus:
                if peer.index <= gpu.index:
                    continue
                there, back = gpu.peers.get(peer.index, "?"), peer.peers.get(gpu.index, "?")
                found.append((gpu.index, peer.index, there if there == back else f"{there}/{back}"))
        return found


class _Unreadable(Exception):
    pass


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.split("\t")]


def _read(text: str) -> list[GpuTopo]:
    if not text.endswith("\n"):
        raise _Unreadable("output cut mid-line")
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    start = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    if start == len(lines):
        raise _Unreadable("empty output")
    header = _cells(lines[start])
    if header[:1] == [""]:
        header = header[1:]
    devices = [cell for cell in header if _DEVICE.match(cell)]
    if not devices or devices[0] != "GPU0" or header[: len(devices)] != devices:
        raise _Unreadable(f"no GPU0.. header: {lines[start][:80]!r}")
    extra = [cell for cell in header[len(devices) :] if cell]
    if any(cell not in _AFFINITY_HEADERS for cell in extra):
        raise _Unreadable(f"unknown header columns: {extra}")
    columns = {pos: int(m.group(2)) for pos, m in enumerate(_DEVICE.match(c) for c in devices) if m and m[1] == "GPU"}
    nic_columns = {pos: int(m[2]) for pos, m in enumerate(_DEVICE.match(c) for c in devices) if m and m[1] == "NIC"}
    gpus: list[GpuTopo] = []
    end = start + 1
    for end in range(start + 1, len(lines)):
        line = lines[end]
        if not line.strip():
            break
        cells = _cells(line)
        row = _DEVICE.match(cells[0])
        if row is None:
            raise _Unreadable(f"unexpected matrix row: {line[:80]!r}")
        if row[1] == "NIC":
            continue
        device_cells = cells[1 : 1 + len(devices)]
        rest = [cell for cell in cells[1 + len(devices) :] if cell]
        if len(device_cells) != len(devices) or len(rest) != len(extra):
            raise _Unreadable(f"matrix row with {len(cells) - 1} cells, header has {len(header)}: {line[:80]!r}")
        if not all(_CELL.match(cell) for cell in device_cells):
            raise _Unreadable(f"unknown connection in {line[:80]!r}")
        affinity = dict(zip(extra, rest, strict=True))
        gpus.append(
            GpuTopo(
                index=int(row[2]),
                peers={gpu: device_cells[pos] for pos, gpu in columns.items()},
                cpu_affinity=affinity.get("CPU Affinity", ""),
                numa_affinity=affinity.get("NUMA Affinity", ""),
                gpu_numa_id=affinity.get("GPU NUMA ID", ""),
                nics={nic: device_cells[pos] for pos, nic in nic_columns.items()},
            )
        )
    if not any(line.strip() == "Legend:" for line in lines[end:]):
        raise _Unreadable("no Legend after the matrix (output truncated?)")
    if sorted(g.index for g in gpus) != sorted(columns.values()):
        raise _Unreadable(f"GPU rows {[g.index for g in gpus]} do not match GPU columns {sorted(columns.values())}")
    if any(gpu.peers[gpu.index] != "X" for gpu in gpus):
        raise _Unreadable("a GPU's own cell is not X")
    return sorted(gpus, key=lambda g: g.index)


def _nic_legend(text: str) -> dict[int, str]:
    """``NIC0: mlx5_0`` lines after ``NIC Legend:``."""
    lines = [_ANSI.sub("", line).strip() for line in text.splitlines()]
    if "NIC Legend:" not in lines:
        return {}
    names = (_NIC_NAME.match(line) for line in lines[lines.index("NIC Legend:") + 1 :])
    return {int(m[1]): m[2] for m in names if m}


def parse(stdout: str, exit_code: int | None = 0) -> Topology:
    failure = driver_failure(stdout, exit_code)
    if failure:
        return Topology(failure=failure, raw=stdout)
    if exit_code not in (0, None):
        return Topology(error=f"nvidia-smi topo -m exited {exit_code}", raw=stdout)
    try:
        return Topology(gpus=_read(stdout), nic_names=_nic_legend(stdout), raw=stdout)
    except _Unreadable as exc:
        return Topology(error=str(exc), raw=stdout)


def _matrix_text(model: Topology) -> str:
    """``GPU0: X NV18 NV18 NV18 cpu=0-63 numa=0; GPU1: ...``"""
    return "; ".join(
        f"GPU{gpu.index}: {' '.join(gpu.peers[p.index] for p in model.gpus)}"
        f" cpu={gpu.cpu_affinity or '?'} numa={gpu.numa_affinity or '?'}"
        for gpu in model.gpus
    )


def _signature(model: Topology) -> str:
    """``4xNV18`` when every pair is joined the same way, ``4x(NV17*3,NV18*3)`` otherwise, ``1xGPU`` alone."""
    counts = Counter(connection for _, _, connection in model.pairs())
    n = len(model.gpus)
    if not counts:
        return f"{n}xGPU"
    if len(counts) == 1:
        return f"{n}x{next(iter(counts))}"
    return f"{n}x(" + ",".join(f"{kind}*{count}" for kind, count in sorted(counts.items())) + ")"


def cluster_values(model: Topology) -> dict[str, str]:
    if model.failure or model.error or not model.gpus:
        return {}
    affinities = [gpu.cpu_affinity for gpu in model.gpus]
    affinity = affinities[0] if len(set(affinities)) == 1 else "/".join(affinities)
    return {"topology": _signature(model), "gpu_cpu_affinity": affinity}


def evaluate(model: Topology, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.failure:
        # gpu_count and driver already fail the node for this; one row here says why nothing was judged.
        return [CheckRow(NAME, "nvidia-smi", Status.SKIP, "nvidia_smi_failed", model.failure)]
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    matrix = _matrix_text(model)
    if len(model.gpus) == 1:
        return [CheckRow(NAME, "matrix", Status.PASS, "single_gpu", matrix, None, gpu=model.gpus[0].index)] + nic_rows(
            model, profile
        )
    return _pair_rows(model, profile, matrix) + nic_rows(model, profile)


def _pair_rows(model: Topology, profile: Profile, matrix: str) -> list[CheckRow]:
    links = profile.nvlink.links_per_gpu if profile.nvlink else 0
    if links == 0:
        return [CheckRow(NAME, "matrix", Status.PASS, "recorded", matrix)]
    expected = f"NV{links}"
    pairs = model.pairs()
    rows = [
        CheckRow(NAME, f"GPU{a}-GPU{b}", Status.FAIL, "nvlink_pairs", connection, expected, matrix)
        for a, b, connection in pairs
        if connection != expected
    ]
    if not rows:
        every = f"{len(pairs)} x {expected}"
        rows.append(CheckRow(NAME, "pairs", Status.PASS, "ok", every, every, matrix))
    return rows


def _distance(connection: str) -> int:
    return NEAREST_FIRST.index(connection) if connection in NEAREST_FIRST else len(NEAREST_FIRST)


def nic_rows(model: Topology, profile: Profile) -> list[CheckRow]:
    """Each GPU's nearest NIC (recorded: the NIC its traffic should use), a GPU with only NICs across the CPU
    interconnect named, and a rail whose NIC is not the GPU's nearest. Nothing when the node shows no NIC."""
    rails = {rail.gpu: rail.nic for rail in profile.probes.rails if rail.nic}
    rows = []
    for gpu in model.gpus:
        if not gpu.nics:
            continue
        best = min(_distance(c) for c in gpu.nics.values())
        nearest = sorted(model.nic_names.get(n, f"NIC{n}") for n, c in gpu.nics.items() if _distance(c) == best)
        seen = ", ".join(f"{model.nic_names.get(n, f'NIC{n}')} {c}" for n, c in sorted(gpu.nics.items()))
        kind = NEAREST_FIRST[best] if best < len(NEAREST_FIRST) else "?"
        if kind == "SYS":
            rows.append(
                CheckRow(
                    NAME,
                    f"GPU{gpu.index} NIC",
                    Status.FAIL,
                    "nic_across_cpu",
                    f"{'/'.join(nearest)} SYS",
                    "PIX, PXB, PHB or NODE",
                    seen,
                    gpu=gpu.index,
                )
            )
        else:
            rows.append(
                CheckRow(
                    NAME,
                    f"GPU{gpu.index} NIC",
                    Status.PASS,
                    "recorded",
                    f"{'/'.join(nearest)} {kind}",
                    None,
                    seen,
                    gpu=gpu.index,
                )
            )
        named = rails.get(gpu.index)
        by_name = {model.nic_names.get(n, f"NIC{n}"): c for n, c in gpu.nics.items()}
        if named in by_name and _distance(by_name[named]) > best:
            said = f"rail{gpu.index} uses {named} ({by_name[named]}); nearest: {', '.join(nearest)} ({kind})"
            rows.append(
                CheckRow(
                    NAME,
                    f"rail{gpu.index}",
                    Status.WARN,
                    "rail_nic_not_nearest",
                    named,
                    "/".join(nearest),
                    said,
                    gpu=gpu.index,
                )
            )
    return rows


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    cluster_values=cluster_values,
    causes=(Link(NVSWITCH, frozenset({NAME}), "preflight", FABRIC_DOWN),),  # a fabric down: no NVLink pairs
    samples=(
        healthy("h200x4", {"recorded"}, fixture="captures/h200x4/topo-m.txt"),
        healthy("h100x1", {"single_gpu"}, fixture="captures/h100x1/topo-m.txt"),
        fault("nic_across_cpu", {"nic_across_cpu"}, fixture="topology/h200x4_nic_across_cpu.txt"),
        driver_unreachable({"nvidia_smi_failed"}),
    ),
)
