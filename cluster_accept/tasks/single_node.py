"""The single-node stage: ship the probes to a node, run them, bring back figures and NCCL's transport.

Per node (in Prefect task runs over chunks of nodes): a private ``mktemp -d`` directory on the node receives the
node-side scripts of every probe (:mod:`cluster_accept.probes`) over SFTP (a copy for the local transport); each
node-side run happens once even when several probes read it (GEMM, HBM and host links share the GPU bench), under
the node-side ``timeout`` (a hung run's whole process group is killed on the node, its other results are kept); the
directory is removed afterwards whatever happened. Evaluation waits for every node, since stragglers are judged
against the cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pandas as pd

from cluster_accept.analysis import nccl_mechanism, stragglers, suspects
from cluster_accept.analysis.calibration import NoiseTable, annotate, calibrated_by_figure
from cluster_accept.analysis.history import Trend, key_figures, node_trends
from cluster_accept.analysis.nccl_account import NcclRun, read_account
from cluster_accept.analysis.nccl_log import why_first
from cluster_accept.analysis.probe_output import ProbeOutput
from cluster_accept.analysis.probe_verdicts import MetricRule, judged_figures, measurement_frame
from cluster_accept.analysis.regressions import figure_regressions
from cluster_accept.checks.base import CheckRow, NodeRow, Status
from cluster_accept.checks.declarations import Expectation, Link
from cluster_accept.checks.reasons import Action, Reason, declare
from cluster_accept.inventory.model import Inventory, Node, Profile
from cluster_accept.probes.base import NodeScript, Probe, discover, scripts_for
from cluster_accept.probes.scripts import SETTINGS_FILE, settings_prelude
from cluster_accept.remote.probe_dir import run_in_probe_dir
from cluster_accept.remote.result import CommandResult, NodeResult, NodeStatus, RemoteCommand
from cluster_accept.rundir.checkpoints import Checkpoints
from cluster_accept.tasks.prove_causes import mechanism_rows, prove_causes
from cluster_accept.tasks.rows import node_row, tool_error_row, unreachable_row
from cluster_accept.tasks.stage import RunState, per_node
from cluster_accept.vocabulary.rows import Measurement, NcclFact
from cluster_accept.vocabulary.text import keep_tail

NAME = "single-node"
SESSION_REASONS = declare(
    Reason(
        "session_failed",
        Status.ERROR,
        "the probe session broke before any probe ran (see the detail): check the node, then rerun",
        Action.CHECK_NODE,
    ),
)


def probes_of_stage() -> list[Probe]:
    return discover(stage=NAME)


def probe_commands(node: Node, quick: bool = False, probes: Sequence[Probe] | None = None) -> list[RemoteCommand]:
    """The node-side runs for ``node``, each once. ``command_prefix`` is the operator's own."""
    chosen = probes_of_stage() if probes is None else probes
    return [
        RemoteCommand(
            script.name,
            (settings_prelude(node) if script.says_settings else "") + (script.command(node, quick) or ""),
            timeout_s=script.timeout_for(node, quick),
        )
        for script in scripts_for(node, chosen, quick)
    ]


def probe_script(node: Node, check: str, quick: bool = False, probes: Sequence[Probe] | None = None) -> str:
    """The node-side command behind a judged figure of ``check`` (what reproduces it)."""
    for probe in probes_of_stage() if probes is None else probes:
        if probe.check == check:
            command = probe.command(node, quick)
            if command is not None:
                return command
    return ""


def run_probes_on_node(node: Node, quick: bool = False, probes: Sequence[Probe] | None = None) -> NodeResult:
    """Ship, run, collect, clean up. Never raises."""
    chosen = probes_of_stage() if probes is None else probes
    scripts = scripts_for(node, chosen, quick)
    settings = (SETTINGS_FILE,) if any(script.says_settings for script in scripts) else ()
    files = tuple(dict.fromkeys([*(f for script in scripts for f in script.files), *settings]))
    return run_in_probe_dir(node, files, probe_commands(node, quick, chosen))


def single_node_probes(
    node: Node, checkpoints: Checkpoints | None = None, quick: bool = False, probes: Sequence[Probe] | None = None
) -> NodeResult:
    """A node's probes, checkpointed as soon as they came back."""
    outcome = run_probes_on_node(node, quick, probes)
    if checkpoints is not None:
        checkpoints.save_node(NAME, outcome)
    return outcome


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


@dataclass(frozen=True)
class StageFigures:
    """A probe stage's judgement: its rows, its figures as typed rows, and the one frame of those figures that
    its judgement read (passed on to what judges them again: straggler confirmation, regressions, trends)."""

    rows: list[NodeRow]
    measurements: list[Measurement]
    frame: pd.DataFrame
    nccl: list[NcclFact] = field(default_factory=list)


def _evaluate_node(
    run_id: str,
    inventory: Inventory,
    outcome: NodeResult,
    probes: Sequence[Probe],
    quick: bool,
    stage: str = NAME,
    keep: Callable[[str, ProbeOutput], None] | None = None,
) -> _Judged:
    """One node's rows read off its runs, its figures as measurement rows, and each probe's output."""
    node = inventory.node(outcome.node)
    judged = _Judged()
    session = _node_session_row(outcome)
    if session is not None:
        judged.rows.append(node_row(run_id, inventory.cluster, stage, node.name, *session))
        if outcome.status is not NodeStatus.UNREACHABLE:
            return judged
    # A node that went away mid-batch: the runs that completed before are judged, the others are not.
    results = {r.name: r for r in outcome.commands if session is None or r.exit_code is not None}
    for script in scripts_for(node, probes, quick):
        result = results.get(script.name)
        if result is None:
            continue
        sharing = [p for p in probes if p.script.name == script.name and p.command(node, quick) is not None]
        outputs = [(probe, probe.parse(result.stdout)) for probe in sharing]
        command, raw = script.command(node, quick) or "", _raw(result)
        judged.nccl += read_account(result.stdout, NcclRun(run_id, inventory.cluster, stage, node.name, script.name))
        rows = run_rows(node, script, result, outputs[0][1], quick)  # the run's errors, once: each output carries them
        for probe, output in outputs:
            rows += probe.inspect(output, node.profile) if probe.inspect else []
            if probe.compare is not None or keep is not None and probe is outputs[0][0]:
                judged.outputs.setdefault(probe.name, {})[node.name] = output  # compared across nodes, or kept
            where = (run_id, inventory.cluster, stage, node.name, node.profile_name)
            judged.measurements += [Measurement.of(figure, *where) for figure in output.measurements]
        judged.rows += [node_row(run_id, inventory.cluster, stage, node.name, r, raw, command) for r in rows]
    return judged


def evaluate_single_node(
    run_id: str,
    inventory: Inventory,
    outcomes: list[NodeResult],
    quick: bool = False,
    probes: Sequence[Probe] | None = None,
    stage: str = NAME,
    keep: Callable[[str, ProbeOutput], None] | None = None,
    noise: NoiseTable | None = None,
) -> StageFigures:
    """The stage's rows and figures: each node's own rows, then each probe's judgement over the whole
    cluster's figures (and its comparison of their outputs). ``keep(node, output)`` sees each node's output of
    the stage's first probe (the burn's time series go to their own table); ``noise``: the cluster's
    calibration, beside each figure it measured (what its relative judgements rest on)."""
    chosen = probes_of_stage() if probes is None else probes
    judged = _Judged()
    for outcome in outcomes:
        node_part = _evaluate_node(run_id, inventory, outcome, chosen, quick, stage, keep)
        judged.rows += node_part.rows
        judged.measurements += node_part.measurements
        judged.nccl += node_part.nccl
        for probe in chosen:  # a node's outputs are held only as long as they are needed
            output = node_part.outputs.get(probe.name, {}).get(outcome.node)
            if output is not None and keep is not None and probe is chosen[0]:
                keep(outcome.node, output)
            if output is not None and probe.compare is not None:
                judged.outputs.setdefault(probe.name, {})[outcome.node] = output
    profiles = {n.name: n.profile for n in inventory.nodes}
    frame = annotate(measurement_frame(judged.measurements), noise, profiles)
    for probe in chosen:
        found = _cluster_rows(probe, frame, judged.outputs.get(probe.name, {}), inventory, quick, profiles)
        for node_name, row in found:
            command = probe.command(inventory.node(node_name), quick) or ""
            judged.rows.append(node_row(run_id, inventory.cluster, stage, node_name, row, "", command))
    return StageFigures(judged.rows, judged.measurements, frame, judged.nccl)


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


def figure_reader(state: RunState) -> Callable[[NodeResult, Sequence[Probe], str], list[Measurement]]:
    """How proving a suspect reads one node's figures of a run made again."""

    def read(outcome: NodeResult, probes: Sequence[Probe], stage: str) -> list[Measurement]:
        return evaluate_single_node(state.run_id, state.inventory, [outcome], state.quick, probes, stage).measurements

    return read


def measure_again(state: RunState, names: Sequence[str], probes: Sequence[Probe]) -> list[NodeResult]:
    """``names`` measured again with ``probes``, in waves of the profiles' ``probes.max_parallel_nodes`` (all at
    once where no profile bounds it, as the stage itself runs them); results in ``names`` order."""
    nodes = [state.inventory.node(name) for name in names]
    limits = [n.profile.probes.max_parallel_nodes for n in nodes if n.profile.probes.max_parallel_nodes]
    wave = max(1, min(limits)) if limits else max(1, len(nodes))
    with ThreadPoolExecutor(max_workers=min(wave, len(nodes)) or 1) as pool:
        return list(pool.map(lambda node: run_probes_on_node(node, state.quick, probes), nodes))


def confirm_stragglers(state: RunState, probes: Sequence[Probe], judged: StageFigures) -> list[NodeRow]:
    """Each node with a straggler or inconclusive row against its peers measured again (only the runs that
    flagged it), in :data:`~analysis.stragglers.ROUNDS` rounds beside a control node that passed, each round in
    waves of the profile's ``max_parallel_nodes``; the rows re-judged on it (:func:`analysis.stragglers.confirm`)."""
    suspects = stragglers.flagged(judged.rows)
    if not suspects:
        return judged.rows
    control = control_node(judged, suspects)
    by_scripts: dict[frozenset[str], list[str]] = {}  # nodes that run the same probes again are judged together:
    for name, checks in sorted(suspects.items()):  # each judgement walks the cluster's node list
        by_scripts.setdefault(frozenset(p.script.name for p in probes if p.check in checks), []).append(name)
    again: list[dict[str, Any]] = []
    for scripts, names in by_scripts.items():
        chosen = [p for p in probes if p.script.name in scripts]
        for turn in range(stragglers.ROUNDS if control else 1):
            outcomes = measure_again(state, [*names, *([control] if control else [])], chosen)
            found = evaluate_single_node(state.run_id, state.inventory, outcomes, state.quick, chosen)
            again += [{**m.record(), "round": turn} for m in found.measurements]
    thresholds = {n.name: n.profile.thresholds for n in state.inventory.nodes}
    after = pd.DataFrame(again) if again else measurement_frame([])
    return stragglers.confirm(judged.rows, judged.frame, after, judged_rules(probes), thresholds, control)


def control_node(judged: StageFigures, suspects: Mapping[str, set[str]]) -> str | None:
    """The node measured again beside the suspects: one with figures and no relative row that did not pass (its
    drift is the machine's, not its own), the first by name; None where there is none."""
    doubtful = {r.node for r in judged.rows if r.item.endswith("_vs_cluster") and r.status != Status.PASS}
    measured = sorted(set(judged.frame["node"])) if not judged.frame.empty else []
    return next((n for n in measured if n not in suspects and n not in doubtful), None)


def judged_rules(probes: Sequence[Probe]) -> dict[str, MetricRule]:
    """Every figure any probe judges, with its rule: what history and regressions compare."""
    return {metric: rule for probe in probes for metric, rule in probe.metrics.items()}


def regression_rows(
    state: RunState, probes: Sequence[Probe], rules: Mapping[str, MetricRule], frame: pd.DataFrame
) -> list[NodeRow]:
    """Each measured node against its own earlier runs: scheduled checks watch for drift. ``rules``: the
    figures ``probes`` judge (:func:`judged_rules`); ``frame``: the stage's figures."""
    if state.history is None or frame.empty:
        return []
    thresholds = {n.name: n.profile.thresholds for n in state.inventory.nodes}
    current = key_figures(frame, rules)
    return [
        node_row(
            state.run_id,
            state.cluster,
            NAME,
            node,
            row,
            "",
            probe_script(state.inventory.node(node), row.check, state.quick, probes),
        )
        for node, row in figure_regressions(
            current,
            state.history.figures,
            thresholds,
            rules,
            calibrated=calibrated_by_figure(judged_figures(frame, rules)),
        )
    ]


class SingleNodeStage:
    """GEMM, memory, host links and the intra-node all-reduce on every node still accepted, in waves of the
    profile's ``max_parallel_nodes``; judged against thresholds, the cluster's median and the node's own
    history."""

    name = NAME
    suites = frozenset({"light", "full"})
    tables = ("checks", "measurements", "nccl")

    def run(self, state: RunState) -> None:
        probes = probes_of_stage()
        nodes = state.still_accepted()
        limits = [n.profile.probes.max_parallel_nodes for n in nodes if n.profile.probes.max_parallel_nodes]
        outcomes = per_node(
            state,
            NAME,
            nodes,
            state.checkpoints.load_nodes(NAME),
            partial(single_node_probes, checkpoints=state.checkpoints, quick=state.quick, probes=probes),
            wave=min(limits) if limits else None,
        )
        judged = evaluate_single_node(
            state.run_id, state.inventory, outcomes, state.quick, probes, noise=state.calibration
        )
        state.tables.nccl.extend(judged.nccl)
        rows = confirm_stragglers(state, probes, judged)
        proof = prove_causes(
            state,
            NAME,
            probes,
            outcomes,
            (rows, judged.frame),
            (run_probes_on_node, figure_reader(state)),
            judged.nccl,
        )
        state.rows += proof.rows + mechanism_rows(state, NAME, probes, proof.rows, judged.nccl)
        state.measurements += judged.measurements + proof.measurements
        state.rows += regression_rows(state, probes, judged_rules(probes), judged.frame)
        state.trends = trend_records(state, judged.frame)

    def reasons(self) -> list[tuple[str, Mapping[str, Reason]]]:
        return probe_reasons(probes_of_stage())

    def causes(self) -> tuple[Link, ...]:
        probes = probes_of_stage()
        own = suspects.probe_stage_causes(frozenset(p.check for p in probes), NAME)
        return own + tuple(link for probe in probes for link in probe.causes)

    def expectations(self) -> tuple[Expectation, ...]:
        return tuple(e for probe in probes_of_stage() for e in probe.expectations)


def trend_records(state: RunState, current: pd.DataFrame) -> list[Trend]:
    """Each tested node's figures (``current``, the stage's frame) against its earlier runs (the report's
    history table); none without a history."""
    if state.history is None:
        return []
    names = [n.name for n in state.inventory.tested]
    trends = node_trends(state.history.figures, current, names, judged_rules(probes_of_stage()))
    return Trend.of_frame(trends)


def probe_reasons(probes: Sequence[Probe]) -> list[tuple[str, Mapping[str, Reason]]]:
    """The reasons a probe stage's rows carry: the session's, each probe's, and those it writes under other checks."""
    found: list[tuple[str, Mapping[str, Reason]]] = [
        ("probe", SESSION_REASONS),
        (suspects.NAME, suspects.REASONS),
        (nccl_mechanism.NAME, nccl_mechanism.REASONS),
    ]
    for probe in probes:
        found.append((probe.check, probe.reasons))
        found += list(probe.other_reasons.items())
    return found


STAGE = SingleNodeStage()
