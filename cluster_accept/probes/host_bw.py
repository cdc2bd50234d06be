"""Pinned host<->device bandwidth per GPU, one GPU at a time, from the GPU bench run.

It depends on which NUMA node the pinned buffer sits on and on the PCIe switch layout, not only on the GPU:
a GPU far below its peers is reported as a warning, never a reason to reject the node.
"""

from __future__ import annotations

from cluster_accept.analysis.causes import gpu_state_causes
from cluster_accept.analysis.probe_verdicts import MetricRule
from cluster_accept.checks.base import Status
from cluster_accept.checks.declarations import Link
from cluster_accept.checks.reasons import Action, Reason, declare
from cluster_accept.probes.base import SINGLE_NODE, Probe, cluster_judgement, json_figures
from cluster_accept.probes.scripts import GPU_BENCH

NAME = "host_bw"
ORDER = 30
SCRIPT = GPU_BENCH
METRICS = {
    "h2d_gbps": MetricRule(NAME, None, True, Status.WARN),
    "d2h_gbps": MetricRule(NAME, None, True, Status.WARN),
}
REASONS = declare(
    Reason(
        "straggler",
        Status.WARN,
        "host<->device bandwidth far below its peers: check the GPU's PCIe slot and NUMA placement",
        Action.CHECK_NODE,
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
)
