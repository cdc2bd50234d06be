#!/bin/sh
# Slurm HealthCheckProgram (or a prolog) for cluster-accept: the light preflight on this node, without SSH.
# A node that fails is drained with the reasons in Slurm's reason field ("cluster-accept: nvlink:inactive ...");
# a node cluster-accept drained earlier that passes again is resumed; a node drained for any other reason is
# never touched. Nodes stay in service while they pass, like NHC.
#
# slurm.conf:
#   HealthCheckProgram=/usr/local/sbin/cluster-accept-healthcheck
#   HealthCheckInterval=3600
#   HealthCheckNodeState=IDLE,CYCLE
#
# slurmd waits a limited time for a health check (kills it after about a minute), and a check with Prefect
# and every preflight command can take longer on a busy node: so the check runs detached (a session of its
# own), one at a time per node (flock: a check still running makes the next one a no-op), logging to
# $CLUSTER_ACCEPT_OUT/healthcheck-<node>.log, and drains the node itself when it fails.
#
# slurmd starts it as root with an empty environment (only SLURMD_NODENAME is set), so everything it needs
# comes from here or from the site file /etc/default/cluster-accept (CLUSTER_ACCEPT_ENV names another):
#   PATH                       where cluster-accept, nvidia-smi and scontrol are
#   CLUSTER_ACCEPT_INVENTORY   the site's inventory (default /etc/cluster-accept/inventory.yaml)
#   CLUSTER_ACCEPT_OUT         where the run directories go (default /var/lib/cluster-accept/runs)
#   SLURM_CONF                 when slurm.conf is not in its default place
set -u
site=${CLUSTER_ACCEPT_ENV:-/etc/default/cluster-accept}
if [ -r "$site" ]; then . "$site"; fi
PATH=${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}
HOME=${HOME:-/root}
PREFECT_HOME=${PREFECT_HOME:-/var/lib/cluster-accept/prefect}
export PATH HOME PREFECT_HOME
node=${SLURMD_NODENAME:-$(hostname -s)}
out=${CLUSTER_ACCEPT_OUT:-/var/lib/cluster-accept/runs}
mkdir -p "$out" || exit 1
started="$out/.healthcheck-$node.started"
rm -f "$started"
# shellcheck disable=SC2016 # expanded by the inner shell, from its arguments
setsid sh -c 'touch "$1"; shift; exec flock -n "$@"' sh "$started" "$out/.healthcheck-$node.lock" \
    cluster-accept run \
    --inventory "${CLUSTER_ACCEPT_INVENTORY:-/etc/cluster-accept/inventory.yaml}" \
    --slurm-nodes "$node" --local --stages preflight --out "$out" --history - \
    --drain --resume-passing --apply >>"$out/healthcheck-$node.log" 2>&1 </dev/null &
# slurmd ends the health check's process group once this returns: return only when the check runs in a
# session of its own (it says so by touching $started), or after 10 s.
n=0
while [ ! -e "$started" ] && [ "$n" -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
exit 0
