"""Pinned host<->device bandwidth per GPU, one GPU at a time, from the GPU bench run.

It depends on which NUMA node the pinned buffer sits on and on the PCIe switch layout, not only on the GPU:
a GPU far below its peers is reported as a warning, never a reason to reject the node. Below its minimum — the
profile's ``h2d_gbps_min`` / ``d2h_gbps_min``, or where it sets none a fraction of the GPU's link to the host
(PCIe generation x width; NVLink-C2C on GB200) well under what healthy hosts measured whatever the NUMA
placement — the link itself is suspect (trained narrower or slower, a riser), and the GPU fails.
"""

from __future__ import annotations

from cluster_accept.probes.contract import (
    RUN_FAILED,
    SINGLE_NODE,
    Action,
    Default,
    Expectation,
    FindingKind,
    Link,
    MetricRule,
    Probe,
    Reason,
    Status,
    cluster_judgement,
    declare,
    gpu_state_causes,
    host_rating,
    json_figures,
    threshold_set,
)
from cluster_accept.probes.scripts import GPU_BENCH, GPU_BENCH_SAMPLES

NAME = "host_bw"
ORDER = 30
SCRIPT = GPU_BENCH
# Healthy, one GPU at a time, 1 GiB pinned: h2d 53.5-55.5 GB/s and d2h 55.0-55.5 on H100 SXM and 2 x H200
# (0.85-0.88 of a Gen5 x16 link's 63 GB/s per direction); on 4 x H200 h2d 30.0-55.3 and d2h 41.6-55.4 (0.48-0.88)
# across runs, a buffer on the far socket or a neighbour's traffic. 0.40 (25 GB/s on Gen5 x16) stays under every
# healthy figure; a link trained to x4 or Gen3 moves under half of it. A link at x8 or Gen4 can still pass:
# the pcie check compares the trained width and generation with the profile's. NVLink-C2C (GB200) is the same
# fraction of its 450 GB/s per direction, not yet measured.
HOST_LINK = Default(
    "the GPU's link to the host per direction (PCIe generation x width; NVLink-C2C on GB200)",
    0.40,
    host_rating,
    "H100 SXM and H200, Gen5 x16, one GPU at a time: h2d 30.0-55.5 GB/s, d2h 41.6-55.5 (0.48-0.88 of 63)",
)
METRICS = {
    "h2d_gbps": MetricRule(NAME, "h2d_gbps_min", True, Status.WARN, default=HOST_LINK, devices=frozenset({"cuda"})),
    "d2h_gbps": MetricRule(NAME, "d2h_gbps_min", True, Status.WARN, default=HOST_LINK, devices=frozenset({"cuda"})),
}
REASONS = declare(
    Reason(
        "below_threshold",
        Status.FAIL,
        "host<->device bandwidth below the minimum, a fraction of the GPU's link well under any healthy host's: "
        "check the link's trained width and generation (the pcie row, nvidia-smi -q), the slot and riser",
        Action.RESEAT_CABLE,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "straggler",
        Status.WARN,
        "host<->device bandwidth far below its peers: check the GPU's PCIe slot and NUMA placement",
        Action.CHECK_NODE,
        kind=FindingKind.RELATIVE,
    ),
)


parse = json_figures(METRICS)
evaluate = cluster_judgement(METRICS)


PROBE = Probe(
    name=NAME,
    script=SCRIPT,
    metrics=METRICS,
    reasons=REASONS,
    parse=parse,
    evaluate=evaluate,
    order=ORDER,
    causes=(
        *gpu_state_causes(frozenset({NAME})),
        Link("pcie", frozenset({NAME}), SINGLE_NODE, same_gpu=True),
        # a link trained narrower, or one losing transactions (AER), moves less between host and GPU
        Link("pcie_aer", frozenset({NAME}), SINGLE_NODE, frozenset({"width_degraded", "aer_fatal", "aer_nonfatal"})),
    ),
    expectations=tuple(
        Expectation(key, SINGLE_NODE, NAME, threshold_set(key), metric, ("gemm",), RUN_FAILED)
        for metric, key in (("h2d_gbps", "h2d_gbps_min"), ("d2h_gbps", "d2h_gbps_min"))
    ),
    # the GPU bench's outputs but its CPU run (no copies between host and GPU there)
    samples=tuple(sample for sample in GPU_BENCH_SAMPLES if sample.name != "testbed_cpu"),
)
