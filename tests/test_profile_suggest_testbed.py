"""``profile suggest`` on the test-bed: the suggested profile, used unchanged, accepts the healthy nodes and
rejects the planted faults.

The run judges preflight only: every key the suggestion reads off the nodes (driver, CUDA, GPUs, NVLink, PCIe,
persistence, the NCCL environment, the probe interpreter) is judged there. The single-node stage adds nothing
the suggestion decides but ``relative_verdict`` and costs about 90 s for two CPU nodes on a two-core machine
(the training probe included), beyond this test's budget.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cluster_accept.inventory.model import Profile
from cluster_accept.testbed.faults import fault_plan_from_data
from tests.processes import run_cli, run_verdicts

pytestmark = pytest.mark.testbed

PLAN = {"nodes": {"node03": [{"driver_version": {"version": "570.86.15"}}], "node04": ["gpu_missing"]}}


def _with_profile(inventory: Path, profile_text: str, out: Path) -> Path:
    """The test-bed's inventory with its one profile replaced by ``profile_text``, as it was printed."""
    data = yaml.safe_load(inventory.read_text())
    (name,) = data["profiles"]
    data["profiles"][name] = yaml.safe_load(profile_text)
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def test_the_suggested_profile_accepts_the_healthy_nodes_and_rejects_the_planted(  # type: ignore[no-untyped-def]
    testbed_factory, tmp_path: Path
) -> None:
    bed = testbed_factory(nodes=4, faults=fault_plan_from_data(PLAN), prefix="casg", subnet="10.254.60.0/24")
    proc = run_cli("profile", "suggest", "--inventory", str(bed.inventory_path), "--device", "cpu", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "read 4 of 4 nodes" in proc.stderr
    text = proc.stdout
    profile = Profile.model_validate(yaml.safe_load(text))
    assert profile.base is None and profile.probes.device == "cpu"
    lines = text.splitlines()
    assert "  count: 4  # 3 of 4 nodes; DISAGREE: 4 on node[01-03]; 3 on node04" in lines
    driver = next(line for line in lines if line.startswith("driver_version: "))
    assert driver.endswith("# 3 of 4 nodes; DISAGREE: 580.159.04 on node[01-02,04]; 570.86.15 on node03")
    assert profile.nccl_env["NCCL_SOCKET_IFNAME"] == "eth0"

    inventory = _with_profile(bed.inventory_path, text, tmp_path / "suggested-inventory.yaml")
    out = tmp_path / "runs"
    proc = run_cli("run", "--inventory", str(inventory), "--out", str(out), "--stages", "preflight", "--history", "-")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdicts = run_verdicts(out)
    assert {node: verdict for node, (verdict, _) in verdicts.items()} == {
        "node01": "accepted",
        "node02": "accepted",
        "node03": "rejected",
        "node04": "rejected",
    }
    assert set(verdicts["node03"][1]) <= {"driver:version_mismatch", "driver:drift"}
    assert "driver:version_mismatch" in verdicts["node03"][1]
    assert verdicts["node04"][1] == ["gpu_count:count_low"]


def test_no_node_answering_is_exit_1_and_a_bad_nodes_expression_exit_2(  # type: ignore[no-untyped-def]
    testbed_factory, tmp_path: Path
) -> None:
    bed = testbed_factory(nodes=4, faults=fault_plan_from_data(PLAN), prefix="casg", subnet="10.254.60.0/24")
    data = yaml.safe_load(bed.inventory_path.read_text())
    data["defaults"]["ssh"]["port"] = 2  # nothing listens there: every node refuses
    refused = tmp_path / "refused.yaml"
    refused.write_text(yaml.safe_dump(data))
    proc = run_cli("profile", "suggest", "--inventory", str(refused), "--nodes", "node[01-02]", timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert "no node answered" in proc.stderr
    proc = run_cli("profile", "suggest", "--inventory", str(bed.inventory_path), "--nodes", "node09", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--nodes names nodes not in the inventory: node09" in proc.stderr
