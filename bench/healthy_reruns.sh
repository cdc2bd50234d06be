#!/usr/bin/env bash
# Healthy reruns of a lent host, counted for false rejections: the real CLI, profile: auto, no figure's minimum
# written, RUNS runs (default 5) of preflight and single-node one after another over one shared history, so that
# after the first each run is judged against its peers' figures and the node's own accepted runs alike.
# Usage on the machine, from the repo root, wheels carried in .whl: RUNS=5 bash bench/healthy_reruns.sh
# Prints a line per run (exit code, verdict, rows not passing) and writes healthy_reruns.json under $OUT.
set -u
. bench/device_env.sh
inv=${INVENTORY:-bench/inventories/gpu-host-auto.yaml}
rm -rf /tmp/reruns && mkdir -p /tmp/reruns
{
  nvidia-smi -L
  for n in $(seq 1 "${RUNS:-5}"); do
    s=$(date +%s)
    python3 -m cluster_accept.flows.cli run --inventory "$inv" --out "/tmp/reruns/r$n" --stages preflight,single-node \
      --history /tmp/reruns/history > "$OUT/rerun-$n.log" 2>&1
    echo "### run $n: exit $? wall $(( $(date +%s) - s )) s"
  done
  python3 bench/healthy_reruns.py /tmp/reruns --json "$OUT/healthy_reruns.json"
} > "$OUT/healthy_reruns.log" 2>&1
tail -c 5000 "$OUT/healthy_reruns.log"
