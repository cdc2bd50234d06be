#!/usr/bin/env bash
# check --local before every job after a user's XID 13, on a lent GPU machine as root (bench/check_local_xid.py):
# the clean checks, the XID 13 written through /dev/kmsg, the checks after it, a corrupted CUDA-start cache, an
# XID 79. Usage there, from the repo root, with the wheels carried in .whl: bash bench/check_local_xid.sh [RUNS]
set -u
. bench/device_env.sh
nvidia-smi -L; python3 --version; sysctl kernel.printk_devkmsg 2>/dev/null
python3 bench/check_local_xid.py --runs "${1:-20}" --out "$OUT"
