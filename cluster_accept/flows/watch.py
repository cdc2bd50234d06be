"""``cluster-accept watch``: watch a running job's ranks from their nodes, name the node behind a dead rank, a
hang or a straggler, prove it with a targeted re-test, and only then drain.

Round after round (``interval_s``) the job's nodes are read over SSH (:mod:`watch.rounds`), the window is
localized (:mod:`watch.judge`: arrival order, not step time, which data parallelism equalizes), and a
suspect named for the first time gets a re-test: an ordinary acceptance run of the stages that can see its
kind of fault (:func:`watch.policy.retest_stages`) on the suspect and peers of the same job, judged against those peers.
The re-test waits for the job to leave the nodes it measures and runs beside the rounds, which never stop
(:mod:`flows.watch_retests`). Only a re-test that rejects the suspect while a peer passes confirms it; that run
drains under the operator's options (the breaker, and only our own drains are ever lifted). Otherwise the finding
says the straggler is the job's, hardware not confirmed, with both figures. The rows are written after every
round: what was seen is on disk whatever stops the watch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from prefect import flow, task

from cluster_accept.flows.run_request import RunRequest, outcome_of
from cluster_accept.flows.watch_retests import Retests
from cluster_accept.inventory.hostlist import fold
from cluster_accept.vocabulary.status import Status
from cluster_accept.watch.files import WatchFiles
from cluster_accept.watch.judge import Judgement, judge
from cluster_accept.watch.policy import (
    carry_over,
    fresh_suspects,
    implicated,
    left_since,
    retest_nodes,
    retest_stages,
    retested,
)
from cluster_accept.watch.ras_diagnostics import with_diagnostics
from cluster_accept.watch.request import WatchRequest, WatchSpec, resolve
from cluster_accept.watch.rounds import Asks, WatchState, read_round
from cluster_accept.watch.words import RankSeen, WatchFinding

read_task = task(name="watch-read", retries=0)(read_round)


@dataclass
class WatchOutcome:
    run_dir: Path
    findings: list[WatchFinding]
    rounds: int

    @property
    def named(self) -> list[WatchFinding]:
        return [f for f in self.findings if f.status in (Status.FAIL, Status.WARN)]


def read_nodes(request: WatchRequest, names: Sequence[str], state: WatchState) -> tuple[list[RankSeen], set[str]]:
    """One read of ``names`` outside a round (re-tests waiting after the last one): their ranks, kept in ``state``
    as every read is (what was seen is on disk), and the nodes not read."""
    chosen = [n for n in request.nodes if n.name in names]
    reads = read_task(chosen, request.job, request.spec.watch_dir, {}, 1, request.concurrency, request.job_user)
    state.add_states(reads)
    return [r for read in reads for r in read.ranks], {read.node for read in reads if read.node_ns is None}


def run_retest(request: WatchRequest, suspects: Sequence[WatchFinding], peers: Sequence[str]) -> list[WatchFinding]:
    """One acceptance run of ``suspects`` (all re-tested by the same stages), the nodes they involve and their
    ``peers``, which the job has left; each finding with what it said."""
    stages = retest_stages(suspects[0])
    names = list(dict.fromkeys(n for f in suspects for n in retest_nodes(f)))
    run = RunRequest(
        request.spec.inventory, request.spec.out_dir, nodes=fold([*names, *peers]), stages=list(stages),
        concurrency=request.concurrency, history=request.spec.history, operations=request.spec.operations,
    )  # fmt: skip
    outcome = outcome_of(run)
    drained = {a.node for a in outcome.slurm.actions if a.action == "drain" and a.applied}
    planned = {a.node for a in outcome.slurm.actions if a.action == "drain"}
    breaker = outcome.slurm.breaker.why if outcome.slurm.breaker is not None else None
    out = []
    for finding in suspects:
        culprits, said = implicated(finding, peers, outcome.verdicts)
        out += retested(finding, culprits, f"run {outcome.run_id} ({', '.join(stages)}): {said}", drained, planned,
                        breaker)  # fmt: skip
    return out


def _settle(retests: Retests, findings: list[WatchFinding], state: WatchState) -> None:
    """Begin a re-test of the suspects named for the first time (by kind), move the re-tests in flight on, and
    carry what earlier re-tests said into ``findings``."""
    request, acted = retests.request, retests.acted
    fresh = fresh_suspects(findings, acted)
    job_nodes = [n.name for n in request.nodes]
    if not request.spec.retest:
        acted.update({(f.node, f.kind): f for f in fresh})
    else:
        retried = left_since(acted, state.occupied(), job_nodes)
        for found, wait in ((fresh, True), (retried, False)):  # a retry waits for nothing
            for kind, stages in dict.fromkeys((f.kind, retest_stages(f)) for f in found):
                retests.begin([f for f in found if (f.kind, retest_stages(f)) == (kind, stages)], state, wait)
        retests.advance(state.latest_ranks().values(), state.unread)
    carry_over(findings, acted)


@flow(name="watch", log_prints=False)
def watch(spec: WatchSpec) -> WatchOutcome:
    """The watch of ``spec`` (one served deployment's run, or the command's): resolved, then watched."""
    return watch_job(resolve(spec))


def watch_job(request: WatchRequest) -> WatchOutcome:
    """Read, localize, re-test and write, round after round, until ``for_s`` has passed, the job has ended, or
    (``until_named``) a suspect has been named and re-tested; re-tests wait and run beside the rounds
    (:mod:`flows.watch_retests`), and those still in flight at the end are finished before the last write.

    While a re-test waits for the job to leave its nodes, a round in which a rank has ended since it began to wait
    is not judged: the job's owner is taking it down (excluding the node, requeueing), and its teardown is no
    death."""
    files = WatchFiles.start(
        request.spec.out_dir,
        request.job,
        [n.name for n in request.nodes],
        request.inventory.cluster,
        request.spec.history,
    )
    state = WatchState(keep_s=2 * request.rules.window_s)
    retests = Retests(request, run_retest)
    findings: list[WatchFinding] = []
    judged: Judgement | None = None
    deadline = time.monotonic() + request.spec.for_s
    names, port = [n.name for n in request.nodes], request.spec.ras_port
    while True:
        started = time.monotonic()
        ras = state.ras_ask(names, port, request.job_user) if port else None
        asks = Asks(ras, dict(state.inspector), state.diagnostics_ask(ras))
        reads = read_task(request.nodes, request.job, request.spec.watch_dir, state.since, request.record_limit,
                          request.concurrency, request.job_user, asks)  # fmt: skip
        state.add(reads)
        if judged is None or not retests.teardown(state):
            judged = judge(state.ranks, list(state.collectives.values()), request.rules, time.time_ns(), state.ras)
            findings = with_diagnostics(judged.findings, state.diagnostics)
        _settle(retests, findings, state)
        files.write(state, findings)
        named = any(f.status in (Status.FAIL, Status.WARN) for f in findings)
        settled = named and not retests.busy
        if state.job_over() or time.monotonic() >= deadline or (request.spec.until_named and settled):
            break
        time.sleep(max(0.0, request.spec.interval_s - (time.monotonic() - started)))
    retests.finish(lambda req, names: read_nodes(req, names, state))
    carry_over(findings, retests.acted)
    files.finish(state, findings, request.spec.operations.prometheus, judged)
    return WatchOutcome(files.run_dir, findings, state.rounds)
