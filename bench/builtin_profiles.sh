#!/usr/bin/env bash
# The built-in GPU profiles on a lent GPU machine, in one call (see the device tool): the real CLI (local
# transport) with `profile: auto`, so the datasheet thresholds are judged on real GPUs; the probe interpreter
# check's real output on a CUDA node; and `profile suggest` on the machine. Usage there, from the repo root,
# with the wheels carried in .whl:
#   bash bench/builtin_profiles.sh [INVENTORY]        (results under $OUT)
set -u
INVENTORY=${1:-bench/inventories/h200x2-auto.yaml}
. bench/device_env.sh
{
  echo "### machine"; nvidia-smi -L; nvidia-smi | sed -n 3p
  echo "### probe interpreter check (CUDA profile)"
  python3 -c 'from cluster_accept.checks.probe_python import command_for; from cluster_accept.inventory.model import Profile; print(command_for(Profile()))' > /tmp/probe_cmd.sh
  sh /tmp/probe_cmd.sh | tee "$OUT/probe_python_cuda.txt"
  echo "### profile suggest"
  python3 -m cluster_accept.flows.cli profile suggest --inventory "$INVENTORY" > "$OUT/suggested.yaml" 2> "$OUT/suggest.err"
  echo "exit $?"; cat "$OUT/suggested.yaml" "$OUT/suggest.err"
  echo "### run with profile: auto"
  s=$(date +%s)
  python3 -m cluster_accept.flows.cli run -i "$INVENTORY" --out "$OUT/runs" --stages preflight,single-node --history -
  echo "run exit $? wall $(( $(date +%s) - s )) s"
  python3 - "$OUT/runs" <<'PY'
import sys, pathlib, pandas as pd
run = next(p for p in pathlib.Path(sys.argv[1]).iterdir() if p.is_dir() and p.name != "history")
v = pd.read_parquet(run / "verdicts.parquet"); print(v[["node", "verdict", "reasons"]].to_string())
c = pd.read_parquet(run / "checks.parquet")
keep = c[c.check.isin(["profile", "probe", "gemm", "hbm", "allreduce", "transport", "gpu_count", "nvlink", "pcie", "persistence"])]
cols = ["check", "item", "gpu", "status", "reason", "observed", "expected"]
print(keep[keep.status != "pass"][cols].to_string()); print(keep[cols].head(80).to_string())
m = pd.read_parquet(run / "measurements.parquet")
print(m.groupby("metric")["value"].agg(["min", "max", "count"]).to_string())
PY
  echo "### run with the suggested profile, unchanged"
  python3 - "$INVENTORY" "$OUT/suggested.yaml" "$OUT/suggested-inventory.yaml" <<'PY'
import sys, yaml
inventory = yaml.safe_load(open(sys.argv[1]))
inventory["defaults"]["profile"] = "suggested"
inventory["profiles"] = {"suggested": yaml.safe_load(open(sys.argv[2]))}
yaml.safe_dump(inventory, open(sys.argv[3], "w"), sort_keys=False)
PY
  python3 -m cluster_accept.flows.cli run -i "$OUT/suggested-inventory.yaml" --out "$OUT/runs-suggested" \
    --stages preflight,single-node --history -
  echo "run exit $?"
  tar czf "$OUT/runs.tgz" -C "$OUT" runs runs-suggested && rm -rf "$OUT/runs" "$OUT/runs-suggested"
} > "$OUT/builtin_profiles.log" 2>&1
tail -c 12000 "$OUT/builtin_profiles.log"
