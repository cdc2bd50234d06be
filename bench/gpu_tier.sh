#!/usr/bin/env bash
# The gpu test tier on a lent GPU machine, in one call (see the device tool): tests/test_gpu_tier.py with the
# real CLI on the local transport. Usage on the machine, from the repo root, with the wheels carried in .whl:
#   bash bench/gpu_tier.sh [INVENTORY]        (results and the log under $OUT)
set -u
export CA_GPU_INVENTORY=${1:-bench/inventories/h200x2.yaml}
. bench/device_env.sh
export OUT
{
  echo "### machine"; nvidia-smi -L
  python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
  s=$(date +%s)
  python3 -m pytest -m gpu tests/test_gpu_tier.py -v -p no:cacheprovider --junitxml="$OUT/junit.xml"
  echo "pytest exit $? wall $(( $(date +%s) - s )) s"
} > "$OUT/gpu_tier.log" 2>&1
tail -c 12000 "$OUT/gpu_tier.log"
