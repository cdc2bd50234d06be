"""The preflight's judgement, without Prefect: every node against its profile and the cluster's majority, and the
values each check compares across nodes. The stage (:mod:`.stage`) and a node checking itself
(``cluster-accept check --local``) judge with it alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cluster_accept.checks.base import Check, CheckRow, NodeRow, Status, error_row, majority_values
from cluster_accept.checks.declarations import Link
from cluster_accept.inventory.model import Inventory, Node
from cluster_accept.remote.result import NodeStatus
from cluster_accept.tasks.preflight.check_batch import NodePreflight
from cluster_accept.tasks.rows import node_row, tool_error_row, unreachable_row
from cluster_accept.vocabulary.rows import KEY_PREFIX, NodeValue, ValueKind

NAME = "preflight"


def node_values(run_id: str, cluster: str, outcomes: list[NodePreflight], checks: list[Check[Any]]) -> list[NodeValue]:
    """The values each check compares across nodes (driver version, NCCL env, ...), one row per node and key:
    what the report folds into node sets and what history queries for drift. Error counters are kept too (kind
    ``counter``), for scheduled checks to compare with the node's previous run, and marks (where a check's
    reading ended), for the node's next run."""
    rows: list[NodeValue] = []
    for outcome in outcomes:
        for check in checks:
            if check.name not in outcome.models:
                continue
            model = outcome.models[check.name]
            said = {
                ValueKind.COMPARED: check.cluster_values(model) if check.cluster_values else {},
                ValueKind.COUNTER: {k: str(v) for k, v in (check.counters(model) if check.counters else {}).items()},
                ValueKind.MARK: check.marks(model) if check.marks else {},
            }
            kept = {
                (KEY_PREFIX[kind] + key, kind, key): value
                for kind, found in said.items()
                for key, value in found.items()
            }
            for (_stored, kind, key), value in sorted(kept.items()):
                # read from node text masked where it entered the controller
                rows.append(NodeValue(run_id, cluster, outcome.node, check.name, key, value, kind))
    return rows


def preflight_causes(checks: list[Check[Any]]) -> tuple[Link, ...]:
    """What explains the preflight's own findings, as its checks declare it (a fabric down: no NVLink peers)."""
    return tuple(link for check in checks for link in check.causes)


def since_previous(
    outcomes: list[NodePreflight], checks: list[Check[Any]], previous: Mapping[str, Mapping[str, Mapping[str, str]]]
) -> list[NodePreflight]:
    """Each node's models cut to what is new since its previous run (``previous``: node -> check -> marks, from
    :func:`analysis.verdicts.marks_by_node`), for the checks that judge so (``Check.since``); a node without a
    previous run keeps everything since boot. Marks come from the history or a file on the node, either of which
    can hold anything: a ``since`` that raises on them leaves the check an error row naming it (its model uncut
    could miss what changed since, a counter's growth), never a pass and never the whole stage stopped."""
    cut = [check for check in checks if check.since is not None]
    for outcome in outcomes:
        marks = previous.get(outcome.node, {})
        for check in cut:
            if check.name in outcome.models and check.name in marks and check.name not in outcome.parse_errors:
                assert check.since is not None
                try:
                    outcome.models[check.name] = check.since(outcome.models[check.name], marks[check.name])
                except Exception as exc:  # noqa: BLE001 - the check's row says it; the other checks go on
                    why = f"reading the previous run's marks raised {type(exc).__name__}: {exc}"
                    outcome.parse_errors[check.name] = why
    return outcomes


def evaluate_preflight(
    run_id: str, inventory: Inventory, outcomes: list[NodePreflight], checks: list[Check[Any]]
) -> list[NodeRow]:
    """Judge every node against its profile and the cluster majority."""
    views = {}
    for check in checks:
        per_node: dict[str, dict[str, str]] = {}
        if check.cluster_values is not None:
            for outcome in outcomes:
                if check.name in outcome.models:
                    per_node[outcome.node] = check.cluster_values(outcome.models[check.name])
        views[check.name] = majority_values(per_node)

    rows: list[NodeRow] = []
    for outcome in outcomes:
        node = inventory.node(outcome.node)
        result = outcome.result
        if result.status is NodeStatus.TOOL_ERROR:
            row, raw = tool_error_row(result.detail)
            rows.append(node_row(run_id, inventory.cluster, NAME, node.name, row, raw))
            continue
        lost = result.status is NodeStatus.UNREACHABLE
        if lost:  # the checks that completed before the node went away are judged; the others are not
            row = unreachable_row(result.cause.value if result.cause else None, result.detail)
            rows.append(node_row(run_id, inventory.cluster, NAME, node.name, row, ""))
        if result.status is NodeStatus.ERROR and not result.commands:
            row = CheckRow("ssh", "session", Status.ERROR, "session_failed", None, None, result.detail)
            rows.append(node_row(run_id, inventory.cluster, NAME, node.name, row, ""))
            continue
        for check in checks:
            command = result.command(check.name)
            raw = (command.stdout + ("\n[stderr]\n" + command.stderr if command.stderr else "")) if command else ""
            if lost and (command is None or command.exit_code is None):
                continue
            if command is None or (command.exit_code is None and not command.timed_out):
                check_rows = [error_row(check.name, "no_output", result.detail or "the command did not report")]
            elif command.timed_out:
                check_rows = [
                    CheckRow(
                        check.name,
                        "command",
                        Status.TIMEOUT,
                        "command_timeout",
                        None,
                        None,
                        "killed on the node after its timeout",
                    )
                ]
            elif check.name in outcome.parse_errors:
                check_rows = [error_row(check.name, "parser_crashed", outcome.parse_errors[check.name], raw)]
            else:
                check_rows = own_gpus(check.evaluate(outcome.models[check.name], node.profile, views[check.name]), node)
            command_text = check.command_on(node.profile)
            rows.extend(node_row(run_id, inventory.cluster, NAME, node.name, r, raw, command_text) for r in check_rows)
    return rows


def own_gpus(rows: list[CheckRow], node: Node) -> list[CheckRow]:
    """The rows of the GPUs the node's profile tests: nvidia-smi answers for the host's every GPU, and a node
    partitioned on purpose (``cuda_visible_devices``) is not judged by another part's GPU."""
    tested = node.profile.probes.tested_gpus
    return [r for r in rows if tested is None or r.gpu is None or r.gpu in tested]
