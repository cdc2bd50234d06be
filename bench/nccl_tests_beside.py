"""Our collectives against NVIDIA's nccl-tests on the same host: each figure of the run's all-reduce sweep
(``measurements.parquet``) over nccl-tests' out-of-place bus bandwidth at the same size, and the run's verdict
with every figure judged. Prints one line per collective and size and the ratio; writes --json.

    python3 bench/nccl_tests_beside.py --nccl-tests DIR --run RUN_OUT [--json FILE]

DIR holds ``nccl_tests_<op>.txt`` as bench/nccl_tests_beside.sh writes them; RUN_OUT is the run's --out.
"""

from __future__ import annotations

import argparse
import glob
import json
from pathlib import Path

import pandas as pd

from cluster_accept.analysis.probe_output import parse_nccl_tests

OPS = {  # nccl-tests' binary -> our metric
    "all_reduce": "allreduce_busbw_gbps",
    "all_gather": "allgather_busbw_gbps",
    "reduce_scatter": "reducescatter_busbw_gbps",
    "alltoall": "alltoall_busbw_gbps",
}


def nccl_tests(path: Path) -> dict[int, float]:
    """Out-of-place bus bandwidth (GB/s) by size in bytes, read by the project's own nccl-tests parser (the columns
    are every collective's alike); raises when a row reports wrong values."""
    read = parse_nccl_tests(path.read_text())
    if read.errors:
        raise SystemExit(f"{path.name}: {'; '.join(read.errors)}")
    return {int(m.size): m.value for m in read.measurements if m.size is not None}


def ours(run: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    where = Path(sorted(glob.glob(f"{run}/2*/"))[-1])
    figures = pd.read_parquet(where / "measurements.parquet")
    return (
        figures[figures.probe == "allreduce"],
        pd.read_parquet(where / "checks.parquet"),
        pd.read_parquet(where / "verdicts.parquet"),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nccl-tests", type=Path, required=True)
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    figures, checks, verdicts = ours(args.run)
    rows = []
    for op, metric in OPS.items():
        reference = nccl_tests(args.nccl_tests / f"nccl_tests_{op}.txt")
        ours_by_size = figures[figures.metric == metric].groupby("size")["value"].median()
        for size, value in ours_by_size.items():
            if int(size) in reference:
                ratio = value / reference[int(size)]
                rows.append(
                    {
                        "op": op,
                        "size": int(size),
                        "ours_gbps": value,
                        "nccl_tests_gbps": reference[int(size)],
                        "ratio": round(ratio, 3),
                    }
                )
                print(
                    f"{op:15s} {int(size):>11d} B  ours {value:8.1f}  nccl-tests {reference[int(size)]:8.1f} GB/s"
                    f"  ratio {ratio:.3f}"
                )
    unjudged = checks[checks.reason.isin(["measured", "no_expectation"]) | (checks.status == "not_judged")]
    summary = {
        "verdicts": verdicts[["node", "verdict"]].to_dict("records"),
        "unjudged": sorted(set(unjudged["item"])),
        "ratio_at_1gib": {r["op"]: r["ratio"] for r in rows if r["size"] == 1 << 30},
        "rows": rows,
    }
    print("verdicts:", summary["verdicts"], "unjudged:", summary["unjudged"])
    print("ratio at 1 GiB:", summary["ratio_at_1gib"])
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
