"""A synthetic run of N GPU nodes (4 GPUs each) for the report at scale: the rows, figures and values a real run
of ``preflight,single-node`` produces, in the shapes a simulated run's Parquet holds (checks, node_values,
measurements), built in seconds without running anything.

Every node passes the same preflight rows and warns the same ``hostname:resolves_to_loopback`` (identical
evidence on every node); every ``100 / faulty_pct``-th node carries one of :data:`FAULTS` in turn, with the rows
and raw output the simulated nodes give for that fault. Verdicts come from the real verdict function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cluster_accept.analysis.verdicts import VerdictRow, node_verdict
from cluster_accept.checks.base import NodeRow, Status, discover
from cluster_accept.checks.reasons import ReasonCatalog, catalog
from cluster_accept.probes.base import discover as discover_probes
from cluster_accept.reports.figures import ReportView
from cluster_accept.reports.render import ReportData
from cluster_accept.tasks.stages import declared_links
from cluster_accept.vocabulary.rows import Measurement, NodeValue

LINKS = declared_links()  # the cause links the stages' checks and probes declare

GPUS = 4
PROFILE = "h200x4"
SIZES = tuple(1 << k for k in range(20, 29))  # the all-reduce sweep, 1 MiB to 256 MiB
THRESHOLDS = {
    PROFILE: {"gemm_bf16_tflops_min": 700.0, "hbm_copy_gbps_min": 3000.0, "allreduce_intra_busbw_gbps_min": 300.0}
}
DRIVER, OTHER_DRIVER = "580.159.04", "570.86.15"
SMI_CSV = "".join(f"{g}, NVIDIA H200, {DRIVER}, Enabled, 16, 16\n" for g in range(GPUS))
DRIVER_OUT = f"{DRIVER}\n" * GPUS + "### /proc/driver/nvidia/version rc=0\nNVRM version: NVIDIA UNIX Open Kernel Module"
NVLINK_OUT = "".join(
    f"GPU {g}: NVIDIA H200 (UUID: GPU-{g:08d}-2577-6408-7f45-fd57dff161bc)\n"
    + "".join(f"\t Link {k}: 26.562 GB/s\n" for k in range(18))
    for g in range(GPUS)
)
PCIE_OUT = "".join(f"{g}, 5, 5, 16, 16\n" for g in range(GPUS))
LOOPBACK = "127.0.1.1 {node}\n127.0.0.1 localhost\n"
SMI_FAILED = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."


@dataclass(frozen=True)
class SyntheticRun:
    run: dict[str, Any]
    verdicts: list[VerdictRow]
    data: ReportData


def _row(node: str, check: str, item: str, status: str, reason: str, observed: Any = None, **more: Any) -> NodeRow:
    return NodeRow(
        "r-scale", "sim", more.pop("stage", "preflight"), node, check, item, Status(status), reason,
        None if observed is None else str(observed), more.pop("expected", None), more.pop("detail", ""),
        more.pop("gpu", None), more.pop("raw", ""), more.pop("command", ""),
    )  # fmt: skip


def _passing(node: str) -> list[NodeRow]:
    """The rows every healthy node gives: per-node checks and per-GPU ones, with their raw output."""
    rows = [
        _row(node, "driver", "version", "pass", "ok", DRIVER, expected=DRIVER, raw=DRIVER_OUT),
        _row(node, "gpu_count", "count", "pass", "ok", GPUS, expected=GPUS, raw=SMI_CSV),
        _row(node, "cuda", "version", "pass", "ok", "12.8", expected="12.8"),
        _row(node, "xid", "events", "pass", "ok", "0 XID events", raw="### source=dmesg\n"),
        _row(node, "topology", "nvlink_pairs", "pass", "ok", "NV18", expected="NV18"),
        _row(node, "hostname", "resolves", "warn", "resolves_to_loopback", "127.0.0.1",
             expected="a non-loopback address", raw=LOOPBACK.format(node="$(hostname)")),
        _row(node, "infiniband", "ports", "skip", "no_ib_expected", "0 ports"),
    ]  # fmt: skip
    for gpu in range(GPUS):
        rows += [
            _row(node, "persistence", "mode", "pass", "ok", "Enabled", expected="Enabled", gpu=gpu),
            _row(node, "pcie", "width", "pass", "ok", "x16", expected="x16", gpu=gpu, raw=PCIE_OUT),
            _row(node, "memory", "retired_pages_pending", "skip", "not_available", "[N/A]", expected="No", gpu=gpu),
            _row(node, "nvlink", "links", "pass", "ok", 18, expected=18, gpu=gpu, raw=NVLINK_OUT),
        ]
    return rows


def _gpu_missing(node: str, index: int) -> list[NodeRow]:
    return [_row(node, "gpu_count", "count", "fail", "count_low", GPUS - 1, expected=GPUS, raw=SMI_CSV[:-30])]


def _driver(node: str, index: int) -> list[NodeRow]:
    raw = DRIVER_OUT.replace(DRIVER, OTHER_DRIVER)
    return [
        _row(node, "driver", "version", "fail", "version_mismatch", OTHER_DRIVER, expected=DRIVER, raw=raw),
        _row(node, "driver", "drift", "fail", "drift", OTHER_DRIVER, expected=f"{DRIVER} (majority)", raw=raw),
    ]


def _nvlink(node: str, index: int) -> list[NodeRow]:
    raw = NVLINK_OUT.replace("Link 7: 26.562 GB/s", "Link 7: <inactive>", 2)
    return [
        _row(node, "nvlink", "link7", "fail", "link_inactive", "<inactive>", expected="26.562 GB/s", gpu=1, raw=raw)
    ]


def _pcie(node: str, index: int) -> list[NodeRow]:
    raw = PCIE_OUT.replace("2, 5, 5, 16", "2, 5, 5, 8")
    return [
        _row(node, "pcie", "width", "fail", "width_degraded", "x8", expected="x16", gpu=2, raw=raw),
        _row(node, "pcie", "width_profile", "fail", "width_below_profile", "x8", expected="x16", gpu=2, raw=raw),
    ]


def _persistence(node: str, index: int) -> list[NodeRow]:
    raw = "".join(f"{g}, Disabled\n" for g in range(GPUS))
    return [
        _row(
            node, "persistence", "mode", "fail", "persistence_disabled", "Disabled", expected="Enabled", gpu=g, raw=raw
        )
        for g in range(GPUS)
    ]


def _xid(node: str, index: int) -> list[NodeRow]:
    event = f"[ {1000 + index}.567890] NVRM: Xid (PCI:0000:00:07): 79, pid=0, GPU has fallen off the bus."
    detail = f"XID 79: GPU has fallen off the bus; from dmesg\n{event}"
    return [_row(node, "xid", "xid_79", "fail", "xid_79", "1 event on PCI 0000:00:07", expected="0 XID events",
                 detail=detail, raw=f"### source=dmesg\n{event}\n")]  # fmt: skip


def _smi_failed(node: str, index: int) -> list[NodeRow]:
    return [
        _row(node, "driver", "nvidia-smi", "fail", "nvidia_smi_failed", SMI_FAILED, expected=DRIVER, raw=SMI_FAILED),
        _row(node, "gpu_count", "nvidia-smi", "fail", "nvidia_smi_failed", SMI_FAILED, expected="GPUs listed"),
    ]


def _unreachable(node: str, index: int) -> list[NodeRow]:
    return [_row(node, "ssh", "connect", "unreachable", "timeout", "timeout", expected="reachable",
                 detail=f"connecting to {node}:22 timed out after 10 s")]  # fmt: skip


def _slow_gpu(node: str, index: int) -> list[NodeRow]:
    observed = f"{520 + index % 97:.1f} TFLOP/s"  # every slow GPU measures its own figure
    return [_row(node, "gemm", "gemm_bf16_tflops", "fail", "below_threshold", observed, expected=">= 700 TFLOP/s",
                 gpu=3, stage="single-node")]  # fmt: skip


FAULTS: dict[str, Callable[[str, int], list[NodeRow]]] = {
    "gpu_missing": _gpu_missing, "driver_version": _driver, "nvlink_inactive": _nvlink, "pcie_width": _pcie,
    "persistence_disabled": _persistence, "xid": _xid, "nvidia_smi_fail": _smi_failed, "unreachable": _unreachable,
    "slow": _slow_gpu,
}  # fmt: skip
MEASURED_FAULTS = {"slow"}  # faults after which the node is still measured (the others stop at preflight)


def node_names(nodes: int) -> list[str]:
    width = max(4, len(str(nodes)))
    return [f"gpu{i:0{width}d}" for i in range(1, nodes + 1)]


def faults_of(names: list[str], faulty_pct: float) -> dict[str, str]:
    """Every ``100 / faulty_pct``-th node, from the first, with the next fault of :data:`FAULTS`."""
    step = max(1, round(100 / faulty_pct)) if faulty_pct else 0
    kinds = list(FAULTS)
    return {name: kinds[k % len(kinds)] for k, name in enumerate(names[::step])} if step else {}


def _figures(node: str, index: int, slow: bool) -> list[Measurement]:
    """What the single-node stage measures on a node: GEMM and HBM per GPU, the all-reduce sweep."""
    base = {"run_id": "r-scale", "cluster": "sim", "stage": "single-node", "node": node, "profile": PROFILE}
    wobble = (index * 7919 % 101) / 100  # a deterministic spread between nodes, 0 .. 1
    out = [
        {**base, "probe": "gemm", "gpu": g, "metric": "gemm_bf16_tflops", "unit": "TFLOP/s",
         "value": (520 + index % 97 if slow and g == 3 else 780 + 10 * wobble + g)}
        for g in range(GPUS)
    ]  # fmt: skip
    out = [Measurement(**m) for m in out]
    out += [
        Measurement(**base, probe="hbm", gpu=g, metric="hbm_copy_gbps", unit="GB/s", value=3900 + 40 * wobble + g)
        for g in range(GPUS)
    ]
    out += [
        Measurement(**base, probe="allreduce", gpu=None, metric="allreduce_busbw_gbps", unit="GB/s",
                    size=size, value=min(360.0, 40.0 * (k + 1)) * (0.97 + 0.03 * wobble))
        for k, size in enumerate(SIZES)
    ]  # fmt: skip
    return out


def _trends(node: str, index: int) -> list[dict[str, Any]]:
    """The node's GEMM figure in two earlier runs and this one, as the history gives it."""
    now = 780.0 + index % 13
    return [
        {"node": node, "metric": "gemm_bf16_tflops", "unit": "TFLOP/s", "value": value, "current": current}
        for value, current in ((now + 4, False), (now + 2, False), (now, True))
    ]


def _values(node: str, fault: str | None) -> list[NodeValue]:
    driver = OTHER_DRIVER if fault == "driver_version" else DRIVER
    records = [
        {"node": node, "check": "driver", "key": "driver_version", "value": driver},
        {"node": node, "check": "gpu_count", "key": "gpu_count", "value": str(GPUS - (fault == "gpu_missing"))},
        {"node": node, "check": "cuda", "key": "cuda_version", "value": "12.8"},
        {"node": node, "check": "memory", "key": "counter:gpu0.uncorrected_ecc", "value": "0"},
    ]
    return [NodeValue.from_record(r) for r in records]


def reasons() -> ReasonCatalog:
    return catalog((check.name, check.reasons) for check in discover())


def synthetic_run(nodes: int, faulty_pct: float = 5.0) -> SyntheticRun:
    """The run's rows, verdicts, figures and the probes' report sections, as a real run hands them to the report."""
    names = node_names(nodes)
    faults = faults_of(names, faulty_pct)
    rows: list[NodeRow] = []
    measurements: list[Measurement] = []
    values: list[NodeValue] = []
    trends: list[dict[str, Any]] = []
    verdicts = []
    for index, node in enumerate(names):
        fault = faults.get(node)
        own = _faulty_rows(node, index, fault)
        if fault is None or fault in MEASURED_FAULTS:
            measurements += _figures(node, index, fault == "slow")
            trends += _trends(node, index)
        if fault != "unreachable":
            values += _values(node, fault)
        rows += own
        verdicts.append(node_verdict(node, own, LINKS).row("r-scale", "sim", PROFILE))
    view = ReportView(measurements, rows, THRESHOLDS)
    sections = [s for p in discover_probes() if p.report is not None and (s := p.report(view)) is not None]
    run = {"run_id": "r-scale", "cluster": "sim", "stages": ["preflight", "single-node"], "started": "s",
           "ended": "e", "inventory": f"sim{nodes}.yaml", "inventory_digest": "0" * 64}  # fmt: skip
    data = ReportData(
        rows,
        values,
        trends=trends,
        thresholds=THRESHOLDS,
        reasons=reasons(),
        sections=sections,
        links=LINKS,
    )
    return SyntheticRun(run, verdicts, data)


def _faulty_rows(node: str, index: int, fault: str | None) -> list[NodeRow]:
    if fault == "unreachable":
        return FAULTS[fault](node, index)
    return _passing(node) + (FAULTS[fault](node, index) if fault else [])
