#!/usr/bin/env bash
# Our collectives beside NVIDIA's nccl-tests on a lent multi-GPU host, in one call: nccl-tests built there against
# the NCCL torch loads (its source carried as .nt/nccl-tests.tar.gz, a `git archive` of NVIDIA/nccl-tests), each
# collective from 1 MiB to 1 GiB over every GPU of the host; then the real CLI's acceptance of the host
# (profile: auto, no figure's minimum written, training on) and bench/nccl_tests_beside.py: each of our figures
# against nccl-tests' at the same size, and the run's verdict. Usage there, from the repo root:
#   bash bench/nccl_tests_beside.sh          (results under $OUT)
#   bash bench/nccl_tests_beside.sh settings nccl-tests' all-reduce at 1 GiB on every GPU, healthy and then with each
#                                            setting bench/prove_causes.sh plants or keeps harmless, one at a time:
#                                            what each does to the collective, measured by NVIDIA's own test
set -u
. bench/device_env.sh
nt=/tmp/nccl-tests home=/tmp/nccl-home
mkdir -p "$nt" "$home/lib" /tmp/runs && tar -C "$nt" -xzf .nt/nccl-tests.tar.gz
nccl=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")
ln -sf "$nccl/lib/libnccl.so.2" "$home/lib/libnccl.so" && ln -sf "$nccl/lib/libnccl.so.2" "$home/lib/libnccl.so.2"
ln -sfn "$nccl/include" "$home/include"
cuda=$(dirname "$(dirname "$(command -v nvcc)")")
n=$(nvidia-smi -L | grep -c '^GPU')
build() {
  nvidia-smi -L
  make -s -C "$nt" -j16 MPI=0 CUDA_HOME="$cuda" NCCL_HOME="$home" NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" \
    > "$OUT/nccl_tests_build.log" 2>&1
  echo "### build exit $?"
}
if [ "${1:-beside}" = settings ]; then
  {
    build
    for setting in healthy NCCL_MAX_NCHANNELS=1 NCCL_PROTO=LL NCCL_P2P_LEVEL=LOC NCCL_DEBUG_SUBSYS=INIT,ENV NCCL_IB_TIMEOUT=22; do
      extra=$([ "$setting" = healthy ] || echo "$setting")
      env $extra LD_LIBRARY_PATH="$home/lib:${LD_LIBRARY_PATH:-}" "$nt/build/all_reduce_perf" -b 1G -e 1G -d float \
        -g "$n" -w 5 -n 20 > "$OUT/nccl_tests_setting_${setting%%=*}.txt" 2>&1
      echo "### $setting exit $? busbw $(grep -E '^ +1073741824' "$OUT/nccl_tests_setting_${setting%%=*}.txt" | awk '{print $8}')"
    done
  } > "$OUT/nccl_tests_settings.log" 2>&1
  cat "$OUT/nccl_tests_settings.log"
  exit 0
fi
{
  build
  for op in all_reduce all_gather reduce_scatter alltoall; do
    LD_LIBRARY_PATH="$home/lib:${LD_LIBRARY_PATH:-}" NCCL_DEBUG=VERSION "$nt/build/${op}_perf" -b 1M -e 1G -f 4 -d float \
      -g "$n" -w 5 -n 20 > "$OUT/nccl_tests_$op.txt" 2>&1
    echo "### $op exit $?"
  done
  s=$(date +%s)
  python3 -m cluster_accept.flows.cli run --inventory bench/inventories/gpu-host-auto.yaml --out /tmp/runs/healthy \
    --stages preflight,single-node --history -
  echo "### healthy: exit $? wall $(( $(date +%s) - s )) s"
  python3 bench/nccl_tests_beside.py --nccl-tests "$OUT" --run /tmp/runs/healthy --json "$OUT/nccl_tests_beside.json"
} > "$OUT/nccl_tests_beside.log" 2>&1
tar czf "$OUT/runs.tgz" -C /tmp runs
tail -c 9000 "$OUT/nccl_tests_beside.log"
