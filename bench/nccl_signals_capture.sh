#!/usr/bin/env bash
# NCCL's own signals of a live job captured on a lent GPU machine, for the watch's readers and their tests: RAS's
# status (JSON and text) and the Inspector's records (JSON lines and Prometheus), of a data-parallel NCCL job of two
# "nodes" (one GPU each on a 2-GPU host, both on GPU 0 of a one-GPU host; NCCL_HOSTID per half so NCCL takes them
# for two hosts), armed by `cluster-accept arm --local --format env` with the Inspector built here from NCCL's source
# (carried as .nt/nccl-inspector.tar.gz, a `git archive` of NVIDIA/nccl's plugins/profiler/inspector).
#   healthy   RAS read from each half's port, the Inspector's files and the node reader's lines
#   stopped   half-b's rank stopped (SIGSTOP): RAS read from half-a after 10, 30 and 70 s (NCCL: 60 s to "dead")
#   killed    a new job, half-b's rank killed (SIGKILL): RAS read from half-a after 5 and 20 s
#   prom      a short job with the Inspector in its Prometheus mode (NCCL enforces 30 s between dumps)
# PHASES=diagnostics instead: an NCCL of 2.31 or later preloaded (carried as .nt/libnccl.so.2.xz, the library of the
# PyPI wheel nvidia-nccl-cu13, xz-compressed) for RAS's diagnostics, `ras_read.py --diagnostics` from half-a:
#   diag      a healthy job, also armed with NCCL_RUN_RAS_DIAGNOSTICS=1 (the report at creation, in rank 0's log)
#   diagmix   half-b alone with NCCL_IGNORE_CPU_AFFINITY=1 (a harmless setting that differs across ranks)
# Usage on the machine, from the repo root, wheels in .whl: bash bench/nccl_signals_capture.sh   (results under $OUT)
set -u
. bench/device_env.sh
GPUS=$(nvidia-smi -L | grep -c '^GPU')
if [ "$GPUS" -ge 2 ]; then A=0 B=1; else A=0 B=0; fi
CLI="python3 -m cluster_accept.flows.cli"
JOB=/tmp/sigjob LOGS=$OUT/logs
rm -rf "$JOB" /tmp/caw && mkdir -p "$JOB" "$LOGS" /tmp/insp && cp bench/nccl_signals_job.py "$JOB/"
SO=/tmp/insp/inspector/libnccl-profiler-inspector.so

build() {  # once a machine: a warm one keeps its build
  [ -f "$SO" ] && { echo "### inspector built before"; return 0; }
  tar -C /tmp/insp -xzf .nt/nccl-inspector.tar.gz
  cuda=$(dirname "$(dirname "$(command -v nvcc)")")
  make -C /tmp/insp/inspector CUDA_HOME="$cuda" -j16 > "$OUT/inspector_build.log" 2>&1
  echo "### inspector build exit $? ($cuda)"
}

launch() {  # job seconds master-port [extra env for both halves] [extra env for half-b]
  local half gpu rank armenv
  for half in a b; do
    if [ $half = a ]; then gpu=$A rank=0; else gpu=$B rank=1; fi
    mkdir -p "/tmp/caw/half-$half/$1" "$JOB/$1"
    armenv=$($CLI arm --local --watch-dir "/tmp/caw/half-$half" --format env --job "$1" --inspector "$SO" | tr '\n' ' ')
    (cd "$JOB" && env $armenv NCCL_RAS_ADDR="localhost:2810${rank}" NCCL_HOSTID="half-$half" CUDA_VISIBLE_DEVICES=$gpu \
      ${4:-} $([ $half = b ] && echo "${5:-}") python3 -m torch.distributed.run --nnodes 2 --node-rank $rank --nproc-per-node 1 --master-addr 127.0.0.1 \
      --master-port "$3" nccl_signals_job.py --seconds "$2" --pid-dir "$JOB/$1" > "$LOGS/$1-half-$half.log" 2>&1) &
  done
}

ras() {  # file-stem port: the node reader's line in JSON, then in text with VERBOSE STATUS
  python3 cluster_accept/watch/node/ras_read.py --port "$2" --format json > "$OUT/ras/$1.json.line"
  python3 cluster_accept/watch/node/ras_read.py --port "$2" --format text --verbose > "$OUT/ras/$1.txt.line"
  echo "### ras $1: $(head -c 300 "$OUT/ras/$1.json.line")"
}

wait_pids() {  # job: until both ranks wrote their pid (at most 120 s)
  for _ in $(seq 1 120); do [ -s "$JOB/$1/rank0.pid" ] && [ -s "$JOB/$1/rank1.pid" ] && return 0; sleep 1; done
  echo "### $1: ranks not up in 120 s"; return 1
}

inspector() {  # job stem
  mkdir -p "$OUT/inspector/$2"
  for half in a b; do
    cp -r "/tmp/caw/half-$half/$1/inspector" "$OUT/inspector/$2/half-$half" 2>/dev/null
    python3 cluster_accept/watch/node/inspector_read.py "/tmp/caw/half-$half/$1/inspector" --limit 20 \
      > "$OUT/inspector/$2/half-$half.read" 2>&1
  done
  echo "### inspector $2: $(find "$OUT/inspector/$2" -type f | wc -l) files, $(cat "$OUT"/inspector/"$2"/half-*/* 2>/dev/null | wc -l) lines"
}

diag() {  # file-stem port: RAS's diagnostics as the node reader prints them
  python3 cluster_accept/watch/node/ras_read.py --port "$2" --diagnostics > "$OUT/ras/diag-$1.line"
  echo "### diagnostics $1: $(head -c 600 "$OUT/ras/diag-$1.line")"
}

stop() {  # job: both ranks killed, the launchers waited for
  kill -KILL "$(cat "$JOB/$1/rank0.pid")" "$(cat "$JOB/$1/rank1.pid")" 2> /dev/null; sleep 3
  pkill -f nccl_signals_job; wait
}

diagnostics() {
  mkdir -p /tmp/nccl && xz -dc .nt/libnccl.so.2.xz > /tmp/nccl/libnccl.so.2 || { echo "### no .nt/libnccl.so.2.xz"; return 1; }
  export LD_PRELOAD=/tmp/nccl/libnccl.so.2
  python3 -c "import torch; print('preloaded: nccl', '.'.join(map(str, torch.cuda.nccl.version())))"
  launch diag 90 29540 NCCL_RUN_RAS_DIAGNOSTICS=1
  wait_pids diag && sleep 20
  diag healthy-half-a 28100
  ras diag-healthy-half-a 28100
  stop diag
  launch diagmix 90 29550 "" NCCL_IGNORE_CPU_AFFINITY=1
  wait_pids diagmix && sleep 20
  diag settings-differ-half-a 28100
  stop diagmix
  grep -h "NCCL DIAG" "$LOGS"/diag-half-*.log > "$OUT/ras/diag-at-creation.txt"
  for f in "$LOGS"/*.log; do echo "## $f"; tail -5 "$f"; done
}

signals() {
  build
  launch sig 150 29510
  wait_pids sig && sleep 20
  ras healthy-half-a 28100; ras healthy-half-b 28101
  inspector sig healthy
  kill -STOP "$(cat "$JOB/sig/rank1.pid")"; echo "### stopped rank 1 at $(date +%s)"
  sleep 10; ras stopped10-half-a 28100
  sleep 20; ras stopped30-half-a 28100
  sleep 40; ras stopped70-half-a 28100
  inspector sig stopped
  kill -KILL "$(cat "$JOB/sig/rank0.pid")" "$(cat "$JOB/sig/rank1.pid")"; sleep 5; pkill -f nccl_signals_job; wait
  launch kill 90 29520
  wait_pids kill && sleep 15
  ras before-kill-half-a 28100
  kill -KILL "$(cat "$JOB/kill/rank1.pid")"; echo "### killed rank 1 at $(date +%s)"
  sleep 5; ras killed5-half-a 28100
  sleep 15; ras killed20-half-a 28100
  pkill -f nccl_signals_job; wait
  launch prom 70 29530 "NCCL_INSPECTOR_PROM_DUMP=1 NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS=30000000"
  wait; inspector prom prom
  for f in "$LOGS"/*.log; do echo "## $f"; tail -5 "$f"; done
}

{
  mkdir -p "$OUT/ras"
  nvidia-smi -L
  python3 -c "import torch; print('torch', torch.__version__, 'nccl', '.'.join(map(str, torch.cuda.nccl.version())))"
  "${PHASES:-signals}"
} > "$OUT/capture.log" 2>&1
cp -r /tmp/caw "$OUT/caw"  # the Inspector's own files (JSON lines, Prometheus text) as the plugin wrote them
tar -C "$OUT" -czf /tmp/nccl_signals.tgz . && rm -rf "${OUT:?}"/* && mv /tmp/nccl_signals.tgz "$OUT/"  # one file comes back
tar -xzOf "$OUT/nccl_signals.tgz" ./capture.log | tail -c 3000
