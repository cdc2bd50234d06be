#!/usr/bin/env bash
# check --local on a lent GPU machine, in one call: 20 timed runs (bench/check_local.py), one profiled run, and
# the raw outputs the node checks read (nvidia-smi -q, PCIe AER counters, HCA firmware) kept beside.
set -u
. bench/device_env.sh
nvidia-smi -L
python3 bench/check_local.py --runs 20 --out "$OUT"
inv=$(ls -d /tmp/ca-check-*/inventory.yaml | head -1)
python3 -m cProfile -o /tmp/check.prof -m cluster_accept.flows.cli check --local --inventory "$inv"
python3 -c "import pstats; pstats.Stats('/tmp/check.prof').sort_stats('cumulative').print_stats(30)" \
  > "$OUT/check_profile.txt" 2>&1
python3 -X importtime -m cluster_accept.flows.cli check --local --inventory "$inv" 2> "$OUT/importtime.txt"
python3 -X importtime -m cluster_accept.flows.cli --help 2> "$OUT/importtime-help.txt" > /dev/null
mkdir -p /tmp/raw
nvidia-smi -q > /tmp/raw/nvidia-smi-q.txt 2>&1
for f in /sys/bus/pci/devices/*/aer_dev_*; do [ -r "$f" ] && { echo "### $f"; cat "$f"; }; done > /tmp/raw/aer.txt 2>&1
for f in /sys/class/infiniband/*/fw_ver; do [ -r "$f" ] && { echo "### $f"; cat "$f"; }; done > /tmp/raw/fw_ver.txt 2>&1
tar -C /tmp -czf "$OUT/raw.tar.gz" raw
grep -E "cumulative|check_node|run_preflight|import" "$OUT/check_profile.txt" | head -20
