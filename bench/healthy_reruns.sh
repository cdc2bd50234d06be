#!/usr/bin/env bash
# Healthy reruns of a lent host, counted for false rejections: the real CLI, profile: auto, no figure's minimum
# written, RUNS runs (default 5) of preflight and single-node one after another over one shared history, so that
# after the first each run is judged against its peers' figures and the node's own accepted runs alike.
# Usage on the machine, from the repo root, wheels carried in .whl: RUNS=5 bash bench/healthy_reruns.sh
# STOP_AFTER_S=N starts no run that the slowest run so far would carry past N seconds from the start, so a call
# under a time limit still ends with its summary.
# Prints a line per run (exit code, verdict, rows not passing) and writes healthy_reruns.json under $OUT.
set -u
. bench/device_env.sh
inv=${INVENTORY:-bench/inventories/gpu-host-auto.yaml}
rm -rf /tmp/reruns && mkdir -p /tmp/reruns
{
  nvidia-smi -L
  begin=$(date +%s) slowest=0
  for n in $(seq 1 "${RUNS:-5}"); do
    s=$(date +%s)
    if [ -n "${STOP_AFTER_S:-}" ] && [ $(( s - begin + slowest )) -gt "$STOP_AFTER_S" ]; then
      echo "### stopped before run $n: $(( s - begin )) s gone, the slowest run took $slowest s"
      break
    fi
    python3 -m cluster_accept.flows.cli run --inventory "$inv" --out "/tmp/reruns/r$n" --stages preflight,single-node \
      --history /tmp/reruns/history > "$OUT/rerun-$n.log" 2>&1
    rc=$? wall=$(( $(date +%s) - s ))
    [ "$wall" -gt "$slowest" ] && slowest=$wall
    echo "### run $n: exit $rc wall $wall s"
  done
  python3 bench/healthy_reruns.py /tmp/reruns --json "$OUT/healthy_reruns.json"
} > "$OUT/healthy_reruns.log" 2>&1
tail -c 5000 "$OUT/healthy_reruns.log"
