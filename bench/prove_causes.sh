#!/usr/bin/env bash
# Causes proved on a lent multi-GPU host, profile: auto with no figure's minimum written, the real CLI (local
# transport). Usage on the machine, from the repo root, wheels carried in .whl:
#   bash bench/prove_causes.sh one      the host as one node: healthy, then three NCCL settings that slow
#                                       collectives planted one at a time (/etc/nccl.conf, the environment,
#                                       ~/.nccl.conf); two harmless NCCL settings in every run's environment
#   bash bench/prove_causes.sh halves   the host as two "nodes" NCCL takes for two hosts (NCCL_HOSTID per half):
#                                       healthy, then a setting on one half that slows the path between them
#                                       (halves-planted: the planted runs only; halves-healthy: the healthy run
#                                       only). On a 2-GPU host each half is one GPU.
# Prints the verdicts, the job_settings rows and the failing figures' rows, and asserts what each run must say.
set -u
. bench/device_env.sh
mode=${1:-one}
mkdir -p /tmp/runs
log=$OUT/prove_causes_$mode.log
lean() {  # INVENTORY OUT: the inventory with training and the GPU pair matrix off (the planted runs judge collectives)
  python3 - "$1" "$2" <<'PY'
import sys, yaml
data = yaml.safe_load(open(sys.argv[1]))
for profile in data["profiles"].values():
    profile["training"] = {"enabled": False}
    profile.setdefault("probes", {})["gpu_pairs"] = False
    kept = {k: v for k, v in profile.get("thresholds", {}).items() if not k.startswith("training_")}
    profile["thresholds"] = kept  # a training minimum without training is refused when the inventory loads
yaml.safe_dump(data, open(sys.argv[2], "w"))
PY
}
# Two NCCL settings that change no figure on these hosts, in every run's environment beside the planted one: a
# debug subsystem list, and an InfiniBand timeout on a host without InfiniBand. Neither may ever be named.
HARMLESS=(NCCL_DEBUG_SUBSYS=INIT,ENV NCCL_IB_TIMEOUT=22)
run() {  # NAME INVENTORY STAGES [env...]
  local name=$1 inv=$2 stages=$3; shift 3
  s=$(date +%s)
  env "${HARMLESS[@]}" "$@" python3 -m cluster_accept.flows.cli run --inventory "$inv" --out "/tmp/runs/$name" --stages "$stages" \
    --history -
  echo "### $name: exit $? wall $(( $(date +%s) - s )) s"
}
planted_file() {  # FILE LINE NAME INVENTORY STAGES: LINE in FILE for one run, the file put back after
  local file=$1 line=$2 name=$3 inv=$4 stages=$5 kept=""
  [ -e "$file" ] && kept=$(mktemp) && cp "$file" "$kept"
  echo "$line" >> "$file"
  run "$name" "$inv" "$stages"
  if [ -n "$kept" ]; then cp "$kept" "$file"; else rm -f "$file"; fi
}
{
  nvidia-smi -L
  ls -l /etc/nccl.conf ~/.nccl.conf 2>&1
  if [ "$mode" = one ]; then
    inv=bench/inventories/gpu-host-auto.yaml
    lean "$inv" /tmp/lean.yaml
    run healthy "$inv" preflight,single-node
    planted_file /etc/nccl.conf NCCL_MAX_NCHANNELS=1 max_nchannels /tmp/lean.yaml preflight,single-node
    run proto_ll /tmp/lean.yaml preflight,single-node NCCL_PROTO=LL
    planted_file ~/.nccl.conf NCCL_P2P_LEVEL=LOC p2p_level /tmp/lean.yaml preflight,single-node
  else
    inv=bench/inventories/gpu-host-halves.yaml
    if [ "$(nvidia-smi -L | grep -c '^GPU')" = 2 ]; then
      # one GPU a half: no figure between a half's GPUs, and the socket path between two one-GPU halves has floors
      # of its own: about 0.65 of what a lent 2 x H200 measured there (all-reduce 2.85 GB/s, all-gather 3.59,
      # reduce-scatter 3.13, all-to-all 2.49; bench/results/h200x2-halves/)
      python3 - "$inv" /tmp/halves.yaml <<'PY'
import sys, yaml
from cluster_accept.inventory.threshold_needs import NEEDS_TWO_GPUS
SOCKET_FLOORS = {
    "allreduce_inter_busbw_gbps_min": 1.85,
    "allgather_inter_busbw_gbps_min": 2.3,
    "reducescatter_inter_busbw_gbps_min": 2.0,
    "alltoall_inter_busbw_gbps_min": 1.6,
}
data = yaml.safe_load(open(sys.argv[1]))
for name, devices in (("half-a", "0"), ("half-b", "1")):
    profile = data["profiles"][name]
    profile["probes"]["cuda_visible_devices"] = devices
    profile["thresholds"] = {**{key: None for key in NEEDS_TWO_GPUS}, **profile.get("thresholds", {}), **SOCKET_FLOORS}
yaml.safe_dump(data, open(sys.argv[2], "w"))
PY
      inv=/tmp/halves.yaml
    fi
    [ "$mode" != halves-planted ] && run halves_healthy "$inv" preflight,multi-node
  fi
  if [ "$mode" = halves ] || [ "$mode" = halves-planted ]; then
    lean "$inv" /tmp/lean.yaml
    plant() {  # SETTING OUT: half-b's job environment with SETTING
      python3 - "$1" "$2" <<'PY'
import sys, yaml
data = yaml.safe_load(open("/tmp/lean.yaml"))
data["profiles"]["half-b"]["probes"]["command_prefix"] = f"env NCCL_HOSTID=half-b {sys.argv[1]}"
yaml.safe_dump(data, open(sys.argv[2], "w"))
PY
    }
    plant NCCL_MAX_NCHANNELS=1 /tmp/planted-half.yaml
    run halves_planted /tmp/planted-half.yaml preflight,multi-node
    if python3 -c "import glob,sys,pandas as p; v=p.read_parquet(sorted(glob.glob('/tmp/runs/halves_planted/2*/'))[-1]+'verdicts.parquet'); sys.exit('rejected' in set(v.verdict))"; then
      echo "### one channel did not slow the socket path: a smaller NCCL buffer instead"
      plant NCCL_BUFFSIZE=65536 /tmp/planted-half2.yaml
      run halves_buffsize /tmp/planted-half2.yaml preflight,multi-node
    fi
  fi
  python3 bench/prove_causes_report.py "$mode"
} > "$log" 2>&1
tar czf "$OUT/prove_causes_$mode.tgz" -C /tmp runs
tail -c 14000 "$log"
