"""What each signal costs the job's step, from bench/watch_cost.sh's logs. Per round, each variant's step time (the
slowest rank's mean step, over every log of the run: one per "node"); a signal's cost is the ratio of two variants
run in the same round (the one with the signal over the one without), so a whole round that drew a slower machine
state moves both. Per signal: the mean ratio with a 95 % interval over the rounds (Student's t), and the median
ratio with its distribution-free 95 % interval (order statistics of the rounds' ratios, the sign test's): now and
then one run of a variant shifts whole by 4–19 % on lent GPUs, whatever it is armed with, and such a run widens the
mean's interval without saying anything about the signal; the median's interval is not moved by a few of them.
Prints one line per signal; writes --json. ``--earlier`` adds the rounds of an earlier batch's JSON (the same job
and layout), numbered before these.

    python3 bench/watch_cost.py LOGS [--json FILE] [--earlier JSON ...] [--figure mean|median]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster_accept.analysis.regressions import student_t_quantile  # noqa: E402

NAME = re.compile(r"r(\d+)-([a-z_]+?)(?:-half-[a-z])?\.log$")
SIGNALS = {  # signal: (the variant with it, the same without it)
    "default arming": ("default", "off"),
    "NCCL timing (in the default)": ("default", "no_timing"),
    "Flight Recorder + worker server (the default less NCCL timing)": ("no_timing", "off"),
    "NCCL timing alone": ("timing_only", "off"),
    "RAS (NCCL's default)": ("off", "ras_off"),
    "Inspector (in place of NCCL timing)": ("inspector", "no_timing"),
    "the watch's reads every 5 s (of the default)": ("read", "default"),
}


def step_ms(logs: list[Path], figure: str = "mean") -> float | None:
    """The slowest rank's mean step (each run's rank 0 prints every rank's record), the job's throughput; its median
    with ``figure="median"`` or where the record has no mean (runs before it did); None if a log has none."""
    records = [
        json.loads(line)
        for log in logs
        for line in log.read_text(errors="replace").splitlines()
        if line.startswith('{"info": "training_rank"')
    ]
    return max(r.get(f"step_ms_{figure}", r["step_ms_median"]) for r in records) if records else None


def earlier_rounds(files: list[Path]) -> dict[int, dict[str, float]]:
    """The rounds of earlier batches' JSON, numbered 1, 2, … in the order given."""
    rounds: dict[int, dict[str, float]] = {}
    for file in files:
        for _, steps in sorted(json.loads(file.read_text())["rounds"].items(), key=lambda kv: int(kv[0])):
            rounds[len(rounds) + 1] = {k: float(v) for k, v in steps.items()}
    return rounds


def median_interval(ratios: list[float]) -> tuple[float, float] | None:
    """The distribution-free 95 % interval of the median: the k-th smallest and k-th largest ratio, k the largest
    with P(Binomial(n, 1/2) < k) ≤ 2.5 % (none under 6 rounds)."""
    n, k, below = len(ratios), 0, 0.0
    while below + math.comb(n, k) / 2**n <= 0.025:
        below += math.comb(n, k) / 2**n
        k += 1
    if k == 0:
        return None
    ordered = sorted(ratios)
    return ordered[k - 1], ordered[n - k]


def pct(ratio: float) -> float:
    return round(100 * (ratio - 1), 2)


def cost(ratios: list[float]) -> dict[str, object]:
    mean = statistics.fmean(ratios)
    n = len(ratios)
    half = student_t_quantile(0.975, n - 1) * statistics.stdev(ratios) / n**0.5 if n > 1 else None
    middle = median_interval(ratios)
    return {
        "rounds": len(ratios),
        "cost_pct": pct(mean),
        "ci95_pct": [pct(mean - half), pct(mean + half)] if half else None,
        "median_pct": pct(statistics.median(ratios)),
        "median_ci95_pct": [pct(middle[0]), pct(middle[1])] if middle else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("logs", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--earlier", type=Path, action="append", default=[])
    parser.add_argument("--figure", choices=["mean", "median"], default="mean", help="of each rank's timed steps")
    args = parser.parse_args()
    rounds = earlier_rounds(args.earlier)
    offset = len(rounds)
    runs: dict[tuple[int, str], list[Path]] = {}
    for log in sorted(args.logs.glob("r*.log")):
        if match := NAME.search(log.name):
            runs.setdefault((offset + int(match[1]), match[2]), []).append(log)
    for (number, variant), logs in sorted(runs.items()):
        if (value := step_ms(logs, args.figure)) is not None:
            rounds.setdefault(number, {})[variant] = value
    signals: dict[str, dict[str, object]] = {}
    for signal, (with_it, without) in SIGNALS.items():
        ratios = [r[with_it] / r[without] for r in rounds.values() if with_it in r and without in r]
        if ratios:
            signals[signal] = {"variants": [with_it, without], **cost(ratios)}
            c = signals[signal]
            print(f"{signal}: mean {c['cost_pct']:+.2f} % of the step (95 % interval {c['ci95_pct']}), median "
                  f"{c['median_pct']:+.2f} % ({c['median_ci95_pct']}), {c['rounds']} rounds")  # fmt: skip
    for number, steps in sorted(rounds.items()):
        print(f"round {number}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in sorted(steps.items())))
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "signals": signals}, indent=1))


if __name__ == "__main__":
    main()
