"""The HGX checks on a lent GPU machine, without Prefect: what each new preflight check's command prints there
(kept as fixtures), the node's own check on ``profile: auto`` (no false rejection on a healthy machine), and the
burn's thermal gate on a real burn of every GPU at once (the spread between the GPUs under load, to calibrate
``burn.temp_spread_max_c`` and ``burn.temp_above_median_max_c``).

    python3 bench/hgx_checks.py --out DIR [--burn-seconds 180]

Writes ``DIR/commands/<check>.txt`` (each command's stdout), ``DIR/check_local.json`` (every row of the node's
check) and ``DIR/burn.json`` (each GPU's late-part temperature, the spread, the thermal rows).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cluster_accept.checks.base import discover  # noqa: E402
from cluster_accept.flows.node_check import check_node  # noqa: E402
from cluster_accept.inventory.burn_settings import BurnSettings  # noqa: E402
from cluster_accept.inventory.model import Profile  # noqa: E402
from cluster_accept.probes import burn  # noqa: E402
from cluster_accept.probes.base import load_checked_inventory  # noqa: E402
from cluster_accept.probes.burn import judge  # noqa: E402

NEW_CHECKS = ("nvswitch", "firmware", "pcie_aer", "xid", "ib_counters", "nvlink")
INVENTORY = "cluster: lent\ndefaults: {profile: auto}\nnodes: [{hosts: lent, address: local}]\n"


def commands(out: Path) -> None:
    folder = out / "commands"
    folder.mkdir(parents=True, exist_ok=True)
    for check in discover():
        if check.name in NEW_CHECKS:
            done = subprocess.run(["sh", "-c", check.command], capture_output=True, text=True, timeout=120)
            said = done.stdout + (f"\n[stderr]\n{done.stderr}" if done.stderr else "")
            (folder / f"{check.name}.txt").write_text(said)
            print(f"{check.name}: exit {done.returncode}, {len(done.stdout)} bytes", flush=True)


def node_check(out: Path) -> None:
    path = Path(tempfile.mkdtemp(prefix="hgx-")) / "inventory.yaml"
    path.write_text(INVENTORY)
    found = check_node(load_checked_inventory(path), "lent", "hgx-bench", fresh=True)
    rows = [
        {"check": r.check, "item": r.item, "status": r.status.value, "reason": r.reason, "observed": r.observed,
         "expected": r.expected, "detail": r.detail[:300]}
        for r in found.rows
    ]  # fmt: skip
    (out / "check_local.json").write_text(json.dumps({"line": found.reason_line, "rows": rows}, indent=1) + "\n")
    print("check --local:", found.reason_line)
    for r in rows:
        if r["check"] in NEW_CHECKS:
            print(f"  {r['check']:<12} {r['item']:<28} {r['status']:<5} {r['reason']:<18} {r['observed']}")


def burn_run(out: Path, seconds: int) -> None:
    """The node-side burn on every GPU at once (the script the burn stage ships), then the thermal gate on it."""
    work = Path(tempfile.mkdtemp(prefix="hgx-burn-"))
    for script in (ROOT / "cluster_accept/probes/burn/node/burn.py", ROOT / "cluster_accept/probes/node/gpu_bench.py"):
        (work / script.name).write_text(script.read_text())
    started = time.time()
    done = subprocess.run([sys.executable, "burn.py", "--seconds", str(seconds), "--sample-s", "1"], cwd=work,
                          capture_output=True, text=True, timeout=seconds + 600)  # fmt: skip
    (out / f"burn-{seconds}s.txt").write_text(done.stdout)
    output = burn.parse(done.stdout)
    windows, samples = burn.series(output)
    burns = judge.summarise(windows, samples, float(seconds), burn.unit_of(output))
    temps = {b.gpu: b.late_temp_c for b in burns}
    rows = burn.inspect(output, Profile(burn=BurnSettings(minutes=seconds / 60)))
    known = [t for t in temps.values() if t is not None]
    median = statistics.median(known) if known else None
    summary = {
        "seconds": seconds,
        "wall_s": round(time.time() - started, 1),
        "exit": done.returncode,
        "late_temp_c": temps,
        "temp_max_c": {b.gpu: b.temp_max_c for b in burns},
        "spread_c": round(max(known) - min(known), 2) if len(known) > 1 else None,
        "above_median_c": {g: round(t - median, 2) for g, t in temps.items() if t is not None and median is not None},
        "rows": [(r.item, r.status.value, r.reason, r.observed) for r in rows],
    }
    (out / "burn.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    for key, value in summary.items():
        print(f"{key}: {value}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--burn-seconds", type=int, default=180)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    commands(args.out)
    node_check(args.out)
    if args.burn_seconds:
        burn_run(args.out, args.burn_seconds)


if __name__ == "__main__":
    main()
