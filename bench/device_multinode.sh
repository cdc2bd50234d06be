#!/usr/bin/env bash
# The multi-node launcher's NCCL path on one lent multi-GPU host: two local "nodes" of GPU subsets, the
# network path forced (P2P and SHM off), next to a plain single-launch 4-rank all-reduce under the same
# settings. Usage on the machine, from the repo root: bash bench/device_multinode.sh   (results under $OUT)
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 3
{
  nvidia-smi -L
  echo "### launcher: two local nodes x 2 GPUs, NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1"
  s=$(date +%s%N)
  NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 python3 -m cluster_accept.flows.cli run --inventory bench/inventories/h200x4-two-nodes.yaml \
    --out /tmp/mn --stages multi-node
  echo "exit $? wall $(( ($(date +%s%N) - s) / 1000000 )) ms"
  echo "### plain: one torchrun, 4 ranks, same settings"
  NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO python3 -m torch.distributed.run --standalone \
    --nproc_per_node=4 cluster_accept/probes/node/allreduce.py --min-bytes 1048576 --max-bytes 1073741824 2>&1 \
    | grep -E '^\{|via NET' | sort | uniq -c | sort -rn | head -20
  echo "### launcher figures"
  python3 - <<'PY'
import glob, pandas as pd
d = glob.glob("/tmp/mn/*/")[0]
m = pd.read_parquet(d + "measurements.parquet")
print(m[["group", "metric", "value", "algbw_gbps", "size", "world_size", "transport"]].to_string(index=False))
c = pd.read_parquet(d + "checks.parquet")
print(c[["node", "check", "item", "status", "reason", "observed", "expected"]].to_string(index=False))
print(pd.read_parquet(d + "verdicts.parquet")[["node", "verdict", "reasons"]].to_string(index=False))
for name in ("isolation", "scaling"):
    print(pd.read_parquet(d + f"{name}.parquet").drop(columns=["run_id", "cluster"]).to_string(index=False))
PY
} > "$OUT/device_multinode.log" 2>&1
tar czf "$OUT/mn.tgz" -C /tmp mn
tail -c 15000 "$OUT/device_multinode.log"
