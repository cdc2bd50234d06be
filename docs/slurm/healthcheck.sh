#!/bin/sh
# Slurm HealthCheckProgram for cluster-accept: this node checks itself, synchronously, in seconds (the preflight
# on this machine: no SSH, no Prefect). A node that fails is drained with the reasons in Slurm's reason field
# ("cluster-accept: nvlink:inactive gpu3, ..."); a node cluster-accept drained earlier that passes again is
# resumed, but only when this check looked again at every finding it was drained for; a node drained for any
# other reason is never touched. Nodes stay in service while they pass, like NHC.
#
# slurm.conf:
#   HealthCheckProgram=/usr/local/sbin/cluster-accept-healthcheck
#   HealthCheckInterval=3600
#   HealthCheckNodeState=IDLE,CYCLE
#
# slurmd starts it as root with an empty environment (only SLURMD_NODENAME is set), so everything it needs
# comes from here or from the site file /etc/default/cluster-accept (CLUSTER_ACCEPT_ENV names another):
#   PATH                       where cluster-accept, nvidia-smi and scontrol are
#   CLUSTER_ACCEPT_INVENTORY   the site's inventory (default /etc/cluster-accept/inventory.yaml)
#   CLUSTER_ACCEPT_STATE_DIR   where the node keeps its marks between checks, so an XID is judged once
#                              (default /var/lib/cluster-accept; root's alone to write)
#   CLUSTER_ACCEPT_PROM        a node_exporter textfile to write the verdict to (optional)
#   SLURM_CONF                 when slurm.conf is not in its default place
set -u
site=${CLUSTER_ACCEPT_ENV:-/etc/default/cluster-accept}
if [ -r "$site" ]; then . "$site"; fi
PATH=${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}
export PATH
set -- check --local --inventory "${CLUSTER_ACCEPT_INVENTORY:-/etc/cluster-accept/inventory.yaml}" \
    --drain --resume-passing --apply
if [ -n "${CLUSTER_ACCEPT_PROM:-}" ]; then set -- "$@" --prometheus "$CLUSTER_ACCEPT_PROM"; fi
cluster-accept "$@"
rc=$?
# the verdict is Slurm's already (drained or resumed); a failure of the tool itself is logged, never a drain
if [ "$rc" -gt 1 ]; then logger -t cluster-accept-healthcheck "check failed on the tool's side (exit $rc)" 2>/dev/null; fi
exit 0
