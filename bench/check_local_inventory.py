"""``cluster-accept check --local`` against a large site inventory: one node's check reads only its own part of
the file, so its wall time and memory stay those of a one-node inventory (target: <= 2 s for 50,000 nodes).

Writes the inventories (50,000 nodes by default) in the shapes sites write them, and runs the real CLI on each
(``--node`` in the middle of the file, else ``SLURMD_NODENAME`` through a ``slurm.node_names`` rule written after
the nodes), ``--runs`` times: the median wall time and the tool's own peak RSS (not its children's), each with its
ratio to the targets and to the one-node inventory's. Shapes:

- ``one``: the node alone (the baseline);
- ``explicit``: one entry per node, each with its address and labels (what an inventory generated from a CMDB is);
- ``explicit-slurm``: the same, the node named by Slurm's name (the rule is read after the nodes: two passes);
- ``ranges``: entries of 50 nodes each (``node[00001-00050]``), a rack label each;
- ``hostlist``: one entry naming every node (``node[00001-50000]``).

    python3 bench/check_local_inventory.py [--nodes 50000] [--runs 3] [--out DIR]

On a machine without a GPU the check itself fails (exit 1) in well under a second: what is timed is the tool and
the inventory, the part this bench is about; on a GPU node the check's own commands add their time to every shape.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the targets and the CLI wrapper that reports the tool's own peak RSS: bench/check_local.py's
from check_local import RSS_TARGET_MB, WALL_TARGET_S, WRAPPER  # noqa: E402

HEAD = "cluster: bench\ndefaults: {profile: p, labels: {site: s1}}\nnodes:\n"
TAIL = "profiles:\n  p: {probes: {device: cpu}}\n"
RULE = "slurm: {node_names: {match: 'node(\\d+)', replace: 'gpu-\\1'}}\n"


def address(i: int) -> str:
    return f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"


def inventories(folder: Path, nodes: int) -> dict[str, tuple[Path, str]]:
    """shape -> (inventory file, the node checked)."""
    middle = f"node{nodes // 2:05d}"
    explicit = "".join(
        f"  - {{hosts: node{i:05d}, address: {address(i)}, labels: {{rack: r{i // 40}}}}}\n"
        for i in range(1, nodes + 1)
    )
    ranges = "".join(
        f"  - {{hosts: 'node[{i:05d}-{min(i + 49, nodes):05d}]', labels: {{rack: r{i // 50}}}}}\n"
        for i in range(1, nodes + 1, 50)
    )
    texts = {
        "one": f"  - {{hosts: {middle}}}\n",
        "explicit": explicit,
        "explicit-slurm": explicit,
        "ranges": ranges,
        "hostlist": f"  - {{hosts: 'node[00001-{nodes:05d}]'}}\n",
    }
    found = {}
    for shape, entries in texts.items():
        path = folder / f"{shape}.yaml"
        path.write_text(HEAD + entries + TAIL + (RULE if shape == "explicit-slurm" else ""))
        found[shape] = (path, middle)
    return found


def one_check(inventory: Path, node: str, by_slurm: bool, env: dict[str, str]) -> dict[str, Any]:
    named = [] if by_slurm else ["--node", node]
    argv = [sys.executable, "-c", WRAPPER, "check", "--local", "--inventory", str(inventory), *named]
    run_env = {**env, "SLURMD_NODENAME": node.replace("node", "gpu-")} if by_slurm else env
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=run_env)
    wall = time.perf_counter() - started
    own = [line.split()[1] for line in done.stderr.splitlines() if line.startswith("SELF_MAXRSS_KB ")]
    return {
        "wall_s": round(wall, 4),
        "exit": done.returncode,
        "line": done.stdout.strip()[:200],
        "self_maxrss_mb": round(int(own[-1]) / 1024, 1) if own else None,
        "stderr_tail": done.stderr.strip()[-400:] if done.returncode not in (0, 1) else "",
    }


def measure(shape: str, path: Path, node: str, runs: int, env: dict[str, str]) -> dict[str, Any]:
    results = [one_check(path, node, shape.endswith("-slurm"), env) for _ in range(runs)]
    walls = [float(r["wall_s"]) for r in results]
    rss = [float(r["self_maxrss_mb"]) for r in results if r["self_maxrss_mb"] is not None]
    return {
        "file_mb": round(path.stat().st_size / 2**20, 2),
        "wall_p50_s": round(statistics.median(walls), 3),
        "wall_max_s": round(max(walls), 3),
        "self_maxrss_mb": max(rss) if rss else None,
        "exits": sorted({int(r["exit"]) for r in results}),
        "runs": results,
    }


def ratios(got: dict[str, Any], base: dict[str, Any]) -> str:
    """The shape's wall time and own peak RSS, each against its target and against the one-node inventory."""
    wall, base_wall = float(got["wall_p50_s"]), float(base["wall_p50_s"])
    said = f"wall p50 {wall:.3f} s ({wall / WALL_TARGET_S:.2f} of target, {wall / base_wall:.2f}x one node)"
    rss, base_rss = got["self_maxrss_mb"], base["self_maxrss_mb"]
    if rss is None or base_rss is None:
        return f"{said}, own RSS unknown"
    rss_mb, base_mb = float(rss), float(base_rss)
    return f"{said}, own RSS {rss_mb} MB ({rss_mb / RSS_TARGET_MB:.2f} of target, {rss_mb / base_mb:.2f}x one node)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-check-local-inventory"))
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="ca-inventory-"))
    env = {
        **os.environ,
        "XDG_RUNTIME_DIR": str(folder / "runtime"),  # the check's import cache: its own, not the machine's
        "CLUSTER_ACCEPT_STATE_DIR": str(folder / "state"),  # its marks, likewise
    }
    try:
        found = {
            shape: measure(shape, path, node, args.runs, env)
            for shape, (path, node) in inventories(folder, args.nodes).items()
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    base = found["one"]
    print(
        f"{args.nodes} nodes, {args.runs} runs each; targets: wall <= {WALL_TARGET_S} s, own RSS <= {RSS_TARGET_MB} MB"
    )
    for shape, got in found.items():
        print(f"{shape:>15}: {got['file_mb']:>6} MB file, {ratios(got, base)}, exits {got['exits']}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "check_local_inventory.json").write_text(
        json.dumps({"nodes": args.nodes, "shapes": found}, indent=1) + "\n"
    )
    failed = [shape for shape, got in found.items() if not set(got["exits"]) <= {0, 1}]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
