"""Scale on simulated nodes: the real CLI (Prefect, checks, probes, evaluation, Parquet, report) on N = 1,024,
4,096, … in-process nodes answering from a recording of real test-bed nodes (:mod:`simulator.nodes`).

For each N (5 % of the nodes faulty, every recorded preflight fault and ``slow`` in turn; answers after a
log-normal latency around 20 ms), one ``cluster-accept run --stages preflight,single-node,multi-node`` in a child
process, and:

- wall time per stage (``run.json``), the whole run's wall time;
- the controller's CPU seconds and peak memory (the child's rusage), each per node;
- Prefect's "Subscription queue is full" warnings (the events it dropped);
- Prefect's share: the same preflight without Prefect (a thread pool, the same per-node function, the same
  evaluation and Parquet, :func:`bench.scale.bare_run`) against the CLI's preflight stage;
- the Parquet files' and the report's sizes, and the report's load time in headless Chromium;
- how each per-node figure grows from the smallest N to the largest (1.0: linear in N);
- isolation at N: two more runs of the multi-node stage alone, one with 1 ``slow`` node and one with 1 % of the
  nodes ``slow`` (spread evenly): the rounds isolation took, the groups it ran, the slow nodes it named of those
  planted, and the wall time (``--no-isolation`` leaves them out).

``python3 bench/sim_scale.py [--sizes 1024,4096] [--faulty-pct 5] [--stages preflight,single-node,multi-node]
[--no-isolation | --isolation-only] [--out bench/results/sim-scale]``

(``--isolation-only`` keeps the whole runs already saved in ``--out``: the two can run at different times.)
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402
import yaml  # noqa: E402

from cluster_accept.simulator.nodes import Recording  # noqa: E402
from cluster_accept.testbed.profile import base_profile  # noqa: E402

RECORDING = ROOT / "bench" / "sim" / "testbed-h200x4.json"
# Preflight faults and slow nodes; a variant that breaks multi-node runs (net_stalled) is left out: one hung
# collective fails every node of its sweep group, as it does on a real cluster.
FAULTS = ["gpu_missing", "driver_version", "nvlink_inactive", "nvlink_errors", "pcie_width",
          "persistence_disabled", "xid", "nvidia_smi_fail", "slow"]  # fmt: skip
STAGES = "preflight,single-node,multi-node"
# The test-bed's profile, but a group at half the others' bus bandwidth is slow (the test-bed's own 90 % is for
# CPU figures measured on shared cores; simulated figures spread by spread_pct only).
STRAGGLER_PCT = 25
# What Prefect prints when its in-memory event subscription queue (10,000 events) overflows: events dropped.
QUEUE_FULL = "Subscription queue is full"


def names_of(nodes: int) -> list[str]:
    width = max(4, len(str(nodes)))
    return [f"gpu{i:0{width}d}" for i in range(1, nodes + 1)]


def inventory(path: Path, nodes: int, faulty_pct: float, faults: dict[str, str] | None = None) -> Path:
    """A simulated cluster of ``nodes``: ``faulty_pct`` of them faulty (every fault in turn), or ``faults``."""
    width = max(4, len(str(nodes)))
    names = names_of(nodes)
    step = max(1, round(100 / faulty_pct)) if faulty_pct else 0
    if faults is None:
        faults = {name: FAULTS[k % len(FAULTS)] for k, name in enumerate(names[::step])} if step else {}
    profile = base_profile("h200x4", python=Recording.load(RECORDING).python)
    profile["thresholds"]["straggler_pct"] = STRAGGLER_PCT
    # Every node probed at once, as on a cluster: the test-bed's one node at a time is for nodes that share
    # this machine's cores, and would make single-node's wall time the sum of every node's probes.
    del profile["probes"]["max_parallel_nodes"]
    data = {
        "cluster": f"sim{nodes}",
        "defaults": {"profile": "testbed-h200x4"},
        "nodes": [{"hosts": f"gpu[{1:0{width}d}-{nodes:0{width}d}]"}],
        "simulation": {"recording": str(RECORDING), "faults": faults, "latency_ms": 20, "spread_pct": 2},
        "profiles": {"testbed-h200x4": profile},
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cli_run(inv: Path, out: Path, stages: str = STAGES) -> dict[str, float]:
    """The CLI in a child process: wall, CPU seconds and peak RSS from its rusage."""
    started = time.perf_counter()
    argv = [sys.executable, "-m", "cluster_accept.flows.cli", "run", "--inventory", str(inv), "--out", str(out),
            "--stages", stages, "--history", "-"]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    said = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise SystemExit(f"the run failed: {said.decode(errors='replace')[-3000:]}")
    flooded = said.decode(errors="replace").count(QUEUE_FULL)
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_mib": usage.ru_maxrss / 1024,
            "queue_full": flooded}  # fmt: skip


def bare_preflight(inv: Path, out: Path) -> float:
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); from pathlib import Path; from bench.scale import bare_run; "
        f"print(bare_run(Path({str(inv)!r}), None, Path({str(out)!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def render_s(report: Path) -> float | None:
    if not Path("/usr/bin/chromium").exists():
        return None
    from tests.browser import load_page

    started = time.perf_counter()
    load_page(report, timeout_s=300)
    return time.perf_counter() - started


def isolation_run(nodes: int, bad: int, work: Path) -> dict[str, object]:
    """The multi-node stage alone on ``nodes`` with ``bad`` slow nodes spread evenly: rounds, groups, found."""
    names = names_of(nodes)
    planted = {names[(2 * k + 1) * nodes // (2 * bad)]: "slow" for k in range(bad)}
    inv = inventory(work / f"inventory-{nodes}-{bad}slow.yaml", nodes, 0, planted)
    out = work / f"runs-{nodes}-{bad}slow"
    figures: dict[str, object] = {"nodes": nodes, "bad": bad, **cli_run(inv, out, "multi-node")}
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    stage_s = json.loads((run_dir / "run.json").read_text()).get("stage_seconds", {})
    rounds = pd.read_parquet(run_dir / "isolation.parquet")
    verdicts = pd.read_parquet(run_dir / "verdicts.parquet")
    named = {r.node for r in verdicts.itertuples() if "isolation:slow_node" in list(r.reasons)}
    figures.update(
        multi_node_s=float(stage_s.get("multi-node", 0.0)),
        rounds=int(rounds["round"].nunique()) if len(rounds) else 0,
        groups=len(rounds),
        found=len(named & set(planted)),
        wrongly_named=sorted(named - set(planted)),
        rejected=int((verdicts.verdict != "accepted").sum()),
    )
    return figures


def measure(nodes: int, faulty_pct: float, work: Path, stages: str = STAGES) -> dict[str, object]:
    inv = inventory(work / f"inventory-{nodes}.yaml", nodes, faulty_pct)
    out = work / f"runs-{nodes}"
    figures: dict[str, object] = {"nodes": nodes, **cli_run(inv, out, stages)}
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    info = json.loads((run_dir / "run.json").read_text())
    figures["stage_s"] = info.get("stage_seconds", {})
    bare_dir = work / f"bare-{nodes}"
    bare_dir.mkdir()
    figures["bare_preflight_s"] = bare_preflight(inv, bare_dir)
    preflight = float(info.get("stage_seconds", {}).get("preflight", 0.0))
    figures["prefect_share"] = 1 - figures["bare_preflight_s"] / preflight if preflight else None  # type: ignore[operator]
    figures["parquet_mib"] = {p.name: p.stat().st_size / 2**20 for p in sorted(run_dir.glob("*.parquet"))}
    report = run_dir / "report.html"
    figures["report_mib"] = report.stat().st_size / 2**20
    figures["render_s"] = render_s(report)
    verdicts = json.loads((run_dir / "summary.json").read_text())["counts"]
    figures["verdicts"] = verdicts
    return figures


def table(results: list[dict[str, object]]) -> str:
    head = ("| nodes | wall s | preflight s | single-node s | multi-node s | CPU ms/node | peak MiB | KiB/node "
            "| Prefect share | queue full | Parquet MiB | report MiB | render s | rejected |")  # fmt: skip
    lines = [head, "|" + "---|" * 14]
    for r in results:
        n = int(r["nodes"])  # type: ignore[call-overload]
        stage = r["stage_s"]
        assert isinstance(stage, dict)
        parquet = sum(r["parquet_mib"].values())  # type: ignore[attr-defined]
        share = r["prefect_share"]
        render = r["render_s"]
        lines.append(
            f"| {n:,} | {r['wall_s']:.1f} | {stage.get('preflight', 0):.1f} | {stage.get('single-node', 0):.1f} "
            f"| {stage.get('multi-node', 0):.1f} "
            f"| {1000 * r['cpu_s'] / n:.1f} | {r['peak_mib']:.0f} | {1024 * r['peak_mib'] / n:.1f} "  # type: ignore[operator]
            f"| {'-' if share is None else f'{share:.0%}'} | {r.get('queue_full', '-')} "
            f"| {parquet:.1f} | {r['report_mib']:.1f} "
            f"| {'-' if render is None else f'{render:.1f}'} | {r['verdicts']['rejected']} |"  # type: ignore[index]
        )
    return "\n".join(lines)


def isolation_table(runs: list[dict[str, object]]) -> str:
    head = "| nodes | slow | isolation rounds | groups run | named of planted | wrongly named | multi-node s | wall s |"
    lines = [head, "|" + "---|" * 8]
    for r in runs:
        wrong = r["wrongly_named"]
        assert isinstance(wrong, list)
        lines.append(
            f"| {int(r['nodes']):,} | {r['bad']} | {r['rounds']} | {r['groups']} | {r['found']} of {r['bad']} "  # type: ignore[call-overload]
            f"| {', '.join(wrong) or '-'} | {r['multi_node_s']:.1f} | {r['wall_s']:.1f} |"
        )
    return "\n".join(lines)


def growth(results: list[dict[str, object]]) -> str:
    """Each step's growth per node (1.0: the per-node cost stays the same; above 1: it grows with N)."""
    lines = []
    for first, last in itertools.pairwise(results):
        grow = int(last["nodes"]) / int(first["nodes"])  # type: ignore[call-overload]
        ratios = {key: (last[key] / first[key]) / grow for key in ("cpu_s", "wall_s", "peak_mib")}  # type: ignore[operator]
        span = f"{first['nodes']:,} to {last['nodes']:,} nodes"
        lines.append(
            f"per-node growth from {span} (1.0 = linear): CPU {ratios['cpu_s']:.2f}, wall {ratios['wall_s']:.2f}, "
            f"peak memory {ratios['peak_mib']:.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,4096")
    parser.add_argument("--faulty-pct", type=float, default=5.0)
    parser.add_argument("--stages", default=STAGES)
    parser.add_argument("--no-isolation", action="store_true", help="no runs with 1 and 1 %% slow nodes")
    parser.add_argument(
        "--isolation-only", action="store_true", help="only the isolation runs, added to the whole runs saved in --out"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "sim-scale")
    args = parser.parse_args()
    saved = args.out / "results.json"
    results: list[dict[str, object]] = json.loads(saved.read_text())["runs"] if args.isolation_only else []
    isolation: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="sim-scale-") as work:
        for nodes in [int(s) for s in args.sizes.split(",")]:
            if not args.isolation_only:
                results.append(measure(nodes, args.faulty_pct, Path(work), args.stages))
                print(table(results[-1:]).splitlines()[-1], flush=True)
                save(args.out, results, isolation)  # a long run keeps every size it finished
            for bad in [] if args.no_isolation else sorted({1, max(1, math.ceil(nodes / 100))}):
                isolation.append(isolation_run(nodes, bad, Path(work)))
                print(isolation_table(isolation[-1:]).splitlines()[-1], flush=True)
                save(args.out, results, isolation)
    print(save(args.out, results, isolation))


def save(out: Path, results: list[dict[str, object]], isolation: list[dict[str, object]]) -> str:
    text = table(results) + (f"\n\n{growth(results)}" if len(results) > 1 else "")
    if isolation:
        text += "\n\nIsolation (the multi-node stage alone, slow nodes spread evenly):\n\n" + isolation_table(isolation)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(text + "\n")
    data = {"runs": results, "isolation": isolation}
    (out / "results.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    return text


if __name__ == "__main__":
    main()
