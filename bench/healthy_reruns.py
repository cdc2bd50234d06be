"""Counts the verdicts of healthy reruns (bench/healthy_reruns.sh): a line per run with each node's verdict and
the rows that did not pass, then the totals; a node not accepted in a healthy run is a false rejection."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd


def run_dirs(root: Path) -> list[Path]:
    """Each rerun's one run directory, in the order the runs were made (``r1``, ``r2`` …)."""
    found = []
    for out in sorted(root.glob("r*"), key=lambda p: int(p.name[1:]) if p.name[1:].isdigit() else 0):
        found += [p for p in out.iterdir() if p.is_dir() and p.name != "history"]
    return found


@dataclass(frozen=True)
class Rerun:
    run: str
    verdicts: dict[str, str]
    reasons: dict[str, list[str]]
    not_pass: list[str]  # check:item=status of each row that neither passes nor skips
    against_history: int  # rows judged against the node's own history


def summary(run: Path) -> Rerun:
    """One run: its nodes' verdicts and reasons, and its rows that neither pass nor skip (a part this host lacks)."""
    verdicts = pd.read_parquet(run / "verdicts.parquet").to_dict("records")
    checks = pd.read_parquet(run / "checks.parquet")
    other = checks[~checks["status"].isin(["pass", "skip"])].to_dict("records")
    return Rerun(
        run.name,
        {str(r["node"]): str(r["verdict"]) for r in verdicts},
        {str(r["node"]): [str(x) for x in r["reasons"]] for r in verdicts if len(r["reasons"])},
        sorted(f"{r['check']}:{r['item']}={r['status']}" for r in other),
        int(checks["item"].str.endswith("_vs_history").sum()),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("root", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runs = [summary(run) for run in run_dirs(args.root)]
    for one in runs:
        print(f"{one.run}: {one.verdicts}, {one.against_history} rows against history; not pass: {one.not_pass}")
    rejected = sum(v != "accepted" for one in runs for v in one.verdicts.values())
    print(f"{len(runs)} healthy runs, {rejected} node verdict(s) not accepted")
    if args.json:
        args.json.write_text(json.dumps({"runs": [asdict(r) for r in runs], "not_accepted": rejected}, indent=1))


if __name__ == "__main__":
    main()
