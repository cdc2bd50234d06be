#!/usr/bin/env bash
# The gpu test tier on a lent GPU machine, in one call (see the device tool): tests/test_gpu_tier.py with the
# real CLI on the local transport. Usage on the machine, from the repo root, with the wheels carried in .whl:
#   bash bench/gpu_tier.sh [INVENTORY]        (results and the log under $OUT)
set -u
export CA_GPU_INVENTORY=${1:-bench/inventories/h200x2.yaml}
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=180
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 3
fi
{
  echo "### machine"; nvidia-smi -L
  python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
  s=$(date +%s)
  python3 -m pytest -m gpu tests/test_gpu_tier.py -v -p no:cacheprovider --junitxml="$OUT/junit.xml"
  echo "pytest exit $? wall $(( $(date +%s) - s )) s"
} > "$OUT/gpu_tier.log" 2>&1
tail -c 12000 "$OUT/gpu_tier.log"
