"""How long the watch takes to name a node, from the moment a fault is planted, on the test-bed.

Two test-bed nodes (network namespaces, real sshd, each sshd held to one core), the project's training step as a
two-node gloo job armed only through its environment (tests/watch_job.py), and the real CLI watching it
(``cluster-accept watch --interval 2 --window 60 --hang-after H --until-named --no-retest``), started before the
fault and given its first round. Faults, one job each:

- ``stopped``: node02's rank stopped (SIGSTOP): a hang, named once no collective completed for ``--hang-after``;
- ``killed``: node02's rank killed (SIGKILL): a dead rank;
- ``compute``: a process competing for node02's core at a higher priority: a compute straggler (its rank last at
  most collectives of the window, and waiting for a CPU where its peers do not).

For each, every row that fails with the seconds from the fault to its ``named_ns``. Written to ``--out``:
``result.json`` and each watch's directory. (A slow link needs four nodes, the ring-neighbour rule's floor: the
soak tier's ``tests/test_watch_slurm_testbed.py`` names one and prints when.)

``python3 bench/watch_latency_testbed.py [--hang-after 15] [--out bench/results/testbed-watch-latency]`` (root).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from cluster_accept.testbed import bed  # noqa: E402
from tests.prefect_server import prefect_server  # noqa: E402
from tests.watch_job import HOG, Job, pin_sshd, prioritize_hog  # noqa: E402

PREFIX, SUBNET = "wal", "10.254.60.0/24"


def start_watch(inventory: Path, job: Job, out: Path, hang_after: float, env: dict[str, str]) -> subprocess.Popen[str]:
    """The watch in the background, returned once its first round is on disk."""
    argv = [sys.executable, "-m", "cluster_accept.flows.cli", "watch", "--inventory", str(inventory),
            "--nodes", "node[01-02]", "--job", job.name, "--out", str(out), "--watch-dir", f"{job.watch_dir}/{{node}}",
            "--interval", "2", "--window", "60", "--hang-after", str(hang_after), "--for", "300", "--until-named",
            "--no-retest", "--history", "-"]  # fmt: skip
    watching = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not list(out.glob("*/watch_findings.parquet")):
        if time.monotonic() > deadline or watching.poll() is not None:
            raise RuntimeError(f"the watch wrote no round in 120 s: {watching.communicate()[0][-2000:]}")
        time.sleep(0.5)
    return watching


def named_after(out: Path, planted_ns: int) -> list[dict[str, object]]:
    """Each failing row with the seconds from the fault to its naming."""
    (findings,) = [pd.read_parquet(p) for p in out.glob("*/watch_findings.parquet")]
    failed = findings[findings.status == "fail"]
    return [
        {"node": r.node, "kind": r.kind, "reason": r.reason, "rank": r.rank,
         "seconds": round((int(r.named_ns) - planted_ns) / 1e9, 1), "evidence": r.evidence}
        for r in failed.itertuples()
    ]  # fmt: skip


def measure(tb: bed.Testbed, scratch: Path, out: Path, name: str, plant: Callable[[Job], None], hang_after: float,
            env: dict[str, str]) -> dict[str, object]:  # fmt: skip
    """One job, its watch, the fault planted once the watch reads, and when the watch named what."""
    job = Job(tb, scratch / name, name, 29630 + sum(map(ord, name)) % 64)  # a master port of its own
    try:
        watching = start_watch(tb.inventory_path, job, out / name, hang_after, env)
        planted_ns = time.time_ns()
        plant(job)
        output, _ = watching.communicate(timeout=400)
        (out / name / "watch.log").write_text(output)
        return {"fault": name, "exit_code": watching.returncode, "named": named_after(out / name, planted_ns)}
    finally:
        job.stop()
        subprocess.run(tb.ssh_argv("node02", "pkill -KILL -f 'while 1'"), check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hang-after", type=float, default=15.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "testbed-watch-latency")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="watch-latency-"))
    tb = bed.up(2, state_dir=scratch / "bed", prefix=PREFIX, subnet=SUBNET)
    hogs: list[subprocess.Popen[bytes]] = []

    def compute(job: Job) -> None:
        hogs.append(subprocess.Popen(tb.ssh_argv("node02", HOG.format(python=sys.executable))))
        prioritize_hog(tb)

    faults: dict[str, Callable[[Job], None]] = {
        "stopped": lambda job: os.kill(job.rank_pid("node02"), signal.SIGSTOP),
        "killed": lambda job: os.kill(job.rank_pid("node02"), signal.SIGKILL),
        "compute": compute,
    }
    try:
        for cpu, node in enumerate(("node01", "node02")):
            pin_sshd(tb, node, cpu)
        with prefect_server(scratch / "prefect") as env:
            results = [
                measure(tb, scratch, args.out, name, plant, args.hang_after, env) for name, plant in faults.items()
            ]
        result = {"hang_after_s": args.hang_after, "faults": results}
        (args.out / "result.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        for entry in results:
            for row in entry["named"]:  # type: ignore[attr-defined]
                print(f"{entry['fault']:8} {row['node']} {row['kind']}/{row['reason']} after {row['seconds']} s")
        return 0
    finally:
        for hog in hogs:
            hog.kill()
        bed.down(tb.state_dir, PREFIX)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
