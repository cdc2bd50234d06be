"""What each arming variant costs the job's step, from bench/watch_cost.sh's logs: per round the slowest rank's
median step time of every variant, each variant's ratio to ``off`` in the same round, and the mean ratio with a
95 % interval over the rounds (Student's t). Prints one line per variant; writes --json.

    python3 bench/watch_cost.py LOGS [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}  # two-sided, by dof
NAME = re.compile(r"r(\d+)-(\w+)\.log$")


def step_ms(log: Path) -> float | None:
    """The slowest rank's median step (rank 0 prints every rank's record)."""
    records = [json.loads(line) for line in log.read_text().splitlines() if line.startswith('{"info": "training_rank"')]
    return max(r["step_ms_median"] for r in records) if records else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("logs", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rounds: dict[int, dict[str, float]] = {}
    for log in sorted(args.logs.glob("r*.log")):
        match, value = NAME.search(log.name), step_ms(log)
        if match and value is not None:
            rounds.setdefault(int(match[1]), {})[match[2]] = value
    summary = {"rounds": rounds, "variants": {}}
    for variant in ("default", "no_timing", "timing_only"):
        ratios = [r[variant] / r["off"] for r in rounds.values() if variant in r and "off" in r]
        if not ratios:
            continue
        mean = statistics.fmean(ratios)
        half = (
            T95.get(len(ratios) - 1, 2.0) * statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else None
        )
        cost = {
            "rounds": len(ratios),
            "cost_pct": round(100 * (mean - 1), 2),
            "ci95_pct": [round(100 * (mean - half - 1), 2), round(100 * (mean + half - 1), 2)] if half else None,
        }
        summary["variants"][variant] = cost
        print(
            f"{variant:12s} cost {cost['cost_pct']:+.2f} % of the step (95 % interval {cost['ci95_pct']}, "
            f"{len(ratios)} rounds)"
        )
    for number, steps in sorted(rounds.items()):
        print(f"round {number}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in sorted(steps.items())))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
