#!/usr/bin/env bash
# check --local before and after a change, on one lent GPU machine in one call: bench/check_local.py on the working
# tree, then on an older tree of the package (REV, extracted from a tar made beforehand with
# `git archive REV cluster_accept | gzip > bench/old-tree.tar.gz`, which travels as an untracked file).
set -u
. bench/device_env.sh
nvidia-smi -L
mkdir -p /tmp/old && tar -C /tmp/old -xzf bench/old-tree.tar.gz
python3 bench/check_local.py --runs 20 --out "$OUT/after" 2>&1 | tail -25
PYTHONPATH=/tmp/site:/tmp/old python3 bench/check_local.py --runs 20 --out "$OUT/before" 2>&1 | tail -25
inv=$(ls -d /tmp/ca-check-*/inventory.yaml | head -1)
python3 -X importtime -m cluster_accept.flows.cli check --local --inventory "$inv" 2> "$OUT/after/importtime.txt"
python3 -X importtime -m cluster_accept.flows.cli --help 2> "$OUT/after/importtime-help.txt" > /dev/null
