"""A run sharded by rack over two Prefect workers on two "controller hosts" (UTS namespaces of their own, each
polling its rack's work queue) against a real Prefect server and the test-bed's real sshd nodes; a third rack
has no worker. One run directory and one report come back, every node with its verdict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.prefect_server import prefect, prefect_server, start_worker, stop
from tests.processes import ROOT, only_run

pytestmark = pytest.mark.testbed

RACKS = {"node01": "rack-a", "node02": "rack-a", "node03": "rack-b", "node04": "rack-b", "node05": "rack-c"}
PLAN = {"nodes": {"node04": [{"driver_version": {"version": "570.86.15"}}]}}


def racked_inventory(source: Path, target: Path) -> Path:
    data = yaml.safe_load(source.read_text())
    for entry in data["nodes"]:
        entry["labels"] = {"rack": RACKS[entry["hosts"]]}
    target.write_text(yaml.safe_dump(data, sort_keys=False))
    return target


@pytest.mark.soak  # docs/development.md: the soak tier (heavy end to end)
def test_run_sharded_by_rack_over_two_workers_merges_into_one_run(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=5, faults=PLAN, prefix="csd", subnet="10.254.136.0/24")
    inventory = racked_inventory(bed.inventory_path, tmp_path / "racked.yaml")
    out = tmp_path / "runs"
    workers = []
    # workers ask for runs every 2 s (not 10): a worker still starting on a loaded machine is not mistaken for none
    with prefect_server(tmp_path / "prefect-home", {"PREFECT_WORKER_QUERY_SECONDS": "2"}) as env:
        try:
            made = prefect(env, "work-pool", "create", "racks", "--type", "process")
            assert made.returncode == 0, made.stdout + made.stderr
            for rack, host in (("rack-a", "ctl-a"), ("rack-b", "ctl-b")):
                workers.append(start_worker(env, "racks", rack, host, tmp_path / f"worker-{host}.log"))
            argv = [sys.executable, "-m", "cluster_accept.flows.cli", "run", "--inventory", str(inventory),
                    "--out", str(out), "--stages", "preflight,single-node", "--history", str(tmp_path / "history"),
                    "--shard-by", "rack", "--work-pool", "racks", "--queue-per-shard",
                    "--shard-start-wait", "60"]  # fmt: skip
            done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
        finally:
            for worker in workers:
                stop(worker)
    said = done.stdout + done.stderr
    # rack-c had no worker: its node is not judged (tool error), which outranks node04's rejection
    assert done.returncode == 3, said
    run_dir = only_run(out)
    info = json.loads((run_dir / "run.json").read_text())
    shards = info["sharded"]["shards"]
    assert info["sharded"]["by"] == "rack" and info["ended"]
    assert {k: (s["nodes"], s.get("controller")) for k, s in shards.items()} == {
        "rack-a": ("node[01-02]", "ctl-a"),
        "rack-b": ("node[03-04]", "ctl-b"),
        "rack-c": ("node05", None),
    }
    assert "no worker of work queue 'rack-c' of pool 'racks' started it within 60 s" in shards["rack-c"]["error"]
    assert all(shards[k]["state"].endswith("Completed") for k in ("rack-a", "rack-b"))
    verdicts = pd.read_parquet(run_dir / "verdicts.parquet").set_index("node")
    assert verdicts.verdict.to_dict() == {
        "node01": "accepted",
        "node02": "accepted",
        "node03": "accepted",
        "node04": "rejected",
        "node05": "tool_error",
    }
    assert list(verdicts.loc["node04", "reasons"])[0] == "driver:version_mismatch"
    assert list(verdicts.loc["node05", "reasons"]) == ["tool:shard_not_finished"]
    assert set(verdicts.run_id) == {info["run_id"]}
    checks = pd.read_parquet(run_dir / "checks.parquet")
    measured = pd.read_parquet(run_dir / "measurements.parquet")
    assert set(checks.run_id) == {info["run_id"]} and set(measured.run_id) == {info["run_id"]}
    assert set(measured.node) == {"node01", "node02", "node03"}  # node04 failed preflight, node05 never ran
    assert set(checks[checks.stage == "single-node"].node) == {"node01", "node02", "node03"}
    # each shard is a whole run directory of its own, written by its worker
    for key, host in (("rack-a", "ctl-a"), ("rack-b", "ctl-b")):
        shard_info = json.loads((run_dir / "shards" / key / "run.json").read_text())
        assert shard_info["controller"] == host and shard_info["ended"]
    # the history holds the merged run once, not its shards
    runs = pd.read_parquet(tmp_path / "history" / "runs")
    assert list(runs.run_id) == [info["run_id"]]
    report = (run_dir / "report.md").read_text()
    assert "node04" in report and "version_mismatch" in report and "shard_not_finished" in report
    assert "node05" in report
