"""A real Slurm on the test-bed: munged and slurmctld on this machine, one slurmd inside every simulated node.

Debian's own daemons (``slurm-wlm``, ``munge``), configured by a generated ``slurm.conf`` in the state dir's
``slurm/``: the test-bed's nodes (CPU-only, no GRES), one partition, a private munge socket and key, a
slurmctld port free on this machine (several test-beds run side by side). Each slurmd runs in its node's
network namespace *and* the mount namespace of the node's sshd, so a job step sees what an SSH session sees
(the node's ``/proc/driver/nvidia``, ``/etc/nccl.conf``); the node's environment is written to
``slurm/env/<node>.sh`` for programs Slurm starts with an empty one (``HealthCheckProgram``, a prolog).
Slurm node names are the inventory's unless ``names`` maps them (to test name mapping).

Every daemon's command line names the state dir, so ``down`` finds and kills them like the sshds.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from cluster_accept.testbed import claim, net

SLURM_DIR = "slurm"
PACKAGES = ["slurm-wlm", "slurmctld", "slurmd", "slurm-client", "munge"]
DAEMONS = ("slurmctld", "slurmd", "munged", "sinfo", "srun")
IDLE_WAIT_S = 30.0
HEALTH_CHECK_WAIT_S = 300.0


class SlurmBedError(RuntimeError):
    """Slurm could not be started on the test-bed; the message holds the daemon's log."""


def ensure_slurm() -> None:
    """Debian's Slurm and munge; installed with apt-get when a daemon or client is missing."""
    if all(shutil.which(tool) for tool in DAEMONS):
        return
    proc = subprocess.run(["apt-get", "install", "-y", *PACKAGES], capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not all(shutil.which(tool) for tool in DAEMONS):
        raise SlurmBedError(f"could not install {' '.join(PACKAGES)}: {proc.stderr.strip()[-500:]}")


def slurm_dir(state_dir: Path) -> Path:
    return state_dir / SLURM_DIR


def conf_path(state_dir: Path) -> Path:
    return slurm_dir(state_dir) / "slurm.conf"


def client_env(state_dir: Path) -> dict[str, str]:
    """What a Slurm client (sinfo, scontrol, srun, sbatch) needs to reach this test-bed's Slurm."""
    return {"SLURM_CONF": str(conf_path(state_dir))}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def slurm_conf(
    state_dir: Path,
    cluster: str,
    host_ip: str,
    nodes: Mapping[str, str],
    port: int,
    health_check: str | None = None,
) -> str:
    """The test-bed's ``slurm.conf``: ``nodes`` maps Slurm node name -> address; every path under ``slurm/``."""
    base = slurm_dir(state_dir)
    host = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    lines = [
        "# cluster-accept test-bed Slurm; written by testbed.slurm",
        f"ClusterName={cluster}",
        f"SlurmctldHost={host}({host_ip})",
        f"SlurmctldPort={port}",
        "SlurmdPort=6818",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={base / 'munge' / 'munge.sock'}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={base / 'state'}",
        f"SlurmdSpoolDir={base / 'spool'}/%n",
        f"SlurmctldPidFile={base / 'slurmctld.pid'}",
        f"SlurmdPidFile={base / 'spool'}/%n.pid",
        f"SlurmctldLogFile={base / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={base / 'log'}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill",
        "ReturnToService=2",
        "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "PlugStackConfig=/dev/null",
        "SlurmdTimeout=30",
        "KillWait=5",
    ]
    if health_check:
        # Run when each slurmd starts (and hourly); slurmd gives it an empty environment but SLURMD_NODENAME.
        lines += [f"HealthCheckProgram={health_check}", "HealthCheckInterval=3600", "HealthCheckNodeState=ANY"]
    lines += [f"NodeName={name} NodeAddr={addr} CPUs={cpus} State=UNKNOWN" for name, addr in nodes.items()]
    lines.append("PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def write_node_env(state_dir: Path, node: str, env: Mapping[str, str]) -> Path:
    """``slurm/env/<slurm name>.sh``: the node's environment as ``export`` lines, for programs Slurm starts
    without one; keyed by the Slurm name, which is all such a program is given."""
    path = slurm_dir(state_dir) / "env" / f"{node}.sh"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()), encoding="utf-8")
    return path


def health_check_wrapper(state_dir: Path, program: str, site_env: Mapping[str, str], name: str = "healthcheck") -> Path:
    """The test-bed's ``HealthCheckProgram`` (or, named ``prolog``, its ``Prolog``): the node's environment (by
    ``SLURMD_NODENAME``) and ``site_env`` (``slurm/site.sh``), then ``program``: what a site's node image
    provides (PATH, the tools, its settings) before its check runs."""
    env_dir = slurm_dir(state_dir) / "env"
    site = slurm_dir(state_dir) / "site.sh"
    site.write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in site_env.items()), encoding="utf-8")
    path = slurm_dir(state_dir) / name
    lines = [
        "#!/bin/sh",
        f'. {shlex.quote(str(env_dir))}/"$SLURMD_NODENAME".sh',
        f". {shlex.quote(str(site))}",
        f'exec {shlex.quote(program)} "$@"',
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def _run(cmd: Sequence[str], what: str, log: Path | None = None, env: Mapping[str, str] | None = None) -> None:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60, check=False, env=env)
    if proc.returncode != 0:
        said = log.read_text(errors="replace")[-2000:] if log is not None and log.exists() else ""
        raise SlurmBedError(f"{what} did not start (exit {proc.returncode}): {(proc.stderr + said).strip()}")


def start_controller(state_dir: Path, conf: str) -> None:
    """munged (a key of its own, a private socket) and slurmctld, on this machine."""
    base = slurm_dir(state_dir)
    for sub in ("munge", "state", "spool", "log"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    (base / "munge").chmod(0o711)  # munged refuses a socket dir others cannot traverse
    key = base / "munge" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    conf_path(state_dir).write_text(conf, encoding="utf-8")
    munge = base / "munge"
    _run(
        ["munged", "--force", f"--socket={munge / 'munge.sock'}", f"--key-file={key}",
         f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'seed'}"],
        "munged", munge / "munged.log",
    )  # fmt: skip
    _run(["slurmctld", "-f", str(conf_path(state_dir))], "slurmctld", base / "log" / "slurmctld.log")


_CGROUP_MOUNTS = """
[ -d /sys/fs/cgroup ] || exit 0
mountpoint -q /sys/fs/cgroup && exit 0
"""


def _cgroup_script() -> str:
    """Mount this machine's cgroup hierarchies in the node's namespace: ``ip netns exec`` gave it a fresh
    ``/sys`` without them, and slurmd will not start without its cgroup plugin's mounts."""
    lines = [_CGROUP_MOUNTS.strip()]
    for fstype, target, options in _host_cgroup_mounts():
        q = shlex.quote
        if target == "/sys/fs/cgroup" and fstype == "tmpfs":
            lines.append("mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup")
            continue
        lines.append(f"mkdir -p {q(target)} && mount -t {q(fstype)} -o {q(options)} cgroup {q(target)}")
    return "\n".join(lines) + "\n"


def _host_cgroup_mounts() -> list[tuple[str, str, str]]:
    """(type, mount point, options) of this machine's mounts at and under /sys/fs/cgroup, in mount order."""
    mounts = []
    for line in Path("/proc/1/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or not fields[4].startswith("/sys/fs/cgroup"):
            continue
        fstype, super_options = tail[0], tail[2]
        if fstype == "cgroup":
            keep = [o for o in super_options.split(",") if o not in ("rw", "ro")]
            mounts.append((fstype, fields[4], ",".join(keep) or "none"))
        elif fstype in ("cgroup2", "tmpfs"):
            mounts.append((fstype, fields[4], "rw"))
    return mounts


def start_slurmd(state_dir: Path, sshd_pid: int, slurm_name: str) -> None:
    """slurmd for ``slurm_name`` in the namespaces of the node's sshd (pid ``sshd_pid``)."""
    (slurm_dir(state_dir) / "spool" / slurm_name).mkdir(parents=True, exist_ok=True)
    script = _cgroup_script() + f"exec slurmd -f {shlex.quote(str(conf_path(state_dir)))} -N {shlex.quote(slurm_name)}"
    log = slurm_dir(state_dir) / "log" / f"slurmd-{slurm_name}.log"
    _run(["nsenter", "-t", str(sshd_pid), "-m", "-n", "/bin/sh", "-c", script], f"slurmd of {slurm_name}", log)


def slurmd_seen(state_dir: Path, slurm_name: str) -> tuple[str | None, bool]:
    """When slurmctld last saw ``slurm_name``'s slurmd start (``SlurmdStartTime``, None when unknown), and
    whether the node responds."""
    proc = subprocess.run(
        ["scontrol", "-o", "show", "node", slurm_name], capture_output=True, text=True, timeout=30, check=False,
        env={**os.environ, **client_env(state_dir)},
    )  # fmt: skip
    started = re.search(r"SlurmdStartTime=(\S+)", proc.stdout)
    state = re.search(r"\bState=(\S+)", proc.stdout)
    responding = state is not None and "*" not in state.group(1) and "NOT_RESPONDING" not in state.group(1)
    return (started.group(1) if started else None), responding


def restart_slurmd(state_dir: Path, sshd_pid: int, slurm_name: str, timeout_s: float = 60.0) -> None:
    """A node's slurmd started again (its old one was killed with the node's processes), and registered:
    until slurmctld reports a new start time and the node responding, a test would see the old slurmd's
    state. A slurmd that has not registered in ``timeout_s`` is killed and started once more; then it is an
    error with its log."""
    before, _ = slurmd_seen(state_dir, slurm_name)
    command = f"slurmd -f {conf_path(state_dir)} -N {slurm_name}"
    for attempt in (1, 2):
        if attempt == 2:
            net.kill_pids(claim.processes_whose_command(lambda line: line.strip() == command))
        start_slurmd(state_dir, sshd_pid, slurm_name)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            started, responding = slurmd_seen(state_dir, slurm_name)
            if started not in (None, before) and responding:
                return
            time.sleep(0.5)
    log = slurm_dir(state_dir) / "log" / f"slurmd-{slurm_name}.log"
    said = log.read_text(errors="replace")[-1500:] if log.exists() else "(no log)"
    raise SlurmBedError(f"slurmd of {slurm_name} started twice did not register in {timeout_s:.0f} s: {said}")


def node_states(state_dir: Path) -> dict[str, str]:
    """Slurm node name -> state as ``sinfo`` reports it (``idle``, ``drain``, ``down*``…)."""
    env = {**os.environ, **client_env(state_dir)}
    proc = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=30, check=False, env=env
    )
    states = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def wait_registered(state_dir: Path, names: Sequence[str], timeout_s: float = IDLE_WAIT_S) -> dict[str, str]:
    """Wait until every slurmd has registered (no node ``unknown`` or not responding); their states."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = node_states(state_dir)
        waiting = [n for n in names if n not in states or states[n].startswith("unk") or states[n].endswith("*")]
        if not waiting:
            return states
        if time.monotonic() > deadline:
            log = slurm_dir(state_dir) / "log" / f"slurmd-{waiting[0]}.log"
            said = log.read_text(errors="replace")[-1500:] if log.exists() else "(no log)"
            raise SlurmBedError(f"slurmd of {', '.join(waiting)} did not register in {timeout_s:.0f} s: {said}")
        time.sleep(0.2)


def up(
    state_dir: Path,
    cluster: str,
    host_ip: str,
    addresses: Mapping[str, str],
    sshd_pids: Mapping[str, int],
    envs: Mapping[str, Mapping[str, str]],
    health_check: str | None = None,
    site_env: Mapping[str, str] | None = None,
) -> None:
    """Start Slurm for the nodes (``addresses``: Slurm name -> address; ``sshd_pids``/``envs`` by Slurm name);
    ``health_check`` runs with each node's environment and ``site_env``."""
    ensure_slurm()
    slurm_dir(state_dir).mkdir(parents=True, exist_ok=True)
    for name, env in envs.items():
        write_node_env(state_dir, name, env)
    program = str(health_check_wrapper(state_dir, health_check, site_env or {})) if health_check else None
    start_controller(state_dir, slurm_conf(state_dir, cluster, host_ip, addresses, _free_port(), program))
    for name, pid in sshd_pids.items():
        start_slurmd(state_dir, pid, name)
    # slurmd runs the health check before it registers: a check of its own takes tens of seconds per node
    wait_registered(state_dir, list(sshd_pids), IDLE_WAIT_S + (HEALTH_CHECK_WAIT_S if health_check else 0))
