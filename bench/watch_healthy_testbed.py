"""A healthy job watched for 20 minutes on the test-bed must name nothing.

Two test-bed nodes (network namespaces, real sshd), each sshd held to one core; the project's training step
runs as a two-node gloo job armed only through its environment (tests/watch_job.py), and the real CLI watches it
(``cluster-accept watch --for SECONDS``, reads every 2 s, a 60-s window). Written to ``--out``: ``result.json``
(the watch's exit code, its reads, every finding that is not ``pass``, the compute-straggler rows' figures at
the end) and the watch's own directory.

``python3 bench/watch_healthy_testbed.py [--for 1200] [--out bench/results/testbed-watch-healthy]`` (root).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from cluster_accept.testbed import bed  # noqa: E402
from tests.prefect_server import prefect_server  # noqa: E402
from tests.watch_job import Job, pin_sshd  # noqa: E402

PREFIX, SUBNET = "wah", "10.254.59.0/24"


def watch(inventory: Path, job: Job, out: Path, seconds: float, env: dict[str, str]) -> int:
    argv = [sys.executable, "-m", "cluster_accept.flows.cli", "watch", "--inventory", str(inventory),
            "--nodes", "node[01-02]", "--job", job.name, "--out", str(out), "--watch-dir", f"{job.watch_dir}/{{node}}",
            "--interval", "2", "--window", "60", "--hang-after", "15", "--for", str(seconds),
            "--history", "-"]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=seconds + 600)
    (out / "watch.log").write_text(done.stdout + done.stderr)
    return done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--for", dest="seconds", type=float, default=1200.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "testbed-watch-healthy")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="watch-healthy-"))
    tb = bed.up(2, state_dir=scratch / "bed", prefix=PREFIX, subnet=SUBNET)
    try:
        for cpu, node in enumerate(("node01", "node02")):
            pin_sshd(tb, node, cpu)
        job = Job(tb, scratch, "healthy", 29621)
        with prefect_server(scratch / "prefect") as env:
            code = watch(tb.inventory_path, job, args.out, args.seconds, env)
        job.stop()
        (watch_dir,) = [p for p in args.out.iterdir() if (p / "watch_findings.parquet").exists()]
        findings = pd.read_parquet(watch_dir / "watch_findings.parquet")
        info = json.loads((watch_dir / "watch.json").read_text())
        result = {
            "seconds": args.seconds, "exit_code": code, "reads": info["rounds"], "watch_dir": watch_dir.name,
            "named": findings[findings.status.isin(["fail", "warn"])].to_dict("records"),
            "compute_straggler": findings[findings.kind == "compute_straggler"][["node", "status", "observed"]]
            .to_dict("records"),
        }  # fmt: skip
        (args.out / "result.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(json.dumps(result, indent=2, default=str))
        return 0 if code == 0 and not result["named"] else 1
    finally:
        bed.down(tb.state_dir, PREFIX)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
