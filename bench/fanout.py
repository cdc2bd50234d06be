"""Fan-out speed: our SSH fan-out vs a plain parallel-OpenSSH baseline (``xargs -P`` over ``ssh``).

Brings up a test-bed (real sshd per node in network namespaces), runs the same three commands on N nodes
both ways, one connection per node each way, and prints wall times (median of repeats) and their ratio.
Target: ratio (ours / baseline) <= 1.2 at N = 64. Needs root. Usage:

    python3 bench/fanout.py [--sizes 16,64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster_accept.inventory.load import load_inventory  # noqa: E402
from cluster_accept.remote.fanout import fan_out  # noqa: E402
from cluster_accept.remote.result import NodeStatus, RemoteCommand  # noqa: E402
from cluster_accept.testbed.bed import down, up  # noqa: E402

COMMANDS = ["uname -a", "nvidia-smi -L", "cat /proc/driver/nvidia/version"]
STATE = Path("/tmp/cluster-accept-bench-fanout")
PREFIX = "cab"
SUBNET = "10.253.0.0/22"


def baseline(addresses: list[str], identity: Path, known_hosts: Path, concurrency: int) -> float:
    remote = "; ".join(COMMANDS)
    ssh = (
        f"ssh -i {identity} -o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes "
        f"-o BatchMode=yes -o ConnectTimeout=5 -o LogLevel=ERROR root@{{}} '{remote}'"
    )
    started = time.perf_counter()
    proc = subprocess.run(  # noqa: S602 - fixed command line, addresses from our own test-bed
        f'xargs -P {concurrency} -I{{}} sh -c "{ssh} >/dev/null"',
        input="\n".join(addresses) + "\n",
        shell=True,
        text=True,
        capture_output=True,
    )
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"baseline failed: {proc.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,64")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{'N':>5} {'ours_s':>8} {'xargs_ssh_s':>12} {'ratio':>6}")
    try:
        bed = up(max(sizes), None, state_dir=STATE, prefix=PREFIX, subnet=SUBNET)
        names = sorted(bed.nodes)
        for n in sizes:
            subset = names[:n]
            ours_times, base_times = [], []
            for _ in range(args.repeats):
                ours_times.append(ours_subset(bed.inventory_path, subset, args.concurrency))
                base_times.append(
                    baseline([bed.nodes[x] for x in subset], bed.identity_file, bed.known_hosts_path, args.concurrency)
                )
            o, b = statistics.median(ours_times), statistics.median(base_times)
            print(f"{n:>5} {o:>8.3f} {b:>12.3f} {o / b:>6.2f}")
    finally:
        down(STATE, PREFIX)


def ours_subset(inventory_path: Path, subset: list[str], concurrency: int) -> float:
    inventory = load_inventory(inventory_path)
    wanted = set(subset)
    nodes = [n for n in inventory.tested if n.name in wanted]
    commands = [RemoteCommand(f"c{i}", c) for i, c in enumerate(COMMANDS)]
    started = time.perf_counter()
    results = fan_out(nodes, commands, concurrency=concurrency)
    elapsed = time.perf_counter() - started
    bad = [r.node for r in results.values() if r.status is not NodeStatus.OK or not all(c.ok for c in r.commands)]
    if bad:
        raise SystemExit(f"fan-out failed on {bad}: {[results[b].detail for b in bad][:2]}")
    return elapsed


if __name__ == "__main__":
    main()
