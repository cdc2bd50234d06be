"""A real Slurm's job read by field: jobs whose names imitate Slurm's own fields (``NodeList=``, a line break and
a whole forged record) are read as running on their own node and as their own user, through the same squeue
that an operator's Slurm 22.05 answers with (the test-bed's Debian Slurm has no ``scontrol --json``)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from cluster_accept.ops.slurm import job_nodes

pytestmark = pytest.mark.testbed

NAMES = {
    "node02": "train NodeList=victim[01-08] BatchHost=victim01",
    "node01": "a\nJobId=1 JobName=b UserId=root(0) NodeList=victim[13] BatchHost=victim13",
}


def submit(node: str, name: str, tmp_path: Path) -> str:
    argv = ["sbatch", "--parsable", f"--nodelist={node}", "--nodes=1", f"--job-name={name}", f"--chdir={tmp_path}",
            "--comment=x NodeList=victim[09-10] BatchHost=v", "--output=/dev/null", "--wrap", "sleep 120"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)  # noqa: S603
    return done.stdout.strip().split(";")[0]


def wait_running(job_id: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    argv = ["squeue", "--noheader", f"--jobs={job_id}", "--format=%T"]
    while (state := subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout.strip()) != "RUNNING":
        assert time.monotonic() < deadline, f"job {job_id} did not start: {state!r}"
        time.sleep(0.5)


def test_a_job_named_like_slurms_fields_runs_on_its_own_node(testbed_factory, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=2, prefix="csj", subnet="10.254.192.0/24", slurm=True)
    for key, value in bed.slurm_env.items():
        monkeypatch.setenv(key, value)
    jobs = {node: submit(node, name, tmp_path) for node, name in NAMES.items()}
    try:
        for node, job_id in jobs.items():
            wait_running(job_id)
            assert job_nodes(job_id) == node
        from cluster_accept.ops.slurm import SlurmJob, read_job  # the job's user, for its directory's owner

        for node, job_id in jobs.items():
            assert read_job(job_id) == SlurmJob(job_id, node, 0, "root", "RUNNING")
        shown = subprocess.run(["scontrol", "show", "job", "-o", jobs["node02"]], capture_output=True, text=True,
                               timeout=60, check=True).stdout  # fmt: skip
        assert shown.index(" NodeList=victim[01-08] ") < shown.index(" NodeList=node02 ")  # what text would misread
    finally:
        subprocess.run(["scancel", *jobs.values()], capture_output=True, timeout=60, check=False)  # noqa: S603
