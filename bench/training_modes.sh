#!/usr/bin/env bash
# The training probe's other modes and presets on a lent GPU machine: torch.compile on one GPU, fully sharded
# (FSDP2) on every GPU (the 350M model, as bench/training_fidelity.sh runs it eagerly with DDP), then the 125m
# (light suite) and 1.3b presets with DDP on every GPU. Figures under $OUT.
set -u
. bench/device_env.sh
N=$(nvidia-smi -L | grep -c '^GPU')
M350="--layers 24 --width 1024 --heads 16 --seq-len 2048 --micro-batch 8 --vocab 50304 --steps 20"
M125="--layers 12 --width 768 --heads 12 --seq-len 2048 --micro-batch 8 --vocab 50304 --steps 20 --warmup-steps 5"
M1300="--layers 24 --width 2048 --heads 16 --seq-len 2048 --micro-batch 4 --vocab 50304 --steps 20 --warmup-steps 5"
run() {
  local gpus=$1 name=$2; shift 2
  local s=$(date +%s)
  python3 -m torch.distributed.run --standalone --nproc_per_node="$gpus" cluster_accept/probes/training/node/train_step.py --device cuda \
    "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? wall $(( $(date +%s) - s )) s"
  grep '"training_tokens_per_s_per_gpu"\|"training_peak_memory_gib"\|"params"' "$OUT/$name.log" | cut -c1-300
}
{
  run 1 compile_g1 $M350 --compile --warmup-steps 10
  run "$N" fsdp_g"$N" $M350 --parallel fsdp --warmup-steps 5
  run "$N" preset125m_g"$N" $M125
  run "$N" preset1.3b_g"$N" $M1300
} > "$OUT/training_modes.log" 2>&1
cat "$OUT/training_modes.log" | cut -c1-400
