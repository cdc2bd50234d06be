"""A two-node training job on a test-bed, armed for ``cluster-accept watch`` by its environment only: the
project's own training step under torchrun, one rank a node, each node's sshd held to one core so that what
starts on a node competes for that node's core only. Shared by the watch's test-bed test and its bench."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from cluster_accept.testbed import bed as testbed
from cluster_accept.testbed import net

ROOT = Path(__file__).resolve().parent.parent / "cluster_accept"
SHIM = ROOT / "watch" / "node"
JOB_FILES = (ROOT / "probes" / "training" / "node" / "train_step.py", ROOT / "probes" / "node" / "allreduce.py")
MODEL = "--layers 2 --width 256 --heads 4 --seq-len 128 --micro-batch 8 --vocab 2048"
# A process competing for node02's core at a higher priority (nice -5: three times the rank's weight), its
# session's scheduler group too (each SSH session is a group of its own where the kernel groups sessions): the
# rank and the re-test's probes keep about a quarter of their core, a figure under half its peer's even while
# other work slows the peer on the other core, and the re-test's probes take four times as long, not ten.
HOG = "exec nice -n -5 {python} -c 'while 1: pass'"
HOG_NICE = -5


def prioritize_hog(bed: testbed.Testbed, node: str = "node02", nice: int = HOG_NICE) -> None:
    """The competing process's scheduler group (its SSH session's, where the kernel groups sessions) at ``nice``."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for pid in net.netns_pids(bed.netns(node)):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue  # a process that ended meanwhile
            if b"while 1" in cmdline:
                group = Path(f"/proc/{pid}/autogroup")
                if group.exists():
                    group.write_text(str(nice))
                return
        time.sleep(0.2)
    raise AssertionError(f"the competing process did not start on {node}")


RAS_REPLAY = Path(__file__).resolve().parent / "ras_replay.py"
RAS_CAPTURE = Path(__file__).resolve().parent / "data" / "watch" / "ras" / "captured-2.28.9"


def replay_ras(
    bed: testbed.Testbed, node: str, work: Path, capture: str, pids: dict[int, int]
) -> subprocess.Popen[bytes]:
    """A stand-in for the job's NCCL RAS on ``node`` (gloo ranks have none), on NCCL's port: it answers every client
    with the report of ``capture`` (``tests/data/watch/ras/captured-2.28.9/<capture>.line``), its processes' pids
    put on the test-bed's (captured pid -> pid). Returned once it listens; the caller kills it."""
    body = json.loads((RAS_CAPTURE / f"{capture}.line").read_text())["body"]
    for captured, pid in pids.items():
        body = body.replace(f'"pid": {captured},', f'"pid": {pid},')
    path = work / f"ras-{node}.json"
    path.write_text(body)
    command = f"exec {sys.executable} {RAS_REPLAY} --port 28028 --body {path}"
    server = subprocess.Popen(bed.ssh_argv(node, command))
    probe = f"{sys.executable} -c 'import socket; socket.create_connection((\"127.0.0.1\", 28028), 1).close()'"
    deadline = time.monotonic() + 20
    while subprocess.run(bed.ssh_argv(node, probe), capture_output=True).returncode != 0:
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            raise AssertionError(f"the RAS stand-in did not listen on {node}")
        time.sleep(0.5)
    return server


def pin_sshd(bed: testbed.Testbed, node: str, cpu: int) -> None:
    """Every process later started on ``node`` over SSH inherits the listener's core."""
    pin(bed, node, {cpu}, b"sshd")


def pin(bed: testbed.Testbed, node: str, cpus: set[int], marker: bytes) -> None:
    """The processes of ``node`` whose command line holds ``marker`` (a daemon: what it starts inherits it) held to
    ``cpus``."""
    for pid in net.netns_pids(bed.netns(node)):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # a process that ended between the listing and the read (a session closing)
        if marker in cmdline:  # the listener (it lives as long as the bed) and any session still open
            with contextlib.suppress(ProcessLookupError):  # a session that closed since
                os.sched_setaffinity(pid, cpus)


class Job:
    """A two-node training job started over SSH, armed by its environment only."""

    def __init__(self, bed: testbed.Testbed, work: Path, name: str, port: int) -> None:
        self.bed, self.work, self.name = bed, work, name
        self.watch_dir = work / "watch"
        code = work / "job"
        code.mkdir(parents=True, exist_ok=True)
        for path in JOB_FILES:
            shutil.copy(path, code / path.name)
        master = bed.nodes["node01"]
        self.ranks: list[subprocess.Popen[bytes]] = []
        for index, node in enumerate(("node01", "node02")):
            armed = (
                f"CA_WATCH_DIR={self.watch_dir}/{node} CA_WATCH_JOB={name} TORCH_FR_BUFFER_SIZE=2000 "
                f"PYTHONPATH={SHIM} GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1"
            )
            command = (
                f"cd {code} && env {armed} {sys.executable} -m torch.distributed.run --nnodes 2 "
                f"--node-rank {index} --nproc-per-node 1 --master-addr {master} --master-port {port} "
                f"train_step.py --device cpu {MODEL} --steps 1000000 --warmup-steps 1 --solo-steps 1 "
                f"> {work}/{node}.log 2>&1"
            )
            self.ranks.append(subprocess.Popen(bed.ssh_argv(node, command)))
        self.wait_armed()

    def job_dir(self, node: str) -> Path:
        """The job's directory on ``node`` as the shim chose it: ``<job>`` when this user made it, else
        ``<job>.<uid>`` (another user prepared ``<job>``)."""
        base = self.watch_dir / node
        for name in (self.name, f"{self.name}.{os.getuid()}"):
            path = base / name
            if path.is_dir() and not path.is_symlink() and path.stat().st_uid == os.getuid():
                return path
        return base / self.name

    def rank_pid(self, node: str) -> int:
        found = list(self.job_dir(node).glob("rank*.json"))
        return int(yaml.safe_load(found[0].read_text())["pid"])

    def wait_armed(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            socks = [p for n in ("node01", "node02") for p in self.job_dir(n).glob("rank*.sock")]
            if len(socks) == 2:
                time.sleep(5)  # past init and the solo steps: training
                return
            time.sleep(0.5)
        logs = {n: (self.work / f"{n}.log").read_text()[-2000:] for n in ("node01", "node02")}
        raise AssertionError(f"the job's ranks never armed: {logs}")

    def stop(self, competing_too: bool = True) -> None:
        """End the job (its ranks, and the competing process unless ``competing_too`` is off)."""
        command = "pkill -KILL -f train_step.py" + ("; pkill -KILL -f 'while 1'" if competing_too else "")
        for node in ("node01", "node02"):
            subprocess.run(self.bed.ssh_argv(node, command), check=False)
        for rank in self.ranks:
            rank.wait(timeout=60)
