"""``cluster-accept check --local`` of two or more package trees, interleaved: which is faster on this machine.

One run of bench/check_local.py per tree, one after the other, mixes the change with the machine's drift (on a
lent H200 the same tree's p50 moved by 0.15 s between two such runs). Here every round runs each tree once, in an
order shuffled per round, each tree with its own runtime directory (its probe cache warmed by one check first), so
drift falls on every tree alike. Prints each tree's p50 and p95 wall time, its ratio to the first tree's, and the
share of rounds in which it beat the first tree; writes ``check_local_ab.json`` to --out.

    python3 bench/check_local_ab.py --tree after=. --tree before=/tmp/old [--runs 40] [--out DIR]

A tree is a directory holding ``cluster_accept/`` (put first on PYTHONPATH for its runs). The inventory is
bench/check_local.py's for this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_local  # noqa: E402


def tree_env(tree: Path) -> dict[str, str]:
    """The environment of ``tree``'s checks: its package first on the path, a runtime directory of its own."""
    path = os.pathsep.join([str(tree.resolve()), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**check_local.ENV, "PYTHONPATH": path, "XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="ca-ab-runtime-")}


def rounds(trees: dict[str, Path], inventory: Path, runs: int) -> dict[str, list[float]]:
    """``runs`` rounds, each checking with every tree once in a shuffled order; the first check of each tree
    (its probe interpreter's cold start) is not counted."""
    envs = {name: tree_env(tree) for name, tree in trees.items()}
    for name in trees:
        check_local.ENV = envs[name]
        check_local.one_check(inventory)
    walls: dict[str, list[float]] = {name: [] for name in trees}
    order = list(trees)
    for _ in range(runs):
        random.shuffle(order)
        for name in order:
            check_local.ENV = envs[name]
            walls[name].append(float(check_local.one_check(inventory)["wall_s"]))  # type: ignore[arg-type]
    return walls


def summary(walls: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Each tree's p50 and p95, as ratios to the first tree's too, and the share of rounds it was faster."""
    first = next(iter(walls))
    base50, base95 = statistics.median(walls[first]), check_local.p95(walls[first])
    found = {}
    for name, times in walls.items():
        p50, p95 = statistics.median(times), check_local.p95(times)
        wins = sum(mine < theirs for mine, theirs in zip(times, walls[first], strict=True)) / len(times)
        found[name] = {
            "p50_s": round(p50, 4),
            "p95_s": round(p95, 4),
            "p50_ratio": round(p50 / base50, 3),
            "p95_ratio": round(p95 / base95, 3),
            f"faster_than_{first}": round(wins, 3),
        }
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=DIR holding cluster_accept/")
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--inventory", type=Path)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    trees = {name: Path(path) for name, _, path in (t.partition("=") for t in args.tree)}
    inventory = args.inventory or check_local.this_machine()
    walls = rounds(trees, inventory, args.runs)
    found = summary(walls)
    for name, figures in found.items():
        print(name, " ".join(f"{key}={value}" for key, value in figures.items()))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "check_local_ab.json").write_text(json.dumps({"summary": found, "walls": walls}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
