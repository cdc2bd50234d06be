#!/usr/bin/env bash
# One whole measurement on a lent GPU machine (see the device tool): preflight + single-node stage with the
# real CLI (local transport), probe fidelity, and — with two or more GPUs — a planted co-tenant straggler on
# GPU 0 followed by a healthy rerun. Usage on the machine, from the repo root:
#   bash bench/device_run.sh INVENTORY   (results under $OUT)
set -u
inv=$1
. bench/device_env.sh
mkdir -p /tmp/runs
log=$OUT/device_run.log
{
  echo "### machine"; nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
  echo "### run 1: preflight + single-node"; s=$(date +%s%N)
  python3 -m cluster_accept.flows.cli run --inventory "$inv" --out /tmp/runs/healthy --stages preflight,single-node
  echo "exit $? wall $(( ($(date +%s%N) - s) / 1000000 )) ms"
  echo "### probe fidelity"; python3 bench/probe_fidelity.py
  n=$(nvidia-smi -L | grep -c '^GPU')
  if [ "$n" -ge 2 ]; then
    echo "### run 2: co-tenant GEMM loop on GPU 0"
    python3 bench/cotenant_gemm.py --gpu 0 --seconds 400 & hog=$!
    sleep 5; s=$(date +%s%N)
    python3 -m cluster_accept.flows.cli run --inventory "$inv" --out /tmp/runs/straggler --stages single-node
    echo "exit $? wall $(( ($(date +%s%N) - s) / 1000000 )) ms"
    kill $hog; wait $hog 2>/dev/null
    echo "### run 3: healthy rerun"; s=$(date +%s%N)
    python3 -m cluster_accept.flows.cli run --inventory "$inv" --out /tmp/runs/rerun --stages single-node
    echo "exit $? wall $(( ($(date +%s%N) - s) / 1000000 )) ms"
  fi
  echo "### verdicts and figures"
  python3 - <<'PY'
import glob, pandas as pd
for d in sorted(glob.glob("/tmp/runs/*/2*/")):  # run directories (their ids start with the date), not history/
    print("==", d)
    v = pd.read_parquet(d + "verdicts.parquet"); print(v[["node", "verdict", "reasons"]].to_string(index=False))
    try:
        m = pd.read_parquet(d + "measurements.parquet")
        print(m[["gpu", "metric", "value", "unit", "size", "sm_clock_mhz", "power_w", "temp_c", "transport"]]
              .to_string(index=False))
    except FileNotFoundError:
        pass
    c = pd.read_parquet(d + "checks.parquet")
    bad = c[~c.status.isin(["pass"])]
    print(bad[["stage", "check", "item", "gpu", "status", "reason", "observed", "expected"]].to_string(index=False))
PY
} > "$log" 2>&1
tar czf "$OUT/runs.tgz" -C /tmp runs
tail -c 20000 "$log"
