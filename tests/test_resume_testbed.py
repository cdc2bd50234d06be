"""Resume after a crash: the controller is SIGKILLed mid-way through the single-node stage, then
``cluster-accept run --resume RUN_ID`` finishes the run without redoing what was done, and the final data
has the same rows as a clean run's, once."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pandas as pd
import pytest

from cluster_accept.analysis.probe_output import parse_json_lines
from cluster_accept.analysis.schemas import TABLES
from tests.processes import processes_matching, run_cli, start_cli

pytestmark = pytest.mark.testbed

FAULTS = {"nodes": {"node02": ["down"], "node04": [{"driver_version": {"version": "570.86.15"}}]}}
STAGES = "preflight,single-node"
KEY = ["node", "stage", "check", "item", "gpu"]


def _wait_for(condition, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _run_dir(out: Path) -> Path:
    (found,) = [p for p in out.iterdir() if p.is_dir() and p.name != "history"]
    return found


@pytest.mark.soak  # docs/development.md: the soak tier (heavy end to end)
def test_killed_run_resumes_without_redoing_finished_nodes(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=6, faults=FAULTS, prefix="car", subnet="10.254.68.0/24")
    out = tmp_path / "resumed"
    out.mkdir()
    # The controller in a session of its own: killed as one, like a crashed host.
    controller = start_cli(
        "run", "--inventory", str(bed.inventory_path), "--out", str(out), "--stages", STAGES, session=True
    )
    saved_dir = lambda: next(out.glob("*/checkpoints/single-node"), None)  # noqa: E731
    try:
        _wait_for(lambda: saved_dir() is not None and len(list(saved_dir().glob("*.json"))) >= 2, 240, "2 nodes probed")
    finally:
        os.killpg(controller.pid, signal.SIGKILL)
        controller.communicate(timeout=30)
    run_dir = _run_dir(out)
    assert json.loads((run_dir / "run.json").read_text())["ended"] is None
    before = {p.stem: json.loads(p.read_text()) for p in (run_dir / "checkpoints" / "single-node").glob("*.json")}
    assert 2 <= len(before) < 4  # killed mid-stage: node01, node03, node05, node06 are probed, one at a time

    resumed = run_cli("run", "--resume", run_dir.name, "--out", str(out), timeout=400)
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr  # node02 down, node04's driver
    run = json.loads((run_dir / "run.json").read_text())
    assert run["ended"] and len(run["resumed"]) == 1 and run["stages"] == ["preflight", "single-node"]
    assert not (run_dir / "checkpoints").exists()

    # Nodes probed before the kill were not probed again: their figures are the checkpoint's, to the digit.
    measurements = pd.read_parquet(run_dir / "measurements.parquet")
    for node, data in before.items():
        bench = next(c for c in data["commands"] if c["name"] == "gpu_bench")
        saved = sorted((m.metric, float(m.value)) for m in parse_json_lines(bench["stdout"]).measurements)
        got = measurements[(measurements.node == node) & (measurements.probe == "gpu_bench")]
        assert sorted(zip(got.metric, got.value, strict=True)) == saved, node

    checks = pd.read_parquet(run_dir / "checks.parquet")
    assert not checks.duplicated(subset=KEY + ["reason"]).any()
    assert not measurements.duplicated(subset=["node", "probe", "metric", "gpu", "size"]).any()

    clean_out = tmp_path / "clean"
    clean = run_cli("run", "--inventory", str(bed.inventory_path), "--out", str(clean_out), "--stages", STAGES)
    assert clean.returncode == 1, clean.stdout + clean.stderr
    clean_dir = _run_dir(clean_out)
    clean_checks = pd.read_parquet(clean_dir / "checks.parquet")

    def keys(frame: pd.DataFrame) -> list[tuple[object, ...]]:
        return sorted(tuple("" if pd.isna(v) else v for v in row) for row in frame[KEY].itertuples(index=False))

    assert keys(checks) == keys(clean_checks)
    pre, clean_pre = checks[checks.stage == "preflight"], clean_checks[clean_checks.stage == "preflight"]
    assert keys(pre.assign(gpu=pre.status)) == keys(clean_pre.assign(gpu=clean_pre.status))
    verdicts = pd.read_parquet(run_dir / "verdicts.parquet")
    clean_verdicts = pd.read_parquet(clean_dir / "verdicts.parquet")
    assert dict(zip(verdicts.node, verdicts.verdict, strict=True)) == dict(
        zip(clean_verdicts.node, clean_verdicts.verdict, strict=True)
    )
    assert len(measurements) == len(pd.read_parquet(clean_dir / "measurements.parquet"))
    # one file per table the run wrote that the history keeps (nccl's, the thresholds', the settings' among them)
    kept = sorted((p.parent.parent.name, p.name) for p in (out / "history").rglob("*.parquet"))
    written = sorted(t for t in TABLES if (run_dir / f"{t}.parquet").exists())
    assert kept == [(table, f"{run_dir.name}.parquet") for table in written], kept
    assert {"measurements", "checks", "verdicts", "settings"} <= set(written), written
    # What the killed controller had started on a node ends there on its own (node-side timeout): nothing stays.
    _wait_for(
        lambda: not processes_matching("gpu_bench.py") and not processes_matching("allreduce.py"),
        120,
        "probes of the killed run to end",
    )


@pytest.mark.untimed  # preflight only: runs beside another worker (docs/development.md)
@pytest.mark.xdist_group("test_resume_testbed")
def test_resume_refuses_a_finished_or_unknown_run(tmp_path: Path) -> None:
    unknown = run_cli("run", "--resume", "20260101T000000Z-000000", "--out", str(tmp_path))
    assert unknown.returncode == 2 and "cannot resume 20260101T000000Z-000000" in unknown.stderr
    finished = tmp_path / "r1"
    finished.mkdir()
    (finished / "run.json").write_text(json.dumps({"run_id": "r1", "ended": "2026-11-21T10:00:00+00:00"}))
    again = run_cli("run", "--resume", "r1", "--out", str(tmp_path))
    assert again.returncode == 2 and "run r1 already finished" in again.stderr
    both = run_cli("run", "--resume", "r1", "--out", str(tmp_path), "--stages", "preflight")
    assert both.returncode == 2 and "--resume takes the interrupted run's" in both.stderr
