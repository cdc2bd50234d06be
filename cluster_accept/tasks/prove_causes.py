"""Prove a suspected setting by measuring again without it: the step no health check takes.

After a probe stage is judged (and its stragglers measured again), every node with a figure that failed and a
suspect among the settings its run had (:mod:`analysis.suspects`) runs the probes behind those figures once
more, with the suspects removed from the job's environment (unset, or set empty where an NCCL config file sets
them: NCCL never overwrites a key the environment has). The failing rows are judged again on the new figures;
the suspects become confirmed or cleared rows, and each failing row says what it measured without them.

Bounded: one extra run per node and probe script, only for nodes with a failed figure and a suspect, in
waves of the profiles' ``max_parallel_nodes``; ``probes.prove_causes: false`` names the suspects without
measuring again. The extra figures are kept under the stage ``<stage>:without-suspects``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import pandas as pd

from cluster_accept.analysis import nccl_mechanism
from cluster_accept.analysis.nccl_account import SETTING
from cluster_accept.analysis.nccl_mechanism import ClusterAccount, mechanism
from cluster_accept.analysis.probe_verdicts import measurement_frame
from cluster_accept.analysis.suspects import (
    NCCL_SYMPTOMS,
    JobSetting,
    Retest,
    failing_figures,
    figure_of,
    figure_value,
    proof_rows,
    read_settings,
    recovered,
    retest_note,
    stated_minimum,
    suspects,
    unproved_rows,
)
from cluster_accept.checks.base import NodeRow, Status
from cluster_accept.inventory.model import Node, Profile
from cluster_accept.probes.base import Probe
from cluster_accept.probes.scripts import REMOVED_SETTINGS, tool_keys
from cluster_accept.remote.result import NodeResult
from cluster_accept.tasks.rows import node_row
from cluster_accept.tasks.stage import RunState, in_waves
from cluster_accept.vocabulary.rows import Measurement, NcclFact

SUFFIX = ":without-suspects"
NCCL_LOG = "NCCL's log (set by environment)"  # where a setting only NCCL's own account named was set
# How the stage runs a node's probes, and reads their figures: (node, quick, probes) -> its result;
# (result, probes, stage) -> its figures.
Measure = Callable[[Node, bool, Sequence[Probe]], NodeResult]
ReadFigures = Callable[[NodeResult, Sequence[Probe], str], list[Measurement]]


@dataclass(frozen=True)
class _Case:
    """One node to prove: its failing figure rows, the probes behind them, and the suspects its runs had."""

    node: Node
    failing: list[NodeRow]
    probes: list[Probe]
    suspected: list[JobSetting]


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


def _cases(
    state: RunState,
    probes: Sequence[Probe],
    outcomes: Sequence[NodeResult],
    rows: Sequence[NodeRow],
    facts: Sequence[NcclFact] = (),
    measured: frozenset[str] = frozenset(),
) -> list[_Case]:
    """The nodes to prove: a failed figure (``measured``: every metric the stage's runs gave), and a suspect among
    the settings of the runs behind it."""
    # the probes' judged figures, and those a probe judges off its own output (the data-parallel efficiency)
    metrics = frozenset(metric for probe in probes for metric in probe.metrics) | frozenset(measured)
    by_node = {outcome.node: outcome for outcome in outcomes}
    facts_of: dict[str, list[NcclFact]] = {}
    for fact in facts:
        facts_of.setdefault(fact.node, []).append(fact)
    failed, passed = failing_figures(rows, metrics), _passed(rows, metrics)
    settings: dict[tuple[str, frozenset[str]], list[JobSetting]] = {}

    def of(name: str, scripts: frozenset[str]) -> list[JobSetting]:
        key = (name, scripts)
        if key not in settings:
            settings[key] = node_settings(by_node[name], scripts, facts_of.get(name, []))
        return settings[key]

    cases = []
    for name, failing in sorted(failed.items()):
        node = state.inventory.node(name)
        behind = frozenset(p.script.name for p in probes if any(_behind(p, r) for r in failing))
        chosen = [p for p in probes if p.script.name in behind and p.command(node, state.quick) is not None]
        if name not in by_node or not chosen:
            continue
        figures = {figure_of(r) for r in failing}
        peers = [n for n, done in passed.items() if figures <= done and n in by_node and n not in failed]
        same = [n for n in peers if state.inventory.node(n).profile_name == node.profile_name]
        healthy = [of(n, behind) for n in same]
        suspected = suspects(of(name, behind), node.profile, tool_keys(node), healthy)
        if suspected:
            cases.append(_Case(node, failing, chosen, suspected))
    return cases


def _without(case: _Case, quick: bool, measure: Measure) -> NodeResult:
    """The case's probes run once more on its node with the suspects removed (the commands are built while
    :data:`probes.scripts.REMOVED_SETTINGS` names them, in the thread that runs them)."""
    token = REMOVED_SETTINGS.set({s.key: s.removal() for s in case.suspected})
    try:
        return measure(case.node, quick, case.probes)
    finally:
        REMOVED_SETTINGS.reset(token)


def _retests(
    cases: Sequence[_Case], before: pd.DataFrame, again: pd.DataFrame, profiles: Mapping[str, Profile]
) -> list[Retest]:
    """Each failing row judged again by its probe over the stage's figures, every proved node's figures replaced
    by those it measured without its suspects (one judgement per probe, whatever the number of nodes); a row
    recovered when it passes and its figure rose beyond the profile's ``straggler_pct``."""
    replaced = {(c.node.name, figure_of(r)) for c in cases for r in c.failing}
    keys = list(zip(before["node"], before["metric"], strict=True))
    kept = before[[key not in replaced for key in keys]]
    figures = pd.concat([kept, again], ignore_index=True) if not again.empty else kept
    measured = {(n, m) for n, m in zip(again["node"], again["metric"], strict=True)} if not again.empty else set()
    out = []
    out += _inspected_retests(cases, again)
    for probe in {p for c in cases for p in c.probes}:
        mine = [(c, r) for c in cases for r in c.failing if figure_of(r) in probe.metrics]
        if not mine:
            continue
        judged = probe.evaluate(figures[figures["metric"].isin(list(probe.metrics))], profiles)
        twins = {(n, r.item, r.gpu): r for n, r in judged}
        for case, row in mine:
            twin = twins.get((case.node.name, row.item, row.gpu))
            if (case.node.name, figure_of(row)) not in measured or twin is None:
                out.append(Retest(row, None, False))
                continue
            margin = case.node.profile.thresholds.straggler_pct
            after = figure_value(twin.observed)
            came_back = after is not None and recovered(figure_value(row.observed), after, margin)
            out.append(Retest(row, twin.observed, twin.status == Status.PASS and came_back))
    return out


def _inspected_retests(cases: Sequence[_Case], again: pd.DataFrame) -> list[Retest]:
    """Failing rows of figures a probe judges off its own output (not among its metrics): the figure measured
    again against the minimum the row states, beyond the straggler margin."""
    out = []
    for case in cases:
        judged = {m for p in case.probes for m in p.metrics}
        for row in case.failing:
            if figure_of(row) in judged:
                continue
            hit = (
                again[(again["node"] == case.node.name) & (again["metric"] == figure_of(row))]
                if not again.empty
                else again
            )
            after, floor = (float(hit["value"].iloc[0]) if not hit.empty else None), stated_minimum(row.expected)
            if after is None or floor is None:
                out.append(Retest(row, None, False))
                continue
            margin = case.node.profile.thresholds.straggler_pct
            ok = after >= floor and recovered(figure_value(row.observed), after, margin)
            out.append(Retest(row, f"{after:.3g}", ok))
    return out


def _run_cases(cases: Sequence[_Case], quick: bool, measure: Measure) -> dict[str, NodeResult]:
    """Each case measured again, in waves of the profiles' ``max_parallel_nodes``; by node."""
    results = in_waves(cases, lambda case: case.node, lambda case: _without(case, quick, measure))
    return {case.node.name: result for case, result in zip(cases, results, strict=True)}


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
    """The stage's rows (``judged``: with the frame of figures they were judged on) with the suspects of each
    failing figure named and, unless the profile turns it off, proved or cleared by one run without them
    (``run``: how the stage measures a node and reads its figures; ``facts``: NCCL's account of the stage's
    runs, whose settings count too)."""
    rows, before = judged
    measured = frozenset(before["metric"]) if not before.empty else frozenset()
    cases = _cases(state, probes, outcomes, rows, facts, measured)
    if not cases:
        return Proof(rows, [])
    profiles = {n.name: n.profile for n in state.inventory.nodes}
    proving = [c for c in cases if c.node.profile.probes.prove_causes]
    results = _run_cases(proving, state.quick, run[0])
    kept = [
        replace(m, stage=f"{stage}{SUFFIX}")
        for case in proving
        for m in run[1](results[case.node.name], case.probes, stage)
    ]
    retests = _retests(proving, before, measurement_frame(kept), profiles)
    notes: dict[int, str] = {}
    added: list[NodeRow] = []
    for case in cases:
        if case.node.name not in results:
            found = unproved_rows(case.suspected, "not measured again without it (probes.prove_causes: false)")
        else:
            mine = [r for r in retests if r.row.node == case.node.name]
            notes.update({id(r.row): retest_note(r, case.suspected) for r in mine})
            found = proof_rows(case.suspected, mine)
        added += [node_row(state.run_id, state.cluster, stage, case.node.name, r) for r in found]
    return Proof(noted(rows, notes) + added, kept)


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
