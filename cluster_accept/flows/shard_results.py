"""A run split into shards by a node label (rack, pod), and the shards' run directories merged back into one
run: the parts of a sharded run that need no Prefect (:mod:`flows.sharding` starts and watches the shards).

Each shard is an ordinary acceptance run of its nodes, written under the parent run's ``shards/<key>/`` by
whichever controller host ran it; the parent reads the shards' tables back, gives them its own run id, and
finishes the run as one (verdicts, report, history, Slurm). A shard that did not finish, or whose directory
this host cannot read, is no finding about its nodes: each of them gets a ``tool:shard_not_finished`` row
saying which shard, where it ran and what became of it, so every node still has a verdict and none is drained
for a controller's failure.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar, cast

from cluster_accept.analysis.isolation import IsolationRow
from cluster_accept.analysis.scaling import ScalingRow, TrainingScalingRow
from cluster_accept.analysis.table_files import UnfitTable, read_table_file, row_limit
from cluster_accept.analysis.verdicts import values_by_node
from cluster_accept.checks.base import NodeRow, Status, majority_values
from cluster_accept.checks.reasons import TOOL_CHECK, Action, FindingKind, Reason, declare
from cluster_accept.inventory.hostlist import MAX_NODES, fold
from cluster_accept.inventory.model import Inventory
from cluster_accept.probes.base import discover
from cluster_accept.tasks.stage import RunState
from cluster_accept.vocabulary.rows import Measurement, NcclFact, NodeValue, Record, SettingRow

SHARDS_DIR = "shards"
SHARD_NOT_FINISHED = "shard_not_finished"
# The tables a shard's stages write, and where the parent's state keeps them.
STATE_TABLES = ("checks", "node_values", "measurements", "isolation", "scaling", "training_scaling", "nccl", "settings")
_KEY = re.compile(r"[^A-Za-z0-9_.-]+")
# Check ``shards``: what only the parent of a sharded run can see. Each shard judges drift within itself; a value
# a whole shard agrees on, that the rest of the cluster has otherwise, is seen here and reported.
SHARD_CHECK = "shards"
SHARD_REASONS = declare(
    Reason(
        "drift",
        Status.WARN,
        "every node of this shard has a value the cluster's majority has otherwise (each shard judges drift "
        "within itself, so the shard did not flag it): align the configuration, or pin the value in the profile",
        Action.FIX_CONFIG,
        kind=FindingKind.RELATIVE,
    ),
)

_R = TypeVar("_R", bound=Record)


def shard_key(value: str) -> str:
    """A label value as a shard's directory name and work-queue name: letters, digits, ``_.-``."""
    return _KEY.sub("-", value).strip("-.") or "unnamed"


def shard_plan(inventory: Inventory, label: str) -> dict[str, list[str]]:
    """``key -> node names`` of the inventory's tested nodes by the value of ``label``; a ValueError names the
    nodes without the label, and values that would share one key, since such a split cannot be run as asked."""
    plan: dict[str, list[str]] = {}
    values: dict[str, set[str]] = {}
    missing = [n.name for n in inventory.tested if label not in n.labels]
    if missing:
        raise ValueError(f"--shard-by {label}: nodes {fold(missing)} have no label {label!r} in the inventory")
    for node in inventory.tested:
        value = node.labels[label]
        plan.setdefault(shard_key(value), []).append(node.name)
        values.setdefault(shard_key(value), set()).add(value)
    clashing = {key: sorted(v) for key, v in values.items() if len(v) > 1}
    if clashing:
        key, names = next(iter(clashing.items()))
        raise ValueError(f"--shard-by {label}: values {', '.join(map(repr, names))} would share the shard {key!r}")
    if not plan:
        raise ValueError(f"--shard-by {label}: no node to test")
    return dict(sorted(plan.items()))


@dataclass
class ShardTables:
    """What one shard's run directory holds, as the parent's state keeps it."""

    info: dict[str, Any]
    rows: list[NodeRow] = field(default_factory=list)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def read_table(path: Path, nodes: int) -> list[dict[str, Any]]:
    """A table's records with their own types (nulls stay None, integers stay integers); none when absent. Held
    to the table's schema and to the rows a run of ``nodes`` nodes can write (:func:`read_table_file`)."""
    table = path.name.removesuffix(".parquet")
    return read_table_file(path, table, max_rows=row_limit(table, nodes)).to_pylist() if path.exists() else []


def read_shard(shard_dir: Path) -> ShardTables | str:
    """The shard's tables, or why they cannot be read: no ``run.json``, or a run that never ended."""
    try:
        info = json.loads((shard_dir / "run.json").read_text())
    except (OSError, ValueError) as exc:
        return f"its run directory {shard_dir} is not readable from this host ({exc})"
    if not isinstance(info, dict):
        return f"its run.json in {shard_dir} holds a JSON {type(info).__name__}, not an object"
    if not info.get("ended"):
        return f"its run {shard_dir} did not end (started {info.get('started')}, no 'ended' in run.json)"
    nodes = len(info.get("nodes_tested") or []) if isinstance(info.get("nodes_tested"), list) else MAX_NODES
    try:  # a table cut short or of another schema is this shard's problem, not the whole run's
        tables = {name: read_table(shard_dir / f"{name}.parquet", nodes) for name in STATE_TABLES}
        rows = [NodeRow.from_record(r) for r in tables.pop("checks")]
    except UnfitTable as exc:
        return f"its table {exc.path.name} in {shard_dir}: {exc.problem}"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its tables in {shard_dir} cannot be read ({type(exc).__name__}: {exc})"
    return ShardTables(info, rows, tables)


def _own(kind: type[_R], records: Sequence[Mapping[str, Any]], run_id: str) -> list[_R]:
    """A shard's rows of one table, typed, under the parent's run id."""
    return [replace(cast(Any, kind.from_record(r)), run_id=run_id) for r in records]


def merge_shard(state: RunState, shard: ShardTables, shard_dir: Path) -> None:
    """Add a shard's rows and tables to the parent's state, under the parent's run id, and its per-node series
    files to the parent's run directory."""
    state.rows += [replace(r, run_id=state.run_id) for r in shard.rows]
    state.values += _own(NodeValue, shard.tables.get("node_values", []), state.run_id)
    state.measurements += _own(Measurement, shard.tables.get("measurements", []), state.run_id)
    state.tables.isolation += _own(IsolationRow, shard.tables.get("isolation", []), state.run_id)
    state.tables.scaling += _own(ScalingRow, shard.tables.get("scaling", []), state.run_id)
    state.tables.training_scaling += _own(TrainingScalingRow, shard.tables.get("training_scaling", []), state.run_id)
    state.tables.nccl += _own(NcclFact, shard.tables.get("nccl", []), state.run_id)
    state.tables.settings += _own(SettingRow, shard.tables.get("settings", []), state.run_id)
    for series in series_dirs():
        source = shard_dir / series
        if source.is_dir():
            shutil.copytree(source, state.run_dir.path / series, dirs_exist_ok=True)


def series_dirs() -> tuple[str, ...]:
    """The folders of per-node files a stage writes beside its tables: each probe's declared series
    (``Probe.series``), so a new probe's series is merged from a shard as the burn's is."""
    return tuple(sorted({probe.series.table for probe in discover() if probe.series is not None}))


def not_finished_rows(state: RunState, nodes: Sequence[str], key: str, why: str) -> list[NodeRow]:
    """One ``tool:shard_not_finished`` row per node of a shard whose results are missing."""
    return [
        NodeRow(
            run_id=state.run_id,
            cluster=state.cluster,
            stage=SHARDS_DIR,
            node=node,
            check=TOOL_CHECK,
            item=f"shard {key}",
            status=Status.ERROR,
            reason=SHARD_NOT_FINISHED,
            observed=why,
            expected="the shard's run finished",
            detail=f"shard {key} ({fold(nodes)}): {why}",
        )
        for node in nodes
    ]


def drift_across_shards(state: RunState, plan: Mapping[str, Sequence[str]]) -> list[NodeRow]:
    """A ``shards:drift`` warning for each node holding its shard's majority value of a compared key when the
    whole cluster's majority differs: the drift no single shard could see."""
    per_node = values_by_node(state.values)
    cluster = majority_values(per_node)
    found: list[NodeRow] = []
    for key, names in plan.items():
        shard = majority_values({n: per_node[n] for n in names if n in per_node})
        for item, value in sorted(shard.majority.items()):
            majority = cluster.majority_of(item)
            if majority is None or majority == value:
                continue
            for node in (n for n in names if per_node.get(n, {}).get(item) == value):
                found.append(
                    NodeRow(
                        state.run_id,
                        state.cluster,
                        SHARDS_DIR,
                        node,
                        SHARD_CHECK,
                        item,
                        Status.WARN,
                        "drift",
                        value,
                        f"{majority} (cluster majority)",
                        f"shard {key} agrees on {value}",
                    )  # fmt: skip
                )
    return found
