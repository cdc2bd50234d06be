"""Read what a profile is made of from the nodes, for ``cluster-accept profile suggest``.

A quick interactive command: the nodes are read with the preflight checks' own batch and parsers
(:mod:`tasks.preflight.check_batch`), fanned out by :mod:`remote.fanout` directly, without a Prefect flow (no API server
to start, no run directory to write).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cluster_accept.analysis.calibration import NoiseTable
from cluster_accept.analysis.probe_verdicts import MetricRule
from cluster_accept.analysis.suggest import suggest_profile, suggesting_checks
from cluster_accept.analysis.suggest_calibration import Calibrated
from cluster_accept.checks.base import Check, discover
from cluster_accept.inventory.model import Inventory, Node
from cluster_accept.remote.fanout import DEFAULT_CONCURRENCY, fan_out
from cluster_accept.remote.result import NodeResult, NodeStatus
from cluster_accept.tasks.preflight.check_batch import commands_for, parse_node_result
from cluster_accept.vocabulary.text import keep_head


@dataclass
class ClusterReading:
    """What the nodes answered: node -> {check: parsed model}, and why the others were not read."""

    cluster: str
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    unread: dict[str, str] = field(default_factory=dict)

    def profile_text(self, device: str | None = None, calibration: NoiseTable | None = None) -> str:
        """The suggested profile; ``calibration``: the cluster's latest (``cluster-accept calibrate``), shown with
        the margins it gives each key figure."""
        calibrated = Calibrated(calibration, judged_rules()) if calibration is not None else None
        return suggest_profile(self.models, self.unread, device, self.cluster, calibrated)


def judged_rules() -> dict[str, MetricRule]:
    """Every figure a probe judges, with its rule (whether per GPU, which key bounds it)."""
    from cluster_accept.probes.base import discover as discover_probes

    return {metric: rule for probe in discover_probes() for metric, rule in probe.metrics.items()}


def suggest_checks() -> list[Check[Any]]:
    """The preflight checks a suggested profile is read from."""
    return suggesting_checks(discover())


def unread_cause(result: NodeResult) -> str | None:
    """Why nothing was read from a node (None when its batch ran): the unreachable cause, or the error."""
    if result.status is NodeStatus.UNREACHABLE:
        cause = result.cause.value if result.cause else "unknown"
        return f"unreachable: {cause}" + (f": {result.detail.splitlines()[0]}" if result.detail.strip() else "")
    if result.status is NodeStatus.TOOL_ERROR:
        return "cluster-accept failed on the controller: " + (result.detail.splitlines() or ["?"])[0]
    if result.status is NodeStatus.ERROR and not result.commands:
        return f"session failed: {result.detail}"
    return None


def read_cluster(
    inventory: Inventory,
    nodes: list[Node],
    concurrency: int = DEFAULT_CONCURRENCY,
    on_result: Callable[[NodeResult], None] | None = None,
) -> ClusterReading:
    """Run the suggestion's checks on ``nodes`` at once (at most ``concurrency`` in flight) and parse them."""
    checks = suggest_checks()
    results = fan_out(nodes, lambda node: commands_for(checks, node), concurrency, on_result)
    reading = ClusterReading(inventory.cluster)
    for name, result in results.items():
        cause = unread_cause(result)
        if cause is not None:
            reading.unread[name] = keep_head(" ".join(cause.split()), 300)
        else:
            reading.models[name] = parse_node_result(result, checks).models  # a parser that raised: no value
    return reading
