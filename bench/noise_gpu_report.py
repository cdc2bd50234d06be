"""The runs under OUT and the calibration in OUT/history: per run its verdicts and its relative rows (against
peers or history) by outcome; the noise table. Usage: python3 bench/noise_gpu_report.py OUT"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

RELATIVE = ("_vs_cluster", "_vs_history")


def main(out: Path) -> int:
    for table in sorted((out / "history" / "calibration").glob("*/*.parquet")):
        print(f"## calibration {table.parent.name}/{table.stem}")
        print(pd.read_parquet(table).to_string(index=False))
    for run in sorted(p for p in out.iterdir() if p.is_dir() and p.name != "history"):
        if not (run / "verdicts.parquet").exists():
            print(f"## {run.name}: no verdicts")
            continue
        verdicts = pd.read_parquet(run / "verdicts.parquet")
        checks = pd.read_parquet(run / "checks.parquet")
        relative = checks[checks["item"].str.endswith(RELATIVE) | checks["reason"].isin(["inconclusive", "weak_gpu"])]
        counts = relative.groupby(["status", "reason"]).size().to_dict()
        said = ", ".join(
            f"{node}: {v} {list(r)[:3]}"
            for node, v, r in zip(verdicts.node, verdicts.verdict, verdicts.reasons, strict=True)
        )
        print(f"## {run.name}: {said}; relative rows {counts}")
        for row in relative[relative["status"] != "pass"].itertuples():
            print(
                f"   {row.status} {row.reason} {row.item} gpu {row.gpu}: {row.observed} vs {row.expected}: {row.detail}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
