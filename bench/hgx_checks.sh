#!/usr/bin/env bash
# The HGX checks on a lent GPU machine, in one call: raw outputs of the tools they read (kept as fixtures), each
# new check's command, the node's own check on profile: auto, and a burn of every GPU to calibrate the thermal
# gate (bench/hgx_checks.py). Usage there, from the repo root, with the wheels carried in .whl:
#   bash bench/hgx_checks.sh [BURN_SECONDS]        (results under $OUT)
set -u
. bench/device_env.sh
raw="$OUT/raw"; mkdir -p "$raw"
{
  echo "### machine"; nvidia-smi -L; nvidia-smi | sed -n 3p
  nvidia-smi -q > "$raw/nvidia-smi-q.txt" 2>&1
  nvidia-smi --query-gpu=index,pci.bus_id,vbios_version,inforom.img,inforom.oem --format=csv > "$raw/vbios.txt" 2>&1
  { systemctl show nvidia-fabricmanager -p LoadState -p ActiveState -p SubState -p Result; echo "[exit $?]"; \
    nv-fabricmanager --version; echo "[exit $?]"; } > "$raw/fabricmanager.txt" 2>&1
  for d in /sys/bus/pci/devices/*; do v=$(cat "$d/vendor" 2>/dev/null); case "$v" in 0x10de|0x15b3) ;; *) continue;; esac
    echo "== $d class $(cat "$d/class")"; for f in "$d"/aer_dev_* "$d"/current_link_* "$d"/max_link_*; do
    [ -r "$f" ] && { echo "-- ${f##*/}"; cat "$f"; }; done; done > "$raw/pci-sysfs.txt" 2>&1
  for f in /sys/class/infiniband/*/fw_ver; do [ -r "$f" ] && echo "$f $(cat "$f")"; done > "$raw/fw_ver.txt" 2>&1
  { dmesg 2>&1 || journalctl -k -b --no-pager 2>&1; } | grep -E "Xid|SXid|nvswitch|fabric" | tail -50 > "$raw/kernel-xid.txt"
  { ofed_info -s; echo "[exit $?]"; } > "$raw/ofed.txt" 2>&1
  ls /proc/driver/nvidia-nvswitch/devices > "$raw/nvswitch-proc.txt" 2>&1
  python3 bench/hgx_checks.py --out "$OUT" --burn-seconds "${1:-180}"
} > "$OUT/hgx.log" 2>&1
tail -c 10000 "$OUT/hgx.log"
