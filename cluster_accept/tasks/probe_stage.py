"""One probe stage, configured per stage (``single-node`` and ``burn`` are two instances of it).

The stage's probes (those declaring its name as their ``stage``) run on every node still accepted that the stage
takes, in waves of the profiles' ``probes.max_parallel_nodes`` (:func:`tasks.stage.wave_of`), each node's result
checkpointed the moment it came back (:func:`tasks.stage.per_node` loads a resumed run's instead of running them
again). The whole cluster's figures are judged as one frame (:func:`tasks.probe_runs.judge_nodes`: each
probe's series, where it declares one, written as its node is read); then, as the stage is configured, the
stragglers measured again beside control nodes, the suspected settings proved by measuring without them, each
node held to its own history, and the history's trends kept for the report.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import pandas as pd

from cluster_accept.analysis import nccl_mechanism, stragglers, suspects
from cluster_accept.analysis.calibration import calibrated_by_figure
from cluster_accept.analysis.history import Trend, key_figures, node_trends
from cluster_accept.analysis.probe_verdicts import MetricRule, judged_figures, measurement_frame
from cluster_accept.analysis.reference import shared_changes
from cluster_accept.analysis.regressions import (
    REGRESSION,
    Control,
    confirmed_again,
    figure_regressions,
    moved_together,
    own_past,
    peers_levels,
)
from cluster_accept.analysis.suspects import figure_of, stated_minimum
from cluster_accept.checks.base import NodeRow, Status
from cluster_accept.checks.declarations import Expectation, Link
from cluster_accept.checks.reasons import Reason
from cluster_accept.inventory.model import Node
from cluster_accept.probes.base import Probe, discover
from cluster_accept.remote.result import NodeResult
from cluster_accept.rundir.checkpoints import Checkpoints
from cluster_accept.tasks.probe_runs import (
    SESSION_REASONS,
    StageFigures,
    judge_nodes,
    probe_script,
    run_probes_on_node,
)
from cluster_accept.tasks.prove_causes import mechanism_rows, prove_causes, setting_rows
from cluster_accept.tasks.rows import node_row
from cluster_accept.tasks.stage import RunState, in_waves, per_node, wave_of
from cluster_accept.vocabulary.rows import Measurement


def every_node(node: Node) -> bool:
    """A stage that takes every node still accepted."""
    return True


def probe_node(node: Node, stage: str, checkpoints: Checkpoints, quick: bool, probes: Sequence[Probe]) -> NodeResult:
    """A node's runs of ``stage``'s probes, checkpointed as soon as they came back."""
    outcome = run_probes_on_node(node, quick, probes)
    checkpoints.save_node(stage, outcome)
    return outcome


@dataclass(frozen=True)
class ProbeStage:
    """A stage of probes run on each node alone (:class:`tasks.stage.Stage`). ``takes``: which of the nodes
    still accepted it measures; ``tables``: the run's tables it adds to (NCCL's account of its runs only where it
    names ``nccl``); the switches: what it judges after the cluster's figures, by measuring again (stragglers
    confirmed, suspected settings proved) and against the history (regressions, trends)."""

    name: str
    suites: frozenset[str]
    tables: tuple[str, ...]
    takes: Callable[[Node], bool] = every_node
    confirms_stragglers: bool = False
    proves_causes: bool = False
    judges_regressions: bool = False
    keeps_trends: bool = False

    def probes(self) -> list[Probe]:
        return discover(stage=self.name)

    def run(self, state: RunState) -> None:
        probes = self.probes()
        nodes = [n for n in state.still_accepted() if self.takes(n)]
        work = partial(probe_node, stage=self.name, checkpoints=state.checkpoints, quick=state.quick, probes=probes)
        saved = state.checkpoints.load_nodes(self.name)
        outcomes = per_node(state, self.name, nodes, saved, work, wave=wave_of(nodes))
        judged = judge_nodes(
            state.run_id,
            state.inventory,
            outcomes,
            state.quick,
            probes,
            self.name,
            noise=state.calibration,
            series_to=state.run_dir.path,
        )
        if "nccl" in self.tables:
            state.tables.nccl.extend(judged.nccl)
        if "settings" in self.tables:
            state.tables.settings += setting_rows(state.run_id, state.cluster, self.name, outcomes, probes)
        for table, charted in judged.charted.items():
            state.tables.series.setdefault(table, []).extend(charted)
        rows, proved = self._judged_again(state, probes, outcomes, judged)
        state.rows += rows
        state.measurements += judged.measurements + proved
        if self.keeps_trends:
            state.trends = self.trend_records(state, judged.frame)

    def _judged_again(
        self, state: RunState, probes: Sequence[Probe], outcomes: Sequence[NodeResult], judged: StageFigures
    ) -> tuple[list[NodeRow], list[Measurement]]:
        """The stage's rows once what it measures again is judged (its stragglers confirmed, its suspected settings
        proved and NCCL's mechanism named, as the stage is configured), and the figures proving measured."""
        rows, rounds = straggler_rounds(state, probes, judged) if self.confirms_stragglers else (judged.rows, None)
        if self.judges_regressions:
            rows = rows + against_history(state, self.name, probes, judged.frame, rounds)
        if not self.proves_causes:
            return rows, []
        run = (run_probes_on_node, figure_reader(state))
        proof = prove_causes(state, self.name, probes, outcomes, (rows, judged.frame), run, judged.nccl)
        return proof.rows + mechanism_rows(state, self.name, probes, proof.rows, judged.nccl), proof.measurements

    def trend_records(self, state: RunState, current: pd.DataFrame) -> list[Trend]:
        """Each tested node's figures (``current``) of this stage's probes against its earlier runs (the report's
        history table); none without a history."""
        if state.history is None:
            return []
        names = [n.name for n in state.inventory.tested]
        trends = node_trends(state.history.figures, current, names, judged_rules(self.probes()))
        return Trend.of_frame(trends)

    def reasons(self) -> list[tuple[str, Mapping[str, Reason]]]:
        return probe_reasons(self.probes())

    def causes(self) -> tuple[Link, ...]:
        """Its probes' links, after the suspected settings' and NCCL's mechanism where it proves causes."""
        probes = self.probes()
        own = suspects.probe_stage_causes(frozenset(p.check for p in probes), self.name) if self.proves_causes else ()
        return own + tuple(link for probe in probes for link in probe.causes)

    def expectations(self) -> tuple[Expectation, ...]:
        return tuple(e for probe in self.probes() for e in probe.expectations)


def figure_reader(state: RunState) -> Callable[[NodeResult, Sequence[Probe], str], list[Measurement]]:
    """How proving a suspect reads one node's figures of a run made again."""

    def read(outcome: NodeResult, probes: Sequence[Probe], stage: str) -> list[Measurement]:
        return judge_nodes(state.run_id, state.inventory, [outcome], state.quick, probes, stage).measurements

    return read


def measure_again(state: RunState, names: Sequence[str], probes: Sequence[Probe]) -> list[NodeResult]:
    """``names`` measured again with ``probes``, in waves of the profiles' ``probes.max_parallel_nodes`` (all at
    once where no profile bounds it, as the stage itself runs them); results in ``names`` order."""
    nodes = [state.inventory.node(name) for name in names]
    return in_waves(nodes, lambda node: node, lambda node: run_probes_on_node(node, state.quick, probes))


def confirm_stragglers(state: RunState, probes: Sequence[Probe], judged: StageFigures) -> list[NodeRow]:
    """The rows of :func:`straggler_rounds`."""
    return straggler_rounds(state, probes, judged)[0]


def straggler_rounds(
    state: RunState, probes: Sequence[Probe], judged: StageFigures
) -> tuple[list[NodeRow], pd.DataFrame | None]:
    """Each node with a straggler or inconclusive row against its peers measured again (only the runs that
    flagged it), in :data:`~analysis.stragglers.ROUNDS` rounds beside up to
    :data:`~analysis.stragglers.CONTROLS` control nodes whose figures of the checks that flagged them passed (two
    or more say how far healthy nodes sit apart in the rounds themselves), each round in waves of the profile's
    ``max_parallel_nodes``; the rows re-judged on it (:func:`analysis.stragglers.confirm`), and the figures of the
    rounds (None where nothing was measured again): a regression of a node is held to them too."""
    suspected = stragglers.flagged(judged.rows)
    if not suspected:
        return judged.rows, None
    by_scripts: dict[frozenset[str], list[str]] = {}  # nodes that run the same probes again are judged together:
    for name, checks in sorted(suspected.items()):  # each judgement walks the cluster's node list
        by_scripts.setdefault(frozenset(p.script.name for p in probes if p.check in checks), []).append(name)
    again: list[tuple[int, Measurement]] = []  # each figure measured again, with its round
    beside: dict[str, tuple[str, ...]] = {}  # each suspect: the nodes measured with it
    for scripts, names in by_scripts.items():
        chosen = [p for p in probes if p.script.name in scripts]
        controls = control_nodes(judged, names, set().union(*(suspected[n] for n in names)))
        beside.update({n: tuple(m for m in [*names, *controls] if m != n) for n in names})
        for turn in range(stragglers.ROUNDS if controls or len(names) > 1 else 1):  # paired: beside another node
            outcomes = measure_again(state, [*names, *controls], chosen)
            found = judge_nodes(state.run_id, state.inventory, outcomes, state.quick, chosen)
            again += [(turn, m) for m in found.measurements]
    thresholds = {n.name: n.profile.thresholds for n in state.inventory.nodes}
    after = _rounds_frame(again)
    return stragglers.confirm(judged.rows, judged.frame, after, judged_rules(probes), thresholds, beside), after


def _rounds_frame(again: Sequence[tuple[int, Measurement]]) -> pd.DataFrame:
    """The figures measured again as the one frame their confirmation reads: each with its ``round``."""
    frame = measurement_frame([m for _, m in again])
    return frame.assign(round=[turn for turn, _ in again]) if again else frame


def control_nodes(judged: StageFigures, suspects: Sequence[str], checks: set[str]) -> tuple[str, ...]:
    """The nodes measured again beside ``suspects``, whose ``checks`` flagged them: up to
    :data:`~analysis.stragglers.CONTROLS` with figures and no relative row of those checks that did not pass
    (their drift is the machine's, not their own; a node flagged only by another check's figures, one its node-side
    script may share, is a control here: only the suspects' flagged figures are judged on the rounds), the first by
    name; none where there is none."""
    doubtful = {
        r.node for r in judged.rows if r.check in checks and r.item.endswith("_vs_cluster") and r.status != Status.PASS
    }
    measured = sorted(set(judged.frame["node"])) if not judged.frame.empty else []
    return tuple(n for n in measured if n not in suspects and n not in doubtful)[: stragglers.CONTROLS]


def judged_rules(probes: Sequence[Probe]) -> dict[str, MetricRule]:
    """Every figure any probe judges, with its rule: what history and regressions compare."""
    return {metric: rule for probe in probes for metric, rule in probe.metrics.items()}


def regression_rows(state: RunState, stage: str, probes: Sequence[Probe], frame: pd.DataFrame) -> list[NodeRow]:
    """Each measured node against its own earlier runs: scheduled checks watch for drift. ``frame``: the stage's
    figures, of which those ``probes`` judge are compared."""
    if state.history is None or frame.empty:
        return []
    rules = judged_rules(probes)
    thresholds = {n.name: n.profile.thresholds for n in state.inventory.nodes}
    current = key_figures(frame, rules)
    calibrated = calibrated_by_figure(judged_figures(frame, rules))
    return [
        node_row(
            state.run_id,
            state.cluster,
            stage,
            node,
            row,
            "",
            probe_script(state.inventory.node(node), row.check, state.quick, probes),
        )
        for node, row in figure_regressions(current, state.history.figures, thresholds, rules, calibrated=calibrated)
    ]


def against_history(
    state: RunState, stage: str, probes: Sequence[Probe], frame: pd.DataFrame, rounds: pd.DataFrame | None = None
) -> list[NodeRow]:
    """Each measured node against its own earlier runs (:func:`regression_rows`): a figure most nodes lost together
    is the cluster's movement (:func:`analysis.regressions.moved_together`, with the settings that changed), and
    every regression left is measured again beside a control node whose own figure did not move
    (:func:`confirm_regressions`), and held to what the stage's straggler ``rounds`` measured of it too."""
    rows = moved_together(regression_rows(state, stage, probes, frame), partial(_changed_settings, state))
    if not any(r.reason == REGRESSION for r in rows):
        return rows
    return confirm_regressions(state, probes, rows, round_figures(rounds, judged_rules(probes)))


def round_figures(rounds: pd.DataFrame | None, rules: Mapping[str, MetricRule]) -> dict[tuple[str, str], list[float]]:
    """Each node's figure in each straggler round, by (node, metric), in round order."""
    out: dict[tuple[str, str], list[float]] = {}
    if rounds is None or rounds.empty:
        return out
    for _, one in rounds.groupby("round", sort=True):
        figures = key_figures(one, rules)
        for node, metric, value in zip(figures["node"], figures["metric"], figures["value"], strict=True):
            out.setdefault((str(node), str(metric)), []).append(float(value))
    return out


def confirm_regressions(
    state: RunState,
    probes: Sequence[Probe],
    rows: Sequence[NodeRow],
    in_rounds: Mapping[tuple[str, str], Sequence[float]] | None = None,
) -> list[NodeRow]:
    """The nodes with a regression measured once more with the probes behind it, beside the first node whose every
    figure held against its history; each stays a regression only when it is still low while the control is not,
    and when the figures the stage's straggler rounds measured of it (``in_rounds``) do not put it back within its
    own history (:func:`analysis.regressions.confirmed_again`)."""
    flagged = sorted({r.node for r in rows if r.reason == REGRESSION})
    steady = sorted({r.node for r in rows} - {r.node for r in rows if r.status != Status.PASS})
    control = steady[0] if steady else None
    checks = {r.check for r in rows if r.reason == REGRESSION}
    chosen = [p for p in probes if p.check in checks]
    outcomes = measure_again(state, [*flagged, *([control] if control else [])], chosen)
    measured = judge_nodes(state.run_id, state.inventory, outcomes, state.quick, chosen).measurements
    again = key_figures(measurement_frame(measured), judged_rules(probes))
    value = {(str(n), str(m)): float(v) for n, m, v in zip(again["node"], again["metric"], again["value"], strict=True)}
    floors = {(r.node, r.item): r.expected for r in rows}
    out = []
    for row in rows:
        if row.reason != REGRESSION:
            out.append(row)
            continue
        metric, held = figure_of(row), None
        if control is not None:
            figures = state.history.figures if state.history is not None else pd.DataFrame()
            past = own_past(figures, control, metric, _model_of(again, control, metric))
            floor = stated_minimum(floors.get((control, row.item)))
            held = Control(control, value.get((control, metric)), floor, statistics.median(past) if past else None)
        rounds = list((in_rounds or {}).get((row.node, metric), ()))
        levels = peers_levels(in_rounds or {}, row.node, metric, len(rounds))
        out.append(confirmed_again(row, value.get((row.node, metric)), held, rounds, levels))
    return out


def _model_of(figures: pd.DataFrame, node: str, metric: str) -> str:
    """The model a node's training figure was measured with ("" for any other figure), as its history keys it."""
    if "model" not in figures.columns:
        return ""
    found = figures[(figures["node"] == node) & (figures["metric"] == metric)]["model"]
    return str(found.iloc[0] or "") if not found.empty else ""


def _changed_settings(state: RunState) -> str:
    """The setting changes most nodes of this run share against their last accepted runs (the history's
    ``settings``): the candidates when most nodes fell together; "" without a history of settings."""
    past = state.history.settings if state.history is not None else None
    if past is None or past.empty or not state.tables.settings:
        return ""
    now: dict[str, dict[str, str]] = {}
    for row in state.tables.settings:
        now.setdefault(row.node, {})[row.name] = row.value
    was: dict[str, dict[str, str]] = {}
    for node, name, value in zip(past["node"], past["name"], past["value"], strict=True):
        was.setdefault(str(node), {})[str(name)] = str(value)
    return "; ".join(shared_changes(now, was)) or "no setting the probes ran with changed"


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
