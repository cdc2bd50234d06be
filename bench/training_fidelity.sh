#!/usr/bin/env bash
# The training probe on a lent GPU machine, in one call: its tokens/s against an independent plain training
# loop of the same model on the same GPUs (bench/train_reference.py; alternated, twice each, on one GPU and on
# all of them), and a planted slow GPU (a co-tenant GEMM on the last GPU) that the probe must name as the slow
# rank. Usage on the machine, from the repo root, with the wheels carried in .whl:
#   bash bench/training_fidelity.sh            (logs and JSON lines under $OUT; ratios printed)
set -u
. bench/device_env.sh
N=$(nvidia-smi -L | grep -c '^GPU')
MODEL="--layers 24 --width 1024 --heads 16 --seq-len 2048 --micro-batch 8 --vocab 50304 --warmup-steps 5 --steps 20"
run() {  # run GPUS SCRIPT NAME [extra args]: the whole output kept, JSON lines for the figures
  local gpus=$1 script=$2 name=$3; shift 3
  local s=$(date +%s)
  python3 -m torch.distributed.run --standalone --nproc_per_node="$gpus" "$script" $MODEL "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? wall $(( $(date +%s) - s )) s"
  grep '^{' "$OUT/$name.log" > "$OUT/$name.jsonl"
}
{
  nvidia-smi -L
  python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
  for gpus in 1 "$N"; do
    for round in 1 2; do
      run "$gpus" cluster_accept/probes/training/node/train_step.py "probe_g${gpus}_r${round}" --device cuda
      run "$gpus" bench/train_reference.py "ref_g${gpus}_r${round}" --device cuda
    done
  done
  NCCL_DEBUG=INFO run "$N" cluster_accept/probes/training/node/train_step.py "probe_nccl_info" --device cuda
  python3 bench/cotenant_gemm.py --gpu $((N - 1)) --seconds 120 > "$OUT/cotenant.log" 2>&1 &
  sleep 10
  run "$N" cluster_accept/probes/training/node/train_step.py "probe_slow_gpu" --device cuda
  kill %1
  python3 bench/training_fidelity.py "$OUT"
} > "$OUT/training_fidelity.log" 2>&1
tail -c 12000 "$OUT/training_fidelity.log"
