"""A node's preflight checks as one batch, and what came back parsed: without Prefect, so that commands that
only read the nodes (``profile suggest``) use them without starting it, and the preflight stage wraps them in
its tasks (:mod:`tasks.preflight.stage`).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cluster_accept.checks.base import Check
from cluster_accept.inventory.model import Node
from cluster_accept.remote.fanout import run_node
from cluster_accept.remote.result import NodeResult, RemoteCommand


@dataclass
class NodePreflight:
    node: str
    result: NodeResult
    models: dict[str, Any] = field(default_factory=dict)
    parse_errors: dict[str, str] = field(default_factory=dict)


def commands_for(
    checks: list[Check[Any]], node: Node | None = None, env: Mapping[str, str] | None = None
) -> list[RemoteCommand]:
    """Each check's command; those describing a job's environment run behind the node's
    ``probes.command_prefix`` (a container the jobs run in), so they read what the job reads. ``env`` reaches
    every command, also inside the container (exported there: a prefix such as ``docker exec`` passes none)."""
    profile = node.profile if node is not None else None
    prefix = profile.probes.command_prefix if profile is not None else None
    exports = "".join(f"export {key}={shlex.quote(value)}; " for key, value in (env or {}).items())
    return [
        RemoteCommand(
            c.name,
            f"{prefix} sh -c {shlex.quote(exports + c.command_on(profile))}"
            if prefix and c.job_view
            else c.command_on(profile),
            env=dict(env or {}),
            timeout_s=c.timeout_s,
            reads_only=True,  # a check reads the node's configuration, never changes it
        )
        for c in checks
    ]


def parse_node_result(result: NodeResult, checks: list[Check[Any]]) -> NodePreflight:
    """Parse what came back from a node (fresh, or loaded from a checkpoint). Never raises."""
    outcome = NodePreflight(result.node, result)
    for check in checks:
        command = result.command(check.name)
        if command is None or command.exit_code is None:
            continue
        try:
            outcome.models[check.name] = check.parse(command.stdout, command.exit_code)
        except Exception as exc:  # noqa: BLE001 - a parser bug is an 'error' row, not a lost node
            outcome.parse_errors[check.name] = f"parser raised {type(exc).__name__}: {exc}"
    return outcome


def run_preflight_on_node(node: Node, checks: list[Check[Any]], env: Mapping[str, str] | None = None) -> NodePreflight:
    """Run every check's command on ``node`` in one batch (``env`` set for each) and parse what came back. Never
    raises."""
    return parse_node_result(run_node(node, commands_for(checks, node, env)), checks)
