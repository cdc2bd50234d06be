"""Read what a profile is made of from the nodes, for ``cluster-accept profile suggest``.

A quick interactive command: the nodes are read with the preflight checks' own commands and parsers, fanned
out by :mod:`remote.fanout` directly, without a Prefect flow (no API server to start, no run directory to
write). The node's batch is built here rather than by :func:`tasks.preflight.commands_for` because importing
that module imports Prefect, which takes seconds this command has no use for.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cluster_accept.analysis.suggest import CHECKS, suggest_profile
from cluster_accept.checks.base import Check, discover
from cluster_accept.inventory.hostlist import expand, fold
from cluster_accept.inventory.model import Inventory, Node
from cluster_accept.remote.fanout import DEFAULT_CONCURRENCY, fan_out
from cluster_accept.remote.result import NodeResult, NodeStatus, RemoteCommand


@dataclass
class ClusterReading:
    """What the nodes answered: node -> {check: parsed model}, and why the others were not read."""

    cluster: str
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    unread: dict[str, str] = field(default_factory=dict)

    def profile_text(self, device: str | None = None) -> str:
        return suggest_profile(self.models, self.unread, device, self.cluster)


def suggest_checks() -> list[Check]:
    """The preflight checks a suggested profile is read from."""
    return [check for check in discover() if check.name in CHECKS]


def nodes_to_read(inventory: Inventory, expression: str | None) -> list[Node]:
    """The inventory's tested nodes, or those of them ``expression`` names; ValueError (or HostlistError) for
    a name the inventory lacks, as ``run --nodes`` does."""
    if not expression:
        return inventory.tested
    wanted = set(expand(expression))
    unknown = sorted(wanted - {n.name for n in inventory.nodes})
    if unknown:
        raise ValueError(f"--nodes names nodes not in the inventory: {fold(unknown)}")
    return [n for n in inventory.tested if n.name in wanted]


def commands(checks: list[Check], node: Node) -> list[RemoteCommand]:
    """Each check's command for ``node``'s profile; those describing a job's environment behind the profile's
    ``probes.command_prefix``, as preflight runs them, so that the values read are the ones preflight judges."""
    prefix = node.profile.probes.command_prefix
    batch = []
    for check in checks:
        script = check.command_on(node.profile)
        if prefix and check.job_view:
            script = f"{prefix} sh -c {shlex.quote(script)}"
        batch.append(RemoteCommand(check.name, script, timeout_s=check.timeout_s))
    return batch


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


def parsed_models(result: NodeResult, checks: list[Check]) -> dict[str, Any]:
    """Each check's parsed model from what the node printed; a command that did not report, or a parser that
    raised, gives no model (its values are then missing for this node, and the comments say so)."""
    models: dict[str, Any] = {}
    for check in checks:
        command = result.command(check.name)
        if command is None or command.exit_code is None:
            continue
        try:
            models[check.name] = check.parse(command.stdout, command.exit_code)
        except Exception:  # noqa: BLE001 - a parser bug loses one value, never the suggestion
            continue
    return models


def read_cluster(
    inventory: Inventory,
    nodes: list[Node],
    concurrency: int = DEFAULT_CONCURRENCY,
    on_result: Callable[[NodeResult], None] | None = None,
) -> ClusterReading:
    """Run the suggestion's checks on ``nodes`` at once (at most ``concurrency`` in flight) and parse them."""
    checks = suggest_checks()
    results = fan_out(nodes, lambda node: commands(checks, node), concurrency, on_result)
    reading = ClusterReading(inventory.cluster)
    for name, result in results.items():
        cause = unread_cause(result)
        if cause is not None:
            reading.unread[name] = " ".join(cause.split())[:300]
        else:
            reading.models[name] = parsed_models(result, checks)
    return reading
