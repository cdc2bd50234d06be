"""The preflight stage: Prefect task runs over chunks of nodes, its evaluation over the cluster
(:mod:`.evaluate`), counters against the node's previous run.

All of a node's checks travel as one batch over one session; parsing happens on the controller as soon as
the node answers; evaluation waits for every node because drift is judged against the cluster's majority.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import pandas as pd

from cluster_accept.analysis.history import STAMP_CHARS, run_start
from cluster_accept.analysis.regressions import counter_growth
from cluster_accept.analysis.verdicts import marks_by_node, values_by_node
from cluster_accept.checks.base import Check, NodeRow, discover
from cluster_accept.checks.declarations import Expectation, Link
from cluster_accept.checks.reasons import Reason
from cluster_accept.inventory.model import Node
from cluster_accept.remote.result import NodeStatus
from cluster_accept.rundir.checkpoints import Checkpoints
from cluster_accept.tasks.preflight.auto_profile import CHECK as AUTO_CHECK
from cluster_accept.tasks.preflight.auto_profile import GPU_CHECK, NIC_CHECK, NVLINK_CHECK, resolve_auto_nodes
from cluster_accept.tasks.preflight.auto_profile import REASONS as AUTO_REASONS
from cluster_accept.tasks.preflight.check_batch import NodePreflight, parse_node_result, run_preflight_on_node
from cluster_accept.tasks.preflight.evaluate import (
    NAME,
    evaluate_preflight,
    node_values,
    preflight_causes,
    since_previous,
)
from cluster_accept.tasks.rows import node_row
from cluster_accept.tasks.stage import RunState, per_node
from cluster_accept.vocabulary.rows import NodeValue


def preflight_node(node: Node, checks: list[Check[Any]], checkpoints: Checkpoints | None = None) -> NodePreflight:
    """A node's preflight, checkpointed as soon as it answered."""
    outcome = run_preflight_on_node(node, checks)
    if checkpoints is not None:
        checkpoints.save_node(NAME, outcome.result)
    return outcome


def saved_preflight(checkpoints: Checkpoints, checks: list[Check[Any]]) -> dict[str, NodePreflight]:
    """Nodes whose preflight finished before the run was interrupted, parsed again from their raw output."""
    return {node: parse_node_result(result, checks) for node, result in checkpoints.load_nodes(NAME).items()}


def earlier(run_ids: pd.Series, this_run: str) -> pd.Series:
    """Which of ``run_ids`` started before this run: run ids start with their UTC start time
    (``20261118T110600Z-…``), so one after this run's (a controller whose clock ran fast, a run resumed after later
    ones) is not this run's past. A run not named so (a shard's, named by its key) starts now, by this clock
    (:func:`analysis.history.run_start`, the rule the history reader keeps its runs by)."""
    ids = run_ids.astype(str)
    return (ids.str[:STAMP_CHARS] <= run_start(this_run)) & (ids != this_run)


def previous_values(state: RunState) -> list[NodeValue]:
    """Each node's ``node_values`` rows, per check, of the latest :func:`earlier` run in the history that recorded
    that check on it (none without a history). Per check: a run where a check could not read the node (an error,
    a timeout) keeps no counters or marks for it, and the run before still knows them (a port that flapped stays
    known)."""
    if state.history is None:
        return []
    past = state.history.node_values
    if past.empty:
        return []
    past = past[earlier(past["run_id"], state.run_id)]
    latest = past.groupby(["node", "check"])["run_id"].transform("max")
    kept = past[past["run_id"] == latest].to_dict("records")
    return [NodeValue.from_record({str(k): v for k, v in r.items()}) for r in kept]


def counter_rows(state: RunState, checks: list[Check[Any]], previous: list[NodeValue]) -> list[NodeRow]:
    """Error counters (NVLink, ECC, InfiniBand …) that grew since each node's previous run in the history, or whose
    growth cannot be told (cleared since, held at their maximum, no count): :func:`counter_growth`."""
    if not previous:
        return []
    commands = {c.name: c.command for c in checks}
    grown = counter_growth(values_by_node(state.values, counters=True), values_by_node(previous, counters=True))
    return [node_row(state.run_id, state.cluster, NAME, n, row, "", commands.get(row.check, "")) for n, row in grown]


class PreflightStage:
    """Configuration checks, seconds per node and no GPU load: every check of a node in one batch over one
    session, Prefect task runs over chunks of nodes; judged against the profile and the cluster's majority."""

    name = NAME
    suites = frozenset({"light", "full", "burn"})
    tables = ("checks", "node_values")

    def run(self, state: RunState) -> None:
        checks = discover()
        saved = saved_preflight(state.checkpoints, checks)
        outcomes = per_node(
            state,
            NAME,
            state.inventory.tested,
            saved,
            partial(preflight_node, checks=checks, checkpoints=state.checkpoints),
        )
        answered = [o.node for o in outcomes if o.result.status not in (NodeStatus.TOOL_ERROR, NodeStatus.UNREACHABLE)]
        gpu_models = {o.node: o.models.get(GPU_CHECK) for o in outcomes}
        nic_models = {o.node: o.models.get(NIC_CHECK) for o in outcomes}
        links = {o.node: o.models.get(NVLINK_CHECK) for o in outcomes}
        state.inventory, picked = resolve_auto_nodes(
            state.run_id, state.inventory, gpu_models, answered, nic_models, links
        )
        state.rows += picked
        previous = previous_values(state)
        since_previous(outcomes, checks, marks_by_node(previous))  # XIDs new since the node's last run
        state.rows += evaluate_preflight(state.run_id, state.inventory, outcomes, checks)
        state.values += node_values(state.run_id, state.cluster, outcomes, checks)
        state.rows += counter_rows(state, checks, previous)

    def reasons(self) -> list[tuple[str, Mapping[str, Reason]]]:
        return [(check.name, check.reasons) for check in discover()] + [(AUTO_CHECK, AUTO_REASONS)]

    def causes(self) -> tuple[Link, ...]:
        return preflight_causes(discover())

    def expectations(self) -> tuple[Expectation, ...]:
        return tuple(e for check in discover() for e in check.expectations)


STAGE = PreflightStage()
