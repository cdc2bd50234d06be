#!/usr/bin/env bash
# The watch of a data-parallel NCCL job on a lent GPU machine through the real CLI, with NCCL's RAS read beside the
# Flight Recorder: the job of bench/nccl_signals_job.py as two "nodes" (NCCL_HOSTID per half; one GPU each on a
# 2-GPU host, both on GPU 0 of a one-GPU host; bench/inventories/h200x2-auto-halves.yaml, address local), armed by
# `cluster-accept arm --local --format env`.
#   stopped  half-b's rank stopped (SIGSTOP): `watch --hang-after 20 --until-named` must name half-b (hang), with
#            what RAS said of its process; the time from the stop to the naming is printed
#   killed   half-b's rank killed (SIGKILL): `watch --until-named` must name half-b (dead_rank); time to name
# Usage on the machine, from the repo root, wheels in .whl: bash bench/watch_ras_gpu.sh   (results under $OUT)
set -u
. bench/device_env.sh
GPUS=$(nvidia-smi -L | grep -c '^GPU')
if [ "$GPUS" -ge 2 ]; then A=0 B=1; else A=0 B=0; fi
INV=bench/inventories/h200x2-auto-halves.yaml
if [ "$GPUS" -lt 2 ]; then
  sed 's/cuda_visible_devices: "1"/cuda_visible_devices: "0"/' "$INV" > /tmp/one-gpu.yaml && INV=/tmp/one-gpu.yaml
fi
CLI="python3 -m cluster_accept.flows.cli"
JOB=/tmp/rasjob
rm -rf "$JOB" /tmp/caw /tmp/watch-* && mkdir -p "$JOB" "$OUT/logs" && cp bench/nccl_signals_job.py "$JOB/"

launch() {  # job master-port
  local half gpu rank armenv
  for half in a b; do
    if [ $half = a ]; then gpu=$A rank=0; else gpu=$B rank=1; fi
    mkdir -p "/tmp/caw/half-$half/$1" "$JOB/$1"
    armenv=$($CLI arm --local --watch-dir "/tmp/caw/half-$half" --format env --job "$1" | tr '\n' ' ')
    # Both "nodes" are one machine: RAS's listener is half-a's process on 28028 (the watch's port), half-b's on 28029
    (cd "$JOB" && env $armenv NCCL_RAS_ADDR="localhost:2802$((8 + rank))" NCCL_HOSTID="half-$half" \
      CUDA_VISIBLE_DEVICES=$gpu python3 -m torch.distributed.run \
      --nnodes 2 --node-rank $rank --nproc-per-node 1 --master-addr 127.0.0.1 --master-port "$2" \
      nccl_signals_job.py --seconds 400 --pid-dir "$JOB/$1" > "$OUT/logs/$1-half-$half.log" 2>&1) &
  done
  for _ in $(seq 1 120); do [ -s "$JOB/$1/rank1.pid" ] && [ -s "$JOB/$1/rank0.pid" ] && return 0; sleep 1; done
  echo "### $1: ranks not up in 120 s"
}

summarize() {  # job fault_ns: the findings that fail, and the time from the fault to each naming
  python3 - "$1" "$2" <<'PY'
import glob, sys, pandas as pd
pd.set_option("display.width", 250); pd.set_option("display.max_colwidth", 400)
job, fault = sys.argv[1], int(sys.argv[2])
for d in glob.glob(f"/tmp/watch-{job}/2*/"):  # the run directories (history/ beside them)
    f = pd.read_parquet(d + "watch_findings.parquet")
    print(f"## {job}: {d}")
    print(f[["node", "kind", "status", "reason", "rank"]].to_string(index=False))
    for r in f[f.status == "fail"].itertuples():
        print(f"NAMED {r.node} {r.kind} {r.reason} rank {r.rank} after {(r.named_ns - fault) / 1e9:.1f} s")
        print("  observed:", r.observed); print("  evidence:", r.evidence); print("  owner:", r.owner_line)
    c = pd.read_parquet(d + "watch_coverage.parquet")
    print(c[c.signal == "ras"].to_string(index=False))
PY
}

watching() {  # job seconds [more watch options]: the watch in the background, returned once its first round is written
  $CLI watch --inventory "$INV" --nodes 'half-a,half-b' --job "$1" --watch-dir '/tmp/caw/{node}' --interval 2 \
    --window 30 --until-named --for "$2" --no-retest --out "/tmp/watch-$1" ${3:-} > "$OUT/watch-$1.log" 2>&1 &
  WATCH=$!
  for _ in $(seq 1 90); do ls /tmp/watch-"$1"/*/watch_findings.parquet > /dev/null 2>&1 && return 0; sleep 1; done
  echo "### $1: no round written in 90 s"
}

{
  nvidia-smi -L
  python3 -c "import torch; print('torch', torch.__version__, 'nccl', '.'.join(map(str, torch.cuda.nccl.version())))"
  launch stop 29610 && watching stop 150 "--hang-after 20" && sleep 6
  kill -STOP "$(cat "$JOB/stop/rank1.pid")"; fault=$(date +%s%N); echo "### stopped rank 1 at $fault"
  wait $WATCH; echo "### watch exit $?"
  summarize stop "$fault"
  kill -KILL "$(cat "$JOB/stop/rank1.pid")" "$(cat "$JOB/stop/rank0.pid")"; pkill -f nccl_signals_job; wait
  launch kill 29620 && watching kill 90 && sleep 6
  kill -KILL "$(cat "$JOB/kill/rank1.pid")"; fault=$(date +%s%N); echo "### killed rank 1 at $fault"
  wait $WATCH; echo "### watch exit $?"
  summarize kill "$fault"
  pkill -9 -f nccl_signals_job; wait
} > "$OUT/watch_ras_gpu.log" 2>&1
tar -C /tmp -czf "$OUT/watch.tgz" watch-stop watch-kill 2>/dev/null
tar -C "$OUT" -czf /tmp/logs.tgz logs watch-stop.log watch-kill.log && rm -rf "$OUT/logs" "$OUT"/watch-*.log && mv /tmp/logs.tgz "$OUT/"
tail -c 9000 "$OUT/watch_ras_gpu.log"
