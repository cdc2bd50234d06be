"""What bench/diagnosis_gpu.sh's runs said: verdicts, job_settings rows, failing figures; PASS/FAIL lines for what
each run must say (a healthy run accepted; a planted setting the one confirmed cause of its node's rejection)."""

from __future__ import annotations

import glob
import sys

import pandas as pd

pd.set_option("display.width", 250)
pd.set_option("display.max_colwidth", 400)
EXPECTED = {  # mode -> run -> the setting that must be the one confirmed cause (None: accepted)
    "history": {"healthy1": None, "healthy2": None, "healthy3": None, "launch_blocking": "CUDA_LAUNCH_BLOCKING"},
    "planted": {"tf32_off": "NVIDIA_TF32_OVERRIDE"},
}
COLUMNS = ["node", "check", "item", "status", "reason", "observed", "expected", "detail"]


def judged(name: str, wanted: str | None) -> str:
    runs = sorted(glob.glob(f"/tmp/runs/{name}/2*/"))
    if not runs:
        return f"FAIL {name}: no run directory"
    checks, verdicts = pd.read_parquet(runs[-1] + "checks.parquet"), pd.read_parquet(runs[-1] + "verdicts.parquet")
    print(f"\n===== {name}")
    print(verdicts[["node", "verdict", "reasons", "cause"]].to_string())
    bad = checks[checks.status.isin(["fail", "warn", "error"])]
    print(bad[COLUMNS].to_string())
    settings = checks[checks.check == "job_settings"]
    print(settings[["item", "status", "reason", "observed"]].to_string())
    if wanted is None:
        ok = set(verdicts.verdict) == {"accepted"}
        return f"{'PASS' if ok else 'FAIL'} {name}: accepted" if ok else f"FAIL {name}: {list(verdicts.verdict)}"
    named = settings[settings.status != "pass"]
    ok = list(named["item"]) == [wanted] and list(named.reason) == ["confirmed"] and "rejected" in set(verdicts.verdict)
    return f"{'PASS' if ok else 'FAIL'} {name}: named {list(zip(named['item'], named.reason, strict=True))}"


if __name__ == "__main__":
    lines = [judged(name, wanted) for name, wanted in EXPECTED[sys.argv[1]].items()]
    print("\n" + "\n".join(lines))
