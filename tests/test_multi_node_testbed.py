"""Multi-node stage on the test-bed (CPU, gloo over the bridge): a rate-limited node is named, and only it;
without the limiter nobody is; a node that dies mid-sweep is reported while the others finish; groups with
more ranks than ``--concurrency`` complete on that many launcher threads."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cluster_accept.inventory.hostlist import expand
from cluster_accept.inventory.load import load_inventory
from cluster_accept.remote.ssh_launcher import THREAD_PREFIX
from cluster_accept.tasks.multi_node.ranks import launch_group, launch_groups
from cluster_accept.testbed import bed as testbed
from cluster_accept.testbed import net
from cluster_accept.testbed.faults import fault_plan_from_data
from tests.processes import only_run, processes_matching, run_cli, run_verdicts, start_cli

pytestmark = pytest.mark.testbed
ROOT = Path(__file__).resolve().parent.parent
# node05's link: 80 Mbit/s (0.01 GB/s) is a third of the test-bed's floor (0.03 GB/s) and a tenth of a healthy pair's
# gloo figure, so it is judged as surely as a slower one, and the groups it is in take less time.
SLOW = {"nodes": {"node05": [{"slow": {"rate_mbit": 80}}]}}


def multi_node_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=900)


@pytest.mark.soak  # docs/development.md: the soak tier (heavy end to end)
def test_rate_limited_node_is_isolated(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(
        nodes=8,
        faults=fault_plan_from_data(SLOW),
        prefix="cam",
        subnet="10.254.28.0/24",
    )
    # No absolute floor: the cluster's own smaller groups are the baseline that starts isolation.
    inventory = yaml.safe_load(bed.inventory_path.read_text())
    inventory["profiles"]["testbed-h200x4"]["thresholds"].pop("allreduce_inter_busbw_gbps_min")
    inv_path = tmp_path / "inventory.yaml"
    inv_path.write_text(yaml.safe_dump(inventory))
    proc = multi_node_cli(
        "run", "--inventory", str(inv_path), "--out", str(tmp_path / "runs"), "--stages", "multi-node"
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    tmp_path = tmp_path / "runs"
    got = run_verdicts(tmp_path)
    assert got["node05"][0] == "rejected" and "isolation:slow_node" in got["node05"][1]
    assert {n for n, (v, _) in got.items() if v != "accepted"} == {"node05"}
    run_dir = only_run(tmp_path)
    rounds = pd.read_parquet(run_dir / "isolation.parquet")
    assert len(rounds) >= 2 and set(rounds.phase) >= {"screen", "confirm"}
    bad_groups = [expand(nodes) for nodes in rounds[rounds.bad].nodes]
    assert any("node05" in group for group in bad_groups)  # (shared cores can slow a healthy group too)
    scaling = pd.read_parquet(run_dir / "scaling.parquet")
    assert list(scaling.nodes)[:2] == [2, 4]
    md = (run_dir / "report.md").read_text()
    assert "## Isolation rounds" in md and "## Scaling" in md and "| node05 | rejected |" in md
    # Every step of the sweep is a judged row on each node of its group; the 8-node step is the symptom.
    checks = pd.read_parquet(run_dir / "checks.parquet")
    steps = checks[checks.check == "scaling"]
    assert set(steps.node) == {f"node{i:02d}" for i in range(1, 9)}
    eight = steps[steps["item"] == "8 nodes"]
    assert set(eight.reason) == {"below_smaller_groups"} and set(eight.status) == {"warn"}
    # the first step is the others' baseline and nothing is expected of it without a floor: unjudged, never a pass
    first = steps[steps["item"] == "2 nodes"]
    assert set(zip(first.status, first.reason, strict=True)) == {("not_judged", "no_expectation")}, first
    assert set(first.expected) == {"none: set thresholds.allreduce_inter_busbw_gbps_min"}
    assert not (checks.check == "coverage").any()


@pytest.mark.soak  # docs/development.md: the soak tier (heavy end to end)
def test_no_limiter_rejects_nobody(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=8, faults=None, prefix="cam2", subnet="10.254.44.0/24")
    proc = multi_node_cli(
        "run", "--inventory", str(bed.inventory_path), "--out", str(tmp_path), "--stages", "multi-node"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {v for v, _ in run_verdicts(tmp_path).values()} == {"accepted"}
    m = pd.read_parquet(only_run(tmp_path) / "measurements.parquet")
    assert sorted(set(m.group)) == ["node[01-02]", "node[01-04]", "node[01-08]"]
    assert (m.value > 0.03).all()


def _probe_dirs_of(tag: str) -> list[Path]:
    """Probe directories on the test-bed's nodes (they share /tmp) whose rank wrapper carries ``tag``."""
    found = []
    for wrapper in Path("/tmp").glob("cluster-accept-probe.*/run.sh"):
        try:
            if tag in wrapper.read_text():
                found.append(wrapper.parent)
        except OSError:
            continue  # another run's, removed as we looked
    return found


def test_groups_larger_than_the_bound_complete_on_bounded_threads(testbed_factory) -> None:  # type: ignore[no-untyped-def]
    """Real sshd, real torchrun: every rank of a group must run at once, yet only ``concurrency`` threads do
    SSH work. A group of 4 at concurrency 2, then a round of two disjoint groups of 4 at concurrency 3."""
    bed = testbed_factory(nodes=8, faults=None, prefix="cam2", subnet="10.254.44.0/24")  # the bed above
    nodes = load_inventory(bed.inventory_path).tested
    most, sampling = 0, threading.Event()

    def sample() -> None:
        nonlocal most
        while not sampling.is_set():
            most = max(most, sum(t.name.startswith(THREAD_PREFIX) for t in threading.enumerate()))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        began = time.monotonic()
        single = launch_group(nodes[:4], tag="cambound1", concurrency=2)
        single_s = time.monotonic() - began
        bound_single, most = most, 0
        both = launch_groups([nodes[:4], nodes[4:]], concurrency=3)
    finally:
        sampling.set()
        sampler.join()
    assert single.ok and single.busbw_gbps is not None, single.detail
    assert list(single.ranks) == [n.name for n in nodes[:4]] and single_s < 120
    assert 1 <= bound_single <= 2 and 1 <= most <= 3
    assert [r.ok for r in both] == [True, True], [r.detail for r in both]
    assert all(r.measurements[-1].world_size == 4 for r in [single, *both])
    for tag in ("cambound1", *(r.tag for r in both)):
        assert processes_matching(f"--tag {tag}") == []
        assert _probe_dirs_of(tag) == []  # every rank's probe directory removed


def _sweep_under_way(bed: testbed.Testbed, proc: subprocess.Popen[str]) -> None:
    """Wait until the sweep's first group (node[01-02]) runs its all-reduce ranks."""
    deadline = time.monotonic() + 120
    while not any(
        b"allreduce.py" in cmdline and b"torch.distributed.run" not in cmdline
        for cmdline in _cmdlines(bed.netns("node01"))
    ):
        assert proc.poll() is None and time.monotonic() < deadline, "the sweep's first group never started"
        time.sleep(0.2)


def _cmdlines(netns: str) -> list[bytes]:
    found = []
    for pid in net.netns_pids(netns):
        try:
            found.append(Path(f"/proc/{pid}/cmdline").read_bytes())
        except OSError:
            continue
    return found


def test_node_killed_mid_sweep_is_reported_and_others_finish(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Four nodes: the sweep's steps are node[01-02] and node[01-04]; node03's sshd is killed while the first
    runs, so the node is lost between steps of the sweep, as node07 of eight would be."""
    bed = testbed_factory(nodes=4, faults=None, prefix="cam3", subnet="10.254.48.0/24")
    proc = start_cli("run", "--inventory", str(bed.inventory_path), "--out", str(tmp_path), "--stages", "multi-node")
    try:
        _sweep_under_way(bed, proc)
        testbed.kill_sshd(bed, "node03")
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
        testbed.start_sshd(bed, "node03")
    assert proc.returncode == 1, out + err
    got = run_verdicts(tmp_path)
    assert got["node03"][0] == "unreachable"
    assert {n for n, (v, _) in got.items() if v != "accepted"} == {"node03"}


@pytest.mark.soak  # docs/development.md: isolation by rounds of measurement (the simulator proves it by default)
def test_bisect_names_the_slow_suspect(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(
        nodes=8,
        faults=fault_plan_from_data(SLOW),
        prefix="cam",
        subnet="10.254.28.0/24",
    )
    proc = multi_node_cli(
        "bisect",
        "--inventory",
        str(bed.inventory_path),
        "--nodes",
        "node[04-06]",
        "--good",
        "node[01-02]",
        "--out",
        str(tmp_path),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    got = run_verdicts(tmp_path)
    assert set(got) == {"node01", "node02", "node04", "node05", "node06"}
    assert got["node05"] == ("rejected", ["isolation:slow_node"])
    assert {n for n, (v, _) in got.items() if v != "accepted"} == {"node05"}
    run = (only_run(tmp_path) / "run.json").read_text()
    assert '"bisect"' in run
