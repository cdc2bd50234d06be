"""Memory copy bandwidth per GPU (HBM on a GPU node, host memory on a CPU node), from the GPU bench run.

Judged against the profile's ``hbm_copy_gbps_min`` (where a profile naming its GPU sets none, the built-in
fraction of its memory bandwidth; on a CPU node ``mem_copy_gbps_min``, which no datasheet gives) and against
the cluster's median per GPU; the report draws the figure per GPU.
"""

from __future__ import annotations

from cluster_accept.probes.contract import (
    HBM_FRACTION,
    RUN_FAILED,
    SINGLE_NODE,
    Action,
    Default,
    Expectation,
    FindingKind,
    MetricRule,
    Probe,
    Rating,
    Reason,
    ReportSection,
    ReportView,
    Status,
    cluster_judgement,
    declare,
    gpu_state_causes,
    json_figures,
    per_gpu_chart,
    threshold_set,
)
from cluster_accept.probes.scripts import GPU_BENCH, GPU_BENCH_SAMPLES

NAME = "hbm"
ORDER = 20
SCRIPT = GPU_BENCH
# The built-in profiles write the same minimum (inventory.gpus.profile_data); the default holds it for a profile
# that names its GPU model without it.
DEFAULT = Default(
    "memory bandwidth",
    HBM_FRACTION,
    lambda model: Rating("memory", model.memory_gbps),
    "copy (read + write): 3,014-3,028 GB/s of 3,350 on H100 SXM (0.90), 4,223-4,275 of 4,800 on H200 (0.88-0.89); "
    "a GPU shared with another process: 1,936-2,006 (0.40-0.42)",
)
METRICS = {
    "hbm_copy_gbps": MetricRule(NAME, "hbm_copy_gbps_min", True, default=DEFAULT, devices=frozenset({"cuda"})),
    "mem_copy_gbps": MetricRule(NAME, "mem_copy_gbps_min", True, devices=frozenset({"cpu"})),
}
REASONS = declare(
    Reason(
        "below_threshold",
        Status.FAIL,
        "memory bandwidth below the profile's minimum",
        Action.REPLACE_GPU,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "straggler", Status.FAIL, "memory bandwidth far below its peers", Action.REPLACE_GPU, kind=FindingKind.RELATIVE
    ),
)


parse = json_figures(METRICS)
evaluate = cluster_judgement(METRICS)


def report(view: ReportView) -> ReportSection | None:
    chart = per_gpu_chart("memory", {m: rule.threshold for m, rule in METRICS.items()}, NAME, view)
    return ReportSection("memory", (chart,)) if chart is not None else None


PROBE = Probe(
    name=NAME,
    script=SCRIPT,
    metrics=METRICS,
    reasons=REASONS,
    parse=parse,
    evaluate=evaluate,
    order=ORDER,
    report=report,
    causes=gpu_state_causes(frozenset({NAME})),
    expectations=(
        Expectation("hbm_copy_gbps_min", SINGLE_NODE, NAME, threshold_set("hbm_copy_gbps_min")),
        Expectation(
            "mem_copy_gbps_min",
            SINGLE_NODE,
            NAME,
            threshold_set("mem_copy_gbps_min"),
            "mem_copy_gbps",
            ("gemm",),  # the bench's own failure is said under gemm
            RUN_FAILED,
        ),
    ),
    samples=GPU_BENCH_SAMPLES,  # the GPU bench's outputs, judged with the same reasons by each probe of the run
)
