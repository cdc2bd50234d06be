"""Wall time of a whole preflight run (real CLI, real Prefect) on an N-node test-bed, with 10% of the nodes
faulty, next to the same checks through the bare fan-out (no Prefect), so Prefect's share shows.

    python3 bench/preflight.py [--sizes 64] [--faulty-pct 10]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pandas as pd  # noqa: E402

from checks.base import discover  # noqa: E402
from inventory.load import load_inventory  # noqa: E402
from remote.fanout import fan_out  # noqa: E402
from tasks.preflight import commands_for  # noqa: E402
from testbed.bed import down, node_names, up  # noqa: E402
from testbed.faults import fault_plan_from_data  # noqa: E402

STATE = Path("/tmp/cluster-accept-bench-preflight")
PREFIX = "cabp"
SUBNET = "10.253.16.0/22"
FAULTS = [
    "down",
    "gpu_missing",
    {"persistence_disabled": {"gpu": 0}},
    {"pcie_width": {"gpu": 1, "width": 8}},
    "nvidia_smi_fail",
    {"nvlink_inactive": {"gpu": 2, "link": 5}},
    {"xid": {"code": 79, "gpu": 0}},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64")
    parser.add_argument("--faulty-pct", type=float, default=10.0)
    args = parser.parse_args()
    print(f"{'N':>5} {'faulty':>6} {'cli_run_s':>10} {'bare_fanout_s':>14} {'rejected+unreachable':>21}")
    for n in [int(s) for s in args.sizes.split(",")]:
        names = node_names(n)
        faulty = names[:: max(1, round(100 / args.faulty_pct))][: max(1, round(n * args.faulty_pct / 100))]
        plan = fault_plan_from_data({"nodes": {name: [FAULTS[i % len(FAULTS)]] for i, name in enumerate(faulty)}})
        try:
            bed = up(n, plan, state_dir=STATE, prefix=PREFIX, subnet=SUBNET)
            inventory = load_inventory(bed.inventory_path)
            started = time.perf_counter()
            fan_out(inventory.tested, commands_for(discover()), concurrency=64)
            bare = time.perf_counter() - started
            with tempfile.TemporaryDirectory() as out:
                started = time.perf_counter()
                proc = subprocess.run(
                    ["cluster-accept", "run", "--inventory", str(bed.inventory_path), "--out", out],
                    capture_output=True,
                    text=True,
                )
                wall = time.perf_counter() - started
                verdicts = pd.read_parquet(
                    next(p for p in Path(out).iterdir() if p.name != "history") / "verdicts.parquet"
                )
            bad = int((verdicts.verdict != "accepted").sum())
            print(f"{n:>5} {len(faulty):>6} {wall:>10.2f} {bare:>14.2f} {bad:>21}  (exit {proc.returncode})")
        finally:
            down(STATE, PREFIX)


if __name__ == "__main__":
    main()
