"""How refusing a hostlist grows with its length: a list of 100,000 names and one of 1,000,000, each ending with
a name that is no host name (``bad;name``), both refused. Prints each time and their ratio (about 10 when the
refusal is linear in the list's length; ClusterShell's own parse of such a list grows with its square). Usage:

    python3 bench/hostlist_refusal.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster_accept.inventory.hostlist import HostlistError, expand  # noqa: E402

SIZES = (100_000, 1_000_000)


def refusal_s(names: int) -> float:
    """Seconds ``expand`` takes to refuse ``names`` comma-separated names, the last one bad."""
    expression = ",".join([f"node{i:07d}" for i in range(names - 1)] + ["bad;name"])
    started = time.perf_counter()
    try:
        expand(expression)
    except HostlistError:
        return time.perf_counter() - started
    raise SystemExit(f"a list of {names:,} names ending with a bad one was accepted")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    times = {n: statistics.median(refusal_s(n) for _ in range(args.repeats)) for n in SIZES}
    for n, seconds in times.items():
        print(f"{n:>9,} names refused in {seconds:.3f} s")
    print(f"ratio 1,000,000 / 100,000: {times[SIZES[1]] / times[SIZES[0]]:.1f} (about 10 when linear)")


if __name__ == "__main__":
    main()
