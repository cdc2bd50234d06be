#!/usr/bin/env bash
# The figures the built-in floors of intra-node collectives and GPU-pair copies are calibrated on, on a lent
# multi-GPU machine (`--kind nvidia-h100-x4`): every collective at 256 MiB-1 GiB on all GPUs and on two, the
# same with NCCL's P2P transport disabled (the crippled path: SHM through host memory), and the GPU-pair matrix.
# Usage there, from the repo root:   bash bench/figure_floors.sh        (results under $OUT)
set -u
. bench/device_env.sh
n=$(nvidia-smi -L | grep -c '^GPU')
{ nvidia-smi -L; nvidia-smi topo -m; nvidia-smi --query-gpu=pcie.link.gen.max,pcie.link.width.max --format=csv; } \
  > "$OUT/gpus.txt" 2>&1
ops=all_reduce,all_gather,reduce_scatter,all_to_all,send_recv
sweep() {  # name, GPUs, extra environment
  env $3 python3 -m torch.distributed.run --standalone --nproc_per_node="$2" cluster_accept/probes/node/allreduce.py \
    --ops $ops --min-bytes $((256 << 20)) --max-bytes $((1 << 30)) > "$OUT/$1.txt" 2>&1
  echo "$1 exit $?"
}
sweep healthy-$n "$n" "NCCL_DEBUG=WARN"
sweep p2p-disabled-$n "$n" "NCCL_DEBUG=WARN NCCL_P2P_DISABLE=1"
sweep healthy-2 2 "NCCL_DEBUG=WARN CUDA_VISIBLE_DEVICES=0,1"
sweep p2p-disabled-2 2 "NCCL_DEBUG=WARN NCCL_P2P_DISABLE=1 CUDA_VISIBLE_DEVICES=0,1"
python3 cluster_accept/probes/node/gpu_pairs.py > "$OUT/gpu_pairs.txt" 2>&1; echo "gpu_pairs exit $?"
for f in "$OUT"/*.txt; do echo "== $f"; grep -h '"value"' "$f"; done | python3 -c '
import json, sys
for line in sys.stdin:
    if not line.startswith("{"):
        print(line.strip())
        continue
    r = json.loads(line)
    print(r.get("metric"), r.get("label"), r.get("world_size"), r.get("size"), r.get("value"))'
