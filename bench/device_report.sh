#!/usr/bin/env bash
# The report and history on real GPUs (lent machine, local transport): an acceptance run of preflight and
# the single-node stage, then a light-suite run that is compared with it through the history. Results:
# both run directories (reports with charts, Parquet, summary.json, Prometheus file) under $OUT.
#   bash bench/device_report.sh INVENTORY
set -u
inv=$1
. bench/device_env.sh
log=$OUT/device_report.log
{
  echo "### machine"; nvidia-smi -L
  for suite in acceptance light; do
    s=$(date +%s%N)
    if [ "$suite" = acceptance ]; then
      python3 -m cluster_accept.flows.cli run --inventory "$inv" --out "$OUT/runs" --stages preflight,single-node
    else
      python3 -m cluster_accept.flows.cli run --inventory "$inv" --out "$OUT/runs" --suite light --prometheus "$OUT/cluster_accept.prom"
    fi
    echo "### $suite: exit $? wall $(( ($(date +%s%N) - s) / 1000000 )) ms"
  done
  python3 - "$OUT/runs" <<'PY'
import glob, json, sys, pandas as pd
for d in sorted(glob.glob(sys.argv[1] + "/2*/")):
    run = json.load(open(d + "run.json"))
    print("==", d, run.get("suite"), run.get("stage_seconds"))
    print(json.dumps(json.load(open(d + "summary.json"))["counts"]))
    c = pd.read_parquet(d + "checks.parquet")
    hist = c[c["item"].str.endswith("_vs_history")]
    print(hist[["check", "item", "status", "observed", "expected"]].to_string(index=False))
    bad = c[~c.status.isin(["pass"])]
    print(bad[["stage", "check", "item", "gpu", "status", "reason", "observed", "expected"]].to_string(index=False))
PY
} > "$log" 2>&1
tail -c 12000 "$log"
