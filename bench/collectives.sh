#!/usr/bin/env bash
# Collectives and the GPU-pair matrix on a lent multi-GPU machine (4 x H200: `--kind nvidia-h200-x4`), in one
# call (see the device tool): our collectives sweep against a plain torch.distributed loop at 1 GiB (target:
# each within 3 %), the 12 ordered pairs' copy bandwidth, and the raw node-side outputs kept as parser fixtures.
# Usage there, from the repo root:   bash bench/collectives.sh        (results under $OUT)
set -u
. bench/device_env.sh
{
  nvidia-smi -L; nvidia-smi topo -m
  python3 bench/collectives_fidelity.py --json "$OUT/collectives_fidelity.json"
  echo "exit $?"
} 2>&1 | tee "$OUT/collectives.txt"
n=$(nvidia-smi -L | grep -c '^GPU')
NCCL_DEBUG=INFO python3 -m torch.distributed.run --standalone --nproc_per_node="$n" cluster_accept/probes/node/allreduce.py \
  --ops all_reduce,all_gather,reduce_scatter,all_to_all,send_recv > "$OUT/allreduce-ops.txt" 2>&1
python3 cluster_accept/probes/node/gpu_pairs.py > "$OUT/gpu_pairs.txt" 2>&1
