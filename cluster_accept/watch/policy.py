"""What the watch does with a finding, as pure functions: which stages re-test it, which peers stand beside the
suspect, whether a re-test confirmed it, what its row then says, and how earlier re-tests carry into the next
window's findings. The Prefect loop (:mod:`flows.watch`) only reads, calls these and writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from cluster_accept.analysis.verdicts import NOT_ACCEPTED, Verdict, VerdictRow
from cluster_accept.inventory.hostlist import expand, fold
from cluster_accept.vocabulary.status import Status
from cluster_accept.watch.judge import owner_line
from cluster_accept.watch.words import FindingKind, WatchFinding

# The stages whose probes can see each kind of fault on a node: a compute straggler or a dead rank is a GPU
# (or host) question for GEMM/HBM/burn-style probes; a hang is first the node's state (XIDs, a GPU off the
# bus); a slow communicator is its links, measured in pairs against peers.
# Preflight comes first in each: it reads the node's state (another process on a GPU, XIDs, a GPU off the bus),
# the cause the measurement after it may confirm, and resolves a node of profile auto to its built-in profile.
RETEST_STAGES: dict[str, tuple[str, ...]] = {
    FindingKind.COMPUTE_STRAGGLER.value: ("preflight", "single-node"),
    FindingKind.DEAD_RANK.value: ("preflight", "single-node"),
    FindingKind.HANG.value: ("preflight",),
    FindingKind.COMM_STRAGGLER.value: ("preflight", "multi-node"),
}
# A late rank whose host showed no wait for a CPU (``late_unresolved``): its compute, and the links of it and of its
# ring neighbours, measured in pairs against a peer the finding does not involve.
UNRESOLVED_STAGES = ("preflight", "single-node", "multi-node")
RETEST_PEERS = 2
NOT_CONFIRMED = "job-level {kind}, hardware not confirmed"
NOT_RETESTED = "not re-tested: the job still runs on"
Acted = dict[tuple[str, str], WatchFinding]  # (node, kind) -> the finding as its re-test left it


def retest_stages(finding: WatchFinding) -> tuple[str, ...]:
    """The stages that re-test ``finding``: its kind's, or compute and links where it could not tell them apart."""
    return UNRESOLVED_STAGES if finding.reason == "late_unresolved" else RETEST_STAGES[finding.kind]


def retest_nodes(finding: WatchFinding) -> list[str]:
    """The nodes a re-test of ``finding`` measures as suspects: its node and the nodes it involves."""
    involved = expand(finding.involves) if finding.involves else []
    return [finding.node, *(n for n in involved if n != finding.node)]


def retest_peers(suspects: Sequence[str], job_nodes: Sequence[str], living: set[str]) -> list[str]:
    """Up to :data:`RETEST_PEERS` nodes of the job beside the suspects: those the job has left, where there are (a
    job requeued without the suspect runs on the others again), else the first ones, which the re-test waits for."""
    others = [n for n in job_nodes if n not in suspects]
    return ([n for n in others if n not in living] or others)[:RETEST_PEERS]


def confirmation(node: str, peers: Sequence[str], verdicts: Sequence[VerdictRow]) -> tuple[bool, str]:
    """Whether a re-test confirms ``node``, and what it said: the node not accepted (rejected or unreachable; a
    tool error confirms nothing) while a peer of the same run is accepted (all of them failing says the run or
    the job's load, not the node)."""
    by_node = {v.node: v for v in verdicts}
    passed = _accepted(peers, by_node)
    rejected, said = _verdict_of(node, by_node)
    return rejected and bool(passed), f"{said}; peers accepted: {fold(passed) if passed else 'none'}"


def _accepted(peers: Sequence[str], by_node: Mapping[str, VerdictRow]) -> list[str]:
    return [p for p in peers if p in by_node and by_node[p].verdict == Verdict.ACCEPTED]


def _verdict_of(node: str, by_node: Mapping[str, VerdictRow]) -> tuple[bool, str]:
    """Whether the run did not accept ``node``, and its verdict as said."""
    verdict = by_node.get(node)
    said = f"{node} " + (
        f"{verdict.verdict.value}: {', '.join(verdict.reasons) or verdict.cause}" if verdict else "not judged"
    )
    return verdict is not None and verdict.verdict in NOT_ACCEPTED, said


def not_confirmed(finding: WatchFinding, said: str) -> WatchFinding:
    """A named finding its re-test did not confirm (or could not run): ``warn``, with what the re-test said, and
    an owner's line that no longer says to exclude the node on this finding's word (:func:`unconfirmed_line`)."""
    action = NOT_CONFIRMED.format(kind=finding.kind.replace("_", " "))
    line = unconfirmed_line(finding, said)
    return replace(finding, status=Status.WARN, confirmed=False, retest=said, action=action, owner_line=line)


def unconfirmed_line(finding: WatchFinding, said: str) -> str:
    """The owner's line for a finding its re-test did not confirm: a node the job still ran on is to be excluded
    only so that it can be re-tested; a node its re-test accepted beside its peers is not to be excluded on this
    finding, and the owner is told what the re-test did not measure, where the cause may be instead."""
    kind = finding.kind.replace("_", " ")
    if said.startswith(NOT_RETESTED):
        return (
            f"{finding.node} not re-tested yet (the job still ran there): exclude it only to have it re-tested; "
            f"named for: {finding.observed}"
        )
    stages = ", ".join(retest_stages(finding))
    return (
        f"keep {finding.node}: its re-test ({stages}) did not confirm the {kind} ({said}); the {kind} is the job's "
        f"own or outside what that re-test measured (its data loading, another job on the node, the links between "
        f"nodes for a compute re-test): named for: {finding.observed}"
    )


def implicated(finding: WatchFinding, peers: Sequence[str], verdicts: Sequence[VerdictRow]) -> tuple[list[str], str]:
    """The nodes of ``finding`` (:func:`retest_nodes`) its re-test confirmed, each as :func:`confirmation` has it,
    and what it said of each."""
    by_node = {v.node: v for v in verdicts}
    passed = _accepted(peers, by_node)
    found, said = [], []
    for node in retest_nodes(finding):
        rejected, text = _verdict_of(node, by_node)
        found += [node] if rejected and passed else []
        said.append(text)
    return found, f"{'; '.join(said)}; peers accepted: {fold(passed) if passed else 'none'}"


def retested(
    finding: WatchFinding, culprits: Sequence[str], said: str, drained: set[str], planned: set[str], breaker: str | None
) -> list[WatchFinding]:
    """``finding`` as its re-test left it, and a row for each other node it involves that the re-test rejected
    (``culprits``: :func:`implicated`), each with what was done to its node (``drained``, drains ``planned``, the
    breaker's word)."""
    elsewhere = [n for n in culprits if n != finding.node]
    own = finding.node in culprits
    if elsewhere and not own:
        done = [cleared_by_neighbour(finding, elsewhere, said)]
    else:
        done = [acted_on(finding, own, said, finding.node in drained, finding.node in planned, breaker)]
    for node in elsewhere:
        row = neighbour_link(finding, node, said)
        done.append(acted_on(row, True, said, node in drained, node in planned, breaker))
    return done


def cleared_by_neighbour(finding: WatchFinding, culprits: Sequence[str], said: str) -> WatchFinding:
    """A late rank whose re-test accepted its node and rejected ring neighbours of it: its row passes
    (``late_by_neighbour``), and its owner's line says to keep it."""
    return replace(
        finding, status=Status.PASS, reason="late_by_neighbour", confirmed=False, retest=said,
        action=f"cleared: its re-test rejected {fold(list(culprits))}",
        owner_line=f"keep {finding.node}: its late arrivals were the link of {fold(list(culprits))}, which its re-test "
        f"rejected ({said}); named for: {finding.observed}",
    )  # fmt: skip


def neighbour_link(finding: WatchFinding, node: str, said: str) -> WatchFinding:
    """The communication straggler a late rank's re-test found among its ring neighbours: ``node``, on a row of its
    own (``slow_link_neighbour``), with the late rank's evidence and the line to exclude it."""
    stages = ", ".join(retest_stages(finding))
    observed = f"{finding.node} (its ring neighbour) {finding.observed}"
    return replace(
        finding, kind=FindingKind.COMM_STRAGGLER.value, node=node, status=Status.FAIL, reason="slow_link_neighbour",
        observed=observed, rank=None, gpu=None, involves=finding.node,
        owner_line=f"exclude {node}: the re-test ({stages}) of {finding.node}'s late arrivals rejected {node} and "
        f"accepted {finding.node} ({said}); named for: {observed}",
    )  # fmt: skip


def acted_on(
    finding: WatchFinding, confirmed: bool, said: str, drained: bool, planned: bool, breaker_why: str | None
) -> WatchFinding:
    """The finding after its re-test: unconfirmed (``warn``), or confirmed with what was done to its node (or, for
    a finding involving other nodes, to the nodes its re-test rejected)."""
    if not confirmed:
        return not_confirmed(finding, said)
    if drained:
        action = "drained"
    elif planned:
        action = "drain planned (dry run: --apply runs it)"
    elif breaker_why is not None:
        action = f"not drained: {breaker_why}"
    else:
        action = "confirmed; not drained (--drain not given)"
    return replace(finding, confirmed=True, retest=said, action=action)


def fresh_suspects(findings: Sequence[WatchFinding], acted: Acted) -> list[WatchFinding]:
    """Failing findings whose (node, kind) no re-test has taken yet."""
    return [f for f in findings if f.status is Status.FAIL and (f.node, f.kind) not in acted]


def left_since(acted: Acted, occupied: set[str], job_nodes: Sequence[str]) -> list[WatchFinding]:
    """Findings not re-tested because the job still ran on their nodes, whose node the job has left since (read in
    the latest round, no rank of the job alive), where it has left another node too that is no such suspect of
    the same kind (a peer to measure against): named again, to be re-tested now without waiting."""
    waiting = [f for f in acted.values() if f.retest.startswith(NOT_RETESTED) and f.node not in occupied]
    retried = []
    for kind in dict.fromkeys(f.kind for f in waiting):
        group = [f for f in waiting if f.kind == kind]
        suspects = {f.node for f in group}
        if any(n not in occupied and n not in suspects for n in job_nodes):
            retried += [replace(f, status=Status.FAIL, confirmed=None, retest="", action="") for f in group]
    return retried


def carry_over(findings: list[WatchFinding], acted: Acted) -> None:
    """Earlier re-tests carried into this window's ``findings`` (in place): a failing finding takes its re-test's
    word; a node named earlier stays named in the record, with when it cleared; a node no longer in the window
    stays named; every named finding has the line for the job's owner."""
    for i, finding in enumerate(findings):
        earlier = acted.get((finding.node, finding.kind))
        if earlier is not None and finding.status is Status.FAIL:
            said = earlier.confirmed is not None and earlier.owner_line  # its line says what the re-test found
            findings[i] = replace(
                finding, status=earlier.status, reason=earlier.reason, named_ns=earlier.named_ns or finding.named_ns,
                confirmed=earlier.confirmed, retest=earlier.retest, action=earlier.action,
                owner_line=earlier.owner_line if said else finding.owner_line,
            )  # fmt: skip
        elif earlier is not None:  # passing now, or not judged (a row a re-test named: a late rank's neighbour)
            seen = "not seen" if finding.status is Status.PASS else "not judged"
            findings[i] = replace(earlier, persistence=f"{earlier.persistence}; {seen} in the latest window")
    rows = {(f.node, f.kind) for f in findings}
    findings += [f for key, f in acted.items() if key not in rows]
    for i, finding in enumerate(findings):
        if finding.status in (Status.FAIL, Status.WARN) and not finding.owner_line:
            findings[i] = replace(finding, owner_line=owner_line(finding))
