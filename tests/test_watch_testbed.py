"""``cluster-accept watch`` on the test-bed (real sshd, real torch on CPU over gloo): the project's own training
step runs as a two-node job armed only through its environment (the shim on PYTHONPATH), each node's sshd held
to one core so that what starts on a node competes for that node's core only. Healthy, the watch names nothing;
a process competing for node02's core makes node02's rank arrive last, and the watch names node02; once the job
has left its nodes (its owner stopped it), the re-test (preflight and the single-node stage beside its peer)
confirms it; a rank stopped with SIGSTOP is named as the hang's missing rank with its node; a rank killed is named
dead with its node. A hostile second user on node02 (a rank file linked to /dev/zero, a FIFO, the next job's
directory prepared in advance) is named and skipped: the other ranks are read and no node of another job named."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cluster_accept.testbed import bed as testbed
from tests.processes import run_cli, start_cli
from tests.watch_job import HOG, Job, pin_sshd, prioritize_hog, replay_ras

pytestmark = [pytest.mark.testbed, pytest.mark.soak]  # docs/development.md: the soak tier

NAME_BOUND_S = 90.0  # a straggler must be named (and re-tested) within this after it starts
INSPECTOR_CAPTURE = Path(__file__).parent / "data" / "watch" / "inspector-2.28.9" / "killed-job" / "vm-pid2771.log"


@pytest.fixture
def bed_and_inventory(testbed_factory, tmp_path: Path) -> Iterator[tuple[testbed.Testbed, Path]]:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=2, faults=None, prefix="wat", subnet="10.254.58.0/24")
    for cpu, node in enumerate(("node01", "node02")):
        pin_sshd(bed, node, cpu)
    inventory = yaml.safe_load(bed.inventory_path.read_text())
    thresholds = inventory["profiles"]["testbed-h200x4"]["thresholds"]
    thresholds.update(straggler_pct=25, relative_verdict="fail")  # a node at half its peer's speed is rejected
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(inventory))
    yield bed, path
    for node in ("node01", "node02"):
        subprocess.run(bed.ssh_argv(node, "pkill -KILL -f train_step.py; pkill -KILL -f 'while 1'"), check=False)


def _args(inventory: Path, job: Job, out: Path, *extra: str) -> list[str]:
    return [
        "watch", "--inventory", str(inventory), "--nodes", "node[01-02]", "--job", job.name, "--out", str(out),
        "--watch-dir", f"{job.watch_dir}/{{node}}", "--interval", "2", "--window", "60", "--hang-after", "15",
        "--job-user", str(os.getuid()), *extra,
    ]  # fmt: skip


def _watch(inventory: Path, job: Job, out: Path, *extra: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return run_cli(*_args(inventory, job, out, *extra), timeout=timeout)


def _findings(out: Path) -> pd.DataFrame:
    (watch_dir,) = [p for p in out.iterdir() if (p / "watch_findings.parquet").exists()]
    return pd.read_parquet(watch_dir / "watch_findings.parquet")


def _coverage(out: Path, node: str, signal: str) -> str:
    (watch_dir,) = [p for p in out.iterdir() if (p / "watch_coverage.parquet").exists()]
    rows = pd.read_parquet(watch_dir / "watch_coverage.parquet")
    (detail,) = rows[(rows.node == node) & (rows.signal == signal)].detail
    return str(detail)


def _named(out: Path, node: str, kind: str, within_s: float) -> None:
    """Wait until the running watch under ``out`` has written a failure of ``kind`` on ``node``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            rows = _findings(out)
        except (ValueError, OSError):  # not written yet, or being written
            rows = pd.DataFrame(columns=["node", "kind", "status"])
        if ((rows.node == node) & (rows.kind == kind) & (rows.status == "fail")).any():
            return
        time.sleep(1)
    raise AssertionError(f"{node} {kind} not named within {within_s:g} s")


OTHER_UID = 65534  # a second user on the node (nobody)


def _plant_hostile_rank_files(job_dir: Path) -> None:
    """What a job's user can leave beside its ranks' files to blind the watch: a rank file that is a link to
    /dev/zero (an unbounded read) and one that is a FIFO (a read that never returns)."""
    (job_dir / "rank7.json").symlink_to("/dev/zero")
    os.mkfifo(job_dir / "rank8.json")


def _prepare_next_jobs_directory(base: Path, job: str) -> Path:
    """A second user creates the next job's directory in the shared watch directory (root's, mode 1777, as
    docs/watch-signals.md has it) before that job starts, to feed the reader ranks of its own."""
    base.mkdir(parents=True)
    base.chmod(0o1777)
    squatted = base / job
    squatted.mkdir(mode=0o700)
    os.chown(squatted, OTHER_UID, OTHER_UID)
    return squatted


def _problems(out: Path) -> dict[str, list[str]]:
    (watch_dir,) = [p for p in out.iterdir() if (p / "watch.json").exists()]
    return dict(json.loads((watch_dir / "watch.json").read_text())["problems"])


def test_watch_names_the_straggler_the_hang_and_the_dead_rank(bed_and_inventory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed, inventory = bed_and_inventory
    began = time.monotonic()
    job = Job(bed, tmp_path, "train1", 29611)
    print(f"job started: {time.monotonic() - began:.0f} s")
    _plant_hostile_rank_files(job.job_dir("node02"))
    # node01's job directory as NCCL's Inspector leaves it (a file captured on a GPU job, dumped an hour from now so
    # that every read takes it): read over SSH by the watch; its records are an NCCL communicator's, not this gloo
    # job's, so none is put on a record
    (job.job_dir("node01") / "inspector").mkdir()
    later = f'"dump_timestamp_us":{(time.time_ns() // 1000) + 3600_000_000}'
    dumped = re.sub(r'"dump_timestamp_us":\d+', later, INSPECTOR_CAPTURE.read_text())
    (job.job_dir("node01") / "inspector" / INSPECTOR_CAPTURE.name).write_text(dumped)
    healthy = _watch(inventory, job, tmp_path / "healthy", "--for", "40")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    rows = _findings(tmp_path / "healthy")
    assert set(rows.status) <= {"pass", "not_judged"} and set(rows.node) == {"node01", "node02"}
    assert (rows[rows.kind == "compute_straggler"].status == "pass").all(), rows.to_dict("records")
    problems = _problems(tmp_path / "healthy")
    assert problems.keys() == {"node02"}, problems  # the hostile files are named; node01 and the real ranks read
    assert any("rank 7 unreadable (rank7.json): a link, not followed" in p for p in problems["node02"]), problems
    assert any("rank 8 unreadable (rank8.json): a FIFO, not a regular file" in p for p in problems["node02"]), problems
    said = _coverage(tmp_path / "healthy", "node01", "inspector")
    assert said == "64 records, none put on the Flight Recorder's: no clear alignment of their sequences", said
    assert _coverage(tmp_path / "healthy", "node02", "inspector").startswith("no Inspector files of the job")

    print(f"healthy watched: {time.monotonic() - began:.0f} s")
    hog = subprocess.Popen(bed.ssh_argv("node02", HOG.format(python=sys.executable)))
    prioritize_hog(bed)
    started_ns = time.time_ns()
    watching = start_cli(*_args(inventory, job, tmp_path / "slow", "--for", "300", "--until-named"))
    try:
        _named(tmp_path / "slow", "node02", "compute_straggler", NAME_BOUND_S)
        print(f"straggler named: {time.monotonic() - began:.0f} s")
        job.stop(competing_too=False)  # the owner excludes node02: the re-test waits for the job to leave its nodes
        stdout, stderr = watching.communicate(timeout=600)
    finally:
        watching.kill()
        hog.kill()
        subprocess.run(bed.ssh_argv("node02", "pkill -KILL -f 'while 1'"), check=False)
    assert watching.returncode == 1, stdout + stderr
    rows = _findings(tmp_path / "slow").set_index(["node", "kind"])
    straggler = rows.loc[("node02", "compute_straggler")]
    assert straggler.status == "fail" and straggler.reason == "arrives_last", straggler.to_dict()
    assert straggler["rank"] == 1 and straggler.confirmed, straggler.to_dict()
    seconds = (straggler.named_ns - started_ns) / 1e9
    assert seconds < NAME_BOUND_S, seconds
    assert rows.loc[("node01", "compute_straggler")].status == "pass"
    print(f"straggler named after {seconds:.1f} s")

    print(f"straggler re-tested: {time.monotonic() - began:.0f} s")
    squatted = _prepare_next_jobs_directory(tmp_path / "hung" / "watch" / "node02", "train2")
    job = Job(bed, tmp_path / "hung", "train2", 29612)
    print(f"second job started: {time.monotonic() - began:.0f} s")
    assert job.job_dir("node02") != squatted and not any(squatted.iterdir())  # armed beside it, nothing written in
    os.kill(job.rank_pid("node02"), signal.SIGSTOP)
    # node01's NCCL RAS, as a real job's answered 70 s after its rank was stopped, about node02's stopped rank
    ras = replay_ras(bed, "node01", tmp_path, "stopped70-half-a.json", {2348: job.rank_pid("node02")})
    try:
        hung = _watch(inventory, job, tmp_path / "hang", "--for", "120", "--until-named", "--no-retest")
    finally:
        ras.kill()
    assert hung.returncode == 1, hung.stdout + hung.stderr
    rows = _findings(tmp_path / "hang").set_index(["node", "kind"])
    assert rows.loc[("node02", "hang")].reason == "rank_stopped" and rows.loc[("node02", "hang")]["rank"] == 1
    ras_said = "NCCL RAS (asked on node01 "
    assert ras_said in rows.loc[("node02", "hang")].evidence, rows.loc[("node02", "hang")].evidence
    assert (
        f"rank 1's process {job.rank_pid('node02')} on 192.0.2.2 considered dead"
        in rows.loc[("node02", "hang")].evidence
    )
    assert rows.loc[("node01", "hang")].status == "pass"
    assert set(rows.index.get_level_values("node")) == {"node01", "node02"}  # no node of another job
    said = _problems(tmp_path / "hang")["node02"]
    assert any(f"{squatted}: prepared by uid {OTHER_UID}" in p and "skipped" in p for p in said), said
    job.stop()

    print(f"hang named: {time.monotonic() - began:.0f} s")
    job = Job(bed, tmp_path / "second", "train3", 29613)
    print(f"third job started: {time.monotonic() - began:.0f} s")
    os.kill(job.rank_pid("node01"), signal.SIGKILL)
    dead = _watch(inventory, job, tmp_path / "dead", "--for", "60", "--until-named", "--no-retest")
    assert dead.returncode == 1, dead.stdout + dead.stderr
    rows = _findings(tmp_path / "dead").set_index(["node", "kind"])
    assert rows.loc[("node01", "dead_rank")].status == "fail" and rows.loc[("node01", "dead_rank")]["rank"] == 0
    assert rows.loc[("node02", "dead_rank")].status == "pass"
    job.stop()
