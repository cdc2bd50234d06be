"""What bench/prove_causes.sh's runs said: verdicts, the job_settings rows, failing figures, unjudged figures; and
PASS/FAIL lines for what each run must say. Usage: python3 bench/prove_causes_report.py one|halves"""

from __future__ import annotations

import glob
import sys

import pandas as pd

pd.set_option("display.width", 250)
pd.set_option("display.max_colwidth", 160)
EXPECTED = {  # run -> the setting that must be the confirmed cause (None: a healthy run, accepted)
    "one": {
        "healthy": None,
        "max_nchannels": "NCCL_MAX_NCHANNELS",
        "proto_ll": "NCCL_PROTO",
        "p2p_level": "NCCL_P2P_LEVEL",
    },
    "halves": {"halves_healthy": None, "halves_planted": "NCCL_MAX_NCHANNELS", "halves_buffsize": "NCCL_BUFFSIZE"},
    "halves-healthy": {"halves_healthy": None},
    "halves-planted": {"halves_planted": "NCCL_MAX_NCHANNELS", "halves_buffsize": "NCCL_BUFFSIZE"},
}
FALLBACKS = frozenset({"halves_buffsize"})
HARMLESS = ("NCCL_DEBUG_SUBSYS", "NCCL_IB_TIMEOUT")  # in every run's environment (bench/prove_causes.sh)
COLUMNS = ["stage", "node", "check", "item", "gpu", "status", "reason", "observed", "expected", "detail"]


def show(name: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    run = sorted(glob.glob(f"/tmp/runs/{name}/2*/"))[-1]
    checks, verdicts = pd.read_parquet(run + "checks.parquet"), pd.read_parquet(run + "verdicts.parquet")
    print(f"\n===== {name}")
    print(verdicts[["node", "verdict", "reasons", "cause"]].to_string(index=False))
    figures = pd.read_parquet(run + "measurements.parquet")
    top = figures.sort_values("size").groupby(["stage", "node", "metric", "gpu"], dropna=False).tail(1)
    print(top[["stage", "node", "metric", "gpu", "value", "unit", "size"]].to_string(index=False))
    bad = checks[(checks.status != "pass") | (checks.check == "job_settings")]
    print(bad[COLUMNS].to_string(index=False))
    return checks, verdicts


def verdict(name: str, setting: str | None, checks: pd.DataFrame, verdicts: pd.DataFrame) -> None:
    unjudged = checks[checks.reason.isin(["measured", "no_expectation"]) | (checks.status == "not_judged")]
    print(f"ASSERT {name}: no figure unjudged:", "PASS" if unjudged.empty else f"FAIL {list(unjudged['item'])}")
    harmless = checks[(checks.check == "job_settings") & checks["item"].isin(HARMLESS) & (checks.status != "pass")]
    print(f"ASSERT {name}: {', '.join(HARMLESS)} not blamed:", "PASS" if harmless.empty else "FAIL")
    if setting is None:
        ok = set(verdicts.verdict) == {"accepted"}
        print(f"ASSERT {name}: accepted:", "PASS" if ok else f"FAIL {list(verdicts.verdict)}")
        return
    confirmed = checks[(checks.check == "job_settings") & (checks.reason == "confirmed")]
    named = set(confirmed["item"]) == {setting}  # alone: never beside a harmless one
    rejected = "rejected" in set(verdicts.verdict)
    print(f"ASSERT {name}: rejected with {setting} alone confirmed:", "PASS" if named and rejected else "FAIL")
    carriers = set(confirmed["node"])
    others = verdicts[~verdicts.node.isin(carriers)]  # the halves: half-a runs none of half-b's cause
    spared = set(others.verdict) <= {"accepted"}
    said = "PASS" if spared else f"FAIL {others[['node', 'verdict']].to_dict('records')}"
    print(f"ASSERT {name}: nodes without the cause not rejected:", said)


def main() -> None:
    for name, setting in EXPECTED[sys.argv[1]].items():
        try:
            checks, verdicts = show(name)
        except (IndexError, FileNotFoundError) as exc:
            fallback = name in FALLBACKS  # runs only where the planted run before it was not rejected
            print(f"ASSERT {name}: {'not run (a fallback)' if fallback else f'FAIL no run ({exc})'}")
            continue
        verdict(name, setting, checks, verdicts)


if __name__ == "__main__":
    main()
