"""What each arming variant costs the job's step, from bench/watch_cost.sh's logs: per round the slowest rank's
median step time of every variant, each variant's ratio to ``off`` in the same round, and the mean ratio with a
95 % interval over the rounds (Student's t), and the median ratio (one run of a variant that shifted whole, as
lent GPUs' runs now and then do, moves the mean more than the median). Prints one line per variant; writes --json.
``--earlier`` adds the rounds of an earlier batch's JSON (the same job on the same kind), numbered before these.

    python3 bench/watch_cost.py LOGS [--json FILE] [--earlier JSON ...]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 11: 2.20, 12: 2.18}
# two-sided, by degrees of freedom; past 12 taken as 2.1 (2.09 at 19)
NAME = re.compile(r"r(\d+)-(\w+)\.log$")


def step_ms(log: Path) -> float | None:
    """The slowest rank's median step (rank 0 prints every rank's record)."""
    records = [json.loads(line) for line in log.read_text().splitlines() if line.startswith('{"info": "training_rank"')]
    return max(r["step_ms_median"] for r in records) if records else None


def earlier_rounds(files: list[Path]) -> dict[int, dict[str, float]]:
    """The rounds of earlier batches' JSON, numbered 1, 2, … in the order given."""
    rounds: dict[int, dict[str, float]] = {}
    for file in files:
        for _, steps in sorted(json.loads(file.read_text())["rounds"].items(), key=lambda kv: int(kv[0])):
            rounds[len(rounds) + 1] = {k: float(v) for k, v in steps.items()}
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("logs", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--earlier", type=Path, action="append", default=[])
    args = parser.parse_args()
    rounds = earlier_rounds(args.earlier)
    offset = len(rounds)
    for log in sorted(args.logs.glob("r*.log")):
        match, value = NAME.search(log.name), step_ms(log)
        if match and value is not None:
            rounds.setdefault(offset + int(match[1]), {})[match[2]] = value
    variants: dict[str, dict[str, object]] = {}
    for variant in ("default", "no_timing", "timing_only"):
        ratios = [r[variant] / r["off"] for r in rounds.values() if variant in r and "off" in r]
        if not ratios:
            continue
        mean = statistics.fmean(ratios)
        half = (
            T95.get(len(ratios) - 1, 2.1) * statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else None
        )
        cost: dict[str, object] = {
            "rounds": len(ratios),
            "cost_pct": round(100 * (mean - 1), 2),
            "ci95_pct": [round(100 * (mean - half - 1), 2), round(100 * (mean + half - 1), 2)] if half else None,
            "median_pct": round(100 * (statistics.median(ratios) - 1), 2),
        }
        variants[variant] = cost
        print(
            f"{variant:12s} cost {cost['cost_pct']:+.2f} % of the step (95 % interval {cost['ci95_pct']}, "
            f"{len(ratios)} rounds; median {cost['median_pct']:+.2f} %)"
        )
    for number, steps in sorted(rounds.items()):
        print(f"round {number}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in sorted(steps.items())))
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "variants": variants}, indent=1))


if __name__ == "__main__":
    main()
