#!/usr/bin/env bash
# The burn on a lent GPU machine, in one call (see the device tool): the real CLI (local transport) with
# `--suite burn` on a healthy machine (every GPU must pass), then again with a co-tenant GEMM loop started on
# GPU 0 half-way through the burn (GPU 0 must be named); and a short raw burn output kept as a parser fixture.
# Usage there, from the repo root, with the wheels carried in .whl:
#   bash bench/burn.sh [INVENTORY]        (results under $OUT)
set -u
INVENTORY=${1:-bench/inventories/h100x1-burn.yaml}
. bench/device_env.sh
summary() {
  python3 - "$1" <<'PY'
import sys, pathlib, pandas as pd
run = next(p for p in pathlib.Path(sys.argv[1]).iterdir() if p.is_dir() and p.name != "history")
v = pd.read_parquet(run / "verdicts.parquet"); print(v[["node", "verdict", "reasons"]].to_string()); print("cause:", "; ".join(v.cause))
c = pd.read_parquet(run / "checks.parquet")
cols = ["stage", "check", "item", "gpu", "status", "reason", "observed", "expected"]
print(c[c.stage == "burn"][cols].to_string(max_colwidth=90))
b = pd.read_parquet(run / "burn")
t = b[b.kind == "throughput"]; s = b[b.kind == "sample"]
print("throughput windows", len(t), "samples", len(s))
for gpu, g in t.groupby("gpu"):
    print(f"gpu{gpu} throughput per 30 s:", [round(x, 1) for x in g.groupby((g.t_s // 30) * 30).value.median()])
for gpu, g in s.groupby("gpu"):
    print(f"gpu{gpu} SM clock per 30 s:", list(g.groupby((g.t_s // 30) * 30).sm_clock_mhz.median()),
          "temp max", g.temp_c.max(), "power median", g.power_w.median(), "reasons", sorted(set(g.reasons))[:6])
PY
}
{
  echo "### machine"; nvidia-smi -L; nvidia-smi | sed -n 3p; command -v dcgmi || echo "no dcgmi"
  echo "### raw burn, 20 s (parser fixture)"
  raw=$(mktemp -d) && cp cluster_accept/probes/burn/node/burn.py cluster_accept/probes/node/gpu_bench.py "$raw"/  # shipped together
  (cd "$raw" && python3 burn.py --seconds 20 --sample-s 1 > "$OUT/burn-20s.txt"; echo "exit $?")
  echo "### run 1: healthy, --suite burn"; s=$(date +%s)
  python3 -m cluster_accept.flows.cli run -i "$INVENTORY" --out "$OUT/healthy" --suite burn --history -
  echo "run exit $? wall $(( $(date +%s) - s )) s"; summary "$OUT/healthy"
  echo "### run 2: a co-tenant GEMM loop on GPU 0 from 60 s into the burn"; s=$(date +%s)
  (until pgrep -f "burn.py --device" >/dev/null; do sleep 1; done; sleep 60
   python3 bench/cotenant_gemm.py --gpu 0 --seconds 90) & hog=$!
  python3 -m cluster_accept.flows.cli run -i "$INVENTORY" --out "$OUT/cotenant" --suite burn --history -
  echo "run exit $? wall $(( $(date +%s) - s )) s"; kill $hog 2>/dev/null; wait $hog 2>/dev/null
  summary "$OUT/cotenant"
  tar czf "$OUT/runs.tgz" -C "$OUT" healthy cotenant && rm -rf "$OUT/healthy" "$OUT/cotenant"
} > "$OUT/burn.log" 2>&1
tail -c 12000 "$OUT/burn.log"
