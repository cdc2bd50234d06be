#!/bin/sh
# Slurm Prolog for cluster-accept: this node checks itself before a job starts on it, synchronously, in seconds
# (the preflight on this machine: no SSH, no Prefect). A node that fails is drained with the reasons in Slurm's
# reason field ("cluster-accept: nvlink:inactive gpu3, ...") and the prolog exits 1, so Slurm requeues the job
# onto another node; a healthy node exits 0 and the job starts. A failure of the tool itself (a missing or
# wrong inventory, a bug: exit 2 or 3) never keeps jobs off the node: it is logged and the prolog exits 0.
#
# slurm.conf:
#   Prolog=/usr/local/sbin/cluster-accept-prolog
#   PrologFlags=Alloc          # check at allocation, before the batch script or the first step
#
# slurmd starts it as root with little environment (SLURMD_NODENAME, SLURM_JOB_ID ...), so what it needs comes
# from here or from the site file /etc/default/cluster-accept (CLUSTER_ACCEPT_ENV names another):
#   PATH                       where cluster-accept, nvidia-smi and scontrol are
#   CLUSTER_ACCEPT_INVENTORY   the site's inventory (default /etc/cluster-accept/inventory.yaml)
#   CLUSTER_ACCEPT_STATE_DIR   where the node keeps its marks between checks, so an XID is judged once
#                              (default /var/lib/cluster-accept; root's alone to write)
#   SLURM_CONF                 when slurm.conf is not in its default place
set -u
site=${CLUSTER_ACCEPT_ENV:-/etc/default/cluster-accept}
if [ -r "$site" ]; then . "$site"; fi
PATH=${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}
export PATH
cluster-accept check --local --inventory "${CLUSTER_ACCEPT_INVENTORY:-/etc/cluster-accept/inventory.yaml}" \
    --drain --apply
rc=$?
case $rc in
    0 | 1) exit "$rc" ;;
    *) logger -t cluster-accept-prolog "check failed on the tool's side (exit $rc): job ${SLURM_JOB_ID:-?} let through" \
           2>/dev/null
       exit 0 ;;
esac
