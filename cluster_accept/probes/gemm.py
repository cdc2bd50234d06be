"""GEMM throughput per GPU (bf16, fp16, tf32, fp8; GFLOP/s on a CPU node), every GPU of the node loaded at
once, as a training job loads it: power and thermal limits show only then.

Judged against the profile's ``gemm_bf16_tflops_min`` (and the fp16, tf32 and fp8 minimums; where a profile
naming its GPU sets none, the same fractions of its datasheet's peaks as the built-in profiles write; on a CPU
node ``gemm_fp32_gflops_min`` and ``gemm_bf16_gflops_min``, which no datasheet gives) and against the
cluster's median per GPU (a GPU can pass its threshold and still run at half its peers' speed: the seed reports
found such nodes only by comparing per-node TFLOPS). The report shows the figure per GPU and the per-node
table, worst node first.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from cluster_accept.checks.gpu_processes import BUSY, busy_row
from cluster_accept.inventory.gpus import GEMM_16BIT_FRACTION, GEMM_FP8_FRACTION, GEMM_TF32_FRACTION, GpuModel
from cluster_accept.probes.contract import (
    RUN_FAILED,
    SINGLE_NODE,
    Action,
    CheckRow,
    Default,
    Expectation,
    Figure,
    FindingKind,
    MetricRule,
    Probe,
    ProbeOutput,
    Profile,
    Rating,
    Reason,
    ReportSection,
    ReportView,
    Status,
    cluster_judgement,
    declare,
    gpu_state_causes,
    gpu_table,
    json_figures,
    per_gpu_chart,
    threshold_set,
)
from cluster_accept.probes.scripts import GPU_BENCH, GPU_BENCH_SAMPLES

NAME = "gemm"
ORDER = 10
SCRIPT = GPU_BENCH
ON_CPU = frozenset({"cpu"})
ON_GPU = frozenset({"cuda"})


def _peak(dtype: str, of: Callable[[GpuModel], float | None]) -> Callable[[GpuModel], Rating | None]:
    def rating(model: GpuModel) -> Rating | None:
        peak = of(model)
        return None if peak is None else Rating(f"{dtype} peak", peak, "TFLOP/s")

    return rating


# The built-in profiles write the same minimums (inventory.gpus.profile_data); the defaults hold them for a
# profile that names its GPU model without them.
_16BIT = "8192³ GEMM, every GPU loaded at once: 641-775 TFLOP/s on H100 SXM and H200 (0.65-0.78 of 989.4)"
DEFAULTS = {
    "bf16": Default("dense bf16 peak", GEMM_16BIT_FRACTION, _peak("bf16", lambda m: m.bf16_tflops), _16BIT),
    "fp16": Default("dense fp16 peak", GEMM_16BIT_FRACTION, _peak("fp16", lambda m: m.fp16_tflops), _16BIT),
    "tf32": Default(
        "dense tf32 peak", GEMM_TF32_FRACTION, _peak("tf32", lambda m: m.tf32_tflops), "347-374 of 494.7 (0.70-0.76)"
    ),
    "fp8": Default(
        "dense fp8 peak", GEMM_FP8_FRACTION, _peak("fp8", lambda m: m.fp8_tflops), "1,205-1,420 of 1,978.9 (0.61-0.72)"
    ),
}
METRICS = {
    "gemm_bf16_tflops": MetricRule(NAME, "gemm_bf16_tflops_min", True, default=DEFAULTS["bf16"], devices=ON_GPU),
    "gemm_fp16_tflops": MetricRule(NAME, "gemm_fp16_tflops_min", True, default=DEFAULTS["fp16"], devices=ON_GPU),
    "gemm_tf32_tflops": MetricRule(NAME, "gemm_tf32_tflops_min", True, default=DEFAULTS["tf32"], devices=ON_GPU),
    # the bench measures fp8 only on GPUs with fp8 tensor cores (compute capability 8.9 and later)
    "gemm_fp8_tflops": MetricRule(
        NAME,
        "gemm_fp8_tflops_min",
        True,
        default=DEFAULTS["fp8"],
        devices=ON_GPU,
        emitted_by=lambda model: model.fp8_tflops is not None,
    ),
    "gemm_fp32_gflops": MetricRule(NAME, "gemm_fp32_gflops_min", True, devices=ON_CPU),
    "gemm_bf16_gflops": MetricRule(NAME, "gemm_bf16_gflops_min", True, devices=ON_CPU),
}
# The figure the report draws: the first of these the run has (a CPU node reports GFLOP/s).
CHART_METRICS = ("gemm_bf16_tflops", "gemm_bf16_gflops", "gemm_fp16_tflops", "gemm_fp32_gflops")
REASONS = declare(
    Reason(
        "below_threshold",
        Status.FAIL,
        "GEMM throughput below the profile's minimum: compare clocks and power in the evidence, then replace",
        Action.REPLACE_GPU,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "straggler",
        Status.FAIL,
        "far below its peers: look at clocks, power and throttle reasons in the evidence",
        Action.REPLACE_GPU,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "probe_timeout",
        Status.TIMEOUT,
        "the GPU bench hung and was killed with its process group: look for a hung driver (dmesg)",
        Action.CHECK_NODE,
    ),
    Reason(
        "probe_error",
        Status.ERROR,
        "the GPU bench reported an error for a GPU: rerun; if it repeats, check that GPU",
        Action.RERUN,
    ),
    Reason(
        "probe_failed",
        Status.ERROR,
        "the GPU bench did not finish (see its output): check the probe interpreter and torch, then rerun",
        Action.RERUN,
    ),
)


parse = json_figures(METRICS)
evaluate = cluster_judgement(METRICS)

# Rows this probe writes under the ``gpu`` check: what else ran on a GPU, and clocks that fell behind the
# node's other GPUs under the same load. Both explain a slow GPU (analysis.causes), before anyone replaces it.
CLOCK_MARGIN = 0.10
OTHER_REASONS = {
    "gpu": declare(
        BUSY,
        Reason(
            "clocks_low",
            Status.WARN,
            "this GPU's SM clock under load was well below the node's other GPUs' (see power and clock event "
            "reasons): power or thermal limits, or a co-tenant",
            Action.CHECK_NODE,
            kind=FindingKind.RELATIVE,
        ),
    )
}


def busy_rows(output: ProbeOutput, profile: Profile, during: str = "the GPU bench") -> list[CheckRow]:
    """A row per other process the probe saw on one of its GPUs while it ran (``during``: which probe); the
    sampler sees the host's every GPU, and a node partitioned by its profile answers for its own only."""
    rows, tested = [], profile.probes.tested_gpus
    for info in output.info:
        if info.kind != "foreign_process" or not isinstance(info.get("gpu"), int):
            continue
        if tested is not None and info.members["gpu"] not in tested:
            continue
        pid = info.members["pid"] if isinstance(info.get("pid"), int) else None
        seen = f"seen in {info.get('seen_samples')} of {info.get('samples')} samples while {during} ran"
        rows.append(busy_row(info.members["gpu"], pid, str(info.get("name")), info.get("used_memory_mib"), seen))
    return rows


def _clock_rows(output: ProbeOutput) -> list[CheckRow]:
    """GPUs whose median SM clock under the bench was more than :data:`CLOCK_MARGIN` below the node's median."""
    clocks: dict[int, tuple[float, Figure]] = {}
    for figure in output.measurements:
        if figure.gpu is not None and figure.sm_clock_mhz is not None:
            clocks[figure.gpu] = (figure.sm_clock_mhz, figure)
    if len(clocks) < 2:
        return []
    median = statistics.median(clock for clock, _ in clocks.values())
    rows = []
    for gpu, (clock, c) in sorted(clocks.items()):
        if clock < median * (1 - CLOCK_MARGIN):
            said = f"{clock:g} MHz"
            expected = f">= {median * (1 - CLOCK_MARGIN):.0f} MHz (node median {median:g} - {CLOCK_MARGIN:.0%})"
            detail = f"power {c.power_w} W, clock event reasons {c.clock_event_reasons}"
            rows.append(CheckRow("gpu", "sm_clock_under_load", Status.WARN, "clocks_low", said, expected, detail, gpu))
    return rows


def inspect(output: ProbeOutput, profile: Profile) -> list[CheckRow]:
    """Other processes seen on the GPUs during the bench, and GPUs clocked well below their neighbours."""
    return busy_rows(output, profile) + _clock_rows(output)


def report(view: ReportView) -> ReportSection | None:
    family = {m: METRICS[m].threshold for m in CHART_METRICS}
    chart = per_gpu_chart("gemm", family, NAME, view)
    if chart is None:
        return None
    return ReportSection("gemm", (chart,), gpu_table(view.measurements, CHART_METRICS, "gpu-table"))


PROBE = Probe(
    name=NAME,
    script=SCRIPT,
    metrics=METRICS,
    reasons=REASONS,
    parse=parse,
    evaluate=evaluate,
    order=ORDER,
    inspect=inspect,
    report=report,
    other_reasons=OTHER_REASONS,
    causes=gpu_state_causes(frozenset({NAME})),
    expectations=tuple(
        # each GEMM minimum needs its own figure's row (a bf16 row says nothing of fp8), unless the bench failed
        Expectation(key, SINGLE_NODE, NAME, threshold_set(key), metric, (NAME,), RUN_FAILED)
        for metric, rule in METRICS.items()
        if (key := rule.threshold) is not None
    ),
    samples=GPU_BENCH_SAMPLES,  # the GPU bench's outputs, judged with the same reasons by each probe of the run
)
