#!/usr/bin/env bash
# The training probe's other modes on a lent GPU machine: torch.compile on one GPU, fully sharded (FSDP2) on
# every GPU; the 350M model, as bench/training_fidelity.sh runs it eagerly with DDP. Figures under $OUT.
set -u
. bench/device_env.sh
N=$(nvidia-smi -L | grep -c '^GPU')
MODEL="--layers 24 --width 1024 --heads 16 --seq-len 2048 --micro-batch 8 --vocab 50304 --steps 20"
run() {
  local gpus=$1 name=$2; shift 2
  local s=$(date +%s)
  python3 -m torch.distributed.run --standalone --nproc_per_node="$gpus" probes/node/train_step.py --device cuda \
    $MODEL "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? wall $(( $(date +%s) - s )) s"
  grep '"training_tokens_per_s_per_gpu"\|"training_peak_memory_gib"' "$OUT/$name.log"
}
{
  run 1 compile_g1 --compile --warmup-steps 10
  run "$N" fsdp_g"$N" --parallel fsdp --warmup-steps 5
} > "$OUT/training_modes.log" 2>&1
cat "$OUT/training_modes.log" | cut -c1-400
