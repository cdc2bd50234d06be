"""A rank killed on one node mid-run, on the test-bed (real sshd; real Slurm for srun): the node whose rank was
killed is named with its rank's own evidence, and its peers — stopped with the run, or failing only of the lost
connection — are accepted. Both sweeps, all-reduce and training, under both launchers."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cluster_accept.testbed import bed as testbed
from cluster_accept.testbed import net
from cluster_accept.testbed.slurm import node_states
from tests.processes import only_run, run_cli, run_verdicts

pytestmark = pytest.mark.testbed

SCRIPTS = ("allreduce.py", "train_step.py")
MAPPED = {"node01": "gpu-a1", "node02": "gpu-a2", "node03": "gpu-a3"}


class Killer(threading.Thread):
    """Kills the first worker of each probe script that starts in one node's namespace, once per script (the
    isolation re-tests that follow run unharmed). A training worker is killed a second after it appears: mid-run."""

    def __init__(self, netns: str) -> None:
        super().__init__(daemon=True)
        self.netns, self.done = netns, threading.Event()
        self.killed: dict[str, int] = {}
        self.seen: dict[str, float] = {}

    def run(self) -> None:
        while not self.done.is_set() and len(self.killed) < len(SCRIPTS):
            for pid in net.netns_pids(self.netns):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"torch.distributed.run" in cmdline:
                    continue  # the agent: its worker is the rank's process
                self._maybe_kill(pid, cmdline)
            time.sleep(0.05)

    def _maybe_kill(self, pid: int, cmdline: bytes) -> None:
        for script in SCRIPTS:
            if script.encode() not in cmdline or script in self.killed:
                continue
            first = self.seen.setdefault(script, time.monotonic())
            if script == "train_step.py" and time.monotonic() - first < 1.0:
                return
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            self.killed[script] = pid


def _inventory(bed: testbed.Testbed, path: Path, slurm: bool) -> Path:
    inventory = yaml.safe_load(bed.inventory_path.read_text())
    profile = next(iter(inventory["profiles"].values()))
    profile["training"] = {"enabled": True, "steps": 6, "warmup_steps": 2}  # the kill comes as the worker starts
    if slurm:
        inventory["slurm"] = {"node_names": {"match": r"node0(\d)", "replace": r"gpu-a\1"}}
        profile["probes"]["launcher"] = "slurm"
        profile["probes"]["slurm"] = {"partition": "gpu", "allocation_wait_s": 10, "time_limit_min": 30}
    path.write_text(yaml.safe_dump(inventory))
    return path


def _killed_mid_run(bed: testbed.Testbed, tmp_path: Path, slurm: bool) -> None:
    inventory = _inventory(bed, tmp_path / "inventory.yaml", slurm)
    killer = Killer(bed.netns("node02"))
    killer.start()
    try:
        out = str(tmp_path / "out")
        proc = run_cli("run", "--inventory", str(inventory), "--out", out, "--stages", "multi-node", timeout=900)
    finally:
        killer.done.set()
        killer.join()
    assert set(killer.killed) == set(SCRIPTS), killer.killed
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert run_verdicts(tmp_path / "out") == {
        "node01": ("accepted", []),
        "node02": ("rejected", ["allreduce:collective_failed", "training_scaling:collective_failed"]),
        "node03": ("accepted", []),
    }
    checks = pd.read_parquet(only_run(tmp_path / "out") / "checks.parquet")
    failed = checks[checks.reason == "collective_failed"]
    assert set(failed.node) == {"node02"} and len(failed) == 2
    for row in failed.itertuples():  # the rank's own evidence: the signal that ended its worker
        assert "a worker ended by SIGKILL" in row.detail, row.detail
    stopped = checks[checks.reason == "stopped_with_run"]
    assert set(stopped.node) == {"node01"} and set(stopped.status) == {"skip"}
    assert "exit None" not in " ".join(checks.detail)


@pytest.mark.soak  # docs/development.md: the soak tier (heavy end to end)
def test_a_rank_killed_mid_run_under_ssh_names_its_node_only(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=3, faults={}, prefix="cak1", subnet="10.254.141.0/24")
    _killed_mid_run(bed, tmp_path, slurm=False)


@pytest.mark.soak  # docs/development.md: the soak tier (heavy end to end)
def test_a_rank_killed_mid_run_under_srun_names_its_node_only(testbed_factory, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=3, prefix="cak2", subnet="10.254.142.0/24", slurm=True, slurm_names=MAPPED)
    for key, value in bed.slurm_env.items():
        monkeypatch.setenv(key, value)
    assert set(node_states(bed.state_dir)) == set(MAPPED.values())
    _killed_mid_run(bed, tmp_path, slurm=True)
