"""The report's evidence: each node's findings with their actions, folded so that a cluster of thousands of
nodes reads like one of eight. Pure.

- :func:`findings_by_node`: every finding (a row that did not pass or skip) of every node, cause first, with its
  declared action and the commands that reproduce it;
- :func:`fold_findings`: findings that say the same thing (check, item, GPU, status, reason, observed,
  expected, detail, raw-output excerpt, action) on many nodes, once, with the node set
  (``hostname:resolves_to_loopback`` on ``gpu[0001-4096]``); the excerpts that several of them show, once;
- :func:`node_table`: the per-node table, the nodes to act on first, each named; beyond
  :data:`LIST_EVERY_NODE_UP_TO` nodes the accepted (and the skipped) folded into one row per profile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from cluster_accept.analysis.causes import cause_first, explain
from cluster_accept.analysis.verdicts import Verdict, VerdictRow
from cluster_accept.checks.base import BAD_STATUSES, NodeRow
from cluster_accept.checks.declarations import Link
from cluster_accept.checks.reasons import ReasonCatalog
from cluster_accept.inventory.hostlist import fold
from cluster_accept.reports.actions import reproduce, suggest
from cluster_accept.reports.paging import Column, PagedTable
from cluster_accept.vocabulary.text import keep_head

EXCERPT_CHARS = 1200
LIST_EVERY_NODE_UP_TO = 64  # a cluster this small lists its accepted nodes one by one, as it always has
FOLDED = (Verdict.ACCEPTED.value, Verdict.SKIPPED.value)
BAD = frozenset(s.value for s in BAD_STATUSES)
SAME_EVIDENCE = (
    "check", "item", "gpu", "status", "reason", "observed", "expected", "detail", "excerpt", "action", "why",
)  # fmt: skip
NODE_COLUMNS = (
    Column("node", "link"), Column("profile"), Column("verdict", "class"), Column("cause"), Column("reasons"),
    Column("evidence (observed, expected)", "lines"), Column("suggested action"), Column("reproduce", "code"),
)  # fmt: skip
FINDING_COLUMNS = (
    Column("nodes"), Column("check"), Column("item"), Column("gpu"), Column("status", "class"), Column("reason"),
    Column("observed"), Column("expected"), Column("detail"), Column("action"), Column("reproduce", "code"),
    Column("evidence", "excerpt"),
)  # fmt: skip


@dataclass(frozen=True)
class FoldedFinding:
    """One finding as many nodes show it: its fields (those of one node's record) and the nodes."""

    finding: Mapping[str, Any]
    nodes: tuple[str, ...]
    reproduce: tuple[str, ...]

    @property
    def node_set(self) -> str:
        return fold(self.nodes)


def findings_by_node(
    rows: Sequence[NodeRow], inventory: str, good_node: str | None, reasons: ReasonCatalog, links: Sequence[Link]
) -> dict[str, list[dict[str, Any]]]:
    """Every row that did not pass or skip, per node, as a record for the templates (plain values), with the
    declared action and explanation of its reason; causes (by the declared ``links``) first."""
    by_node: dict[str, list[NodeRow]] = {}
    for row in rows:
        by_node.setdefault(row.node, []).append(row)
    found: dict[str, list[dict[str, Any]]] = {}
    for node, own in sorted(by_node.items()):
        by_index = explain(own, links)
        explained = {id(own[i]): causes for i, causes in by_index.items()}
        for row in cause_first(own, by_index):  # causes first, then the findings they explain
            causes = explained.get(id(row), [])
            # A finding with a cause takes the cause's action: a GPU slowed by a co-tenant is not sent back.
            hint = suggest(causes[0] if causes else row, reasons)
            found.setdefault(node, []).append(
                {
                    **row.record(),
                    "excerpt": keep_head(row.raw_output, EXCERPT_CHARS),
                    "action": hint.action.value,
                    "why": hint.why if not causes else f"explained by {causes[0].code}: {hint.why}",
                    "reproduce": reproduce(row, inventory, good_node) if row.status in BAD_STATUSES else [],
                    "row": row,
                }
            )
    return found


def fold_findings(findings: Mapping[str, Sequence[Mapping[str, Any]]], inventory: str) -> list[FoldedFinding]:
    """Findings that say the same thing on several nodes, once each with their nodes: the failures first, then
    the warnings, each in the order its first node showed it (a node's causes before what they explain)."""
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for node in sorted(findings):
        for finding in findings[node]:
            groups.setdefault(tuple(finding.get(k) for k in SAME_EVIDENCE), []).append(finding)
    folded = [_folded(members, inventory) for members in groups.values()]
    return sorted(folded, key=lambda f: f.finding["status"] not in BAD)  # stable: first appearance kept


def _folded(members: Sequence[Mapping[str, Any]], inventory: str) -> FoldedFinding:
    first = members[0]
    nodes = tuple(str(m["node"]) for m in members)
    lines = list(first["reproduce"])
    if len(nodes) > 1 and lines and lines[-1].startswith("cluster-accept run "):
        # The rerun takes the whole node set; the node-side command stays the first node's.
        lines[-1] = reproduce(replace(first["row"], node=fold(nodes)), inventory)[-1]
    return FoldedFinding(first, nodes, tuple(lines))


def findings_table(folded: Sequence[FoldedFinding]) -> PagedTable:
    """The folded findings as a paged table; an excerpt that several findings show is stored once."""
    shared: dict[str, int] = {}
    rows = []
    for f in folded:
        r = f.finding
        excerpt = shared.setdefault(r["excerpt"], len(shared)) if r["excerpt"] else None
        count = f" ({len(f.nodes):,} nodes)" if len(f.nodes) > 1 else ""
        status = str(r["status"])
        rows.append(
            (
                f"{f.node_set}{count}", r["check"], r["item"], None if r.get("gpu") is None else str(r["gpu"]),
                [status, "rejected" if status in BAD else status], r["reason"], r.get("observed"), r.get("expected"),
                r.get("detail") or "", f"{r['action']}: {r['why']}", list(f.reproduce), excerpt,
            )
        )  # fmt: skip
    keys = tuple(f.nodes for f in folded)
    return PagedTable("findings-table", FINDING_COLUMNS, tuple(rows), keys=keys, shared=tuple(shared))


def _bad_findings(verdict: VerdictRow, findings: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [f for f in findings if f["status"] in BAD or f"{f['check']}:{f['reason']}" in verdict.reasons]


def node_record(verdict: VerdictRow, findings: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A node's row of the per-node table: verdict, reasons, the first evidence, the actions and one command."""
    bad = _bad_findings(verdict, findings)
    return {
        **verdict.record(),
        "evidence": [
            f"{f['check']} {f['item']}{'' if f.get('gpu') is None else ' gpu ' + str(f['gpu'])}: "
            f"{f.get('observed') or '-'} (expected {f.get('expected') or '-'})"
            for f in bad[:3]
        ],
        "more": max(0, len(bad) - 3),
        "actions": list(dict.fromkeys(f["action"] for f in bad)),
        "reproduce": bad[0]["reproduce"][-1] if bad and bad[0]["reproduce"] else "",
    }


def node_records(verdicts: Sequence[VerdictRow], findings: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """The per-node table's records, the nodes to act on first: every node one by one up to
    :data:`LIST_EVERY_NODE_UP_TO` nodes; beyond, the accepted and skipped nodes folded into one record per
    verdict and profile (``nodes``: how many)."""
    ordered = sorted(verdicts, key=lambda v: (v.verdict.value in FOLDED, v.verdict == Verdict.ACCEPTED, v.node))
    fold_healthy = len(verdicts) > LIST_EVERY_NODE_UP_TO
    listed = [node_record(v, findings.get(v.node, [])) for v in ordered if not (fold_healthy and _folds(v))]
    sets: dict[tuple[str, str], list[VerdictRow]] = {}
    for v in ordered:
        if fold_healthy and _folds(v):
            sets.setdefault((v.verdict.value, v.profile), []).append(v)
    for (verdict, profile), members in sorted(sets.items()):
        reasons = sorted({r for m in members for r in m.reasons})
        listed.append(
            {
                "node": fold(m.node for m in members), "nodes": len(members), "profile": profile,
                "verdict": verdict, "cause": "", "reasons": reasons, "evidence": [f"{len(members):,} nodes"],
                "more": 0, "actions": [], "reproduce": "",
            }
        )  # fmt: skip
    return listed


def _folds(verdict: VerdictRow) -> bool:
    return verdict.verdict.value in FOLDED


def node_table(records: Sequence[Mapping[str, Any]]) -> PagedTable:
    rows = []
    for r in records:
        evidence = list(r["evidence"]) + ([f"and {r['more']} more"] if r["more"] else [])
        link = "" if r.get("nodes") else r["node"]  # a folded set has no findings of its own to link to
        rows.append(
            (
                [r["node"], link], r["profile"], [r["verdict"], r["verdict"]], r["cause"], ", ".join(r["reasons"]),
                evidence, "; ".join(r["actions"]), [r["reproduce"]] if r["reproduce"] else [],
            )
        )  # fmt: skip
    return PagedTable("node-table", NODE_COLUMNS, tuple(rows), tags=tuple(r["verdict"] for r in records))
