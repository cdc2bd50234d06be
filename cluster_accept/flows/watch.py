"""``cluster-accept watch``: watch a running job's ranks from their nodes, name the node behind a dead rank, a
hang or a straggler, prove it with a targeted re-test, and only then drain.

Round after round (``interval_s``) the job's nodes are read over SSH (:mod:`watch.rounds`), the window is
localized (:mod:`watch.judge`: arrival order, not step time, which data parallelism equalizes), and a
suspect named for the first time gets a re-test: an ordinary acceptance run of the stages that can see its
kind of fault (:data:`watch.policy.RETEST_STAGES`) on the suspect and peers of the same job, judged against those peers.
Only a re-test that rejects the suspect while a peer passes confirms it; that run drains under the operator's
options (the breaker, and only our own drains are ever lifted). Otherwise the finding says the straggler is the
job's, hardware not confirmed, with both figures. The rows are written after every round: what was seen is on
disk whatever stops the watch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from prefect import flow, task

from cluster_accept.flows.run_request import RunRequest, outcome_of
from cluster_accept.inventory.hostlist import fold
from cluster_accept.vocabulary.status import Status
from cluster_accept.watch.files import WatchFiles
from cluster_accept.watch.judge import judge
from cluster_accept.watch.policy import (
    NOT_RETESTED,
    RETEST_STAGES,
    Acted,
    acted_on,
    carry_over,
    confirmation,
    fresh_suspects,
    left_since,
    not_confirmed,
    retest_peers,
)  # fmt: skip
from cluster_accept.watch.request import WatchRequest, WatchSpec, resolve, slurm_holds
from cluster_accept.watch.rounds import WatchState, occupied_nodes, read_round
from cluster_accept.watch.words import WatchFinding

read_task = task(name="watch-read", retries=0)(read_round)


@dataclass
class WatchOutcome:
    run_dir: Path
    findings: list[WatchFinding]
    rounds: int

    @property
    def named(self) -> list[WatchFinding]:
        return [f for f in self.findings if f.status in (Status.FAIL, Status.WARN)]


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
    peers = retest_peers(names, [n.name for n in request.nodes], state.occupied())
    waited = job_left(request, [*names, *peers], state, wait)
    if waited:
        return [not_confirmed(f, waited) for f in suspects]
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
        breaker = outcome.slurm.breaker.why if outcome.slurm.breaker is not None else None
        out.append(acted_on(finding, confirmed, said, finding.node in drained, finding.node in planned, breaker))
    return out


def _settle(request: WatchRequest, findings: list[WatchFinding], acted: Acted, state: WatchState) -> None:
    """Re-test the suspects named for the first time (by kind), and carry earlier re-tests into ``findings``."""
    fresh = fresh_suspects(findings, acted)
    job_nodes = [n.name for n in request.nodes]
    retried = left_since(acted, state.occupied(), job_nodes) if request.spec.retest else []
    for found, wait in ((fresh, True), (retried, False)):  # a retry neither waits nor waits with a new suspect
        for kind in dict.fromkeys(f.kind for f in found):
            group = [f for f in found if f.kind == kind]
            done = retest(request, group, state, wait) if request.spec.retest else group
            for finding in done:
                acted[(finding.node, finding.kind)] = finding
    carry_over(findings, acted)


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
    acted: Acted = {}
    findings: list[WatchFinding] = []
    deadline = time.monotonic() + request.spec.for_s
    while True:
        started = time.monotonic()
        reads = read_task(request.nodes, request.job, request.spec.watch_dir, state.since, request.record_limit,
                          request.concurrency, request.job_user)  # fmt: skip
        state.add(reads)
        judged = judge(state.ranks, list(state.collectives.values()), request.rules, time.time_ns())
        findings = judged.findings
        files.write(state, findings)  # before a re-test, which takes minutes: what was named is on disk
        _settle(request, findings, acted, state)
        files.write(state, findings)
        named = any(f.status in (Status.FAIL, Status.WARN) for f in findings)
        if state.job_over() or time.monotonic() >= deadline or (request.spec.until_named and named):
            break
        time.sleep(max(0.0, request.spec.interval_s - (time.monotonic() - started)))
    files.finish(state, findings, request.spec.operations.prometheus, judged)
    return WatchOutcome(files.run_dir, findings, state.rounds)
