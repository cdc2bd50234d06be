"""The multi-node launcher under a concurrency bound, on the local transport (no SSH, no root).

Every "node" is ``address: local`` and its "python" is a stand-in whose ranks meet at a file barrier: a rank
only gets past it when every rank of its group runs at the same moment, as ``torchrun`` ranks must. So a
group that completes with more ranks than the bound proves that no rank waited in a queue behind another
one's whole run; a sampler counts the launcher's threads by name while it runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster_accept.inventory.model import DEFAULT_SSH, LOCAL_ADDRESS, Node, ProbeSettings, Profile
from cluster_accept.remote import ssh_launcher as launcher
from cluster_accept.remote.detached import parse_poll, poll_script
from cluster_accept.remote.launch import FAILURE_GRACE_S
from cluster_accept.remote.result import NodeStatus
from cluster_accept.remote.ssh_launcher import POLL_S, THREAD_PREFIX
from cluster_accept.tasks.multi_node.group_rows import culprits, failed_run_rows, teardown_rows
from cluster_accept.tasks.multi_node.ranks import launch_group, launch_groups
from tests.processes import processes_matching

MEASUREMENT = '{"metric": "allreduce_busbw_gbps", "value": 1.5, "size": 1048576, "world_size": %s}\\n'
NCCL_LINE = "NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0"


def standin(path: Path, barrier: Path, fail_rank: int | None = None) -> str:
    """A "python" for the probe: ``-c`` (the free-port probe) prints a port; a rank touches the barrier and
    waits there (shell loop, so its command line keeps the run's tag) until all ``--nnodes`` ranks arrived."""
    crash = f'[ "$k" = {fail_rank} ] && {{ echo "rank $k: simulated crash"; exit 3; }}\n'
    fail = crash if fail_rank is not None else ""
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -I ]; then echo 29500; exit 0; fi\n'  # the free port pick (python -I -c)
        'if [ "$1" = job_settings.py ]; then exit 0; fi\n'  # the settings a rank runs with: none here
        'for a in "$@"; do case "$a" in --nnodes=*) n=${a#*=} ;; --node_rank=*) k=${a#*=} ;; esac; done\n'
        f"{fail}"
        f'b={barrier}/$(echo "$@" | sed "s/.*--tag \\([^ ]*\\).*/\\1/")\n'
        'mkdir -p "$b"; touch "$b/$k"\n'
        'while [ "$(ls "$b" | wc -l)" -lt "$n" ]; do sleep 0.05; done\n'
        f"echo '{NCCL_LINE}'\n"
        f'[ "$k" = 0 ] && printf \'{MEASUREMENT % "%s"}\' "$n"\n'
        "exit 0\n"
    )
    path.chmod(0o755)
    return str(path)


def local_node(name: str, python: str, timeout_s: float = 120) -> Node:
    probes = ProbeSettings(python=python, device="cpu", timeout_s=timeout_s)
    return Node(name=name, ssh=DEFAULT_SSH, profile_name="p", profile=Profile(probes=probes), address=LOCAL_ADDRESS)


@pytest.fixture
def tmpdir_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The nodes' TMPDIR: where the probe directories go, so that the test can see them all removed."""
    tmp = tmp_path / "node-tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    return tmp


class ThreadSampler:
    def __init__(self) -> None:
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            ours = [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]
            self.most = max(self.most, len(ours))
            time.sleep(0.005)

    def __enter__(self) -> ThreadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def sampler() -> Iterator[ThreadSampler]:
    with ThreadSampler() as s:
        yield s


@pytest.mark.integration
def test_group_larger_than_the_bound_completes_with_bounded_threads(
    tmp_path: Path, tmpdir_env: Path, sampler: ThreadSampler
) -> None:
    python = standin(tmp_path / "python", tmp_path / "barrier")
    nodes = [local_node(f"node{i}", python) for i in range(4)]

    began = time.monotonic()
    run = launch_group(nodes, tag="catest1", concurrency=2)

    assert run.ok, run.detail
    assert time.monotonic() - began < 20
    assert list(run.ranks) == [n.name for n in nodes]
    assert all(r.result is not None and r.result.exit_code == 0 for r in run.ranks.values())
    assert run.busbw_gbps == 1.5 and run.measurements[0].world_size == 4
    assert run.transports == {"NET/Socket": 4}  # every rank's log was collected
    assert 1 <= sampler.most <= 2
    assert list(tmpdir_env.iterdir()) == []  # every probe directory removed


@pytest.mark.integration
def test_disjoint_groups_at_once_share_one_bound(tmp_path: Path, tmpdir_env: Path, sampler: ThreadSampler) -> None:
    python = standin(tmp_path / "python", tmp_path / "barrier")
    groups = [[local_node(f"g{g}n{i}", python) for i in range(3)] for g in range(3)]

    runs = launch_groups(groups, concurrency=2)

    assert [r.ok for r in runs] == [True, True, True], [r.detail for r in runs]
    assert len({r.tag for r in runs}) == 3
    assert 1 <= sampler.most <= 2
    assert list(tmpdir_env.iterdir()) == []


@pytest.mark.integration
def test_first_failure_stops_every_rank_and_cleans_up(tmp_path: Path, tmpdir_env: Path) -> None:
    python = standin(tmp_path / "python", tmp_path / "barrier", fail_rank=2)
    nodes = [local_node(f"node{i}", python) for i in range(4)]

    began = time.monotonic()
    run = launch_group(nodes, tag="catest3", concurrency=2)

    assert time.monotonic() - began < 30 + FAILURE_GRACE_S  # not the probe timeout: the others were stopped
    assert not run.ok and run.busbw_gbps is None
    crashed = run.ranks["node2"]
    assert crashed.status is NodeStatus.OK and crashed.result is not None
    assert crashed.result.exit_code == 3 and "simulated crash" in crashed.result.stdout
    for name in ("node0", "node1", "node3"):
        rank = run.ranks[name]
        # Stopped with the run (no exit status), or never started once the run was stopped.
        assert rank.status is NodeStatus.ERROR and rank.cause is None, rank
        assert rank.result is None or (rank.result.exit_code is None and not rank.result.timed_out)
        assert rank.stopped  # stopped for node2's failure: says nothing of its own node
    assert "node2: exit 3" in run.detail
    assert set(culprits(run)) == {"node2"}
    assert processes_matching("--tag catest3") == []
    assert list(tmpdir_env.iterdir()) == []


@pytest.mark.integration
def test_hung_ranks_are_killed_at_the_node_side_timeout(tmp_path: Path, tmpdir_env: Path) -> None:
    python = standin(tmp_path / "python", tmp_path / "barrier")
    # Five ranks are expected, four run: nobody gets past the barrier.
    nodes = [local_node(f"node{i}", python, timeout_s=3) for i in range(4)]
    script = Path(python).read_text().replace('-lt "$n"', '-lt "$((n + 1))"')
    Path(python).write_text(script)

    began = time.monotonic()
    run = launch_group(nodes, tag="catest5", concurrency=2)

    assert 3 <= time.monotonic() - began < 30
    timed_out = [n for n, r in run.ranks.items() if r.result is not None and r.result.timed_out]
    assert timed_out, run.ranks
    assert all(run.ranks[n].result.exit_code in (124, 137) for n in timed_out)  # type: ignore[union-attr]
    assert processes_matching("--tag catest5") == []
    assert list(tmpdir_env.iterdir()) == []


@pytest.mark.integration
def test_ranks_are_looked_at_quickly_only_once_the_whole_run_has_started(
    tmp_path: Path, tmpdir_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run cannot end before its last rank starts: its started ranks wait at the poll interval meanwhile (quick
    looks at every started rank while thousands of others start crowd out those starts), then are looked at soon."""
    python = standin(tmp_path / "python", tmp_path / "barrier")
    nodes = [local_node("early", python), local_node("late", python)]
    late_start = 1.6 * POLL_S
    polls: list[tuple[str, float]] = []
    real_start, real_poll = launcher.start_rank, launcher.poll_rank

    def slow_start(sessions: object, node: Node, *rest: object) -> object:
        if node.name == "late":
            time.sleep(late_start)
        return real_start(sessions, node, *rest)  # type: ignore[arg-type]

    def counted_poll(sessions: object, node: Node, *rest: object) -> object:
        polls.append((node.name, time.monotonic()))
        return real_poll(sessions, node, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(launcher, "start_rank", slow_start)
    monkeypatch.setattr(launcher, "poll_rank", counted_poll)
    began = time.monotonic()
    run = launch_group(nodes, tag="catest7", concurrency=2)

    assert run.ok, run.detail
    while_starting = [at for name, at in polls if name == "early" and at - began < late_start]
    # At the interval: one look at most (quick looks from 0.25 s, doubling, would have been three).
    assert len(while_starting) <= 1, polls
    assert any(name == "late" for name, _ in polls)  # the late rank's end was seen by a poll, with the other's
    assert processes_matching("--tag catest7") == []
    assert list(tmpdir_env.iterdir()) == []


def test_poll_output_cannot_forge_the_status_line() -> None:
    assert parse_poll(0, "running\n", "") is not None
    ended = parse_poll(0, "ended 0\nended 1\nrunning\n", "err")
    assert ended is not None and not ended.running and ended.exit_code == 0 and ended.stdout == "ended 1\nrunning\n"
    assert parse_poll(0, "ended none\n", "").exit_code is None  # type: ignore[union-attr]
    assert parse_poll(None, "running\n", "") is None  # the poll itself was cut off: no answer
    assert parse_poll(0, "garbage\n", "") is None
    script = poll_script("/tmp/cluster-accept-probe.abc", 123, "[-]-tag x")
    assert "--tag x" not in script  # the stop must not match its own command line


@pytest.mark.integration
def test_a_rank_that_cannot_be_reached_is_reported_and_the_others_never_wait(tmp_path: Path, tmpdir_env: Path) -> None:
    python = standin(tmp_path / "python", tmp_path / "barrier")
    remote = Node(
        name="gone",
        ssh=DEFAULT_SSH.model_copy(update={"port": 1, "connect_timeout_s": 2}),  # nothing listens there
        profile_name="p",
        profile=Profile(probes=ProbeSettings(python=python, device="cpu")),
        address="127.0.0.1",
    )
    nodes = [local_node("node0", python), remote]

    run = launch_group(nodes, tag="catest6", concurrency=2)

    assert not run.ok
    assert run.ranks["gone"].status is NodeStatus.UNREACHABLE and run.ranks["gone"].cause is not None
    assert processes_matching("--tag catest6") == []
    assert list(tmpdir_env.iterdir()) == []


def killing_standin(path: Path, barrier: Path, victim: int, teardown_rank: int | None = None) -> str:
    """Ranks that meet, then: rank ``victim``'s worker "is killed" (torchrun's report of a SIGKILL, exit 1,
    a second after its peers notice), and its peers fail of the lost connection at once, as gloo's do. With
    ``teardown_rank`` nobody is killed: every rank finishes and prints ``rank_done``, and that rank then exits 1
    (an abort in the interpreter's teardown)."""
    done = '{"info": "rank_done", "rank": %s, "local_rank": 0, "local_world_size": 1}'
    if teardown_rank is None:
        ending = (
            f'if [ "$k" = {victim} ]; then touch "$b/dead"; sleep 1; '
            'echo "  exitcode  : -9 (pid: 4242)  (SIGKILL)"; '
            'echo "traceback : Signal 9 (SIGKILL) received by PID 4242"; '
            "exit 1; fi\n"
            'while [ ! -e "$b/dead" ]; do sleep 0.05; done\n'
            'echo "[rank$k]: RuntimeError: [pair.cc:537] Read error [10.0.0.2]:16789: Connection reset by peer."\n'
            "exit 1\n"
        )
    else:
        ending = (
            f"echo '{NCCL_LINE}'\n"
            f'[ "$k" = 0 ] && printf \'{MEASUREMENT % "%s"}\' "$n"\n'
            f"printf '{done}\\n' \"$k\"\n"
            f'[ "$k" = {teardown_rank} ] && {{ echo "terminate called without an active exception"; exit 134; }}\n'
            "exit 0\n"
        )
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -I ]; then echo 29500; exit 0; fi\n'  # the free port pick (python -I -c)
        'if [ "$1" = job_settings.py ]; then exit 0; fi\n'  # the settings a rank runs with: none here
        'for a in "$@"; do case "$a" in --nnodes=*) n=${a#*=} ;; --node_rank=*) k=${a#*=} ;; esac; done\n'
        f'b={barrier}/$(echo "$@" | sed "s/.*--tag \\([^ ]*\\).*/\\1/")\n'
        'mkdir -p "$b"; touch "$b/$k"\n'
        'while [ "$(ls "$b" | wc -l)" -lt "$n" ]; do sleep 0.05; done\n' + ending
    )
    path.chmod(0o755)
    return str(path)


@pytest.mark.integration
def test_a_rank_killed_mid_run_is_named_and_its_peers_are_not(tmp_path: Path, tmpdir_env: Path) -> None:
    """The peers fail first, of the lost connection; the killed rank's own end is still read (not cut short by
    a stop), and only its node carries the failure."""
    python = killing_standin(tmp_path / "python", tmp_path / "barrier", victim=1)
    nodes = [local_node(f"node0{i}", python) for i in range(1, 4)]

    run = launch_group(nodes, tag="catest8", concurrency=3)

    assert not run.ok
    killed = run.ranks["node02"]
    assert killed.result is not None and killed.result.exit_code == 1 and not killed.stopped
    assert set(culprits(run)) == {"node02"}
    rows = {node: row for node, row, _ in failed_run_rows(run, "training_scaling", "training run")}
    assert rows["node02"].reason == "collective_failed" and "SIGKILL" in rows["node02"].detail
    assert {rows[n].reason for n in ("node01", "node03")} == {"stopped_with_run"}
    assert "exit None" not in run.detail and "node02: exit 1, a worker ended by SIGKILL" in run.detail
    assert processes_matching("--tag catest8") == []


@pytest.mark.integration
def test_a_teardown_error_after_the_work_is_a_warning_not_a_failure(tmp_path: Path, tmpdir_env: Path) -> None:
    python = killing_standin(tmp_path / "python", tmp_path / "barrier", victim=-1, teardown_rank=0)
    nodes = [local_node(f"node0{i}", python) for i in range(1, 4)]

    run = launch_group(nodes, tag="catest9", concurrency=3)

    assert run.ok and run.busbw_gbps == 1.5, run.detail  # rank 0 hosts the store and aborted after its work
    assert {n for n, r in run.ranks.items() if r.teardown_error} == {"node01"}
    assert [(n, r.reason) for n, r in teardown_rows(run, "allreduce")] == [("node01", "teardown_error")]
    assert processes_matching("--tag catest9") == []


@pytest.mark.integration
def test_workers_a_failed_rank_left_behind_are_cleared_from_its_node(tmp_path: Path, tmpdir_env: Path) -> None:
    """Every rank fails of itself before any stop, one leaving a worker in a session of its own (as an agent
    killed at its timeout leaves its workers): the run's end clears it by the run's tag all the same."""
    path = tmp_path / "python"
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -I ]; then echo 29500; exit 0; fi\n'  # the free port pick (python -I -c)
        'if [ "$1" = job_settings.py ]; then exit 0; fi\n'  # the settings a rank runs with: none here
        'for a in "$@"; do case "$a" in --node_rank=*) k=${a#*=} ;; esac; done\n'
        't=$(echo "$@" | sed "s/.*--tag \\([^ ]*\\).*/\\1/")\n'
        'if [ "$k" = 1 ]; then setsid sh -c "while :; do sleep 1; done" worker --tag "$t" \\\n'
        "  < /dev/null > /dev/null 2>&1 &\n"
        "fi\n"
        'echo "rank $k: simulated crash"; exit 3\n'
    )
    path.chmod(0o755)
    nodes = [local_node(f"node0{i}", str(path)) for i in range(1, 4)]

    run = launch_group(nodes, tag="catest10", concurrency=3)

    assert not run.ok and all(r.result is not None and r.result.exit_code == 3 for r in run.ranks.values())
    assert processes_matching("--tag catest10") == []
    assert list(tmpdir_env.iterdir()) == []
