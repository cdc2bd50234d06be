"""Pinned host<->device bandwidth per GPU, one GPU at a time, from the GPU bench run.

It depends on which NUMA node the pinned buffer sits on and on the PCIe switch layout, not only on the GPU:
a GPU far below its peers is reported as a warning, never a reason to reject the node.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from cluster_accept.analysis.probe_output import ProbeOutput, parse_json_lines
from cluster_accept.analysis.probe_verdicts import MetricRule, judge
from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.checks.reasons import Action, Reason, declare
from cluster_accept.inventory.model import Profile
from cluster_accept.probes.base import own_figures
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


def parse(stdout: str) -> ProbeOutput:
    return own_figures(parse_json_lines(stdout), METRICS)


def evaluate(figures: pd.DataFrame, profiles: Mapping[str, Profile]) -> list[tuple[str, CheckRow]]:
    return judge(figures, METRICS, {node: p.thresholds for node, p in profiles.items()})
