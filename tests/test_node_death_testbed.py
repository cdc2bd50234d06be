"""A node that dies is called dead: unreachable, ``ssh:session_lost`` when it went away under a session — never
a refused key, never a failed check — at each phase: before the connection, during authentication, in the
middle of the preflight batch, in the middle of a single-node probe and in the middle of a multi-node run.
"Dies" is every process of the node killed at once, sshd included."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from cluster_accept.testbed import bed as testbed
from cluster_accept.testbed import net
from tests.processes import only_run, run_verdicts, start_cli
from tests.test_fault_matrix_testbed import no_duplicates, wait_until_clean

pytestmark = pytest.mark.testbed
HOOKS = Path("/run/cluster-accept-tests")  # sshd runs AuthorizedKeysCommand only from root-owned paths


def cmdlines(netns: str) -> list[bytes]:
    found = []
    for pid in net.netns_pids(netns):
        try:
            found.append(Path(f"/proc/{pid}/cmdline").read_bytes())
        except OSError:
            continue
    return found


def kill_node_when(
    bed: testbed.Testbed, node: str, seen: Callable[[list[bytes]], bool], wait_s: float, run: subprocess.Popen[str]
) -> None:
    """Wait until ``seen`` holds for the node's processes, then kill them all: the node crashed."""
    deadline = time.monotonic() + wait_s
    while not seen(cmdlines(bed.netns(node))):
        if run.poll() is not None:
            raise AssertionError(f"the run ended before {node} died: {run.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{node} never reached the phase to die in: {cmdlines(bed.netns(node))}")
        time.sleep(0.1)
    net.kill_pids(net.netns_pids(bed.netns(node)))


def die_during_auth(bed: testbed.Testbed, node: str) -> str:
    """Make ``node``'s sshd kill every process of the node while it authenticates a client (sshd asks its
    AuthorizedKeysCommand about the key: that command kills the node). Returns the original sshd_config."""
    HOOKS.mkdir(mode=0o755, exist_ok=True)
    hook = HOOKS / f"die-{bed.prefix}-{node}.sh"
    hook.write_text(f'#!/bin/sh\nfor p in $(ip netns pids {bed.netns(node)}); do kill -9 "$p"; done\n')
    hook.chmod(0o755)
    config = bed.node_dir(node) / "sshd_config"
    original = config.read_text()
    lines = [line for line in original.splitlines() if not line.startswith("AuthorizedKeysFile ")]
    hooked = ["AuthorizedKeysFile none", f"AuthorizedKeysCommand {hook} %u", "AuthorizedKeysCommandUser root"]
    config.write_text("\n".join(lines[:1] + hooked + lines[1:]) + "\n")  # sshd takes a keyword's first value
    testbed.start_sshd(bed, node)
    return original


def test_nodes_dying_before_and_during_their_session_are_unreachable(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(
        nodes=4, faults={"nodes": {"node04": ["nvidia_smi_hang"]}}, prefix="cak9", subnet="10.254.100.0/24"
    )
    net.kill_pids(net.netns_pids(bed.netns("node02")))  # dead before the run: nothing answers
    original = die_during_auth(bed, "node03")
    try:
        proc = start_cli("run", "--inventory", str(bed.inventory_path), "--out", str(tmp_path), "--stages", "preflight")
        try:  # node04 dies while its batch waits on a hung nvidia-smi
            kill_node_when(
                bed, "node04", lambda seen: any(b"nvidia-smi" in c or b"nvidia_smi" in c for c in seen), 120, proc
            )
            out, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
    finally:
        (bed.node_dir("node03") / "sshd_config").write_text(original)
        for hook in HOOKS.glob(f"die-{bed.prefix}-*.sh"):
            hook.unlink()
        for node in ("node02", "node03", "node04"):
            testbed.start_sshd(bed, node)
    assert proc.returncode == 1, out + err
    got = run_verdicts(tmp_path)
    assert got["node01"] == ("accepted", []), got
    assert got["node02"] == ("unreachable", ["ssh:refused"]), got
    assert got["node03"][0] == "unreachable" and got["node03"][1] == ["ssh:session_lost"], got
    assert got["node04"][0] == "unreachable" and got["node04"][1] == ["ssh:session_lost"], got
    checks = pd.read_parquet(only_run(tmp_path) / "checks.parquet")
    dead = checks[checks.node.isin(["node02", "node03", "node04"])]
    assert set(dead.status) <= {"pass", "warn", "skip", "unreachable"}, dead[["node", "check", "status", "reason"]]
    lost = checks[(checks.node == "node04") & (checks.check == "ssh")].iloc[0]
    assert "before the command's exit status" in lost.detail, lost.detail
    assert "then refused" in checks[(checks.node == "node03") & (checks.check == "ssh")].iloc[0].detail


def run_while_node02_dies(
    bed: testbed.Testbed, out_dir: Path, stages: str, seen: Callable[[list[bytes]], bool]
) -> None:
    """Run ``stages`` on the test-bed, kill node02 once ``seen`` holds for its processes, start its sshd again
    afterwards; the run must exit 1 (a node not accepted)."""
    proc = start_cli("run", "--inventory", str(bed.inventory_path), "--out", str(out_dir), "--stages", stages)
    try:
        kill_node_when(bed, "node02", seen, 180, proc)
        out, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
        testbed.start_sshd(bed, "node02")
    assert proc.returncode == 1, out + err


def test_a_node_dying_mid_multi_node_run_is_unreachable_and_its_peers_are_not_blamed(  # type: ignore[no-untyped-def]
    testbed_factory, tmp_path: Path
) -> None:
    bed = testbed_factory(nodes=3, faults={}, prefix="cam9", subnet="10.254.104.0/24")
    run_while_node02_dies(
        bed,
        tmp_path,
        "multi-node",
        lambda seen: any(b"allreduce.py" in c and b"torch.distributed.run" not in c for c in seen),
    )
    got = run_verdicts(tmp_path)
    assert got["node02"] == ("unreachable", ["ssh:session_lost"]), got
    assert got["node01"][0] == got["node03"][0] == "accepted", got
    assert os.path.exists(only_run(tmp_path) / "report.html")


def test_a_node_dying_mid_probe_is_unreachable_and_the_others_complete(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=3, faults={}, prefix="cad9", subnet="10.254.76.0/24")
    run_while_node02_dies(
        bed,
        tmp_path,
        "preflight,single-node",
        lambda seen: any(b"gpu_bench.py" in c or b"allreduce.py" in c for c in seen),
    )
    run_dir = only_run(tmp_path)
    got = run_verdicts(tmp_path)
    assert got["node02"] == ("unreachable", ["ssh:session_lost"]), got  # dead, not a failed probe
    assert got["node01"] == got["node03"] == ("accepted", []), got
    checks = pd.read_parquet(run_dir / "checks.parquet")
    bad = checks[(checks.node == "node02") & (checks.stage == "single-node") & (checks.status != "pass")]
    assert set(bad.status) == {"unreachable"}, bad[["check", "status", "reason"]]
    measurements = pd.read_parquet(run_dir / "measurements.parquet")
    assert {"node01", "node03"} <= set(measurements.node)
    no_duplicates(run_dir)
    assert wait_until_clean(bed) == {}
