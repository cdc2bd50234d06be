"""The single-node stage: GEMM, memory, host links and the intra-node all-reduce on every node still accepted.

One :class:`~tasks.probe_stage.ProbeStage` over the probes whose ``stage`` is ``single-node`` (a probe's default),
in waves of the profile's ``max_parallel_nodes``; judged against thresholds, the cluster's median (stragglers
measured again beside a control node) and the node's own history, with the settings suspected behind a slow
figure proved by measuring without them. Its runs' NCCL account goes to the ``nccl`` table.
"""

from __future__ import annotations

from cluster_accept.probes.base import SINGLE_NODE
from cluster_accept.tasks.probe_stage import ProbeStage

NAME = SINGLE_NODE
STAGE = ProbeStage(
    NAME,
    suites=frozenset({"light", "full"}),
    tables=("checks", "measurements", "nccl", "settings"),
    confirms_stragglers=True,
    proves_causes=True,
    judges_regressions=True,
    keeps_trends=True,
)
