"""Peak memory of ``cluster-accept history`` over a history holding one highly compressible file of 2,000,000
identical rows (a few dozen KB on disk) in place of one run's table, against the same history without it.

Builds a history of ten runs of a four-node cluster (``--nodes``), measures the peak RSS of ``cluster-accept
history --json`` over it, then, for each table the command reads, over a copy where one run's file of that table
holds 2,000,000 rows, and prints each peak, the file's size and the ratio to the clean history's peak. The command
reads a file only as far as its run's row (its node count) makes its row count plausible and its footer says it
unpacks within a fixed budget, whatever the row claims (with ``--nodes 100`` the 2,000,000 rows are plausible), so
each ratio stays under the bound (``--bound``, 1.25 by default); exit 1 when one does not. Usage:

    python3 bench/history_memory.py [--rows 2000000] [--nodes 4] [--bound 1.25] [--repo DIR]

``--repo``: the checkout whose ``cluster_accept`` the command runs (default this one), to measure another version.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from cluster_accept.analysis.history import append_run  # noqa: E402
from cluster_accept.analysis.schemas import TABLES, write_table  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NODES = [f"node{i:02d}" for i in range(1, 5)]
RUNS = [f"202611{d:02d}T000000Z-aaaaaa" for d in range(1, 11)]
READ_TABLES = ("verdicts", "checks", "node_values", "measurements")  # what the command reads
_PEAK = "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)\n" \
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"  # fmt: skip


def _rows(table: str, run: str) -> list[dict[str, object]]:
    """One run's rows of ``table`` for every node."""
    tag = {"run_id": run, "cluster": "c"}
    if table == "verdicts":
        return [{**tag, "node": n, "profile": "p", "verdict": "accepted", "reasons": []} for n in NODES]
    if table == "checks":
        return [
            {**tag, "stage": "preflight", "node": n, "check": "driver", "item": "", "status": "pass"} for n in NODES
        ]
    if table == "node_values":
        return [{**tag, "node": n, "check": "driver", "key": "driver_version", "value": "580.95.05"} for n in NODES]
    return [
        {**tag, "stage": "single-node", "node": n, "gpu": 0, "metric": "gemm_bf16_tflops", "value": 700.0,
         "unit": "TFLOP/s"} for n in NODES
    ]  # fmt: skip


def build_history(work: Path) -> Path:
    """Ten runs of the nodes (:data:`NODES`), each appended as a run appends its tables."""
    history = work / "history"
    for day, run in enumerate(RUNS, start=1):
        run_dir = work / "runs" / run
        run_dir.mkdir(parents=True)
        started = dt.datetime(2026, 11, day, tzinfo=dt.timezone.utc)
        row = {"run_id": run, "cluster": "c", "started": started, "nodes_tested": len(NODES), "skipped": 0}
        write_table(run_dir / "runs.parquet", [row], TABLES["runs"])
        for table in READ_TABLES:
            write_table(run_dir / f"{table}.parquet", _rows(table, run), TABLES[table])
        append_run(history, run_dir, run, f"2026-11-{day:02d}")
    return history


def plant(history: Path, table: str, rows: int) -> Path:
    """Replace the last run's ``table`` file with ``rows`` copies of its first row: a file of a few dozen KB."""
    path = next((history / table).glob(f"date=*/{RUNS[-1]}.parquet"))
    first = pq.read_table(path).slice(0, 1)
    planted = first.take(pa.array([0] * rows))
    pq.write_table(planted, path, compression="zstd", row_group_size=rows)
    return path


def peak_kib(history: Path, repo: Path) -> int:
    """Peak RSS (KiB) of ``cluster-accept history --history HISTORY --json`` run from ``repo``."""
    command = [sys.executable, "-m", "cluster_accept.flows.cli", "history", "--history", str(history), "--json"]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    done = subprocess.run([sys.executable, "-c", _PEAK, *command], capture_output=True, text=True, cwd=repo, env=env)
    if done.returncode != 0:
        return -1  # the command itself failed: said below
    return int(done.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--nodes", type=int, default=len(NODES), help="the nodes each run's row says it had")
    parser.add_argument("--bound", type=float, default=1.25)
    parser.add_argument("--repo", type=Path, default=ROOT)
    args = parser.parse_args()
    if args.nodes < 1:
        parser.error(f"--nodes must be at least 1, not {args.nodes}")
    NODES[:] = [f"node{i:03d}" for i in range(1, args.nodes + 1)]
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        clean = build_history(Path(tmp) / "clean")
        base = peak_kib(clean, args.repo)
        print(f"clean history of {len(NODES)} nodes a run: peak RSS {base / 1024:.0f} MiB")
        for table in READ_TABLES:
            copy = Path(tmp) / table
            shutil.copytree(clean, copy)
            size = plant(copy, table, args.rows).stat().st_size
            peak = peak_kib(copy, args.repo)
            if peak < 0:
                print(f"{table:>12}: {args.rows:,} rows in {size / 1024:.0f} KiB: the command failed")
                worst = float("inf")
                continue
            ratio = peak / base
            worst = max(worst, ratio)
            print(f"{table:>12}: {args.rows:,} rows in {size / 1024:.0f} KiB: peak RSS {peak / 1024:.0f} MiB, "
                  f"ratio {ratio:.2f} (bound {args.bound})")  # fmt: skip
    within = "within" if worst <= args.bound else "over"
    print(f"worst ratio at {len(NODES)} nodes {worst:.2f}: {within} the bound {args.bound}")
    raise SystemExit(0 if worst <= args.bound else 1)


if __name__ == "__main__":
    main()
