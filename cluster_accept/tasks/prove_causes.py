"""Prove the cause of a slow figure: the smallest set of settings whose reverting restores it, arm by arm.

After a probe stage is judged (its stragglers measured again, each node held to its own history), every node with
a figure that failed runs the probes behind it again, arm after arm, with some of the settings that differ from
its known-good reference (:mod:`analysis.reference`: its last accepted run, else a healthy peer, else the
defaults) set back to the reference's (unset, set empty where an NCCL config file sets them: NCCL never
overwrites a key the environment has, or set to the reference's value). Which settings each arm reverts is the
search's (:mod:`analysis.minimal_cause`); each arm is judged as the stage judged the figure, and an arm that did
not run with the settings asked is void. The changes become confirmed, confirmed-together, cleared or unresolved
rows (:mod:`analysis.proof`), and each failing row says what the search found.

Bounded: only nodes with a failed figure and a difference, each search by its bound of arms (``probes.
prove_arms_extra``), each round of arms in waves of the profiles' ``max_parallel_nodes``; ``probes.prove_causes:
false`` names the differences without measuring again. The arms' figures are kept under the stage
``<stage>:without-suspects``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from cluster_accept.analysis import nccl_mechanism
from cluster_accept.analysis.calibration import calibrated_by_figure
from cluster_accept.analysis.minimal_cause import Search
from cluster_accept.analysis.nccl_account import SETTING
from cluster_accept.analysis.nccl_mechanism import ClusterAccount, mechanism
from cluster_accept.analysis.noise import Noise, robust_cv
from cluster_accept.analysis.probe_verdicts import MetricRule, judged_figures, measurement_frame
from cluster_accept.analysis.proof import (
    REPEATS,
    arm_outcome,
    arm_settings_wrong,
    figure_note,
    finding_rows,
    unproved_change_rows,
)
from cluster_accept.analysis.reference import DEFAULTS, Change, Reference, closest, difference, suspected
from cluster_accept.analysis.regressions import HISTORY_SUFFIX
from cluster_accept.analysis.suspects import (
    NCCL_LOG,
    NCCL_SYMPTOMS,
    JobSetting,
    Retest,
    failing_figures,
    figure_of,
    figure_value,
    read_settings,
    recovered,
    stated_minimum,
)
from cluster_accept.checks.base import NodeRow, Status
from cluster_accept.inventory.model import Node, Profile
from cluster_accept.probes.base import Probe
from cluster_accept.probes.scripts import REMOVED_SETTINGS, tool_keys
from cluster_accept.remote.result import NodeResult
from cluster_accept.tasks.rows import node_row
from cluster_accept.tasks.stage import RunState, in_waves
from cluster_accept.vocabulary.rows import Measurement, NcclFact, SettingRow

SUFFIX = ":without-suspects"
# How the stage runs a node's probes, and reads their figures: (node, quick, probes) -> its result;
# (result, probes, stage) -> its figures.
Measure = Callable[[Node, bool, Sequence[Probe]], NodeResult]
ReadFigures = Callable[[NodeResult, Sequence[Probe], str], list[Measurement]]


@dataclass(frozen=True)
class _Case:
    """One node to prove: its failing figure rows, the probes behind them, and what its runs changed against its
    known-good reference."""

    node: Node
    failing: list[NodeRow]
    probes: list[Probe]
    changes: list[Change]  # the differences against ``reference`` that can have slowed it
    reference: Reference


def node_settings(outcome: NodeResult, scripts: frozenset[str], facts: Sequence[NcclFact] = ()) -> list[JobSetting]:
    """The settings the node's runs of ``scripts`` said they had (each key once, the first run's), then those
    NCCL's log says it took that the runs did not name (a file read inside a container, a launcher's own).
    ``facts``: NCCL's account of this node's runs (the caller indexes the stage's by node once)."""
    found: dict[str, JobSetting] = {}
    for result in outcome.commands:
        if result.name in scripts:
            for setting in read_settings(result.stderr or ""):
                found.setdefault(setting.key, setting)
    for fact in facts:
        if fact.kind == SETTING and fact.node == outcome.node and fact.probe in scripts and fact.name not in found:
            found[fact.name] = JobSetting(fact.name, fact.value, NCCL_LOG)
    return list(found.values())


def _behind(probe: Probe, row: NodeRow) -> bool:
    """Whether ``probe``'s run gave the figure ``row`` judges: one of its metrics, or one it judges itself."""
    return figure_of(row) in probe.metrics or row.check == probe.check


def _passed(rows: Sequence[NodeRow], metrics: frozenset[str]) -> dict[str, set[str]]:
    """By node, the figures (of ``metrics``) it measured and passed: only such a node clears a setting it shares
    (one whose run crashed never measured the figure the setting may have cost)."""
    found: dict[str, set[str]] = {}
    for row in rows:
        if row.status == Status.PASS and figure_of(row) in metrics:
            found.setdefault(row.node, set()).add(figure_of(row))
    return found


def _reference(
    state: RunState, name: str, scripts: frozenset[str], now: list[JobSetting], peers: dict[str, list[JobSetting]]
) -> Reference:
    """The node's known-good reference for the runs of ``scripts``: its last accepted run's settings, else the
    closest node of this run whose same figures passed (``peers``), else the libraries' defaults."""
    history = getattr(state, "history", None)
    past = history.settings if history is not None else None
    if past is not None and not past.empty:
        mine = past[(past["node"] == name) & past["probe"].isin(list(scripts))]
        if not mine.empty:
            settings = [_setting_of(r) for r in mine.drop_duplicates("name").to_dict("records")]
            return Reference(tuple(settings), f"its last accepted run {mine['run_id'].iloc[0]}")
    return closest(now, peers) or Reference((), DEFAULTS)


def _setting_of(record: Mapping[str, Any]) -> JobSetting:
    return JobSetting(str(record["name"]), str(record["value"]), str(record["source"]), str(record.get("also") or ""))


def _cases(
    state: RunState,
    probes: Sequence[Probe],
    outcomes: Sequence[NodeResult],
    rows: Sequence[NodeRow],
    facts: Sequence[NcclFact] = (),
    measured: frozenset[str] = frozenset(),
) -> list[_Case]:
    """The nodes to prove: a failed figure (``measured``: every metric the stage's runs gave), and a difference
    against the node's known-good reference among the settings of the runs behind it."""
    # the probes' judged figures, and those a probe judges off its own output (the data-parallel efficiency)
    metrics = frozenset(metric for probe in probes for metric in probe.metrics) | frozenset(measured)
    by_node = {outcome.node: outcome for outcome in outcomes}
    facts_of: dict[str, list[NcclFact]] = {}
    for fact in facts:
        facts_of.setdefault(fact.node, []).append(fact)
    failed, passed = failing_figures(rows, metrics), _passed(rows, metrics)
    cases = []
    for name, failing in sorted(failed.items()):
        node = state.inventory.node(name)
        behind = frozenset(p.script.name for p in probes if any(_behind(p, r) for r in failing))
        chosen = [p for p in probes if p.script.name in behind and p.command(node, state.quick) is not None]
        if name not in by_node or not chosen:
            continue
        figures = {figure_of(r) for r in failing}
        like = [n for n, done in passed.items() if figures <= done and n in by_node and n not in failed]
        same = [n for n in like if state.inventory.node(n).profile_name == node.profile_name]
        peers = {n: node_settings(by_node[n], behind, facts_of.get(n, [])) for n in same}
        now = node_settings(by_node[name], behind, facts_of.get(name, []))
        reference = _reference(state, name, behind, now, peers)
        changes = suspected(difference(now, reference.settings), node.profile, tool_keys(node), peers.values())
        if changes:
            cases.append(_Case(node, failing, chosen, changes, reference))
    return cases


def _arm_run(case: _Case, reverted: frozenset[str], quick: bool, measure: Measure) -> NodeResult:
    """The case's probes run once more on its node with ``reverted`` changes set back to the reference (the
    commands are built while :data:`probes.scripts.REMOVED_SETTINGS` names them, in the thread that runs them)."""
    token = REMOVED_SETTINGS.set({c.key: c.revert() for c in case.changes if c.key in reverted})
    try:
        return measure(case.node, quick, case.probes)
    finally:
        REMOVED_SETTINGS.reset(token)


def _retests(
    cases: Sequence[_Case],
    before: pd.DataFrame,
    again: pd.DataFrame,
    profiles: Mapping[str, Profile],
    noise: Mapping[tuple[str, str], Noise],
) -> list[Retest]:
    """Each failing row judged again by its probe over the stage's figures, every measured node's figures replaced
    by those of its arm (one judgement per probe, whatever the number of nodes); a row recovered when it passes
    and its figure rose beyond the profile's ``straggler_pct`` and ``noise_k`` times the figure's calibrated
    noise (a figure back only within its noise is not restored)."""
    replaced = {(c.node.name, figure_of(r)) for c in cases for r in c.failing}
    keys = list(zip(before["node"], before["metric"], strict=True))
    kept = before[[key not in replaced for key in keys]]
    figures = pd.concat([kept, again], ignore_index=True) if not again.empty else kept
    measured = {(n, m) for n, m in zip(again["node"], again["metric"], strict=True)} if not again.empty else set()
    out = _inspected_retests(cases, again, noise)
    for probe in {p for c in cases for p in c.probes}:
        mine = [(c, r) for c in cases for r in c.failing if figure_of(r) in probe.metrics and not _against_history(r)]
        if not mine:
            continue
        judged = probe.evaluate(figures[figures["metric"].isin(list(probe.metrics))], profiles)
        twins = {(n, r.item, r.gpu): r for n, r in judged}
        for case, row in mine:
            twin = twins.get((case.node.name, row.item, row.gpu))
            if (case.node.name, figure_of(row)) not in measured or twin is None:
                out.append(Retest(row, None, False))
                continue
            after = figure_value(twin.observed)
            margin = _margin(case, figure_of(row), noise)
            came_back = after is not None and recovered(figure_value(row.observed), after, margin)
            out.append(Retest(row, twin.observed, twin.status == Status.PASS and came_back))
    return out


def _against_history(row: NodeRow) -> bool:
    """A row against the node's own history: re-judged against the floor it states, not by the probe."""
    return row.item.endswith(HISTORY_SUFFIX)


def _margin(case: _Case, metric: str, noise: Mapping[tuple[str, str], Noise]) -> float:
    """The rise a figure must show to count as restored: ``straggler_pct``, or ``noise_k`` times its noise."""
    limits = case.node.profile.thresholds
    known = noise.get((case.node.name, metric))
    return max(limits.straggler_pct, 100 * limits.noise_k * known.cv) if known is not None else limits.straggler_pct


def _inspected_retests(
    cases: Sequence[_Case], again: pd.DataFrame, noise: Mapping[tuple[str, str], Noise]
) -> list[Retest]:
    """Failing rows of figures not judged again by a probe's evaluation (one a probe judges off its own output,
    a figure against the node's own history): the figure measured again against the minimum the row states,
    beyond the restoring margin."""
    out = []
    for case in cases:
        judged = {m for p in case.probes for m in p.metrics}
        for row in case.failing:
            if figure_of(row) in judged and not _against_history(row):
                continue
            hit = (
                again[(again["node"] == case.node.name) & (again["metric"] == figure_of(row))]
                if not again.empty
                else again
            )
            if not hit.empty and "size" in hit.columns and hit["size"].notna().any():
                hit = hit[hit["size"] == hit["size"].max()]  # a swept figure is judged at its largest size
            after, floor = (float(hit["value"].median()) if not hit.empty else None), stated_minimum(row.expected)
            if after is None or floor is None:
                out.append(Retest(row, None, False))
                continue
            ok = after >= floor and recovered(figure_value(row.observed), after, _margin(case, figure_of(row), noise))
            out.append(Retest(row, f"{after:.3g}", ok))
    return out


@dataclass
class _Arm:
    """One arm of a case's search while it is measured: every figure its runs gave, how many runs, and how its
    settings differed from those asked (void) if they did."""

    case: _Case
    reverted: frozenset[str]
    figures: list[Measurement] = field(default_factory=list)
    runs: int = 0
    wrong: str = ""


def _next_arms(cases: Sequence[_Case], searches: Mapping[str, Search]) -> list[_Arm]:
    return [_Arm(c, arm) for c in cases if (arm := searches[c.node.name].next_arm()) is not None]


def _measure(state: RunState, stage: str, arms: Sequence[_Arm], run: tuple[Measure, ReadFigures]) -> list[Measurement]:
    """Each arm run once more (in waves of the profiles' ``max_parallel_nodes``), its figures and the settings it
    said it ran with added to it; the figures, under the stage ``<stage>:without-suspects``."""
    results = in_waves(arms, lambda a: a.case.node, lambda a: _arm_run(a.case, a.reverted, state.quick, run[0]))
    kept = []
    for arm, result in zip(arms, results, strict=True):
        figures = run[1](result, arm.case.probes, stage)
        arm.figures += figures
        arm.runs += 1
        ran = node_settings(result, frozenset(p.script.name for p in arm.case.probes))
        arm.wrong = arm.wrong or arm_settings_wrong(arm.case.changes, arm.reverted, ran)
        kept += [replace(m, stage=f"{stage}{SUFFIX}") for m in figures]
    return kept


def _highest(figures: Sequence[Measurement]) -> list[Measurement]:
    """Of each figure measured more than once (an arm measured again), the highest: what runs beside a throughput
    probe only ever pulls it down."""
    best: dict[tuple[object, ...], Measurement] = {}
    for m in figures:
        key = (m.node, m.metric, m.gpu, m.size)
        if key not in best or m.value > best[key].value:
            best[key] = m
    return list(best.values())


def _search(
    state: RunState, stage: str, cases: Sequence[_Case], before: pd.DataFrame, run: tuple[Measure, ReadFigures]
) -> tuple[dict[str, Search], list[Measurement]]:
    """Every case's search run to its end: each round one arm per node still searching, judged together (an arm
    not told apart measured again, at most :data:`analysis.proof.REPEATS` times); by node, and every figure the
    arms measured."""
    profiles = {n.name: n.profile for n in state.inventory.nodes}
    noise = figure_noise(before, {m: r for c in cases for p in c.probes for m, r in p.metrics.items()})
    searches = {
        c.node.name: Search([ch.key for ch in c.changes], c.node.profile.probes.prove_arms_extra) for c in cases
    }
    # each failing row's reference level: the peers' median for a straggler, then its figure with everything reverted
    levels = peer_levels([r for c in cases for r in c.failing], before)
    kept: list[Measurement] = []
    asked = _next_arms(cases, searches)
    while asked:
        kept += _measure(state, stage, asked, run)
        frame = measurement_frame(_highest([m for a in asked for m in a.figures]))
        retests = _retests([a.case for a in asked], before, frame, profiles, noise)
        again, done = [], []
        for arm in asked:
            mine = [r for r in retests if r.row.node == arm.case.node.name]
            outcome, said = arm_outcome(mine, arm.wrong, levels, last=arm.runs > REPEATS)
            if outcome is None:
                again.append(arm)
                continue
            search = searches[arm.case.node.name]
            if not search.arms and outcome == "restored":
                levels.update({id(r.row): v for r in mine if (v := figure_value(r.again)) is not None})
            search.record(outcome, f"{said} (highest of {arm.runs} runs)" if arm.runs > 1 else said)
            done.append(arm.case)
        asked = again + _next_arms(done, searches)
    return searches, kept


def peer_levels(rows: Sequence[NodeRow], before: pd.DataFrame) -> dict[int, float]:
    """By row ``id``, a straggler's level before any arm: the median of the other nodes' same figure (of the same
    GPU where it has one), what the stage held it to."""
    found: dict[int, float] = {}
    for row in rows:
        if not row.item.endswith("_vs_cluster") or before.empty:
            continue
        peers = before[(before["metric"] == figure_of(row)) & (before["node"] != row.node)]
        if row.gpu is not None and "gpu" in peers.columns and (peers["gpu"] == row.gpu).any():
            peers = peers[peers["gpu"] == row.gpu]
        if not peers.empty:
            found[id(row)] = float(peers.groupby("node")["value"].median().median())
    return found


def figure_noise(before: pd.DataFrame, rules: Mapping[str, MetricRule]) -> dict[tuple[str, str], Noise]:
    """By (node, metric), the noise an arm's figure must rise beyond to count as restored: the calibration's
    where the cluster has one, else the spread of the figure over the run's nodes (each node's median; it holds
    the nodes' own run-to-run noise and more)."""
    if before.empty:
        return {}
    figures = judged_figures(before, rules)
    found = calibrated_by_figure(figures)
    for metric, group in figures.groupby("metric"):
        spread = robust_cv(list(group.groupby("node")["value"].median()), "the spread of the run's nodes")
        for node in group["node"].unique():
            key = (str(node), str(metric))
            if key not in found and spread is not None:
                found[key] = spread
    return found


def noted(rows: Sequence[NodeRow], notes: Mapping[int, str]) -> list[NodeRow]:
    """``rows``, each failing figure's detail (by ``id``) followed by what it measured without the suspects."""
    return [
        replace(r, detail=f"{r.detail}; {notes[id(r)]}" if r.detail else notes[id(r)]) if id(r) in notes else r
        for r in rows
    ]


@dataclass(frozen=True)
class Proof:
    """What proving added to a stage: its rows (the failing ones noted, the suspects' rows after them) and the
    figures measured without the suspects."""

    rows: list[NodeRow]
    measurements: list[Measurement]


def prove_causes(
    state: RunState,
    stage: str,
    probes: Sequence[Probe],
    outcomes: Sequence[NodeResult],
    judged: tuple[list[NodeRow], pd.DataFrame],
    run: tuple[Measure, ReadFigures],
    facts: Sequence[NcclFact] = (),
) -> Proof:
    """The stage's rows (``judged``: with the frame of figures they were judged on) with the smallest set of
    changes against each failing node's known-good reference that explains its failing figures, found and proved
    arm by arm (:class:`analysis.minimal_cause.Search`) unless the profile turns proving off (``run``: how the
    stage measures a node and reads its figures; ``facts``: NCCL's account of the stage's runs, whose settings
    count too)."""
    rows, before = judged
    measured = frozenset(before["metric"]) if not before.empty else frozenset()
    cases = _cases(state, probes, outcomes, rows, facts, measured)
    if not cases:
        return Proof(rows, [])
    proving = [c for c in cases if c.node.profile.probes.prove_causes]
    searches, kept = _search(state, stage, proving, before, run)
    notes: dict[int, str] = {}
    added: list[NodeRow] = []
    for case in cases:
        search = searches.get(case.node.name)
        if search is None or search.finding is None:
            why = "not measured again without it (probes.prove_causes: false)"
            found = unproved_change_rows(case.changes, why, case.reference.said)
        else:
            notes.update({id(r): figure_note(search.finding, case.changes, case.reference.said) for r in case.failing})
            found = finding_rows(case.changes, search.finding, case.reference.said)
        added += [node_row(state.run_id, state.cluster, stage, case.node.name, r) for r in found]
    return Proof(noted(rows, notes) + added, kept)


def setting_rows(
    run_id: str, cluster: str, stage: str, outcomes: Sequence[NodeResult], probes: Sequence[Probe]
) -> list[SettingRow]:
    """What each node's runs of ``probes`` said they ran with, one row per run and setting: the ``settings``
    table, a later run's known-good reference."""
    scripts = {p.script.name for p in probes}
    return [
        SettingRow(run_id, cluster, stage, outcome.node, result.name, s.key, s.value, s.source, s.also)
        for outcome in outcomes
        for result in outcome.commands
        if result.name in scripts
        for s in read_settings(result.stderr or "")
    ]


def mechanism_rows(
    state: RunState, stage: str, probes: Sequence[Probe], rows: Sequence[NodeRow], facts: Sequence[NcclFact]
) -> list[NodeRow]:
    """How NCCL ran each node with a failing collective or training figure otherwise than the nodes whose figures
    passed (or than the node's NVLinks allow), read from NCCL's own log of the stage's runs: the mechanism
    between the slow figure and the setting behind it."""
    metrics = {m for p in probes if p.check in NCCL_SYMPTOMS for m in p.metrics}
    failing = failing_figures(rows, metrics)
    if not failing or not facts:
        return []
    account = ClusterAccount.of(facts)
    healthy: dict[str, set[str]] = {}  # by profile: a node is held to the majority of nodes like it only
    for node in state.inventory.tested:
        if node.name not in failing:
            healthy.setdefault(node.profile_name, set()).add(node.name)
    found = []
    for name in sorted(failing):
        node = state.inventory.node(name)
        links = node.profile.nvlink.links_per_gpu if node.profile.nvlink is not None else None
        peers = healthy.get(node.profile_name, set())
        for row in nccl_mechanism.mechanism_rows(mechanism(name, account, peers, links)):
            found.append(node_row(state.run_id, state.cluster, stage, name, row))
    return found
