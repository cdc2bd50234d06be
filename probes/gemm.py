"""GEMM throughput per GPU (bf16, fp16, tf32, fp8; GFLOP/s on a CPU node), every GPU of the node loaded at
once, as a training job loads it: power and thermal limits show only then.

Judged against the profile's ``gemm_bf16_tflops_min`` and against the cluster's median per GPU (a GPU can
pass its threshold and still run at half its peers' speed: the seed reports found such nodes only by
comparing per-node TFLOPS). The report shows the figure per GPU and the per-node table, worst node first.
"""

from __future__ import annotations

from cluster_accept.analysis.probe_verdicts import MetricRule
from cluster_accept.checks.base import Status
from cluster_accept.checks.reasons import Action, Reason, declare
from cluster_accept.probes.base import cluster_judgement, json_figures
from cluster_accept.probes.scripts import GPU_BENCH
from cluster_accept.reports.figures import ReportSection, ReportView, gpu_table, per_gpu_chart

NAME = "gemm"
ORDER = 10
SCRIPT = GPU_BENCH
METRICS = {
    "gemm_bf16_tflops": MetricRule(NAME, "gemm_bf16_tflops_min", True),
    "gemm_fp16_tflops": MetricRule(NAME, None, True),
    "gemm_tf32_tflops": MetricRule(NAME, None, True),
    "gemm_fp8_tflops": MetricRule(NAME, None, True),
    "gemm_fp32_gflops": MetricRule(NAME, None, True),
    "gemm_bf16_gflops": MetricRule(NAME, None, True),
}
# The figure the report draws: the first of these the run has (a CPU node reports GFLOP/s).
CHART_METRICS = ("gemm_bf16_tflops", "gemm_bf16_gflops", "gemm_fp16_tflops", "gemm_fp32_gflops")
REASONS = declare(
    Reason(
        "below_threshold",
        Status.FAIL,
        "GEMM throughput below the profile's minimum: compare clocks and power in the evidence, then replace",
        Action.REPLACE_GPU,
    ),
    Reason(
        "straggler",
        Status.FAIL,
        "far below its peers: look at clocks, power and throttle reasons in the evidence",
        Action.REPLACE_GPU,
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


def report(view: ReportView) -> ReportSection | None:
    family = {m: METRICS[m].threshold for m in CHART_METRICS}
    chart = per_gpu_chart("gemm", family, NAME, view)
    if chart is None:
        return None
    return ReportSection("gemm", (chart,), gpu_table(view.measurements, CHART_METRICS, "gpu-table"))
