"""``cluster-accept watch``: watch a running job's ranks from their nodes, name the node behind a dead rank, a
hang or a straggler, prove it with a targeted re-test, and only then drain.

Round after round (``interval_s``) the job's nodes are read over SSH (:mod:`tasks.watch`), the window is
localized (:mod:`analysis.live_job`: arrival order, not step time, which data parallelism equalizes), and a
suspect named for the first time gets a re-test: an ordinary acceptance run of the stages that can see its
kind of fault (:data:`RETEST_STAGES`) on the suspect and peers of the same job, judged against those peers.
Only a re-test that rejects the suspect while a peer passes confirms it; that run drains under the operator's
options (the breaker, and only our own drains are ever lifted). Otherwise the finding says the straggler is the
job's, hardware not confirmed, with both figures. The rows are written after every round: what was seen is on
disk whatever stops the watch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from prefect import flow, task

from cluster_accept.analysis.live_job import localize, owner_line
from cluster_accept.analysis.verdicts import NOT_ACCEPTED, Verdict, VerdictRow
from cluster_accept.flows.finish import RunOutcome
from cluster_accept.flows.run_request import RunRequest, outcome_of
from cluster_accept.flows.watch_files import WatchFiles
from cluster_accept.flows.watch_request import WatchRequest, WatchSpec, resolve, slurm_holds
from cluster_accept.inventory.hostlist import fold
from cluster_accept.tasks.watch import WatchState, occupied_nodes, read_round
from cluster_accept.vocabulary.live_job import FindingKind, WatchFinding
from cluster_accept.vocabulary.status import Status

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
RETEST_PEERS = 2
NOT_CONFIRMED = "job-level {kind}, hardware not confirmed"
NOT_RETESTED = "not re-tested: the job still runs on"
read_task = task(name="watch-read", retries=0)(read_round)


@dataclass
class WatchOutcome:
    run_dir: Path
    findings: list[WatchFinding]
    rounds: int

    @property
    def named(self) -> list[WatchFinding]:
        return [f for f in self.findings if f.status in (Status.FAIL, Status.WARN)]


def _peers(suspects: Sequence[str], job_nodes: Sequence[str], living: set[str]) -> list[str]:
    """Up to :data:`RETEST_PEERS` nodes of the job beside the suspects: those the job has left, where there are (a
    job requeued without the suspect runs on the others again), else the first ones, which the re-test waits for."""
    others = [n for n in job_nodes if n not in suspects]
    return ([n for n in others if n not in living] or others)[:RETEST_PEERS]


def job_left(request: WatchRequest, nodes: Sequence[str], state: WatchState, wait: bool = True) -> str:
    """Wait, reading ``nodes`` every interval for up to ``retest_wait_s`` (``wait`` off: one read), until no rank
    of the job lives on them and, for a Slurm job, Slurm no longer runs it there (:func:`slurm_holds`: the ranks'
    files are the job user's to remove); '' once none does, else which nodes it still runs on. A GPU (or core)
    measured while the job loads it measures the job: the suspect and its peers are re-tested only once the job
    has left them (its owner excluded the node and requeued it, or it ended)."""
    chosen = [n for n in request.nodes if n.name in nodes]
    wait_s = request.spec.retest_wait_s if wait else 0.0
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        reads = read_task(chosen, request.job, request.spec.watch_dir, {}, 1, request.concurrency, request.job_user)
        state.add_states(reads)
        unread = [read.node for read in reads if read.node_ns is None]
        ranks_on = set(occupied_nodes((r for read in reads for r in read.ranks), unread))
        living = sorted(ranks_on | slurm_holds(request, nodes))
        if not living:
            return ""
        if not said and wait:
            print(f"re-test of {fold(list(nodes))} waits up to {request.spec.retest_wait_s:g} s for the job to leave "
                  f"{fold(living)}", flush=True)  # fmt: skip
            said = True
        if time.monotonic() >= deadline:
            return (
                f"{NOT_RETESTED} {fold(living)} after {wait_s:g} s, and a GPU measured under the job measures the "
                "job; exclude the node and requeue the job: the watch re-tests the node once the job has left it"
            )
        time.sleep(request.spec.interval_s)


def retest(
    request: WatchRequest, suspects: Sequence[WatchFinding], state: WatchState, wait: bool = True
) -> list[WatchFinding]:
    """One acceptance run of ``suspects`` (all of one kind) and their peers once the job has left them (``wait``
    off: only if it has left them now); each finding with what it said."""
    kind = suspects[0].kind
    names = list(dict.fromkeys(f.node for f in suspects))
    peers = _peers(names, [n.name for n in request.nodes], state.occupied())
    waited = job_left(request, [*names, *peers], state, wait)
    if waited:
        return [_not_confirmed(f, waited) for f in suspects]
    run = RunRequest(
        request.spec.inventory, request.spec.out_dir, nodes=fold([*names, *peers]), stages=list(RETEST_STAGES[kind]),
        concurrency=request.concurrency, history=request.spec.history, operations=request.spec.operations,
    )  # fmt: skip
    outcome = outcome_of(run)
    drained = {a.node for a in outcome.slurm.actions if a.action == "drain" and a.applied}
    planned = {a.node for a in outcome.slurm.actions if a.action == "drain"}
    out = []
    for finding in suspects:
        confirmed, said = confirmation(finding.node, peers, outcome.verdicts)
        said = f"run {outcome.run_id} ({', '.join(RETEST_STAGES[kind])}): {said}"
        out.append(_acted(finding, confirmed, said, finding.node in drained, finding.node in planned, outcome))
    return out


def confirmation(node: str, peers: Sequence[str], verdicts: Sequence[VerdictRow]) -> tuple[bool, str]:
    """Whether a re-test confirms ``node``, and what it said: the node not accepted (rejected or unreachable; a
    tool error confirms nothing) while a peer of the same run is accepted (all of them failing says the run or
    the job's load, not the node)."""
    by_node = {v.node: v for v in verdicts}
    passed = [p for p in peers if p in by_node and by_node[p].verdict == Verdict.ACCEPTED]
    verdict = by_node.get(node)
    rejected = verdict is not None and verdict.verdict in NOT_ACCEPTED
    said = f"{node} " + (
        f"{verdict.verdict.value}: {', '.join(verdict.reasons) or verdict.cause}" if verdict else "not judged"
    )
    return rejected and bool(passed), f"{said}; peers accepted: {fold(passed) if passed else 'none'}"


def _not_confirmed(finding: WatchFinding, said: str) -> WatchFinding:
    """A named finding its re-test did not confirm (or could not run): ``warn``, with what the re-test said."""
    action = NOT_CONFIRMED.format(kind=finding.kind.replace("_", " "))
    return replace(finding, status=Status.WARN, confirmed=False, retest=said, action=action)


def _acted(
    finding: WatchFinding, confirmed: bool, said: str, drained: bool, planned: bool, outcome: RunOutcome
) -> WatchFinding:
    if not confirmed:
        return _not_confirmed(finding, said)
    if drained:
        action = "drained"
    elif planned:
        action = "drain planned (dry run: --apply runs it)"
    elif outcome.slurm.breaker is not None:
        action = f"not drained: {outcome.slurm.breaker.why}"
    else:
        action = "confirmed; not drained (--drain not given)"
    return replace(finding, confirmed=True, retest=said, action=action)


def _suspects(findings: Sequence[WatchFinding], tested: set[tuple[str, str]]) -> list[WatchFinding]:
    return [f for f in findings if f.status is Status.FAIL and (f.node, f.kind) not in tested]


def _left_since(
    acted: dict[tuple[str, str], WatchFinding], state: WatchState, job_nodes: Sequence[str]
) -> list[WatchFinding]:
    """Findings not re-tested because the job still ran on their nodes, whose node the job has left since (read in
    the latest round, no rank of the job alive), where it has left another node too that is no such suspect of
    the same kind (a peer to measure against): named again, to be re-tested now without waiting."""
    occupied = state.occupied()
    waiting = [f for f in acted.values() if f.retest.startswith(NOT_RETESTED) and f.node not in occupied]
    retried = []
    for kind in dict.fromkeys(f.kind for f in waiting):
        group = [f for f in waiting if f.kind == kind]
        suspects = {f.node for f in group}
        if any(n not in occupied and n not in suspects for n in job_nodes):
            retried += [replace(f, status=Status.FAIL, confirmed=None, retest="", action="") for f in group]
    return retried


def _settle(
    request: WatchRequest, findings: list[WatchFinding], acted: dict[tuple[str, str], WatchFinding], state: WatchState
) -> None:
    """Re-test the suspects named for the first time (by kind), and carry earlier re-tests into ``findings``."""
    fresh = _suspects(findings, set(acted))
    retried = _left_since(acted, state, [n.name for n in request.nodes]) if request.spec.retest else []
    for found, wait in ((fresh, True), (retried, False)):  # a retry neither waits nor waits with a new suspect
        for kind in dict.fromkeys(f.kind for f in found):
            group = [f for f in found if f.kind == kind]
            done = retest(request, group, state, wait) if request.spec.retest else group
            for finding in done:
                acted[(finding.node, finding.kind)] = finding
    for i, finding in enumerate(findings):
        earlier = acted.get((finding.node, finding.kind))
        if earlier is not None and finding.status is Status.FAIL:
            findings[i] = replace(
                finding, status=earlier.status, named_ns=earlier.named_ns or finding.named_ns,
                confirmed=earlier.confirmed, retest=earlier.retest, action=earlier.action,
            )  # fmt: skip
    for i, finding in enumerate(findings):  # a node named earlier stays named in the record, with when it cleared
        earlier = acted.get((finding.node, finding.kind))
        if earlier is not None and finding.status is Status.PASS:
            findings[i] = replace(earlier, persistence=f"{earlier.persistence}; not seen in the latest window")
    rows = {(f.node, f.kind) for f in findings}
    findings += [f for key, f in acted.items() if key not in rows]  # a node no longer in the window stays named
    for i, finding in enumerate(findings):
        if finding.status in (Status.FAIL, Status.WARN) and not finding.owner_line:
            findings[i] = replace(finding, owner_line=owner_line(finding))


@flow(name="watch", log_prints=False)
def watch(spec: WatchSpec) -> WatchOutcome:
    """The watch of ``spec`` (one served deployment's run, or the command's): resolved, then watched."""
    return watch_job(resolve(spec))


def watch_job(request: WatchRequest) -> WatchOutcome:
    """Read, localize, re-test and write, round after round, until ``for_s`` has passed, the job has ended, or
    (``until_named``) a suspect has been named and re-tested."""
    files = WatchFiles.start(
        request.spec.out_dir,
        request.job,
        [n.name for n in request.nodes],
        request.inventory.cluster,
        request.spec.history,
    )
    state = WatchState(keep_s=2 * request.rules.window_s)
    acted: dict[tuple[str, str], WatchFinding] = {}
    findings: list[WatchFinding] = []
    deadline = time.monotonic() + request.spec.for_s
    while True:
        started = time.monotonic()
        reads = read_task(request.nodes, request.job, request.spec.watch_dir, state.since, request.record_limit,
                          request.concurrency, request.job_user)  # fmt: skip
        state.add(reads)
        findings = localize(state.ranks, list(state.collectives.values()), request.rules, time.time_ns())
        files.write(state, findings)  # before a re-test, which takes minutes: what was named is on disk
        _settle(request, findings, acted, state)
        files.write(state, findings)
        named = any(f.status in (Status.FAIL, Status.WARN) for f in findings)
        if state.job_over() or time.monotonic() >= deadline or (request.spec.until_named and named):
            break
        time.sleep(max(0.0, request.spec.interval_s - (time.monotonic() - started)))
    files.finish(state, findings, request.spec.operations.prometheus)
    return WatchOutcome(files.run_dir, findings, state.rounds)
