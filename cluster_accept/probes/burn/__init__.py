"""The burn-in: minutes of GEMM and memory load on every GPU of a node at once, clocks, power, temperature,
throttle reasons and ECC sampled every second, the kernel log read for XIDs before and after.

Fails a GPU whose clocks fall under load with a thermal or power reason active (``throttled``), whose sustained
throughput in the burn's last part falls from its first by more than the profile allows (``throughput_dropped``:
a GPU heating up, or a co-tenant that started half-way), that grows uncorrected ECC errors, or whose driver logs
an XID meanwhile. Each GPU's median throughput over the burn is also judged against its minimum
(``burn_tflops_min``, or where the profile sets none half the GPU's bf16 peak) and its peers across the cluster
(a GPU at half its peers' speed under sustained load). The per-second series go to ``burn/<node>.parquet`` and a
chart per node into the report (``series``: the stage writes them as each node is judged).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from cluster_accept.checks.gpu_processes import BUSY
from cluster_accept.checks.xid import XIDS
from cluster_accept.probes.burn import judge as judgement
from cluster_accept.probes.burn.report import burn_section
from cluster_accept.probes.contract import (
    RUN_FAILED,
    Action,
    CheckRow,
    Default,
    Expectation,
    Figure,
    FindingKind,
    MetricRule,
    NodeSeries,
    Probe,
    ProbeOutput,
    Profile,
    Rating,
    Reason,
    Record,
    ReportSection,
    ReportView,
    SeriesPlace,
    Status,
    cluster_judgement,
    declare,
    fault,
    gpu_state_causes,
    parse_json_lines,
    threshold_set,
)
from cluster_accept.probes.gemm import busy_rows
from cluster_accept.probes.scripts import BURN, BURN_HEALTHY, BURN_PROFILE, BURN_TORCH_MISSING
from cluster_accept.vocabulary.lazy import pandas as pd

NAME = "burn"
STAGE = "burn"
ORDER = 60
SCRIPT = BURN
CHART_POINTS = 60  # per GPU, what the report's chart draws of a node's series
# Each GPU's median bf16 GEMM throughput over the burn, memory load beside it: 615-624 TFLOP/s on 4 x H100 SXM
# over 180 s and 622.7 on one (0.62-0.63 of the 989.4 peak); 284.0 with another process loading the same GPU
# (0.29). 0.50 (495 on H100/H200) sits between, under the GEMM probe's 0.60: a sustained load runs hotter.
DEFAULT = Default(
    "dense bf16 peak",
    0.50,
    lambda model: Rating("bf16 peak", model.bf16_tflops, "TFLOP/s"),
    "H100 SXM, 20-180 s: 615-624 TFLOP/s (0.62-0.63 of 989.4); a co-tenant on the GPU: 284.0 (0.29)",
)
METRICS = {
    "burn_tflops": MetricRule(NAME, "burn_tflops_min", True, default=DEFAULT, devices=frozenset({"cuda"})),
    "burn_gflops": MetricRule(NAME, "burn_gflops_min", True, devices=frozenset({"cpu"})),
}
REASONS = declare(
    Reason("sustained", Status.PASS, "held its throughput and clocks through the burn", Action.NONE),
    Reason(
        "inconclusive",
        Status.WARN,
        "its throughput fell past the allowed drop, but inside the spread of its own first part's windows: the "
        "drop cannot be told from the load's wobble; burn again with nothing else running on the node",
        Action.RERUN,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "below_threshold",
        Status.FAIL,
        "its throughput over the burn is below the minimum (the profile's, or the row's fraction of the GPU's "
        "peak): see clocks, power and other processes in the evidence",
        Action.REPLACE_GPU,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "runs_hot",
        Status.FAIL,
        "under the same sustained load this GPU ran hotter than its node's other GPUs by more than the profile "
        "allows (burn.temp_above_median_max_c): check its fan, heat sink and thermal paste; it will throttle first",
        Action.CHECK_NODE,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "thermal_spread",
        Status.FAIL,
        "the node's GPUs ran further apart in temperature under the same load than the profile allows "
        "(burn.temp_spread_max_c): uneven cooling (airflow, a fan, a blocked inlet)",
        Action.CHECK_NODE,
        kind=FindingKind.RELATIVE,
    ),
    Reason("thermal_uniform", Status.PASS, "the node's GPUs ran within the allowed temperature spread", Action.NONE),
    Reason(
        "pcie_downtrained",
        Status.FAIL,
        "under load the GPU's PCIe link ran below its maximum generation or width (an idle GPU trains down to "
        "save power, a loaded one must not): reseat the GPU or its riser, check the slot",
        Action.RESEAT_CABLE,
    ),
    Reason(
        "throughput_dropped",
        Status.FAIL,
        "its throughput in the burn's last part fell from its first part by more than the profile allows: a GPU "
        "heating up (see clocks and reasons) or another process that started meanwhile",
        Action.CHECK_NODE,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "throttled",
        Status.FAIL,
        "its SM clock fell under sustained load with a thermal or power reason active: check the node's cooling "
        "(fans, airflow, heat sink) and power; replace the GPU if it repeats",
        Action.REPLACE_GPU,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "clocks_fell",
        Status.WARN,
        "its SM clock fell under sustained load without a thermal or power reason: application clocks or "
        "another process",
        Action.CHECK_NODE,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "ecc_uncorrected_grew",
        Status.FAIL,
        "uncorrected ECC errors appeared during the burn: failing GPU memory",
        Action.REPLACE_GPU,
    ),
    Reason(
        "ecc_corrected_grew",
        Status.WARN,
        "corrected ECC errors appeared during the burn: watch it; replace the GPU if they keep growing",
        Action.CHECK_NODE,
    ),
    Reason("xid", Status.FAIL, "the driver logged an XID during the burn (see the line)", Action.CHECK_NODE),
    Reason(
        "kernel_log_unreadable",
        Status.SKIP,
        "the kernel log could not be read on the node, so XIDs during the burn were not looked for",
        Action.NONE,
    ),
    Reason(
        "sampler_failed",
        Status.ERROR,
        "nvidia-smi could not be sampled during the burn, so clocks and throttle reasons were not judged",
        Action.CHECK_NODE,
    ),
    Reason("not_in_suite", Status.SKIP, "this suite runs no burn (its minutes are 0 in the profile)", Action.NONE),
    Reason("no_windows", Status.ERROR, "the burn reported no throughput for this GPU (see its errors)", Action.RERUN),
    Reason(
        "straggler",
        Status.FAIL,
        "far below its peers under sustained load: see clocks and power",
        Action.REPLACE_GPU,
        kind=FindingKind.RELATIVE,
    ),
    Reason("probe_timeout", Status.TIMEOUT, "the burn hung and was killed with its process group", Action.CHECK_NODE),
    Reason(
        "probe_error",
        Status.ERROR,
        "the burn reported an error for a GPU: rerun; if it repeats, check it",
        Action.RERUN,
    ),
    Reason("probe_failed", Status.ERROR, "the burn did not finish (see its output): rerun", Action.RERUN),
)
OTHER_REASONS = {"gpu": declare(BUSY)}
_SAMPLE_COLUMNS = ["gpu", "t_s", "sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c", "reasons", "ecc_corrected",
                   "ecc_uncorrected", "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max"]  # fmt: skip


def run_info(output: ProbeOutput) -> Mapping[str, Any]:
    return next((i.members for i in output.info if i.kind == "probe"), {})


def series(output: ProbeOutput) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(windows, samples) of one node's burn: throughput per window and nvidia-smi's samples, per GPU."""
    said = {kind: [dict(i.members) for i in output.info if i.kind == kind] for kind in ("window", "sample")}
    windows = pd.DataFrame(said["window"], columns=["gpu", "t_s", "value"])
    samples = pd.DataFrame(said["sample"], columns=_SAMPLE_COLUMNS)
    windows = windows[pd.to_numeric(windows.gpu, errors="coerce").notna()]
    samples = samples[pd.to_numeric(samples.gpu, errors="coerce").notna()]
    return windows.astype({"gpu": int}), samples.astype({"gpu": int})


def unit_of(output: ProbeOutput) -> str:
    return "TFLOP/s" if run_info(output).get("device", "cuda") == "cuda" else "GFLOP/s"


def parse(stdout: str) -> ProbeOutput:
    """The run's records, and per GPU its median throughput over the burn as a figure judged across the cluster."""
    output = parse_json_lines(stdout)
    windows, samples = series(output)
    unit = unit_of(output)
    metric = "burn_tflops" if unit == "TFLOP/s" else "burn_gflops"
    for gpu in sorted(set(windows.gpu)):
        mine = windows[windows.gpu == gpu]
        theirs = samples[samples.gpu == gpu]
        value = round(float(mine.value.median()), 3)
        figure = Figure(metric, value, probe=NAME, unit=unit, gpu=int(gpu), iterations=len(mine))
        if not theirs.empty:
            clock, power, temp = theirs.sm_clock_mhz.median(), theirs.power_w.median(), theirs.temp_c.max()
            figure = replace(figure, sm_clock_mhz=float(clock), power_w=float(power), temp_c=float(temp))
        output.measurements.append(figure)
    return output


evaluate = cluster_judgement(METRICS)


def inspect(output: ProbeOutput, profile: Profile) -> list[CheckRow]:
    """Each GPU's burn judged, XIDs logged meanwhile, other processes seen on the GPUs."""
    info = run_info(output)
    seconds = float(info.get("seconds") or 0)
    if info and seconds <= 0:
        return [
            CheckRow(NAME, "burn", Status.SKIP, "not_in_suite", "0 minutes", None, "the silent-data check still ran")
        ]
    windows, samples = series(output)
    rows = _judged_rows(windows, samples, seconds, unit_of(output), profile, info.get("gpus"))
    rows += _log_rows(output, info.get("device") == "cuda")
    return rows + busy_rows(output, profile, "the burn")


def _judged_rows(
    windows: pd.DataFrame, samples: pd.DataFrame, seconds: float, unit: str, profile: Profile, gpus: object
) -> list[CheckRow]:
    burns = judgement.summarise(windows, samples, seconds, unit, profile.burn.clock_drop_max_pct)
    rows = []
    for finding in judgement.judge(burns, profile.burn, profile.thresholds.noise_k) + judgement.thermal(
        burns, profile.burn
    ):
        status = REASONS[finding.reason].severity
        rows.append(
            CheckRow(
                NAME,
                f"gpu{finding.gpu}" if finding.gpu is not None else "thermal",
                status,
                finding.reason,
                finding.observed,
                finding.expected,
                finding.detail,
                finding.gpu,
            )  # fmt: skip
        )
    have = {b.gpu for b in burns}
    for gpu in range(int(gpus) if isinstance(gpus, int) else 0):
        if gpu not in have:
            rows.append(CheckRow(NAME, f"gpu{gpu}", Status.ERROR, "no_windows", None, "throughput per window", "", gpu))
    return rows


def _log_rows(output: ProbeOutput, cuda: bool) -> list[CheckRow]:
    rows = []
    for info in output.info:
        kind = info.kind
        if kind == "xid":
            for code, pci, line in judgement.xid_codes([str(info.get("line", ""))]):
                meaning = XIDS[code].meaning if code in XIDS else "see NVIDIA's XID catalog"
                rows.append(
                    CheckRow(NAME, f"xid {code} {pci}", Status.FAIL, "xid", f"Xid {code}: {meaning}", "no XID", line)
                )
        elif kind == "xid_unreadable":
            rows.append(
                CheckRow(NAME, "kernel_log", Status.SKIP, "kernel_log_unreadable", None, None, str(info.get("reason")))
            )
        elif kind == "sampler_failed" and cuda:
            rows.append(CheckRow(NAME, "samples", Status.ERROR, "sampler_failed", None, None, str(info.get("reason"))))
    return rows


def _thinned(frame: pd.DataFrame, points: int) -> pd.DataFrame:
    parts = [g.iloc[:: max(1, -(-len(g) // points))] for _, g in frame.groupby("gpu")]
    return pd.concat(parts) if parts else frame


@dataclass(frozen=True)
class BurnPoint(Record):
    """One point of a GPU's burn, as ``burn/<node>.parquet`` (and the report's thinned copy) holds it: a window
    of its load (``kind`` ``throughput``: ``value`` in ``unit``) or one of nvidia-smi's samples (``sample``)."""

    run_id: str
    cluster: str
    node: str
    gpu: int
    kind: str
    t_s: float  # seconds since the burn started
    value: float | None = None
    unit: str | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    power_w: float | None = None
    temp_c: float | None = None
    reasons: str | None = None  # active clock event reasons, NVML's bitmask in hex
    ecc_corrected: float | None = None
    ecc_uncorrected: float | None = None
    pcie_gen: float | None = None
    pcie_gen_max: float | None = None
    pcie_width: float | None = None
    pcie_width_max: float | None = None


def time_series(place: SeriesPlace, output: ProbeOutput, points: int | None = None) -> list[BurnPoint]:
    """The burn's rows for ``burn/<node>.parquet``: per GPU, its samples and its throughput windows; with
    ``points``, at most that many of each per GPU (what the report's charts draw)."""
    windows, samples = series(output)
    unit = unit_of(output)
    if points is not None:  # each GPU's throughput and temperature, thinned for the report's charts
        windows, samples = _thinned(windows, points), _thinned(samples, points)
    rows = [_point(place, "sample", None, r) for r in samples.to_dict("records")]
    return rows + [_point(place, "throughput", unit, r) for r in windows.to_dict("records")]


def _point(place: SeriesPlace, kind: str, unit: str | None, record: Mapping[Any, Any]) -> BurnPoint:
    said = {str(key): value for key, value in record.items()}
    return BurnPoint(run_id=place.run_id, cluster=place.cluster, node=place.node, kind=kind, unit=unit, **said)


def report(view: ReportView) -> ReportSection | None:
    return burn_section(view, REASONS)


# A GPU slower late in the burn than early, or than its peers, or clocked down without a thermal or power reason:
# what a co-tenant or clock events explain; not an XID, ECC errors, or a thermal or power throttle.
SLOW_BURN = frozenset({"throughput_dropped", "straggler", "clocks_fell"})

PROBE = Probe(
    name=NAME,
    script=SCRIPT,
    metrics=METRICS,
    reasons=REASONS,
    parse=parse,
    evaluate=evaluate,
    stage=STAGE,
    order=ORDER,
    inspect=inspect,
    report=report,
    other_reasons=OTHER_REASONS,
    series=NodeSeries("burn", time_series, CHART_POINTS),  # 10 minutes of 8 GPUs: ~10,000 rows a node
    causes=gpu_state_causes(frozenset({NAME}), STAGE, SLOW_BURN),
    expectations=(
        Expectation("burn.minutes", STAGE, NAME, lambda p: p.burn.minutes > 0 or p.burn.light_minutes > 0),
        *(
            Expectation(key, STAGE, NAME, threshold_set(key), metric, (NAME,), RUN_FAILED | {"not_in_suite"})
            for metric, key in (("burn_tflops", "burn_tflops_min"), ("burn_gflops", "burn_gflops_min"))
        ),
    ),
    samples=(
        BURN_HEALTHY.judged({"ok", "sustained"}),
        fault(
            "hw_slowdown",
            {"below_threshold", "throttled"},
            fixture="burn/h100_20s_hw_slowdown.txt",
            profile=BURN_PROFILE,
        ),
        BURN_TORCH_MISSING,
    ),
)
