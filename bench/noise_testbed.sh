#!/usr/bin/env bash
# Noise-aware relative verdicts on the real test-bed (bench/noise_testbed.py), in the background with its log kept:
# 20 runs (10 of them beside busy loops) and 5 with one node 15 % slower; about 15 minutes on 2 cores.
# Usage, as root from the repo root:  bash bench/noise_testbed.sh [ARGS of noise_testbed.py]
# Follow it with:  tail -f bench/results/testbed-noise/log.txt
set -u
out=bench/results/testbed-noise
mkdir -p "$out"
nohup python3 bench/noise_testbed.py --out "$out" "$@" > "$out/log.txt" 2>&1 &
echo "started $! (log: $out/log.txt)"
