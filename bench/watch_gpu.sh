#!/usr/bin/env bash
# cluster-accept watch on a lent 2- or 4-GPU host split into two "nodes" NCCL takes for two hosts (NCCL_HOSTID
# per half; bench/inventories/gpu-host-halves.yaml or h200x2-auto-halves.yaml): the training step as a real NCCL job of two
# halves, armed only through its environment (`cluster-accept arm --local --format env`).
#   1. overhead: the same job unarmed and armed, twice each, alternated; step time per run (ms)
#   2. a rank killed mid-run (half-a, rank 0): named dead with its node
#   3. straggler: a GEMM co-tenant started on half-b's last GPU mid-run; the watch must name half-b, that
#      rank and GPU; once named, the job is stopped (its owner excluding the node) and the re-test (preflight and
#      the single-node stage beside half-a, the co-tenant still running) must confirm it; time to name measured
#      (one node-side read of the armed NCCL job is kept: fr_nccl_read.txt)
# Usage on the machine, from the repo root: bash bench/watch_gpu.sh   (results under $OUT); OVERHEAD_ROUNDS=0,
# PHASES=strag, STRAG_RETEST=--no-retest, STRAG_FOR=SECONDS run less of it; STRAG_LIMIT_S bounds that watch and its
# re-test, so the findings are printed within the machine's command limit.
set -u
source bench/device_env.sh
GPUS=$(nvidia-smi -L | wc -l)
if [ "$GPUS" -ge 4 ]; then INV=bench/inventories/gpu-host-halves.yaml; A=0,1; B=2,3; PER=2; SLOW_GPU=3
else INV=bench/inventories/h200x2-auto-halves.yaml; A=0; B=1; PER=1; SLOW_GPU=1; fi
JOB=/tmp/job LOGS=/tmp/watch-logs
rm -rf /tmp/watch-strag /tmp/watch-dead "$LOGS"  # a warm machine's earlier watch is not this one's
mkdir -p "$JOB" "$LOGS" && cp cluster_accept/probes/training/node/train_step.py cluster_accept/probes/node/allreduce.py "$JOB/"
MODEL="--layers 12 --width 1024 --heads 16 --seq-len 1024 --micro-batch 8"
# The straggler's job computes more per step than it communicates: with MODEL the halves' socket path keeps
# NCCL's stream busy ~96 % of each step (20 buckets, ~306 ms of all-reduce in a ~318 ms step on 2 x H200), so a
# co-tenant's slower compute hides under the communication and no rank arrives late. 8 x the tokens a step.
STRAG_MODEL=${STRAG_MODEL:-"--layers 12 --width 1024 --heads 16 --seq-len 2048 --micro-batch 32"}
CLI="python3 -m cluster_accept.flows.cli"
$CLI arm --local --watch-dir /tmp/caw/half-a --format taskprolog > "$OUT/watch_gpu.log" 2>&1

launch() {  # name steps armed(0/1) port [model]
  local half gpus rank env
  for half in a b; do
    if [ $half = a ]; then gpus=$A; rank=0; else gpus=$B; rank=1; fi
    env="NCCL_HOSTID=half-$half CUDA_VISIBLE_DEVICES=$gpus"
    [ "$3" = 1 ] && env="$env $($CLI arm --local --watch-dir /tmp/caw/half-$half --format env --job "$1" | tr '\n' ' ')"
    (cd "$JOB" && env $env python3 -m torch.distributed.run --nnodes 2 --node-rank $rank --nproc-per-node $PER \
      --master-addr 127.0.0.1 --master-port "$4" train_step.py ${5:-$MODEL} --steps "$2" --warmup-steps 10 \
      --solo-steps 2 > "$LOGS/$1-half-$half.log" 2>&1) &
  done
}

summarize() {  # the watch's findings and coverage, printed at once (a later step may run out of time)
  python3 - "$1" <<'PY'
import glob, sys, pandas as pd
pd.set_option("display.width", 250); pd.set_option("display.max_colwidth", 160)
for d in glob.glob(f"/tmp/watch-{sys.argv[1]}/*/"):
    try:
        f = pd.read_parquet(d + "watch_findings.parquet")
    except OSError:
        continue
    print(f"## {sys.argv[1]} {d}")
    print(f[["node", "kind", "status", "reason", "rank", "gpu", "named_ns", "confirmed", "action"]].to_string(index=False))
    for r in f[f.status != "pass"].itertuples():
        print(r.node, r.kind, "|", r.observed, "|", r.evidence, "|", r.persistence, "|", r.retest, "|", r.owner_line)
    print(pd.read_parquet(d + "watch_coverage.parquet").to_string(index=False))
for d in glob.glob(f"/tmp/watch-{sys.argv[1]}/*/verdicts.parquet"):
    print(f"## re-test {d}")
    print(pd.read_parquet(d).to_string(index=False))
PY
}

step_ms() {  # the job's step time: the slowest rank's median (rank 0 prints every rank's record)
  python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if l.startswith('{\"info\": \"training_rank\"')]; print(max(x['step_ms_median'] for x in r))" "$1"
}

{
  nvidia-smi -L
  echo "### 1. overhead of arming (steps 100, step time ms)"
  for round in $(seq 1 "${OVERHEAD_ROUNDS:-2}"); do
    for armed in 0 1; do
      launch "ovh$round$armed" 100 $armed $((29500 + round * 10 + armed)); wait
      echo "round $round armed $armed step_ms $(step_ms "$LOGS/ovh$round$armed-half-a.log")"
    done
  done

  if [[ " ${PHASES:-dead strag} " == *" dead "* ]]; then
  echo "### 2. a rank killed mid-run (half-a, rank 0)"
  launch dead 100000 1 29700
  sleep 30
  pid=$(python3 -c "import json; print(json.load(open('/tmp/caw/half-a/dead/rank0.json'))['pid'])")
  kill -9 "$pid"; echo "killed rank 0 pid $pid at $(date +%s%N)"
  $CLI watch --inventory $INV --nodes 'half-a,half-b' --job dead --watch-dir '/tmp/caw/{node}' --interval 2 \
    --window 30 --for 20 --no-retest --out /tmp/watch-dead
  echo "watch exit $?"
  pkill -9 -f train_step.py; wait
  summarize dead
  fi

  if [[ " ${PHASES:-dead strag} " == *" strag "* ]]; then
  echo "### 3. GEMM co-tenant on GPU $SLOW_GPU (half-b) mid-run"
  launch strag 100000 1 29600 "$STRAG_MODEL"
  sleep "${STRAG_WARM_S:-40}"
  python3 cluster_accept/watch/node/job_read.py --dir /tmp/caw/half-b/strag --limit 40 > "$OUT/fr_nccl_read.txt"
  python3 bench/cotenant_gemm.py --gpu $SLOW_GPU --seconds 600 & COTENANT=$!
  start=$(date +%s%N); echo "cotenant started_ns $start"
  (sleep 5; nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv) &
  timeout "${STRAG_LIMIT_S:-420}" $CLI watch --inventory $INV --nodes 'half-a,half-b' --job strag \
    --watch-dir '/tmp/caw/{node}' --interval 2 --window 30 --until-named --for "${STRAG_FOR:-240}" --retest-wait 120 \
    ${STRAG_RETEST:-} --out /tmp/watch-strag & WATCH=$!
  # Once a node is named, its owner stops the job (excluding the node): the re-test waits for the job to leave the
  # GPUs it measures. The co-tenant stays: it is what the re-test should find.
  until python3 -c "import glob,sys,pandas as p; sys.exit(not any((p.read_parquet(f).status == 'fail').any() for f in glob.glob('/tmp/watch-strag/*/watch_findings.parquet')))" 2>/dev/null; do
    kill -0 $WATCH 2>/dev/null || break; sleep 1
  done
  if kill -0 $WATCH 2>/dev/null; then echo "named by $(date +%s%N); the job is stopped"; fi
  pkill -9 -f train_step.py
  wait $WATCH; echo "watch exit $?"
  kill $COTENANT; wait
  summarize strag
  fi
} >> "$OUT/watch_gpu.log" 2>&1
# Few files come back from the machine: the jobs' logs and the watches' directories go as two archives.
tar czf "$OUT/logs.tgz" -C "$LOGS" .
tar czf "$OUT/watch.tgz" -C /tmp $(cd /tmp && ls -d watch-strag watch-dead 2>/dev/null)
tail -c 12000 "$OUT/watch_gpu.log"
