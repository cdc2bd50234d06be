"""The probe interpreter, checked in preflight on real sshd nodes: a node whose interpreter has no torch and a
node whose ``probes.python`` names nothing are each rejected with their own reason, and no probe runs there."""

from __future__ import annotations

import venv
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.processes import only_run, run_cli

pytestmark = pytest.mark.testbed


def _inventory_with_interpreters(bed_inventory: Path, no_torch: Path, target: Path) -> Path:
    """The test-bed's inventory with node02 on an interpreter without torch and node03 on a path that is
    not there; node01 keeps the test-bed's own."""
    data = yaml.safe_load(bed_inventory.read_text())
    base_name = data["defaults"]["profile"]
    base = data["profiles"][base_name]
    for name, python in (("no-torch", str(no_torch)), ("wrong-path", "/opt/probes/venv/bin/python3")):
        data["profiles"][name] = {**base, "probes": {**base["probes"], "python": python}}
    data["nodes"][1]["profile"] = "no-torch"
    data["nodes"][2]["profile"] = "wrong-path"
    target.write_text(yaml.safe_dump(data, sort_keys=False))
    return target


def test_interpreter_failures_are_named_before_any_probe(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=3, prefix="cai", subnet="10.254.108.0/24")
    env_dir = tmp_path / "no-torch"
    venv.EnvBuilder(with_pip=False).create(env_dir)  # this machine's Python, without its site-packages: no torch
    inventory = _inventory_with_interpreters(bed.inventory_path, env_dir / "bin" / "python3", tmp_path / "inv.yaml")
    out = tmp_path / "out"
    proc = run_cli(
        "run", "--inventory", str(inventory), "--out", str(out), "--stages", "preflight,single-node",
        "--history", "-", timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_dir = only_run(out)
    verdicts = {
        r.node: (r.verdict, list(r.reasons)) for r in pd.read_parquet(run_dir / "verdicts.parquet").itertuples()
    }
    assert verdicts["node01"] == ("accepted", [])
    assert verdicts["node02"] == ("rejected", ["probe:torch_missing"])
    assert verdicts["node03"] == ("rejected", ["probe:python_missing"])

    checks = pd.read_parquet(run_dir / "checks.parquet")
    probe = checks[(checks.check == "probe") & (checks.status == "fail")].set_index("node")
    assert probe.loc["node02", "observed"] == "not installed"
    assert probe.loc["node02", "expected"] == f"torch for {env_dir / 'bin' / 'python3'}"
    assert (probe.loc["node03", "observed"], probe.loc["node03", "expected"]) == (
        "not found",
        "/opt/probes/venv/bin/python3",
    )
    ok = checks[(checks.check == "probe") & (checks.node == "node01")]
    assert sorted(zip(ok.item, ok.status, strict=True)) == [("cuda", "skip"), ("python", "pass"), ("torch", "pass")]
    measured = set(pd.read_parquet(run_dir / "measurements.parquet").node)
    assert measured == {"node01"}  # the probes never started on the two nodes whose interpreter cannot run them
    assert "probe:torch_missing" in proc.stdout and "probe:python_missing" in proc.stdout
