"""NCCL's own account of the run in the report: per run, the channels each node's NCCL opened, the variables it
took, its version and plug-ins (and the algorithm and protocol, where the log had them), folded into node sets as
every difference across the cluster is ("24 channels on node[01-63]; 4 channels on node64"). A line that reads the
same for several runs is said once, naming them all. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cluster_accept.analysis.nccl_account import ALGORITHM, PLUGIN, PROTOCOL, SETTING, VERSION, facts_of
from cluster_accept.analysis.nccl_mechanism import channel_counts, choices
from cluster_accept.inventory.hostlist import describe_folded
from cluster_accept.vocabulary.rows import NcclFact


def _channels_text(coll: int, p2p: int | None) -> str:
    said = f"{coll} channel{'s' if coll != 1 else ''}"
    return f"{said} ({p2p} p2p)" if p2p is not None else said


def _channel_entries(facts: list[NcclFact]) -> list[tuple[str, str, str]]:
    p2p = channel_counts(facts, "p2p")
    entries = []
    for shape, nodes in sorted(channel_counts(facts).items(), key=lambda item: item[0].label):
        values = {node: _channels_text(count, p2p.get(shape, {}).get(node)) for node, count in nodes.items()}
        entries.append(("channels", shape.label, describe_folded(values)))
    return entries


def _process_entries(facts: list[NcclFact]) -> list[tuple[str, str, str]]:
    """Per run (stage and probe): each node's version, the variables NCCL took (``none``: it took none) and its
    plug-ins, over all its ranks."""
    by_run: dict[tuple[str, str], dict[str, list[NcclFact]]] = {}
    for fact in facts:
        by_run.setdefault((fact.stage, fact.probe), {}).setdefault(fact.node, []).append(fact)
    entries = []
    for (stage, probe), nodes in by_run.items():
        label = f"{stage} {probe}"
        took = _per_node(nodes, SETTING, lambda f: f"{f.name}={f.value}")
        entries.append(("settings NCCL took", label, describe_folded({n: v or "none" for n, v in took.items()})))
        for what, kind, text in (("version", VERSION, _value), ("plug-ins", PLUGIN, _named)):
            said = {node: value for node, value in _per_node(nodes, kind, text).items() if value}
            if said:
                entries.append((what, label, describe_folded(said)))
    return entries


def _value(fact: NcclFact) -> str:
    return fact.value


def _named(fact: NcclFact) -> str:
    return f"{fact.name} {fact.value}"


def _per_node(nodes: Mapping[str, list[NcclFact]], kind: str, text: Callable[[NcclFact], str]) -> dict[str, str]:
    """Each node's distinct facts of ``kind`` over its ranks, as ``text`` says each, sorted and joined."""
    return {node: ", ".join(sorted({text(f) for f in held if f.kind == kind})) for node, held in nodes.items()}


def _choice_entries(facts: list[NcclFact]) -> list[tuple[str, str, str]]:
    entries = []
    for kind in (ALGORITHM, PROTOCOL):
        for (stage, probe, name), nodes in sorted(choices(facts, kind).items()):
            entries.append((kind, f"{stage} {probe} {name}", describe_folded(nodes)))
    return entries


def account_lines(records: Iterable[NcclFact | Mapping[str, Any]]) -> list[tuple[str, str]]:
    """``[("channels (single-node allreduce, 4 ranks on 1 node)", "24 channels (32 p2p) on node[01-63]; …"), …]``:
    what NCCL said, per run, folded into node sets; a line that reads the same for several runs once."""
    facts = facts_of(records)
    merged: dict[tuple[str, str], list[str]] = {}
    for what, run, folded in _channel_entries(facts) + _process_entries(facts) + _choice_entries(facts):
        merged.setdefault((what, folded), []).append(run)
    return [(f"{what} ({'; '.join(runs)})", folded) for (what, folded), runs in merged.items()]
