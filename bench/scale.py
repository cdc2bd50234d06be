"""Scale: a preflight run on N = 64, 128, 256 test-bed nodes, 10% of them faulty.

For each N, on the first N nodes of one test-bed (real sshd per node in network namespaces), prints:

- the fan-out ratio: our SSH fan-out of three commands against ``xargs -P64 ssh`` on the same healthy nodes
  (target <= 1.2);
- the real CLI's wall time (``cluster-accept run --stages preflight``: Prefect, Parquet, report), its
  stages' wall times from ``run.json``, and the controller's peak memory (max RSS of the CLI process);
- the same preflight without Prefect (a plain thread pool calling the same per-node function, the same
  evaluation and Parquet writes) and Prefect's share: ``1 - bare / cli`` (target <= 20%). This charges
  Prefect with the interpreter's start and imports too, so it errs against us.

With ``--server`` the CLI runs against a Prefect server started once by this script (``PREFECT_API_URL``,
as a team running scheduled checks would have) instead of starting Prefect's ephemeral API every run.

Needs root. ``python3 bench/scale.py [--sizes 64,128,256] [--faulty-pct 10] [--server]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pandas as pd  # noqa: E402

from bench.fanout import baseline, ours_subset  # noqa: E402
from cluster_accept.analysis.schemas import CHECKS, NODE_VALUES, write_table  # noqa: E402
from cluster_accept.checks.base import discover  # noqa: E402
from cluster_accept.inventory.hostlist import fold  # noqa: E402
from cluster_accept.inventory.load import load_inventory, select_nodes  # noqa: E402
from cluster_accept.tasks.preflight.check_batch import run_preflight_on_node  # noqa: E402
from cluster_accept.tasks.preflight.stage import evaluate_preflight, node_values  # noqa: E402
from cluster_accept.testbed.bed import down, node_names, up  # noqa: E402
from cluster_accept.testbed.faults import fault_plan_from_data  # noqa: E402

STATE = Path("/tmp/cluster-accept-bench-scale")
PREFIX = "cabs"
SUBNET = "10.253.16.0/22"
CONCURRENCY = 64
FAULTS = [
    "down",
    "gpu_missing",
    {"persistence_disabled": {"gpu": 0}},
    {"pcie_width": {"gpu": 1, "width": 8}},
    "nvidia_smi_fail",
    {"nvlink_inactive": {"gpu": 2, "link": 5}},
    {"xid": {"code": 79, "gpu": 0}},
    "garbage",
]


def cli_run(
    inventory: Path, nodes: str, out: str, env: dict[str, str] | None = None
) -> tuple[float, int, dict[str, float], pd.DataFrame, int]:
    """(wall s, exit code, stage seconds, verdicts, peak RSS in MiB) of one real CLI preflight run."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        ["cluster-accept", "run", "--inventory", str(inventory), "--nodes", nodes, "--out", out]
        + ["--stages", "preflight", "--history", "-", "--concurrency", str(CONCURRENCY)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise SystemExit(
            f"cli run failed ({proc.returncode}): {proc.stderr.read().decode()[-3000:] if proc.stderr else ''}"
        )
    run_dir = next(p for p in Path(out).iterdir() if p.is_dir() and p.name != "history")
    stages = json.loads((run_dir / "run.json").read_text()).get("stage_seconds", {})
    return wall, proc.returncode, stages, pd.read_parquet(run_dir / "verdicts.parquet"), usage.ru_maxrss // 1024


def bare_run(inventory_path: Path, nodes: str, out: Path) -> float:
    """The same preflight with no Prefect: thread pool, the same per-node function, evaluation, Parquet."""
    started = time.perf_counter()
    inventory = select_nodes(load_inventory(inventory_path), nodes)
    checks = discover()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        outcomes = list(pool.map(lambda node: run_preflight_on_node(node, checks), inventory.tested))
    rows = evaluate_preflight("bare", inventory, outcomes, checks)
    write_table(out / "checks.parquet", rows, CHECKS)
    write_table(out / "node_values.parquet", node_values("bare", inventory.cluster, outcomes, checks), NODE_VALUES)
    return time.perf_counter() - started


def prefect_server(home: Path) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """A Prefect server on a free local port, its database under ``home``; the env that points at it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{env['PREFECT_API_URL']}/health", timeout=2).read()
            return server, env
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the Prefect server did not start") from None
            time.sleep(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,128,256")
    parser.add_argument("--faulty-pct", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3, help="fan-out ratio: median of this many runs")
    parser.add_argument("--server", action="store_true", help="run against a Prefect server, not the ephemeral API")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    names = node_names(max(sizes))
    step = max(1, round(100 / args.faulty_pct))
    faulty = names[step // 2 :: step]  # every 10th node: each prefix of the test-bed is 10% faulty
    plan = fault_plan_from_data({"nodes": {name: [FAULTS[i % len(FAULTS)]] for i, name in enumerate(faulty)}})
    print(
        f"{'N':>4} {'faulty':>6} {'ours_s':>7} {'xargs_s':>8} {'ratio':>6} {'cli_s':>7} {'preflight_s':>11} "
        f"{'bare_s':>7} {'prefect':>8} {'peak_MiB':>9} {'not_accepted':>12}"
    )
    server, env = None, None
    home = tempfile.TemporaryDirectory()
    try:
        if args.server:
            server, env = prefect_server(Path(home.name))
            print(f"# against a Prefect server: {env['PREFECT_API_URL']}", flush=True)
        began = time.perf_counter()
        bed = up(max(sizes), plan, state_dir=STATE, prefix=PREFIX, subnet=SUBNET)
        print(f"# test-bed of {max(sizes)} nodes up in {time.perf_counter() - began:.1f} s", flush=True)
        for n in sizes:
            subset = names[:n]
            healthy = [x for x in subset if x not in set(faulty)]
            ours, base = [], []
            for _ in range(args.repeats):
                ours.append(ours_subset(bed.inventory_path, healthy, CONCURRENCY))
                base.append(
                    baseline([bed.nodes[x] for x in healthy], bed.identity_file, bed.known_hosts_path, CONCURRENCY)
                )
            o, b = statistics.median(ours), statistics.median(base)
            expression = fold(subset)
            with tempfile.TemporaryDirectory() as out:
                wall, _, stages, verdicts, peak = cli_run(bed.inventory_path, expression, out, env)
            with tempfile.TemporaryDirectory() as out:
                bare = bare_run(bed.inventory_path, expression, Path(out))
            not_accepted = int((verdicts.verdict != "accepted").sum())
            expected = len([x for x in subset if x in set(faulty)])
            surprises = verdicts[(verdicts.verdict != "accepted") != verdicts.node.isin(faulty)]
            for row in surprises.itertuples():  # a healthy node not accepted, or a faulty one accepted
                print(f"# unexpected: {row.node} {row.verdict} {list(row.reasons)}", flush=True)
            print(
                f"{n:>4} {expected:>6} {o:>7.2f} {b:>8.2f} {o / b:>6.2f} {wall:>7.1f} "
                f"{stages.get('preflight', 0):>11.1f} {bare:>7.1f} {1 - bare / wall:>7.0%} {peak:>9} "
                f"{not_accepted:>12}",
                flush=True,
            )
    finally:
        down(STATE, PREFIX)
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
        home.cleanup()


if __name__ == "__main__":
    main()
