"""``cluster-accept check --local`` as a Slurm Prolog sees it: wall time and peak memory over repeated runs on
this machine, with ``nvidia-smi``'s own time beside (the floor any GPU node check pays).

Targets (issue: a node checks itself at every job start): p50 wall about 1 s, p95 wall <= 2 s, the tool's own
peak RSS <= 150 MB; ``cluster-accept --help`` <= 0.5 s. The node-side commands the check runs (nvidia-smi, the
probe interpreter's torch import ...) are children: their peak is reported apart. The first check of a boot
starts CUDA in the probe interpreter and keeps the answer; the timed runs after it take it (as every job's prolog
after the first does); three ``--fresh`` runs show the cost of starting it every time. The tool's own start is
shown apart: the seconds ``python -X importtime`` counts for the check's imports and for ``--help``'s (medians of
five). Prints each figure and its ratio to its target; writes ``check_local.json`` to --out.

    python3 bench/check_local.py [--runs 20] [--inventory FILE] [--out DIR]

Without --inventory, a one-node inventory of this machine is written to a temporary directory: on ``profile:
auto`` (the GPU model picks the built-in profile, as a site inventory would), or, on a machine without
``nvidia-smi``, on a profile whose probes run on the CPU (the check then fails, exit 1, and what is timed is the
tool and the commands it runs). The runs use compiled bytecode as an installed tool does
(``PYTHONDONTWRITEBYTECODE`` is dropped from their environment; the first check writes it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WALL_TARGET_S = 2.0  # p95: a Prolog's budget
WARM_TARGET_S = 1.0  # p50: the node's own check in about a second
HELP_TARGET_S = 0.5
RSS_TARGET_MB = 150.0
# Runs the real CLI's main and reports its own peak RSS (not its children's) on stderr as it exits.
WRAPPER = (
    "import atexit, resource, sys\n"
    "atexit.register(lambda: sys.stderr.write("
    "f'\\nSELF_MAXRSS_KB {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\\n'))\n"
    "sys.argv = ['cluster-accept', *sys.argv[1:]]\n"
    "from cluster_accept.flows.cli import main\n"
    "main()\n"
)
AUTO_INVENTORY = "cluster: bench\ndefaults: {profile: auto}\nnodes: [{hosts: this, address: local}]\n"
CPU_INVENTORY = (
    "cluster: bench\ndefaults: {profile: cpu}\nnodes: [{hosts: this, address: local}]\n"
    "profiles: {cpu: {probes: {device: cpu}}}\n"
)
# A runtime directory of the bench's own: the first check finds no kept CUDA start (cold), the others find it.
# Bytecode is written and read as an installed tool's is.
ENV = {
    **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
    "XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="ca-check-runtime-"),
}
_IMPORT_LINE = re.compile(r"import time:\s+\d+ \|\s+(\d+) \| \S")


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def one_check(inventory: Path, *extra: str) -> dict[str, object]:
    argv = [sys.executable, "-c", WRAPPER, "check", "--local", "--inventory", str(inventory), *extra]
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=ENV)
    wall = time.perf_counter() - started
    own = [line.split()[1] for line in done.stderr.splitlines() if line.startswith("SELF_MAXRSS_KB ")]
    return {
        "wall_s": round(wall, 4),
        "exit": done.returncode,
        "line": done.stdout.strip(),
        "self_maxrss_mb": round(int(own[-1]) / 1024, 1) if own else None,
        "stderr_tail": done.stderr.strip()[-400:] if done.returncode not in (0, 1) else "",
    }


def help_times(runs: int) -> dict[str, float]:
    """``cluster-accept --help``'s wall time, p50 and p95, and its ratio to :data:`HELP_TARGET_S`."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", WRAPPER, "--help"], capture_output=True, timeout=60, env=ENV, check=True)
        times.append(time.perf_counter() - started)
    p50 = statistics.median(times)
    return {"p50_s": round(p50, 4), "p95_s": round(p95(times), 4), "p50_ratio_to_target": round(p50 / HELP_TARGET_S, 3)}


def import_seconds(*args: str, runs: int = 5) -> float:
    """The median over ``runs`` of the seconds ``python -X importtime`` counts for ``cluster-accept ARGS``: the
    imports of the tool's own start (each top-level import's cumulative time; its own overhead included)."""
    totals = []
    for _ in range(runs):
        argv = [sys.executable, "-X", "importtime", "-c", WRAPPER, *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=ENV)
        found = (_IMPORT_LINE.match(line) for line in done.stderr.splitlines())  # top-level imports only
        totals.append(sum(int(m[1]) for m in found if m is not None) / 1e6)
    return round(statistics.median(totals), 4)


def nvidia_smi_times(runs: int) -> dict[str, float] | None:
    """``nvidia-smi -q``'s wall time (the full query the GPU checks read), p50 and p95; None without it."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        try:
            subprocess.run(["nvidia-smi", "-q"], capture_output=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        times.append(time.perf_counter() - started)
    return {"p50_s": round(statistics.median(times), 4), "p95_s": round(p95(times), 4)}


def command_times(inventory: Path) -> dict[str, float]:
    """Each preflight command of this node run alone, slowest first: where a check's time goes."""
    from cluster_accept.checks.base import discover
    from cluster_accept.inventory.load import as_local
    from cluster_accept.probes.base import load_checked_inventory
    from cluster_accept.remote.session import LocalSession
    from cluster_accept.tasks.preflight.check_batch import commands_for

    node = as_local(load_checked_inventory(inventory)).nodes[0]
    session = LocalSession(node)
    times = {}
    for command in commands_for(discover(), node):
        started = time.perf_counter()
        session.run_batch([command], 120.0)
        times[command.name] = round(time.perf_counter() - started, 3)
    return dict(sorted(times.items(), key=lambda item: -item[1]))


def children_peak_mb() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)


def this_machine() -> Path:
    """A one-node inventory of this machine (module docstring): ``profile: auto``, or probes on the CPU where
    there is no ``nvidia-smi``."""
    inventory = Path(tempfile.mkdtemp(prefix="ca-check-")) / "inventory.yaml"
    inventory.write_text(AUTO_INVENTORY if shutil.which("nvidia-smi") else CPU_INVENTORY)
    return inventory


def summarize(
    runs: list[dict[str, object]], cold: dict[str, object], fresh: list[dict[str, object]]
) -> dict[str, object]:
    """The warm checks' wall p50 and p95, the first check of the boot's and the ``--fresh`` ones', the tool's own
    peak RSS; each with its ratio to its target."""
    walls = [float(r["wall_s"]) for r in runs]  # type: ignore[arg-type]
    rss = [float(r["self_maxrss_mb"]) for r in runs if r["self_maxrss_mb"] is not None]  # type: ignore[arg-type]
    p50 = statistics.median(walls)
    return {
        "runs": len(runs),
        "wall_p50_s": round(p50, 4),
        "wall_p50_ratio_to_target": round(p50 / WARM_TARGET_S, 3),
        "wall_p95_s": round(p95(walls), 4),
        "wall_p95_ratio_to_target": round(p95(walls) / WALL_TARGET_S, 3),
        "first_check_of_boot_wall_s": cold["wall_s"],
        "first_check_ratio_to_warm_p50": round(float(cold["wall_s"]) / p50, 2),  # type: ignore[arg-type]
        "fresh_wall_s": [r["wall_s"] for r in fresh],
        "self_maxrss_mb_max": max(rss) if rss else None,
        "self_maxrss_ratio_to_target": round(max(rss) / RSS_TARGET_MB, 3) if rss else None,
        "exits": sorted({int(r["exit"]) for r in runs}),  # type: ignore[call-overload]
        "lines": sorted({str(r["line"]) for r in runs}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--inventory", type=Path)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-check-local"))
    args = parser.parse_args()
    inventory = args.inventory or this_machine()
    cold = one_check(inventory)  # the boot's first check: the probe interpreter starts CUDA, and keeps the answer
    results = [one_check(inventory) for _ in range(args.runs)]
    fresh = [one_check(inventory, "--fresh") for _ in range(3)]  # CUDA started every time
    summary = summarize(results, cold, fresh)
    summary["children_maxrss_mb"] = children_peak_mb()
    summary["help"] = help_times(args.runs)
    check_args = ("check", "--local", "--inventory", str(inventory))
    summary["import_s"] = {"check": import_seconds(*check_args), "help": import_seconds("--help")}
    summary["nvidia_smi_q"] = nvidia_smi_times(args.runs)
    summary["command_alone_s"] = command_times(inventory)
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"summary": summary, "runs": results, "cold": cold, "fresh": fresh}
    (args.out / "check_local.json").write_text(json.dumps(data, indent=1) + "\n")
    for key, value in summary.items():
        print(f"{key}: {value}")
    bad = [r for r in results if r["exit"] not in (0, 1)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
