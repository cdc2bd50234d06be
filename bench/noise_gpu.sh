#!/usr/bin/env bash
# Noise-aware verdicts on a lent GPU host (the host as one node, profile: auto, no minimum written, the real CLI
# on the local transport). Usage on the machine, from the repo root, wheels carried in .whl:
#   bash bench/noise_gpu.sh calibrate   cluster-accept calibrate: 5 A=A runs of preflight + single-node, the noise
#                                       table written to the history (runs/noise-gpu/history)
#   bash bench/noise_gpu.sh judge       5 healthy runs judged with that table (same history): none may be rejected
#   bash bench/noise_gpu.sh report      the table, and per run its verdict and its relative rows by outcome
# Runs stay under runs/noise-gpu (git-ignored: kept between calls on a warm machine); $OUT gets the logs, the
# table and the runs' small tables.
set -u
. bench/device_env.sh
mode=${1:-calibrate}
out=runs/noise-gpu
mkdir -p "$out"
inv=$out/inventory.yaml
python3 - bench/inventories/gpu-host-auto.yaml "$inv" <<'PY'
import sys, yaml
data = yaml.safe_load(open(sys.argv[1]))
for profile in data["profiles"].values():
    profile["training"] = {"enabled": False}  # one node trains with no peer; its floors are judged elsewhere
yaml.safe_dump(data, open(sys.argv[2], "w"))
PY
cli() { python3 -m cluster_accept.flows.cli "$@"; }
{
  nvidia-smi -L
  case "$mode" in
    calibrate)
      s=$(date +%s)
      cli calibrate --inventory "$inv" --runs 5 --stages preflight,single-node --out "$out"
      echo "### calibrate: exit $? wall $(( $(date +%s) - s )) s"
      ;;
    judge)
      for i in 1 2 3 4 5; do
        s=$(date +%s)
        cli run --inventory "$inv" --out "$out" --stages preflight,single-node
        echo "### judged run $i: exit $? wall $(( $(date +%s) - s )) s"
      done
      ;;
  esac
  python3 bench/noise_gpu_report.py "$out"
} 2>&1 | tee -a "$OUT/noise_gpu_$mode.log"
mkdir -p "$OUT/runs"
cp -r "$out/history/calibration" "$OUT/" 2>/dev/null
for run in "$out"/*/; do
  name=$(basename "$run")
  [ "$name" = history ] && continue
  mkdir -p "$OUT/runs/$name"
  cp "$run"/verdicts.parquet "$run"/checks.parquet "$run"/measurements.parquet "$OUT/runs/$name/" 2>/dev/null
done
