"""A node's probe runs: shipped, run, and read back into rows and figures; what every probe stage does per node.

Per node a private ``mktemp -d`` directory on the node receives the node-side scripts of the stage's probes
(:mod:`cluster_accept.probes`) over SFTP (a copy for the local transport); each node-side run happens once even
when several probes read it (GEMM, HBM and host links share the GPU bench), under the node-side ``timeout`` (a hung
run's whole process group is killed on the node, its other results are kept); the directory is removed afterwards
whatever happened. Judging waits for every node, since stragglers are judged against the cluster. Without
``probes``, the functions here take the probes of the default stage (``single-node``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from cluster_accept.analysis.calibration import NoiseTable, annotate
from cluster_accept.analysis.nccl_account import NcclRun, read_account
from cluster_accept.analysis.nccl_log import why_first
from cluster_accept.analysis.probe_output import ProbeOutput
from cluster_accept.analysis.probe_verdicts import measurement_frame
from cluster_accept.analysis.schemas import TABLES, write_table
from cluster_accept.checks.base import CheckRow, NodeRow, Status
from cluster_accept.checks.reasons import Action, Reason, declare
from cluster_accept.inventory.model import Inventory, Node, Profile
from cluster_accept.probes.base import SINGLE_NODE, NodeScript, Probe, discover, scripts_for
from cluster_accept.probes.scripts import SETTINGS_FILE, settings_prelude
from cluster_accept.probes.series import NodeSeries, SeriesPlace
from cluster_accept.remote.probe_dir import run_in_probe_dir
from cluster_accept.remote.result import CommandResult, NodeResult, NodeStatus, RemoteCommand
from cluster_accept.tasks.rows import node_row, tool_error_row, unreachable_row
from cluster_accept.vocabulary.rows import Measurement, NcclFact, Record
from cluster_accept.vocabulary.text import keep_tail

SESSION_REASONS = declare(
    Reason(
        "session_failed",
        Status.ERROR,
        "the probe session broke before any probe ran (see the detail): check the node, then rerun",
        Action.CHECK_NODE,
    ),
)


def _chosen(probes: Sequence[Probe] | None) -> Sequence[Probe]:
    return discover(stage=SINGLE_NODE) if probes is None else probes


def probe_commands(node: Node, quick: bool = False, probes: Sequence[Probe] | None = None) -> list[RemoteCommand]:
    """The node-side runs for ``node``, each once. ``command_prefix`` is the operator's own."""
    return [
        RemoteCommand(
            script.name,
            (settings_prelude(node) if script.says_settings else "") + (script.command(node, quick) or ""),
            timeout_s=script.timeout_for(node, quick),
        )
        for script in scripts_for(node, _chosen(probes), quick)
    ]


def probe_script(node: Node, check: str, quick: bool = False, probes: Sequence[Probe] | None = None) -> str:
    """The node-side command behind a judged figure of ``check`` (what reproduces it)."""
    for probe in _chosen(probes):
        if probe.check == check:
            command = probe.command(node, quick)
            if command is not None:
                return command
    return ""


def run_probes_on_node(node: Node, quick: bool = False, probes: Sequence[Probe] | None = None) -> NodeResult:
    """Ship, run, collect, clean up. Never raises."""
    chosen = _chosen(probes)
    scripts = scripts_for(node, chosen, quick)
    settings = (SETTINGS_FILE,) if any(script.says_settings for script in scripts) else ()
    files = tuple(dict.fromkeys([*(f for script in scripts for f in script.files), *settings]))
    return run_in_probe_dir(node, files, probe_commands(node, quick, chosen))


def run_rows(
    node: Node, script: NodeScript, result: CommandResult, output: ProbeOutput, quick: bool = False
) -> list[CheckRow]:
    """What the run itself says, under the check that owns it: killed at its timeout, errors it reported,
    or an exit status other than 0."""
    check = script.owner
    if result.timed_out:
        expected = f"done within {script.timeout_for(node, quick):g} s"
        said = "killed on the node with its whole process group"
        return [CheckRow(check, result.name, Status.TIMEOUT, "probe_timeout", None, expected, said)]
    rows = [CheckRow(check, result.name, Status.ERROR, "probe_error", None, None, e) for e in output.errors]
    if result.exit_code != 0 and not output.errors:
        _, detail = why_first(result.stdout + "\n" + result.stderr, keep_tail(result.stderr or result.stdout, 2000))
        observed = f"exit {result.exit_code}"
        rows.append(CheckRow(check, result.name, Status.ERROR, "probe_failed", observed, "exit 0", detail))
    return rows


def _node_session_row(outcome: NodeResult) -> tuple[CheckRow, str] | None:
    """The row saying why a node's probes did not all run, with its evidence; None when the session held."""
    if outcome.status is NodeStatus.TOOL_ERROR:
        return tool_error_row(outcome.detail)
    if outcome.status is NodeStatus.UNREACHABLE:
        return unreachable_row(outcome.cause.value if outcome.cause else None, outcome.detail), ""
    if outcome.status is NodeStatus.ERROR and not outcome.commands:
        return CheckRow("probe", "session", Status.ERROR, "session_failed", None, None, outcome.detail), ""
    return None


def _raw(result: CommandResult) -> str:
    """A run's output as evidence: its tails (masked where the output entered the controller, so no secret is
    cut in two)."""
    stderr = "\n[stderr]\n" + keep_tail(result.stderr, 4000) if result.stderr else ""
    return keep_tail(result.stdout, 20000) + stderr


@dataclass
class _Judged:
    rows: list[NodeRow] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)
    outputs: dict[str, dict[str, ProbeOutput]] = field(default_factory=dict)  # probe -> node -> its output
    nccl: list[NcclFact] = field(default_factory=list)  # NCCL's account of each run (analysis.nccl_account)
    charted: dict[str, list[Record]] = field(default_factory=dict)  # each series' thinned copy, by table


@dataclass(frozen=True)
class StageFigures:
    """A probe stage's judgement: its rows, its figures as typed rows, and the one frame of those figures that
    its judgement read (passed on to what judges them again: straggler confirmation, regressions, trends);
    ``charted``: the thinned copy of each series its probes keep (``Probe.series``), by the run's table."""

    rows: list[NodeRow]
    measurements: list[Measurement]
    frame: pd.DataFrame
    nccl: list[NcclFact] = field(default_factory=list)
    charted: dict[str, list[Record]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Reading:
    """Where a stage's node outputs are read: the run, its nodes, its probes, and the stage the rows name;
    ``kept``: by probe, the series it keeps (``Probe.series``; empty where the reading keeps none)."""

    run_id: str
    inventory: Inventory
    probes: Sequence[Probe]
    quick: bool
    stage: str
    kept: Mapping[str, NodeSeries[Record]] = field(default_factory=dict)


def _evaluate_node(reading: _Reading, outcome: NodeResult) -> _Judged:
    """One node's rows read off its runs, its figures as measurement rows, and each probe's output."""
    run_id, cluster, stage, quick = reading.run_id, reading.inventory.cluster, reading.stage, reading.quick
    node = reading.inventory.node(outcome.node)
    judged = _Judged()
    session = _node_session_row(outcome)
    if session is not None:
        judged.rows.append(node_row(run_id, cluster, stage, node.name, *session))
        if outcome.status is not NodeStatus.UNREACHABLE:
            return judged
    # A node that went away mid-batch: the runs that completed before are judged, the others are not.
    results = {r.name: r for r in outcome.commands if session is None or r.exit_code is not None}
    for script in scripts_for(node, reading.probes, quick):
        result = results.get(script.name)
        if result is None:
            continue
        sharing = [p for p in reading.probes if p.script.name == script.name and p.command(node, quick) is not None]
        outputs = [(probe, probe.parse(result.stdout)) for probe in sharing]
        command, raw = script.command(node, quick) or "", _raw(result)
        judged.nccl += read_account(result.stdout, NcclRun(run_id, cluster, stage, node.name, script.name))
        rows = run_rows(node, script, result, outputs[0][1], quick)  # the run's errors, once: each output carries them
        for probe, output in outputs:
            rows += probe.inspect(output, node.profile) if probe.inspect else []
            if probe.compare is not None or probe.name in reading.kept:
                judged.outputs.setdefault(probe.name, {})[node.name] = output  # compared across nodes, or kept
            where = (run_id, cluster, stage, node.name, node.profile_name)
            judged.measurements += [Measurement.of(figure, *where) for figure in output.measurements]
        judged.rows += [node_row(run_id, cluster, stage, node.name, r, raw, command) for r in rows]
    return judged


def _keep_series(root: Path, series: NodeSeries[Record], place: SeriesPlace, output: ProbeOutput) -> list[Record]:
    """The node's whole series to its own Parquet file under ``root`` at once; only the report's thinned rows stay."""
    path = root / series.table / f"{place.node}.parquet"
    write_table(path, series.rows(place, output, None), TABLES[series.table])
    return list(series.rows(place, output, series.points))


def judge_nodes(
    run_id: str,
    inventory: Inventory,
    outcomes: list[NodeResult],
    quick: bool = False,
    probes: Sequence[Probe] | None = None,
    stage: str = SINGLE_NODE,
    noise: NoiseTable | None = None,
    series_to: Path | None = None,
) -> StageFigures:
    """The stage's rows and figures: each node's own rows, then each probe's judgement over the whole
    cluster's figures (and its comparison of their outputs). ``noise``: the cluster's calibration, beside each
    figure it measured (what its relative judgements rest on). ``series_to``: the run directory where each probe
    that declares a series (``Probe.series``: the burn's) writes it, node by node as it is read."""
    chosen = _chosen(probes)
    kept: dict[str, NodeSeries[Record]] = {}
    if series_to is not None:
        kept = {p.name: p.series for p in chosen if p.series is not None}
        for series in kept.values():
            (series_to / series.table).mkdir(exist_ok=True)
    reading = _Reading(run_id, inventory, chosen, quick, stage, kept)
    judged = _Judged(charted={series.table: [] for series in kept.values()})
    for outcome in outcomes:
        node_part = _evaluate_node(reading, outcome)
        judged.rows += node_part.rows
        judged.measurements += node_part.measurements
        judged.nccl += node_part.nccl
        for probe in chosen:  # a node's outputs are held only as long as they are needed
            output = node_part.outputs.get(probe.name, {}).get(outcome.node)
            if output is not None and probe.name in kept and series_to is not None:
                series = kept[probe.name]
                place = SeriesPlace(run_id, inventory.cluster, outcome.node)
                judged.charted[series.table] += _keep_series(series_to, series, place, output)
            if output is not None and probe.compare is not None:
                judged.outputs.setdefault(probe.name, {})[outcome.node] = output
    profiles = {n.name: n.profile for n in inventory.nodes}
    frame = annotate(measurement_frame(judged.measurements), noise, profiles)
    for probe in chosen:
        found = _cluster_rows(probe, frame, judged.outputs.get(probe.name, {}), inventory, quick, profiles)
        for node_name, row in found:
            command = probe.command(inventory.node(node_name), quick) or ""
            judged.rows.append(node_row(run_id, inventory.cluster, stage, node_name, row, "", command))
    return StageFigures(judged.rows, judged.measurements, frame, judged.nccl, judged.charted)


def _cluster_rows(
    probe: Probe,
    frame: pd.DataFrame,
    outputs: Mapping[str, ProbeOutput],
    inventory: Inventory,
    quick: bool,
    profiles: Mapping[str, Profile],
) -> list[tuple[str, CheckRow]]:
    """A probe's judgement across nodes: its figures against the cluster's, and its outputs compared."""
    found = list(probe.compare(outputs, profiles)) if probe.compare is not None and outputs else []
    if frame.empty:
        return found
    ran = [n.name for n in inventory.tested if probe.command(n, quick) is not None]
    mine = frame[frame["metric"].isin(list(probe.metrics)) & frame["node"].isin(ran)]
    return found + (probe.evaluate(mine, profiles) if not mine.empty else [])
