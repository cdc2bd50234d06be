#!/usr/bin/env bash
# The training sweep through the real CLI on one lent multi-GPU host seen as two "nodes"
# (bench/inventories/h200x2-two-nodes.yaml): the multi-node stage as NCCL finds the host (its halves share one
# machine, so the single-node stage would see each other's GPU processes; bench/training_fidelity.sh measures
# single nodes), then
# the multi-node stage again with P2P and SHM off (NCCL's network path). Prints each run's training scaling
# table, training rows and verdicts; the run directories come back as $OUT/runs.tgz.
set -u
. bench/device_env.sh
INVENTORY=${1:-bench/inventories/h200x2-two-nodes.yaml}
show() {
  python3 - "$1" <<'PY'
import glob, sys, pandas as pd
pd.set_option("display.width", 250); pd.set_option("display.max_colwidth", 90)
d = sorted(glob.glob(sys.argv[1] + "/*/"))[-1]
print(pd.read_parquet(d + "training_scaling.parquet").drop(columns=["run_id", "cluster"]).to_string(index=False))
c = pd.read_parquet(d + "checks.parquet")
keep = c["check"].str.startswith(("training", "isolation", "transport"))
print(c[keep][["stage", "node", "check", "item", "status", "reason", "observed", "expected"]].to_string(index=False))
print(pd.read_parquet(d + "verdicts.parquet")[["node", "verdict", "reasons"]].to_string(index=False))
PY
}
{
  nvidia-smi -L
  s=$(date +%s)
  python3 -m cluster_accept.flows.cli run --inventory "$INVENTORY" --out /tmp/runs/host --stages multi-node --history -
  echo "exit $? wall $(( $(date +%s) - s )) s"
  show /tmp/runs/host
  s=$(date +%s)
  NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 python3 -m cluster_accept.flows.cli run --inventory "$INVENTORY" \
    --out /tmp/runs/net --stages multi-node --history -
  echo "exit $? wall $(( $(date +%s) - s )) s"
  show /tmp/runs/net
} > "$OUT/training_scaling.log" 2>&1
tar czf "$OUT/runs.tgz" -C /tmp runs
tail -c 12000 "$OUT/training_scaling.log"
