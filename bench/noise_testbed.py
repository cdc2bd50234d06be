"""Noise-aware relative verdicts on the real test-bed: healthy nodes under outside load are not rejected, a node
15 % slower is.

A 4-node test-bed (network namespaces, real sshd) on ``profile: auto`` with the default relative judgement
(``straggler_pct`` 5, ``relative_verdict`` fail, ``noise_k`` 3), and the real CLI run
``--stages preflight,single-node`` again and again:

- ``--runs`` healthy runs (default 20), the machine loaded from outside in the ``--loaded`` ones (default 5-14:
  one ``python3 -c 'while True: pass'`` in the first half of them, two in the second), started before the run
  and killed after it;
- ``--slower-runs`` quiet runs (default 5) with the fault ``slower`` (``--factor``, default 1.15) on
  ``--slower-node``: every ``torch.matmul`` of that node takes 1.15 times as long, so its GEMM figures are 13 %
  lower and nothing else changes.

Each run goes to its own ``--out`` under a scratch directory, with no history (``--history -``): every run is
judged on its own figures only, so the runs are independent samples of the peers' comparison and of the
straggler confirmation, and the history's own relative rows (a figure against the node's earlier runs, whose
noise is another one) neither add to the counts nor make them depend on the order of loaded and quiet runs.

Per run: wall time, outside load, each node's verdict, the relative rows (``*_vs_cluster``) counted by reason
(``ok``, ``straggler``, ``straggler_unconfirmed``, ``inconclusive``), every rejection with its reasons, every
relative row that is not ``ok`` with its detail, and each figure's noise (the peers' robust spread, the largest
``repeat_cv``). The same figures are judged again offline by the old fixed rule (below the peers' median less
5 %, no noise): how many rows it would have flagged as stragglers, and of those re-measured in the run, how
many stay below that line (the old rule's confirmation; a flagged figure the new rule did not re-measure has no
second figure, so its old outcome is unknown).

``python3 bench/noise_testbed.py [--runs 20] [--loaded 5-14] [--slower-runs 5] [--factor 1.15]
[--out bench/results/testbed-noise]`` (root; about 30-60 s a run on a 2-core machine). Writes to ``--out``:
``runs.json`` (everything), ``runs.csv`` (a line a run), ``table.md``, ``relative_rows.csv`` (every relative row
that is not ``ok``, with its detail), ``figures.csv`` (every judged figure) and ``noise.csv`` (per load and
metric: how far a healthy node's figure moves between runs against the noise a run's judgement sees);
``bench/noise_testbed.sh`` runs it in the background and keeps the log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from cluster_accept.analysis.noise import robust_cv  # noqa: E402
from cluster_accept.inventory.load import load_inventory  # noqa: E402
from cluster_accept.testbed import bed  # noqa: E402
from tests.prefect_server import prefect_server  # noqa: E402
from tests.processes import auto_cpu_inventory  # noqa: E402

PREFIX, SUBNET = "canb", "10.254.184.0/24"
STAGES = "preflight,single-node"
SUFFIX = "_vs_cluster"
REASONS = ("ok", "straggler", "straggler_unconfirmed", "inconclusive")
OLD_PCT = 5.0
HOG = "while True: pass"
# A figure measured again: alone, or in paired rounds beside a control node (its first round's raw figure).
AGAIN = re.compile(
    r"measured again (?:alone: |\d+ time\(s\) beside the control \S+ \(its own figure [^)]*\): )([0-9.eE+-]+)"
)


@contextlib.contextmanager
def hogs(count: int) -> Iterator[list[int]]:
    """``count`` busy loops in the root namespace for the ``with`` block: load from outside the nodes."""
    procs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(count)]
    try:
        time.sleep(1 if procs else 0)  # on the cores before the run starts
        yield [p.pid for p in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def hogs_in(run: int, loaded: Sequence[int]) -> int:
    """How many busy loops run ``run`` (1-based) has: none outside ``loaded``, one in its first half, two after."""
    if run not in loaded:
        return 0
    return 1 if loaded.index(run) < len(loaded) / 2 else 2


class RunFailed(RuntimeError):
    """A ``cluster-accept run`` that ended with neither a verdict (exit 0 or 1) nor one run directory."""


def cli_run(inventory: Path, out: Path, env: dict[str, str]) -> tuple[float, int, Path, str]:
    """(wall s, exit code, run directory, the end of stderr) of one ``cluster-accept run``."""
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "cluster_accept.flows.cli", "run", "--inventory", str(inventory), "--out", str(out)]
        + ["--stages", STAGES, "--history", "-"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800, check=False,
    )  # fmt: skip
    wall = time.perf_counter() - started
    runs = [p for p in out.iterdir() if p.is_dir() and p.name != "history"] if out.exists() else []
    if proc.returncode not in (0, 1) or len(runs) != 1:
        raise RunFailed(f"cluster-accept run failed ({proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return wall, proc.returncode, runs[0], proc.stderr[-2000:]


def relative_rows(checks: pd.DataFrame) -> pd.DataFrame:
    """The rows judging a figure against its peers' median (``*_vs_cluster``)."""
    return checks[checks["item"].astype(str).str.endswith(SUFFIX)]


def judged_figures(measurements: pd.DataFrame, metrics: set[str]) -> pd.DataFrame:
    """The stage's own figures the relative rows judged (not those of a run made again without a suspect), a
    swept figure at its largest size only, as the judgement reads them."""
    df = measurements[(measurements["stage"] == "single-node") & measurements["metric"].isin(sorted(metrics))]
    swept = df["metric"].astype(str).str.endswith("_busbw_gbps")
    top = df[swept].groupby(["node", "metric"])["size"].transform("max")
    return pd.concat([df[~swept], df[swept][df[swept]["size"] == top]])


def old_rule(figures: pd.DataFrame, straggler_pct: float = OLD_PCT) -> pd.DataFrame:
    """The old fixed rule over one run's figures: below the peers' median (same profile and metric) less
    ``straggler_pct``, whatever the noise. Returns the flagged figures with their median and shortfall."""
    if figures.empty:
        return figures.assign(median=[], shortfall_pct=[])
    keys = ["profile", "metric"] if "profile" in figures.columns else ["metric"]
    median = figures.groupby(keys)["value"].transform("median")
    shortfall = 100 * (median - figures["value"]) / median
    judged = figures.assign(median=median, shortfall_pct=shortfall)
    return judged[judged["shortfall_pct"] >= straggler_pct]


def old_rule_confirmed(flagged: pd.DataFrame, relative: pd.DataFrame, straggler_pct: float = OLD_PCT) -> dict[str, int]:
    """The old rule's confirmation where the run has the second figure: a flagged figure the new rule also
    re-measured (its row says ``measured again alone: X``, or the first of its paired rounds beside a control)
    stays flagged when X is still ``straggler_pct`` below the median. ``unknown``: flagged figures nobody
    re-measured in this run."""
    counts = {"confirmed": 0, "cleared": 0, "unknown": 0}
    for row in _records(flagged):
        counts[old_outcome(row, relative, straggler_pct)] += 1
    return counts


def old_outcome(flagged: dict[str, Any], relative: pd.DataFrame, straggler_pct: float = OLD_PCT) -> str:
    """``confirmed``, ``cleared`` or ``unknown``: one flagged figure under the old rule's confirmation."""
    item = f"{flagged['metric']}{SUFFIX}"
    hit = relative[(relative["node"] == flagged["node"]) & (relative["item"] == item)]
    found = AGAIN.search(str(hit["detail"].iloc[0])) if not hit.empty else None
    if found is None:
        return "unknown"
    return "confirmed" if float(found.group(1)) < float(flagged["median"]) * (1 - straggler_pct / 100) else "cleared"


def figure_noise(figures: pd.DataFrame) -> dict[str, dict[str, float | None]]:
    """Per metric: the peers' robust spread and the largest ``repeat_cv``, in percent."""
    out: dict[str, dict[str, float | None]] = {}
    for metric, group in figures.groupby("metric"):
        spread = robust_cv([float(v) for v in group["value"]], "peers")
        column = group["repeat_cv"] if "repeat_cv" in group.columns else pd.Series(dtype=float)
        repeats = [float(v) for v in pd.to_numeric(column, errors="coerce").dropna()]
        out[str(metric)] = {
            "peers_cv_pct": round(100 * spread.cv, 2) if spread is not None else None,
            "max_repeat_cv_pct": round(100 * max(repeats), 2) if repeats else None,
        }
    return out


def summarise(run_dir: Path) -> dict[str, Any]:
    """One run's verdicts, relative rows by reason, rejections, non-ok relative rows, noise and old-rule counts."""
    verdicts = pd.read_parquet(run_dir / "verdicts.parquet")
    checks = pd.read_parquet(run_dir / "checks.parquet")
    relative = relative_rows(checks)
    figures = judged_figures(pd.read_parquet(run_dir / "measurements.parquet"), _metrics(relative))
    flagged = old_rule(figures)
    unusual = relative[relative["reason"] != "ok"]
    return {
        "verdicts": {str(r["node"]): str(r["verdict"]) for r in _records(verdicts)},
        "rejections": {str(r["node"]): list(r["reasons"]) for r in _records(verdicts) if r["verdict"] != "accepted"},
        "relative_rows": len(relative),
        "by_reason": {reason: int((relative["reason"] == reason).sum()) for reason in REASONS},
        "relative_fail": int((relative["status"] == "fail").sum()),
        "not_ok_rows": [_row(r) for r in _records(unusual)],
        "noise": figure_noise(figures),
        "old_rule_flagged": len(flagged),
        "old_rule_flagged_rows": [
            {
                "node": str(r["node"]),
                "metric": str(r["metric"]),
                "shortfall_pct": round(float(r["shortfall_pct"]), 1),
                "outcome": old_outcome(r, relative),
            }
            for r in _records(flagged)
        ],  # fmt: skip
        "old_rule_after_confirmation": old_rule_confirmed(flagged, relative),
        "figures": [
            {
                "node": str(r["node"]),
                "metric": str(r["metric"]),
                "value": float(r["value"]),
                "repeat_cv": None if pd.isna(r.get("repeat_cv")) else float(r["repeat_cv"]),
            }
            for r in _records(figures)
        ],  # fmt: skip
    }


def noise_summary(records: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Per load (busy loops) and metric, over the runs: how far a healthy node's figure moves between runs (its
    coefficient of variation, the median over nodes) against the noise each run's judgement could see (the peers'
    robust spread of that run, the figures' ``repeat_cv``). Faulty runs are left out."""
    rows = [{"run": r["run"], "hogs": r["hogs"], **f} for r in records if r["kind"] != "slower" for f in r["figures"]]
    out = []
    for (hogs_count, metric), group in pd.DataFrame(rows).groupby(["hogs", "metric"]):
        per_node = group.groupby("node")["value"].agg(lambda v: 100 * v.std() / v.mean())
        spreads = [robust_cv([float(v) for v in g["value"]], "peers") for _, g in group.groupby("run")]
        peers = [100 * n.cv for n in spreads if n is not None]
        repeats = group["repeat_cv"].dropna()
        out.append({
            "hogs": hogs_count, "metric": metric, "runs": group["run"].nunique(),
            "between_runs_cv_pct": round(float(per_node.median()), 1),
            "peers_cv_pct_median": round(float(pd.Series(peers).median()), 1) if peers else None,
            "peers_cv_pct_min": round(min(peers), 1) if peers else None,
            "repeat_cv_pct_median": round(100 * float(repeats.median()), 1) if len(repeats) else None,
            "repeat_cv_pct_max": round(100 * float(repeats.max()), 1) if len(repeats) else None,
        })  # fmt: skip
    return pd.DataFrame(out)


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{str(k): v for k, v in record.items()} for record in frame.to_dict("records")]


def _metrics(relative: pd.DataFrame) -> set[str]:
    return {str(item)[: -len(SUFFIX)] for item in relative["item"]}


def _row(record: dict[str, Any]) -> dict[str, Any]:
    keys = ("node", "item", "gpu", "status", "reason", "observed", "expected", "detail")
    return {k: (None if pd.isna(record.get(k)) else record.get(k)) for k in keys}


def csv_line(record: dict[str, Any]) -> dict[str, Any]:
    """One run as a flat line of ``runs.csv``."""
    old = record["old_rule_after_confirmation"]
    return {
        "run": record["run"], "kind": record["kind"], "hogs": record["hogs"], "wall_s": record["wall_s"],
        "exit": record["exit"], "load_1min_after": record["load_1min"][1],
        **{f"verdict_{n}": v for n, v in sorted(record["verdicts"].items())},
        "relative_rows": record["relative_rows"], **record["by_reason"], "relative_fail": record["relative_fail"],
        "rejected": " ".join(sorted(record["rejections"])), "old_rule_flagged": record["old_rule_flagged"],
        "old_rule_confirmed": old["confirmed"], "old_rule_cleared": old["cleared"], "old_rule_unknown": old["unknown"],
        "old_rule_rejected": " ".join(old_rejected(record)),
    }  # fmt: skip


def old_rejected(record: dict[str, Any]) -> list[str]:
    """The nodes the old rule would have rejected in a run: a flagged figure still below when measured again."""
    return sorted({r["node"] for r in record["old_rule_flagged_rows"] if r.get("outcome") == "confirmed"})


def table(records: Sequence[dict[str, Any]]) -> str:
    """The runs as a Markdown table."""
    head = (
        "| run | kind | hogs | wall s | exit | rejected | ok | straggler | unconfirmed | inconclusive | "
        "old rule flagged | old rule, re-measured still below | old rule would reject |\n|" + "---|" * 13 + "\n"
    )
    lines = []
    for r in records:
        by, old = r["by_reason"], r["old_rule_after_confirmation"]
        rejected = ", ".join(f"{n} ({'; '.join(why)})" for n, why in sorted(r["rejections"].items())) or "none"
        lines.append(
            f"| {r['run']} | {r['kind']} | {r['hogs']} | {r['wall_s']:.0f} | {r['exit']} | {rejected} | {by['ok']} | "
            f"{by['straggler']} | {by['straggler_unconfirmed']} | {by['inconclusive']} | {r['old_rule_flagged']} | "
            f"{old['confirmed']} of {old['confirmed'] + old['cleared']} | {', '.join(old_rejected(r)) or 'none'} |"
        )
    return head + "\n".join(lines) + "\n"


def write_results(out: Path, records: Sequence[dict[str, Any]], setup: dict[str, Any]) -> None:
    """``runs.json`` (everything), ``runs.csv`` (one line a run), ``relative_rows.csv`` (every relative row that is
    not ``ok``) and ``table.md``; rewritten after every run, so an interrupted bench keeps what it measured."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "runs.json").write_text(json.dumps({"setup": setup, "runs": list(records)}, indent=1) + "\n")
    pd.DataFrame([csv_line(r) for r in records]).to_csv(out / "runs.csv", index=False)
    rows = [{"run": r["run"], "kind": r["kind"], "hogs": r["hogs"], **row} for r in records for row in r["not_ok_rows"]]
    pd.DataFrame(rows, columns=["run", "kind", "hogs", "node", "item", "gpu", "status", "reason", "observed",
                                "expected", "detail"]).to_csv(out / "relative_rows.csv", index=False)  # fmt: skip
    (out / "table.md").write_text(table(records))
    figures = [{"run": r["run"], "kind": r["kind"], "hogs": r["hogs"], **f} for r in records for f in r["figures"]]
    pd.DataFrame(figures).to_csv(out / "figures.csv", index=False)
    if any(r["kind"] != "slower" for r in records):
        noise_summary(records).to_csv(out / "noise.csv", index=False)


def one_run(inventory: Path, scratch: Path, run: int, kind: str, hog_count: int, env: dict[str, str]) -> dict[str, Any]:
    """One CLI run with ``hog_count`` busy loops beside it, summarised."""
    load_before, failed = os.getloadavg()[0], []
    for attempt in range(2):  # a run that ends without a verdict is made once more, its failure kept
        try:
            with hogs(hog_count):
                wall, code, run_dir, _ = cli_run(inventory, scratch / f"run{run:02d}-{attempt}", env)
            break
        except RunFailed as exc:
            failed.append(str(exc)[-1500:])
            print(f"run {run:2d} failed (attempt {attempt + 1}): {str(exc)[-500:]}", flush=True)
            if attempt:
                raise
    record: dict[str, Any] = {"run": run, "kind": kind, "hogs": hog_count, "wall_s": round(wall, 1), "exit": code}
    record["failed_attempts"] = failed
    record["load_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]  # before, after: all load, ours too
    record.update(summarise(run_dir))
    by = record["by_reason"]
    print(
        f"run {run:2d} {kind:7s} hogs={hog_count} {wall:5.0f}s exit={code} rejected={sorted(record['rejections'])} "
        f"ok={by['ok']} straggler={by['straggler']} unconfirmed={by['straggler_unconfirmed']} "
        f"inconclusive={by['inconclusive']} old_rule={record['old_rule_flagged']}",
        flush=True,
    )
    return record


def loaded_runs(text: str) -> list[int]:
    """``5-14`` or ``5,7,9`` (1-based run numbers)."""
    found: list[int] = []
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        found += list(range(int(first), int(last or first) + 1))
    return found


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--loaded", default="5-14", help="runs with busy loops beside them (1-based)")
    parser.add_argument("--slower-runs", type=int, default=5)
    parser.add_argument("--factor", type=float, default=1.15)
    parser.add_argument("--slower-node", default="node03")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "testbed-noise")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directories here (default: deleted)")
    return parser.parse_args()


def main() -> None:
    args = _arguments()
    scratch = Path(args.keep or tempfile.mkdtemp(prefix="ca-noise-"))
    scratch.mkdir(parents=True, exist_ok=True)
    loaded, records = loaded_runs(args.loaded), []
    tb = bed.up(4, state_dir=scratch / "bed", prefix=PREFIX, subnet=SUBNET)
    try:
        inventory = auto_cpu_inventory(tb.inventory_path, scratch / "inventory.yaml", straggler_pct=5)
        setup = _setup(args, inventory, loaded)
        with prefect_server(scratch / "prefect") as env:
            for run in range(1, args.runs + 1):
                hog_count = hogs_in(run, loaded)
                records.append(one_run(inventory, scratch, run, "loaded" if hog_count else "quiet", hog_count, env))
                write_results(args.out, records, setup)
            bed.set_fault(tb, args.slower_node, [{"slower": {"factor": args.factor}}])
            for run in range(args.runs + 1, args.runs + args.slower_runs + 1):
                records.append(one_run(inventory, scratch, run, "slower", 0, env))
                write_results(args.out, records, setup)
    finally:
        bed.down(tb.state_dir, PREFIX)
        if args.keep is None:
            shutil.rmtree(scratch, ignore_errors=True)


def _setup(args: argparse.Namespace, inventory: Path, loaded: Sequence[int]) -> dict[str, Any]:
    """What the runs were: the thresholds the inventory judges by, the load and the fault."""
    profile = load_inventory(inventory).nodes[0].profile
    limits = profile.thresholds
    return {
        "nodes": 4, "stages": STAGES, "history": "none (--history -)",
        "thresholds": {"straggler_pct": limits.straggler_pct, "noise_k": limits.noise_k,
                       "relative_verdict": limits.relative_verdict},
        "loaded_runs": {str(r): hogs_in(r, loaded) for r in loaded}, "slower": {"node": args.slower_node,
        "factor": args.factor, "runs": args.slower_runs}, "machine_cores": len(os.sched_getaffinity(0)),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }  # fmt: skip


if __name__ == "__main__":
    main()
