#!/usr/bin/env bash
# What arming a job costs it, per signal: the same data-parallel training job (GPT, 12 layers, width 1024, seq 1024,
# micro-batch 8, DDP over NCCL on every GPU of the host: its all-reduce overlaps the backward pass over NVLink) run
# unarmed and armed, in rounds, each round every variant once in a shuffled order:
#   off          not armed
#   default      `cluster-accept arm --local --format env` as it arms a job by default
#   no_timing    the default without NCCL's timing (--no-nccl-timing)
#   timing_only  only TORCH_NCCL_ENABLE_TIMING=1
# Each run's step time is the slowest rank's median over STEPS timed steps; bench/watch_cost.py prints each
# variant's cost against `off` with a 95 % interval over the rounds (paired per round) and writes watch_cost.json.
# Usage on the machine, from the repo root: bash bench/watch_cost.sh   (ROUNDS=4 STEPS=80; results under $OUT;
# EARLIER=FILE adds an earlier batch's watch_cost.json to the figures). On a
# machine without a GPU it runs a small model on the CPU over gloo: a dry run of the bench, not a figure.
set -u
source bench/device_env.sh
if nvidia-smi -L > /dev/null 2>&1; then GPUS=$(nvidia-smi -L | wc -l) DEVICE=cuda
else GPUS=2 DEVICE=cpu MODEL=${MODEL:-"--layers 2 --width 128 --heads 4 --seq-len 128 --micro-batch 2"}; fi  # a dry run
JOB=/tmp/cost-job LOGS=$OUT/cost-logs
mkdir -p "$JOB" "$LOGS" && cp cluster_accept/probes/training/node/train_step.py cluster_accept/probes/node/allreduce.py "$JOB/"
MODEL=${MODEL:-"--layers 12 --width 1024 --heads 16 --seq-len 1024 --micro-batch 8"}
CLI="python3 -m cluster_accept.flows.cli"
arming() {  # variant job: the environment that variant adds
  case $1 in
    off) ;;
    default) $CLI arm --local --watch-dir /tmp/caw/cost --format env --job "$2" 2>/dev/null | tr '\n' ' ' ;;
    no_timing) $CLI arm --local --watch-dir /tmp/caw/cost --format env --job "$2" --no-nccl-timing 2>/dev/null | tr '\n' ' ' ;;
    timing_only) echo TORCH_NCCL_ENABLE_TIMING=1 ;;
  esac
}
{
  nvidia-smi -L 2>&1
  $CLI arm --local --watch-dir /tmp/caw/cost --format env --job probe 2>&1
  port=29600
  for round in $(seq 1 "${ROUNDS:-4}"); do
    for variant in $(printf '%s\n' off default no_timing timing_only | shuf); do
      name="r$round-$variant" port=$((port + 1))
      extra=$(arming "$variant" "$name")
      (cd "$JOB" && env $extra python3 -m torch.distributed.run --standalone --nproc-per-node "$GPUS" \
        --master-port "$port" train_step.py --device "$DEVICE" $MODEL --steps "${STEPS:-80}" --warmup-steps 10 --solo-steps 1 \
        > "$LOGS/$name.log" 2>&1)
      echo "### round $round variant $variant exit $? env [$extra]"
    done
    python3 bench/watch_cost.py "$LOGS" --json "$OUT/watch_cost.json" ${EARLIER:+--earlier "$EARLIER"}  # after every round: a cut run keeps its rounds
  done
} > "$OUT/watch_cost.log" 2>&1
tail -c 4000 "$OUT/watch_cost.log"
