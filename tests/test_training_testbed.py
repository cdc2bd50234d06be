"""The training probe end to end on the test-bed (real sshd, torch's tiny CPU preset over gloo): single-node
rows and figures per node, then the multi-node sweep at 1 and 2 nodes. Gloo over the test-bed's veths on two
shared cores scales far below 99%, so with that minimum the sweep must isolate with training runs, find no
node to blame (two nodes: nothing to pair with) and fail both nodes saying the scaling itself is lost."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.processes import only_run, run_cli, run_verdicts

pytestmark = pytest.mark.testbed


@pytest.mark.soak  # docs/development.md: the soak tier (heavy end to end)
def test_training_single_node_and_sweep_on_the_testbed(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=2, faults=None, prefix="trn", subnet="10.254.56.0/24")
    inventory = yaml.safe_load(bed.inventory_path.read_text())
    profile = inventory["profiles"]["testbed-h200x4"]
    profile["training"] = {"enabled": True, "steps": 6, "warmup_steps": 2}
    profile["thresholds"]["training_scaling_efficiency_min"] = 0.99
    inv_path = tmp_path / "inventory.yaml"
    inv_path.write_text(yaml.safe_dump(inventory))
    out = tmp_path / "runs"
    proc = run_cli(
        "run", "--inventory", str(inv_path), "--out", str(out), "--stages", "single-node,multi-node", timeout=900
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_dir = only_run(out)
    checks = pd.read_parquet(run_dir / "checks.parquet")
    single = checks[(checks.stage == "single-node") & (checks.check == "training")]
    for node in ("node01", "node02"):
        rows = single[single.node == node].set_index("item")
        assert rows.loc["model", "observed"] == "gpt 0.1M L2 d64 h4 s64 mb4 v512 ddp fp32 eager"
        assert rows.loc["loss", "status"] == "pass", rows.loc["loss", "detail"]
        assert rows.loc["slowest_rank", "reason"] == "single_rank"
    figures = pd.read_parquet(run_dir / "measurements.parquet")
    per_gpu = figures[figures.metric == "training_tokens_per_s_per_gpu"]
    assert sorted(per_gpu.node) == ["node01", "node02"] and (per_gpu.value > 0).all()
    assert set(per_gpu.model) == {"gpt 0.1M L2 d64 h4 s64 mb4 v512 ddp fp32 eager"}
    scaling = pd.read_parquet(run_dir / "training_scaling.parquet")
    assert list(scaling.nodes) == [1, 2] and list(scaling.gpus) == [1, 2]
    assert scaling.efficiency.iloc[0] == 1.0 and scaling.efficiency.iloc[1] < 0.99
    assert list(scaling.below_min) == [False, True]
    isolation = pd.read_parquet(run_dir / "isolation.parquet")
    assert set(isolation.signal) == {"training"}  # the all-reduce sweep passed; training asked for isolation
    steps = checks[(checks.check == "training_scaling") & (checks["item"] == "2 nodes")]
    assert set(zip(steps.node, steps.reason, strict=True)) == {
        (n, r) for n in ("node01", "node02") for r in ("efficiency_low", "unattributed")
    }
    got = run_verdicts(out)
    assert all(v == "rejected" and "training_scaling:unattributed" in reasons for v, reasons in got.values()), got
    md = (run_dir / "report.md").read_text()
    assert "## Training per node, slowest first" in md and "## Training scaling across nodes" in md
    assert not (checks.check == "coverage").any()
