"""A rank named by its enqueue on a backend whose enqueue waits for the collective before it (gloo) is a compute
straggler only where its host shows it waited for a CPU; otherwise the finding says it cannot tell compute from a
late completion over a slow link, and names the ring neighbour it receives from (judge.host). The node-side
reader gives each rank's CPU run and run-queue wait from /proc."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from cluster_accept.inventory.hostlist import expand
from cluster_accept.watch.node import job_read
from cluster_accept.watch.read import ReadWindow, parse_node_read
from cluster_accept.watch.words import CollectiveSeen, FindingKind, RankSeen
from tests.test_live_job_localize import MS, Job, S, failed, judged, row


def _untimed(collectives: list[CollectiveSeen], backend: str) -> list[CollectiveSeen]:
    """The same arrivals as a recorder that gives enqueue times only (gloo's, or NCCL's without timing)."""
    return [replace(c, exec_ms=None, complete_ns=None, backend=backend) for c in collectives]


def _reads(job: Job, now: int, wait_share: dict[int, float]) -> list[RankSeen]:
    """Reads every 2 s over the last 12 s, each rank's threads running 0.9 s a second and waiting for a CPU so
    that its wait is ``wait_share`` of its runnable time (0.02 where not given); a rank left out of the dict's
    ``None`` values gives no CPU figures."""
    out = []
    for step, at in enumerate(range(now - 12 * S, now, 2 * S)):
        for rank in job.ranks:
            share = wait_share.get(rank, 0.02)
            run = int(step * 1.8 * S) + 10 * S
            wait = int(run * share / (1 - share))
            out.append(job.read(rank, at, cpu_run_ns=run, cpu_wait_ns=wait))
    return out


def _slow_gloo(backend: str = "gloo") -> tuple[Job, list[CollectiveSeen], int]:
    job = Job(nodes=4, per_node=1, slow={3: (0, 40.0)}, seed=3)
    collectives = _untimed(job.collectives(), backend)
    return job, collectives, job.end_ns + S // 2


def test_a_late_gloo_rank_that_waited_for_a_cpu_is_a_compute_straggler() -> None:
    job, collectives, now = _slow_gloo()
    rows = judged(job, _reads(job, now, {3: 0.6}), collectives, now)
    assert failed(rows) == [("node03", "compute_straggler", "arrives_last", 3)]
    named = row(rows, "node03", FindingKind.COMPUTE_STRAGGLER)
    assert "rank 3 waited for a CPU 60% of its runnable time" in named.evidence, named.evidence
    assert "its peers' at most 2%" in named.evidence


def test_a_late_gloo_rank_its_host_does_not_show_slow_is_unresolved_with_its_ring_neighbours() -> None:
    """The same arrivals, its threads waiting for a CPU no more than its peers' (asleep in a receive over a slow
    link would look so): the finding cannot tell compute from communication and says so, naming its ring
    neighbours, rank 2 on node02 (it receives from) and rank 0 on node00 (it sends to): a send into a slow link
    ends late too; a host that gave no CPU figures is no evidence of compute either."""
    job, collectives, now = _slow_gloo()
    for reads in (_reads(job, now, {3: 0.03}), job.reads(now - 10 * S, now - 5 * S, now - S // 2)):
        rows = judged(job, reads, collectives, now)
        assert failed(rows) == [("node03", "compute_straggler", "late_unresolved", 3)]
        named = row(rows, "node03", FindingKind.COMPUTE_STRAGGLER)
        said = "its ring neighbours: rank 2 on node02 (it receives from), rank 0 on node00 (it sends to)"
        assert named.evidence.endswith(said) and named.involves == "node[00,02]", (named.evidence, named.involves)
    assert "no CPU figures" in named.evidence
    # a wait 10 points over its peers' is not enough; at a lower minimum it is
    waited = _reads(job, now, {3: 0.12})
    assert failed(judged(job, waited, collectives, now))[0][2] == "late_unresolved"
    assert failed(judged(job, waited, collectives, now, cpu_wait_share_min=0.05))[0][2] == "arrives_last"
    # every rank held to one core waits behind its own threads: 85 % beside peers at 51 % is its cores shared
    crowded = _reads(job, now, {0: 0.51, 1: 0.5, 2: 0.49, 3: 0.85})
    assert failed(judged(job, crowded, collectives, now))[0][2] == "arrives_last"
    assert failed(judged(job, _reads(job, now, {0: 0.51, 3: 0.65}), collectives, now))[0][2] == "late_unresolved"


def test_an_nccl_rank_late_by_enqueue_is_its_hosts_own_as_before() -> None:
    """NCCL's enqueue never waits for a collective to finish: a late enqueue is the host's, whatever its CPU."""
    job, collectives, now = _slow_gloo("nccl")
    rows = judged(job, _reads(job, now, {3: 0.03}), collectives, now)
    assert failed(rows) == [("node03", "compute_straggler", "arrives_last", 3)]


def test_a_healthy_gloo_job_names_nothing_whatever_its_cpu_waits() -> None:
    job = Job(nodes=4, per_node=1, seed=3)
    collectives = _untimed(job.collectives(), "gloo")
    now = job.end_ns + S // 2
    assert failed(judged(job, _reads(job, now, {1: 0.7}), collectives, now)) == []


def _start_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


@pytest.mark.integration  # a real process read from /proc
def test_the_node_reader_sums_a_rank_threads_cpu_run_and_wait_from_proc() -> None:
    """A real process: its run time grows while it spins; another start time (a reused pid) or a gone process
    gives nothing, and the reader's line carries both counts, which the watcher types."""
    spin = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time() + 5\nwhile time.time() < t: pass"])
    try:
        time.sleep(0.3)  # started and spinning
        ticks = _start_ticks(spin.pid)
        first = job_read.cpu_times(spin.pid, ticks)
        time.sleep(0.5)
        second = job_read.cpu_times(spin.pid, ticks)
        assert first is not None and second is not None and second[0] - first[0] > 100 * MS
        assert job_read.cpu_times(spin.pid, ticks + 1) is None
    finally:
        spin.kill()
        spin.wait()
    assert job_read.cpu_times(spin.pid, ticks) is None
    me = job_read.cpu_times(os.getpid(), _start_ticks(os.getpid()))
    assert me is not None and me[0] > 0 and me[1] >= 0


def test_the_watcher_takes_only_counts_for_the_cpu_figures() -> None:
    def parsed(**said: object) -> RankSeen:
        rank = {"rank": 0, "local_rank": 0, "pid": 7, "state": "running", **said}
        text = "\n".join(json.dumps(line) for line in ({"read": {"node_ns": T0_NS, "hostname": "n1"}}, {"rank": rank}))
        return parse_node_read(text, "job1", "n1", ReadWindow(sent_ns=T0_NS, received_ns=T0_NS + MS)).ranks[0]

    counted = parsed(cpu_run_ns=5, cpu_wait_ns=0)
    assert (counted.cpu_run_ns, counted.cpu_wait_ns) == (5, 0)
    for bad in (True, -1, "5", 2.5, None):
        refused = parsed(cpu_run_ns=bad, cpu_wait_ns=bad)
        assert (refused.cpu_run_ns, refused.cpu_wait_ns) == (None, None), bad


T0_NS = 1_795_784_687_900_000_000


def test_a_slow_link_between_two_gloo_ranks_makes_both_late_and_the_pair_is_named() -> None:
    """A slow link between two ring neighbours makes both late (the sender's send stalls, the receiver's receive),
    who is last alternating between them: neither alone is last at the share a straggler needs, the two together
    are. The one more often last is named, unresolved, its ring neighbours involved, so that the re-test measures
    the link; in a healthy job no pair is named, nor in a job of three nodes, where two are most of the job."""
    job = Job(nodes=4, per_node=1, slow={1: (0, 40.0), 2: (0, 40.0)}, seed=3)
    collectives = _untimed(job.collectives(), "gloo")
    now = job.end_ns + S // 2
    rows = judged(job, _reads(job, now, {}), collectives, now)
    assert [f[1:3] for f in failed(rows)] == [("compute_straggler", "late_unresolved")], failed(rows)
    node = failed(rows)[0][0]
    partner = "node02" if node == "node01" else "node01"
    named = row(rows, node, FindingKind.COMPUTE_STRAGGLER)
    assert named.observed.startswith(f"with {partner}, its ring neighbour, last at "), named.observed
    assert partner in expand(named.involves), named.involves
    healthy = Job(nodes=4, per_node=1, seed=3)
    assert failed(judged(healthy, _reads(healthy, now, {}), _untimed(healthy.collectives(), "gloo"), now)) == []
    three = Job(nodes=3, per_node=1, slow={1: (0, 40.0), 2: (0, 40.0)}, seed=3)
    late = _untimed(three.collectives(), "gloo")
    assert failed(judged(three, _reads(three, three.end_ns + S // 2, {}), late, three.end_ns + S // 2)) == []
