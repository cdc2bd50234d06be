#!/usr/bin/env bash
# profile: auto between nodes on a lent 2-GPU host seen as two one-GPU "nodes" (bench/inventories/
# h200x2-auto-halves.yaml), with the real CLI: preflight (the fabric read, the expectations derived) and the
# multi-node stage (all-reduce sweep, training sweep), once as NCCL finds the host and once with P2P and SHM off
# (NCCL's network path: sockets). Prints the fabric, transport and training rows and the verdicts, and asserts
# that the healthy run is accepted and the socket run rejected by the training minimum auto derived.
# Usage on the machine, from the repo root, with the wheels carried in .whl: bash bench/fabric_auto.sh
set -u
. bench/device_env.sh
INVENTORY=${1:-bench/inventories/h200x2-auto-halves.yaml}
run() {  # NAME [env...]
  local name=$1; shift
  s=$(date +%s)
  env "$@" python3 -m cluster_accept.flows.cli run --inventory "$INVENTORY" --out "/tmp/runs/$name" \
    --stages preflight,multi-node --history -
  echo "$name: exit $? wall $(( $(date +%s) - s )) s"
}
{
  nvidia-smi -L
  run host
  run sockets NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
  python3 - <<'PY'
import glob, pandas as pd
pd.set_option("display.width", 250); pd.set_option("display.max_colwidth", 110)
verdicts = {}
for name in ("host", "sockets"):
    d = sorted(glob.glob(f"/tmp/runs/{name}/2*/"))[-1]
    c = pd.read_parquet(d + "checks.parquet")
    keep = (c["item"] == "fabric") | c["check"].isin(["transport", "training_scaling", "scaling", "nccl_harmful"])
    print(f"== {name}")
    print(c[keep & (c.status != "pass") | (c["item"] == "fabric")][
        ["stage", "node", "check", "item", "status", "reason", "observed", "expected"]].to_string(index=False))
    t = pd.read_parquet(d + "training_scaling.parquet")
    print(t.drop(columns=["run_id", "cluster"]).to_string(index=False))
    v = pd.read_parquet(d + "verdicts.parquet")
    print(v[["node", "verdict", "reasons"]].to_string(index=False))
    verdicts[name] = (set(v.verdict), [list(r) for r in v.reasons])
host, sockets = verdicts["host"], verdicts["sockets"]
print("ASSERT healthy accepted:", "PASS" if host[0] == {"accepted"} else f"FAIL {host}")
ok = sockets[0] == {"rejected"} and all(any(r.startswith("training_scaling:") for r in rs) for rs in sockets[1])
print("ASSERT sockets rejected by training scaling:", "PASS" if ok else f"FAIL {sockets}")
PY
} > "$OUT/fabric_auto.log" 2>&1
tar czf "$OUT/runs.tgz" -C /tmp runs
tail -c 11000 "$OUT/fabric_auto.log"
