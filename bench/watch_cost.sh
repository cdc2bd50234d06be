#!/usr/bin/env bash
# What arming a job costs it, per signal: the same data-parallel training job (train_step.py: a GPT, DDP over NCCL,
# its all-reduce overlapping the backward pass) run unarmed and armed, in rounds, each round every variant once in a
# shuffled order:
#   off          not armed (NCCL's RAS is on by default: it is on here too)
#   ras_off      NCCL_RAS_ENABLE=0: NCCL's RAS switched off, nothing else
#   default      `cluster-accept arm --local --format env` as it arms a job by default (Flight Recorder, worker
#                server, NCCL timing, RAS)
#   no_timing    the default without NCCL's timing (--no-nccl-timing)
#   timing_only  only TORCH_NCCL_ENABLE_TIMING=1
#   inspector    --no-nccl-timing --inspector: NCCL's Inspector (built here from NCCL's source, carried as
#                .nt/nccl-inspector.tar.gz) in place of NCCL timing, as `arm` arms it for GPU times
#   read         the default, read as the watch reads it: every 5 s each node's job reader (the Flight Recorder
#                through every rank's worker server) and one node's RAS reader
# LAYOUT=node: one node of every GPU of the host (NVLink between them). LAYOUT=halves: two "nodes" of one GPU each
# (GPU 0 twice on a one-GPU host), NCCL_HOSTID per half, so NCCL connects them over NET/Socket as two hosts.
# Each run's step time is the slowest rank's mean over STEPS timed steps (a read every 5 s slows one step in a
# hundred: the median would not see it); bench/watch_cost.py prints the cost of
# each signal (a pair of variants in the same round) with 95 % intervals and writes watch_cost.json.
# Usage on the machine, from the repo root: LAYOUT=node ROUNDS=4 VARIANTS="off default" bash bench/watch_cost.sh
# (results under $OUT, the runs' logs as cost-logs.tgz; EARLIER=FILE adds an earlier batch's watch_cost.json of the
# same layout and job; STOP_AFTER_S: no round begun after that many seconds). On a
# machine without a GPU it runs a small model on the CPU over gloo: a dry run of the bench, not a figure.
set -u -o pipefail
source bench/device_env.sh
LAYOUT=${LAYOUT:-node} VARIANTS=${VARIANTS:-"off default no_timing timing_only"}
if nvidia-smi -L > /dev/null 2>&1; then GPUS=$(nvidia-smi -L | grep -c '^GPU') DEVICE=cuda
else GPUS=2 DEVICE=cpu MODEL=${MODEL:-"--layers 2 --width 128 --heads 4 --seq-len 128 --micro-batch 2"}; fi  # a dry run
if [ "$LAYOUT" = halves ]; then  # the socket path: a smaller model, the step mostly its all-reduce
  MODEL=${MODEL:-"--layers 4 --width 768 --heads 12 --seq-len 512 --micro-batch 8 --vocab 8192"}
  if [ "$GPUS" -ge 2 ]; then HALF_GPU=(0 1); else HALF_GPU=(0 0); fi
fi
MODEL=${MODEL:-"--layers 12 --width 1024 --heads 16 --seq-len 1024 --micro-batch 8"}
JOB=/tmp/cost-job LOGS=/tmp/cost-logs CAW=/tmp/caw/cost SO=/tmp/insp/inspector/libnccl-profiler-inspector.so
rm -rf "$LOGS" "$CAW"* && mkdir -p "$JOB" "$LOGS" && cp cluster_accept/probes/training/node/train_step.py cluster_accept/probes/node/allreduce.py "$JOB/"
CLI="python3 -m cluster_accept.flows.cli"

build_inspector() {  # once a machine: a warm one keeps its build
  [ -f "$SO" ] && return 0
  mkdir -p /tmp/insp && tar -C /tmp/insp -xzf .nt/nccl-inspector.tar.gz
  make -C /tmp/insp/inspector CUDA_HOME="$(dirname "$(dirname "$(command -v nvcc)")")" -j16 > "$OUT/inspector_build.log" 2>&1
  echo "### inspector build exit $?"
  [ -f "$SO" ]
}

declare -A ARMED  # variant|watch-dir: its environment for a job named JOBNAME (`arm` once a variant, not a run)
arming() {  # variant watch-dir job: sets EXTRA, the environment that variant adds, on one line; fails when
  # `arm` did (an armed variant run unarmed would report its signal's cost as nothing)
  [ -n "${ARMED[$1|$2]+set}" ] || ARMED[$1|$2]=$(armed "$1" "$2" JOBNAME) || { unset "ARMED[$1|$2]"; return 1; }
  EXTRA=${ARMED[$1|$2]//JOBNAME/$3}
  [ "$1" = off ] || [ -n "$EXTRA" ]
}

armed() {  # variant watch-dir job
  local arm="$CLI arm --local --watch-dir $2 --format env --job $3"
  case $1 in
    off) ;;
    ras_off) echo NCCL_RAS_ENABLE=0 ;;
    default | read) $arm 2>/dev/null | tr '\n' ' ' ;;
    no_timing) $arm --no-nccl-timing 2>/dev/null | tr '\n' ' ' ;;
    timing_only) echo TORCH_NCCL_ENABLE_TIMING=1 ;;
    inspector) $arm --no-nccl-timing --inspector "$SO" 2>/dev/null | tr '\n' ' ' ;;
  esac
}

train() {  # log port nnodes node-rank gpus-visible nproc [env ...]: one torchrun of the job
  local log=$1 port=$2 nnodes=$3 rank=$4 visible=$5 nproc=$6
  shift 6
  (cd "$JOB" && env "$@" ${visible:+CUDA_VISIBLE_DEVICES=$visible} python3 -m torch.distributed.run --nnodes "$nnodes" \
    --node-rank "$rank" --nproc-per-node "$nproc" --master-addr 127.0.0.1 --master-port "$port" train_step.py \
    --device "$DEVICE" $MODEL --steps "${STEPS:-100}" --warmup-steps 10 --solo-steps 1 > "$log" 2>&1)
}

read_loop() {  # name dir...: the watch's node-side reads of the run's job every 5 s while the run's launchers live
  local dirs=("$@") pids=($RUN_PIDS)
  while sleep 5; do
    for dir in "${dirs[@]:1}"; do
      python3 -I cluster_accept/watch/node/job_read.py --dir "$dir" --since-ns $(( $(date +%s%N) - 10000000000 )) \
        --user "$(id -u)" 2>&1 | grep -c '^{"c"' | sed "s|^|$(date +%T) $dir: collectives |" >> "$LOGS/$1.reads"
    done
    python3 -I cluster_accept/watch/node/ras_read.py --port "${RAS_PORT:-28028}" --user "$(id -u)" 2>&1 \
      | head -c 200 >> "$LOGS/$1.reads"; echo >> "$LOGS/$1.reads"
    kill -0 "${pids[@]}" 2> /dev/null || break
  done
}

run() {  # round variant port: one run of the variant in the layout (none where `arm` failed for it)
  local name="r$1-$2" half gpu i extra dirs=() pids=()
  if [ "$LAYOUT" = node ]; then
    arming "$2" "$CAW" "$name" || { echo "### round $1 variant $2: arm failed, not run"; return; }
    extra=$EXTRA dirs=("$CAW/$name")
    train "$LOGS/$name.log" "$3" 1 0 "" "$GPUS" $extra & pids+=($!)
  else
    for i in 0 1; do
      half=$([ $i = 0 ] && echo a || echo b) gpu=${HALF_GPU[$i]}
      arming "$2" "$CAW-$half" "$name" || { echo "### round $1 variant $2: arm failed, not run"; return; }
      extra=$EXTRA dirs+=("$CAW-$half/$name")
      train "$LOGS/$name-half-$half.log" "$3" 2 "$i" "$gpu" 1 $extra NCCL_HOSTID="half-$half" \
        NCCL_RAS_ADDR="localhost:2810$i" & pids+=($!)  # two "hosts" on one: a RAS port each
    done
  fi
  [ "$2" = read ] && { RUN_PIDS="${pids[*]}" RAS_PORT=$([ "$LAYOUT" = node ] && echo 28028 || echo 28100) \
    read_loop "$name" "${dirs[@]}" & }
  wait  # the run's launchers, and the read loop, which ends with them
  echo "### $(date +%T) round $1 variant $2 env [$extra]"
}

{
  nvidia-smi -L 2>&1
  python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None)"
  case " $VARIANTS " in *" inspector "*) build_inspector || VARIANTS=${VARIANTS//inspector/} ;; esac
  $CLI arm --local --watch-dir "$CAW" --format env --job probe 2>&1
  echo "### layout $LAYOUT, model [$MODEL], variants [$VARIANTS], $(date +%T)"
  port=29600
  for round in $(seq 1 "${ROUNDS:-4}"); do
    [ "$SECONDS" -lt "${STOP_AFTER_S:-100000}" ] || { echo "### stopped before round $round: ${SECONDS} s"; break; }
    for variant in $(printf '%s\n' $VARIANTS | shuf); do
      port=$((port + 1))
      run "$round" "$variant" "$port"
    done
    python3 bench/watch_cost.py "$LOGS" --json "$OUT/watch_cost.json" ${EARLIER:+--earlier "$EARLIER"}  # a cut run keeps its rounds
    tar -C "$(dirname "$LOGS")" -czf "$OUT/cost-logs.tgz" "$(basename "$LOGS")"  # one file: $OUT brings back few
  done
} > "$OUT/watch_cost.log" 2>&1
tail -c 5000 "$OUT/watch_cost.log"
