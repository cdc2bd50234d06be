"""The burn stage: sustained load on every node still accepted, the silent-data-corruption check after it, and DCGM's
diagnostics where the node has DCGM.

Runs after the short single-node probes (a node that already failed them is not burned) and before the multi-node
stage. Every node burns at once (up to the profile's ``max_parallel_nodes``): a burn is minutes, and a cluster
burned a node at a time would take days. Per node (in Prefect task runs over chunks of nodes) it ships the burn
script, runs it and ``dcgmi diag`` in the node's private probe directory, each under its own node-side limit (the
burn's minutes plus the usual margin; DCGM's own), and brings the raw output back, checkpointed. The judgement is
the single-node stage's, over the ``burn`` probes; the per-second series go to ``burn/<node>.parquet`` as each node
is judged (a cluster's series never sit in memory at once), the report keeps a thinned copy for its charts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from cluster_accept.analysis.probe_output import ProbeOutput
from cluster_accept.analysis.schemas import BURN, write_table
from cluster_accept.checks.declarations import Expectation, Link
from cluster_accept.checks.reasons import Reason
from cluster_accept.inventory.model import Node
from cluster_accept.probes import burn as burn_probe
from cluster_accept.probes.base import Probe, discover
from cluster_accept.remote.result import NodeResult
from cluster_accept.rundir.checkpoints import Checkpoints
from cluster_accept.tasks.single_node import (
    evaluate_single_node,
    probe_reasons,
    run_probes_on_node,
)
from cluster_accept.tasks.stage import RunState, per_node

NAME = "burn"
SERIES_DIR = "burn"  # one Parquet file per node: a 10-minute burn of 8 GPUs is ~10,000 rows, 1,000 nodes ~10 M
CHART_POINTS = 60  # per GPU, what the report's chart draws


def burn_probes() -> list[Probe]:
    return discover(stage=NAME)


def burn_node(node: Node, checkpoints: Checkpoints, quick: bool, probes: Sequence[Probe]) -> NodeResult:
    """A node's burn and DCGM run, checkpointed as soon as they came back."""
    outcome = run_probes_on_node(node, quick, probes)
    checkpoints.save_node(NAME, outcome)
    return outcome


class BurnStage:
    """The burn-in, the silent-data-corruption check and DCGM on the nodes still accepted whose profile asks for
    any of them; in the light suite a short burn and DCGM's level 1."""

    name = NAME
    suites = frozenset({"light", "full", "burn"})
    tables = ("checks", "measurements")  # and burn/<node>.parquet, written as each node is judged

    def run(self, state: RunState) -> None:
        probes = burn_probes()
        nodes = [n for n in state.still_accepted() if n.profile.burn.runs]
        limits = [n.profile.probes.max_parallel_nodes for n in nodes if n.profile.probes.max_parallel_nodes]
        outcomes = per_node(
            state,
            NAME,
            nodes,
            state.checkpoints.load_nodes(NAME),
            partial(burn_node, checkpoints=state.checkpoints, quick=state.quick, probes=probes),
            wave=min(limits) if limits else None,
        )
        charted: list[dict[str, Any]] = []
        folder = state.run_dir.path / SERIES_DIR
        folder.mkdir(exist_ok=True)

        def keep(node: str, output: ProbeOutput) -> None:
            """The node's whole series to its own Parquet file at once; only the report's thinned lines stay."""
            tags = {"run_id": state.run_id, "cluster": state.cluster}
            write_table(folder / f"{node}.parquet", [{**tags, **r} for r in burn_probe.time_series(node, output)], BURN)
            charted.extend({**tags, **r} for r in burn_probe.time_series(node, output, points=CHART_POINTS))

        judged = evaluate_single_node(
            state.run_id, state.inventory, outcomes, state.quick, probes, stage=NAME, keep=keep, noise=state.calibration
        )
        state.rows += judged.rows
        state.measurements += judged.measurements
        state.tables.burn.extend(charted)

    def reasons(self) -> list[tuple[str, Mapping[str, Reason]]]:
        return probe_reasons(burn_probes())

    def causes(self) -> tuple[Link, ...]:
        return tuple(link for probe in burn_probes() for link in probe.causes)

    def expectations(self) -> tuple[Expectation, ...]:
        return tuple(e for probe in burn_probes() for e in probe.expectations)


STAGE = BurnStage()
