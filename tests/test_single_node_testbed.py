"""Single-node stage in CPU mode on the test-bed: probes shipped over SFTP, run, cleaned up, judged.

The test-bed's profile probes one node at a time (its nodes share this machine's two cores) with a looser
straggler margin than a real cluster's.
"""

from __future__ import annotations

import glob
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cluster_accept.probes.base import SINGLE_NODE, discover, load_checked_inventory, scripts_for
from cluster_accept.testbed.faults import fault_plan_from_data
from tests.processes import interpreter_stand_in, only_run, processes_matching, run_cli

pytestmark = pytest.mark.testbed
ROOT = Path(__file__).resolve().parent.parent


def test_cpu_probes_end_to_end_with_a_hung_probe(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(
        nodes=4,
        faults=fault_plan_from_data({"nodes": {"node04": ["gpu_missing"]}}),
        prefix="cas",
        subnet="10.254.24.0/24",
    )
    hang = tmp_path / "hanging-python"
    hang.write_text(interpreter_stand_in("exec sleep 600.4242"))
    hang.chmod(0o755)
    inventory = yaml.safe_load(bed.inventory_path.read_text())
    profile = inventory["profiles"]["testbed-h200x4"]
    profile["probes"]["timeout_s"] = 120
    hung = yaml.safe_load(yaml.safe_dump(profile))
    hung["probes"]["python"] = str(hang)
    hung["probes"]["timeout_s"] = 4
    inventory["profiles"]["hung-probe"] = hung
    for entry in inventory["nodes"]:
        if entry["hosts"] == "node03":
            entry["profile"] = "hung-probe"
    inv_path = tmp_path / "inventory.yaml"
    inv_path.write_text(yaml.safe_dump(inventory))
    before = set(glob.glob("/tmp/cluster-accept-probe.*"))

    proc = run_cli(
        "run",
        "--inventory",
        str(inv_path),
        "--out",
        str(tmp_path / "runs"),
        "--stages",
        "preflight,single-node",
        timeout=600,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_dir = only_run(tmp_path / "runs")
    verdicts = {
        r.node: (r.verdict, list(r.reasons)) for r in pd.read_parquet(run_dir / "verdicts.parquet").itertuples()
    }
    assert verdicts["node01"] == ("accepted", [])
    assert verdicts["node02"] == ("accepted", [])
    # every node-side run of the hung node's probes, by the check that owns it (gemm, allreduce and any added one)
    runs = scripts_for(load_checked_inventory(inv_path).node("node03"), discover(stage=SINGLE_NODE))
    assert {"gemm", "allreduce"} <= {run.owner for run in runs}
    assert verdicts["node03"] == ("rejected", [f"{run.owner}:probe_timeout" for run in runs])
    assert verdicts["node04"][0] == "rejected" and "gpu_count:count_low" in verdicts["node04"][1]

    m = pd.read_parquet(run_dir / "measurements.parquet")
    assert set(m.node) == {"node01", "node02"}  # node03 timed out, node04 failed preflight: not measured
    for node in ("node01", "node02"):
        mine = m[m.node == node]
        assert {"gemm_fp32_gflops", "gemm_bf16_gflops", "mem_copy_gbps", "allreduce_busbw_gbps"} <= set(mine.metric)
        assert (mine.value > 0).all()
        sweep = mine[mine.metric == "allreduce_busbw_gbps"].sort_values("size")
        assert list(sweep["size"]) == [1 << 20, 4 << 20, 16 << 20]
        assert set(sweep.world_size) == {2}
    checks = pd.read_parquet(run_dir / "checks.parquet")
    single = checks[checks.stage == "single-node"]
    assert set(single.node) == {"node01", "node02", "node03"}
    stragglers = single[(single.reason == "straggler") & (single.status == "fail")]
    assert stragglers.empty, stragglers[["node", "item", "detail"]].to_string()  # CPU mode: warnings at most
    assert set(single[single.node == "node03"].status) == {"timeout"}
    assert not processes_matching("sleep 600.4242")  # the hung probe was killed on the node
    # probe directories removed (stale ones of earlier dead runs may have been swept as well)
    assert set(glob.glob("/tmp/cluster-accept-probe.*")) <= before
