#!/usr/bin/env bash
# Diagnosis on a lent GPU machine (one GPU is enough), profile: auto with no threshold written, the real CLI on the
# local transport, in two calls. Usage on the machine, from the repo root, wheels carried in .whl:
#   bash bench/diagnosis_gpu.sh history   three healthy runs of preflight and single-node over one history (each
#                                         must be accepted), check --local, then CUDA_LAUNCH_BLOCKING=1 (a debugging
#                                         leftover: every kernel launch waits) planted after the accepted runs: the
#                                         training figure's failures must name it alone, from the history's difference
#   bash bench/diagnosis_gpu.sh planted   NVIDIA_TF32_OVERRIDE=0 (cuBLAS's TF32 off: the tf32 GEMM runs as fp32)
#                                         planted in the job environment beside settings a container image sets, no
#                                         history: the cause must be that setting alone, proved arm by arm
# bench/diagnosis_report.py prints the verdicts, the job_settings rows and the failing figures, and PASS/FAIL lines.
set -u
. bench/device_env.sh
mode=${1:-history}
inv=bench/inventories/gpu-host-auto.yaml
log=$OUT/diagnosis_$mode.log
mkdir -p /tmp/runs
run() {  # NAME HISTORY [env...]
  local name=$1 history=$2; shift 2
  s=$(date +%s)
  env "$@" python3 -m cluster_accept.flows.cli run --inventory "$inv" --out "/tmp/runs/$name" \
    --stages preflight,single-node --history "$history"
  echo "### $name: exit $? wall $(( $(date +%s) - s )) s"
}
{
  nvidia-smi -L
  python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"
  env | grep -E '^(NCCL_|TORCH_|PYTORCH_|CUDA_|NVIDIA_|CUBLAS|CUDNN_|OMP_|MKL_|NVSHMEM_|UCX_)' | sort
  if [ "$mode" = history ]; then
    for i in 1 2 3; do run "healthy$i" /tmp/history; done
    s=$(date +%s)
    python3 -m cluster_accept.flows.cli check --local --inventory "$inv" > /tmp/runs/check_local.txt 2>&1
    echo "### check_local: exit $? wall $(( $(date +%s) - s )) s"; tail -5 /tmp/runs/check_local.txt
    run launch_blocking /tmp/history CUDA_LAUNCH_BLOCKING=1
  else
    # what an image and a site set beside the culprit (none of them changes a GEMM), then the culprit
    run tf32_off - CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_MODULE_LOADING=LAZY PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
      OMP_NUM_THREADS=8 TORCH_NCCL_ASYNC_ERROR_HANDLING=3 CUDA_DEVICE_MAX_CONNECTIONS=32 NVIDIA_TF32_OVERRIDE=0
  fi
  python3 bench/diagnosis_report.py "$mode"
} > "$log" 2>&1
tar czf "$OUT/diagnosis_runs_$mode.tgz" -C /tmp runs
tail -c 14000 "$log"
