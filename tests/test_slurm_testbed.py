"""Slurm for real on the test-bed (Debian's munged, slurmctld, and a slurmd in every simulated node): drain and
resume as Slurm itself reports them, multi-node probes launched by srun under Slurm's own node names, the
health-check example run by slurmd, and the sbatch example run in an allocation."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cluster_accept.inventory.load import load_inventory
from cluster_accept.ops.slurm import SlurmNode, parse_show_nodes, read_nodes
from cluster_accept.remote import srun
from cluster_accept.remote.result import NodeStatus
from cluster_accept.tasks.multi_node.ranks import launch_group
from cluster_accept.testbed import bed as testbed
from cluster_accept.testbed import slurm as slurm_bed
from cluster_accept.testbed.slurm import node_states
from cluster_accept.testbed.slurm_nodes import node_marks_env
from tests.processes import ROOT, only_run, run_cli, run_verdicts

pytestmark = pytest.mark.testbed

EXAMPLES = ROOT / "docs" / "slurm"
MAPPED = {"node01": "gpu-a1", "node02": "gpu-a2", "node03": "gpu-a3"}


def scontrol(*args: str) -> str:
    done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def slurm_nodes() -> dict[str, SlurmNode]:
    nodes, error = read_nodes()
    assert not error, error
    return nodes


def drains() -> dict[str, tuple[bool, str]]:
    """node -> (drained, reason): what an operator changes; Slurm's own view of a dead node changes alone."""
    return {name: (node.drained, node.reason) for name, node in slurm_nodes().items()}


def wait_for(what: str, ready: Callable[[], bool], timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, f"waited {timeout_s:.0f} s for {what}: {slurm_nodes()}"
        time.sleep(1.0)


@pytest.mark.untimed  # preflight, or Slurm alone: runs beside another worker (docs/development.md)
@pytest.mark.xdist_group("test_slurm_testbed")
def test_drain_dry_run_apply_and_resume_passing(testbed_factory, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    faults = {"nodes": {"node02": ["gpu_missing"], "node03": ["down"]}}
    bed = testbed_factory(nodes=5, faults=faults, prefix="csl", subnet="10.254.124.0/24", slurm=True)
    for key, value in bed.slurm_env.items():
        monkeypatch.setenv(key, value)
    scontrol("update", "nodename=node04", "state=drain", "reason=cluster-accept: gpu_count:count_low (run old)")
    scontrol("update", "nodename=node01", "state=drain", "reason=bad fan, ticket 42")
    quoting = "vendor hold, was Reason=cluster-accept: ssh:refused (run 1)"  # an administrator quoting our reason
    scontrol("update", "nodename=node05", "state=drain", f"reason={quoting}")
    before = slurm_nodes()
    marked = drains()
    assert before["node04"].drained_by_us and before["node01"].drained and not before["node01"].drained_by_us
    assert before["node05"].drained and before["node05"].reason == quoting and not before["node05"].drained_by_us
    text = parse_show_nodes(scontrol("show", "node", "-o"))  # Slurm 22.05's text, read as the fallback reads it
    assert text["node05"].reason == quoting and not text["node05"].drained_by_us
    common = ["--inventory", str(bed.inventory_path), "--stages", "preflight"]

    common += ["--max-drain", "2"]  # two of five: past the breaker's default (one in ten, at least one)
    dry = run_cli("run", *common, "--out", str(tmp_path / "dry"), "--drain", "--resume-passing")
    assert dry.returncode == 1, dry.stdout + dry.stderr
    assert "slurm (dry run, add --apply):" in dry.stdout
    assert "state=drain 'reason=cluster-accept: gpu_count:count_low" in dry.stdout
    assert drains() == marked  # a dry run only asks

    prom = tmp_path / "textfile" / "cluster_accept.prom"
    applied = run_cli(
        "run", *common, "--out", str(tmp_path / "applied"), "--drain", "--resume-passing", "--apply",
        "--prometheus", str(prom),
    )  # fmt: skip
    assert applied.returncode == 1, applied.stdout + applied.stderr
    run_id = only_run(tmp_path / "applied").name
    after = slurm_nodes()
    assert after["node02"].drained and after["node02"].reason == f"cluster-accept: gpu_count:count_low (run {run_id})"
    assert after["node03"].drained and after["node03"].reason == f"cluster-accept: ssh:refused (run {run_id})"
    assert not after["node04"].drained and after["node04"].reason == ""  # ours, passing now: resumed
    assert drains()["node01"] == marked["node01"]  # passes, but an administrator drained it: left alone
    assert drains()["node05"] == (True, quoting)  # the same: its reason only quotes ours
    wait_for("node04 in service", lambda: node_states(bed.state_dir)["node04"] == "idle", 60)  # idle* until pinged
    states = node_states(bed.state_dir)
    assert states["node02"] == "drained" and states["node01"] == "drained" and states["node05"] == "drained"
    reasons = subprocess.run(["sinfo", "-R", "-h", "-o", "%N|%E"], capture_output=True, text=True, check=True)
    assert f"node02|cluster-accept: gpu_count:count_low (run {run_id})" in reasons.stdout.splitlines()

    record = json.loads((only_run(tmp_path / "applied") / "slurm.json").read_text())
    assert record["apply"] is True and [(a["node"], a["action"], a["applied"]) for a in record["actions"]] == [
        ("node02", "drain", True), ("node03", "drain", True), ("node04", "resume", True),
    ]  # fmt: skip
    summary = (only_run(tmp_path / "applied") / "summary.json").read_text()
    assert '"not_accepted"' in summary and "gpu_count:count_low" in summary
    text = prom.read_text()
    assert 'cluster_accept_node_verdict{cluster="testbed",node="node02",verdict="rejected"} 1' in text
    assert 'cluster_accept_node_verdict{cluster="testbed",node="node01",verdict="accepted"} 1' in text


@pytest.mark.untimed  # preflight, or Slurm alone: runs beside another worker (docs/development.md)
@pytest.mark.xdist_group("test_slurm_testbed")
def test_the_drain_breaker_on_real_slurm(testbed_factory, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Three of four failing: nothing drained, every one listed with its reasons, exit 3. One of four: drained. An
    inventory whose SSH port no node listens on: the controller named, nothing drained, exit 3."""
    faults = {"nodes": {"node04": ["gpu_missing"], "node05": ["gpu_missing"], "node06": ["gpu_missing"]}}
    bed = testbed_factory(nodes=6, faults=faults, prefix="csb", subnet="10.254.151.0/24", slurm=True)
    for key, value in bed.slurm_env.items():
        monkeypatch.setenv(key, value)
    common = ["--inventory", str(bed.inventory_path), "--stages", "preflight", "--drain", "--apply"]
    untouched = drains()

    many = run_cli("run", *common, "--nodes", "node[03-06]", "--out", str(tmp_path / "many"))
    assert many.returncode == 3, many.stdout + many.stderr
    assert "3 of 4 tested nodes would be drained, more than the breaker allows" in many.stderr
    for node in ("node04", "node05", "node06"):
        assert f"slurm: not drained: {node}: cluster-accept: gpu_count:count_low (run " in many.stdout, many.stdout
    assert drains() == untouched
    record = json.loads((only_run(tmp_path / "many") / "slurm.json").read_text())
    assert record["actions"] == [] and [h["node"] for h in record["breaker"]["held"]] == ["node04", "node05", "node06"]

    one = run_cli("run", *common, "--nodes", "node[01-04]", "--out", str(tmp_path / "one"))
    assert one.returncode == 1, one.stdout + one.stderr
    run_id = only_run(tmp_path / "one").name
    assert drains()["node04"] == (True, f"cluster-accept: gpu_count:count_low (run {run_id})")
    assert {n: d for n, d in drains().items() if n != "node04"} == {n: d for n, d in untouched.items() if n != "node04"}

    data = yaml.safe_load(bed.inventory_path.read_text())
    data["defaults"]["ssh"]["port"] = 2  # no node listens there: the controller's mistake, not the nodes'
    wrong = tmp_path / "wrong-port.yaml"
    wrong.write_text(yaml.safe_dump(data))
    before = drains()
    nowhere = run_cli("run", "--inventory", str(wrong), "--stages", "preflight", "--drain", "--apply",
                      "--nodes", "node[01-03],node05", "--out", str(tmp_path / "nowhere"))  # fmt: skip
    assert nowhere.returncode == 3, nowhere.stdout + nowhere.stderr
    assert "every tested node (4, node[01-03,05]) is unreachable the same way (ssh:refused)" in nowhere.stderr
    assert "the controller is the likely fault" in nowhere.stderr
    assert drains() == before


def _slurm_inventory(bed: testbed.Testbed, path: Path, training: bool = True) -> Path:
    """The test-bed's inventory with launcher: slurm, Slurm's names by a rule, and the training probe on."""
    inventory = yaml.safe_load(bed.inventory_path.read_text())
    inventory["slurm"] = {"node_names": {"match": r"node0(\d)", "replace": r"gpu-a\1"}}
    profile = inventory["profiles"]["testbed-h200x4"]
    profile["probes"]["launcher"] = "slurm"
    profile["probes"]["slurm"] = {"partition": "gpu", "allocation_wait_s": 10, "time_limit_min": 30}
    if training:
        profile["training"] = {"enabled": True, "steps": 6, "warmup_steps": 2}
    path.write_text(yaml.safe_dump(inventory))
    return path


@pytest.fixture
def mapped_bed(testbed_factory, monkeypatch) -> testbed.Testbed:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=3, prefix="csn", subnet="10.254.128.0/24", slurm=True, slurm_names=MAPPED)
    for key, value in bed.slurm_env.items():
        monkeypatch.setenv(key, value)
    assert set(node_states(bed.state_dir)) == set(MAPPED.values())
    return bed


@pytest.mark.soak  # docs/development.md: the soak tier (heavy end to end)
def test_launcher_slurm_runs_all_reduce_and_training_through_srun(mapped_bed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    inventory = _slurm_inventory(mapped_bed, tmp_path / "inventory.yaml")
    out = tmp_path / "runs"
    proc = run_cli("run", "--inventory", str(inventory), "--out", str(out), "--stages", "multi-node", timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = only_run(out)
    figures = pd.read_parquet(run_dir / "measurements.parquet")
    inter = figures[(figures.stage == "multi-node") & (figures.metric == "allreduce_busbw_gbps")]
    assert set(inter.group) >= {"node[01-03]"} and (inter.value > 0).all()
    scaling = pd.read_parquet(run_dir / "training_scaling.parquet")  # the training probe, 1 to 3 nodes
    assert list(scaling.nodes) == [1, 2, 3] and list(scaling.group) == ["node01", "node[01-02]", "node[01-03]"]
    assert (scaling.tokens_per_s > 0).all()
    assert set(run_verdicts(out)) == {"node01", "node02", "node03"}
    jobs = scontrol("show", "job", "-o").splitlines()  # the allocations made for the runs, kept a while after
    assert jobs and all(re.search(r"JobName=cluster-accept-[0-9a-f]+ ", job) for job in jobs), jobs
    assert any(" NodeList=gpu-a[1-3] " in job for job in jobs)  # under Slurm's own names
    assert not [job for job in jobs if "JobState=RUNNING" in job or "JobState=PENDING" in job]  # all given back


def test_a_node_slurm_will_not_allocate_is_named(mapped_bed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    inventory = load_inventory(_slurm_inventory(mapped_bed, tmp_path / "inventory.yaml", training=False))
    scontrol("update", "nodename=gpu-a3", "state=drain", "reason=cabling, ticket 7")
    try:
        run = launch_group(inventory.tested)
    finally:
        scontrol("update", "nodename=gpu-a3", "state=resume")
    assert not run.ok  # not judged: Slurm's refusal is no finding about the nodes, never a reason to drain them
    assert {rank.status for rank in run.ranks.values()} == {NodeStatus.TOOL_ERROR}
    assert "gpu-a3 is drained" in run.ranks["node03"].detail, run.ranks["node03"].detail
    assert run.ranks["node01"].detail.startswith("not started because of node03:"), run.ranks["node01"].detail
    good = launch_group(inventory.tested[:2])
    assert good.ok and good.busbw_gbps is not None and good.busbw_gbps > 0, good.detail


@pytest.mark.untimed  # preflight, or Slurm alone: runs beside another worker (docs/development.md)
@pytest.mark.xdist_group("test_slurm_testbed")
def test_an_abandoned_launch_stops_its_step_and_gives_its_allocation_back(mapped_bed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    nodes = load_inventory(_slurm_inventory(mapped_bed, tmp_path / "inventory.yaml", training=False)).tested[:2]
    live = srun.Live()
    allocation = srun.allocate(nodes, "abandoned", live)
    assert allocation.ours and allocation.job_id in live.jobs, allocation.error
    argv = ["srun", f"--jobid={allocation.job_id}", "--nodes=2", "--ntasks=2", "--overlap", "sleep", "300"]
    step = threading.Thread(target=srun._run, args=(argv, 600.0, None, live))
    step.start()
    wait_for("the step to run", lambda: f"{allocation.job_id}.0" in subprocess.run(
        ["squeue", "-h", "-s", "-o", "%i"], capture_output=True, text=True, check=True).stdout, 30)  # fmt: skip
    live.stop_all()  # what the launcher does when the controller abandons the launch
    step.join(30)
    assert not step.is_alive()
    wait_for("the allocation to end", lambda: "JobState=CANCELLED" in scontrol("show", "job", allocation.job_id), 30)


def test_the_sbatch_example_checks_its_allocation(mapped_bed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    inventory = _slurm_inventory(mapped_bed, tmp_path / "inventory.yaml", training=False)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "CLUSTER_ACCEPT_INVENTORY": str(inventory),
        "CLUSTER_ACCEPT_OUT": str(tmp_path / "runs"),
        "CLUSTER_ACCEPT_STAGES": "preflight,multi-node",
    }
    batch = subprocess.run(
        ["sbatch", "--wait", "--nodes=2", "--nodelist=gpu-a[1-2]", f"--chdir={tmp_path}",
         str(EXAMPLES / "acceptance.sbatch")],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    (output,) = tmp_path.glob("cluster-accept-*.out")
    said = output.read_text()
    assert batch.returncode == 0, batch.stdout + batch.stderr + said
    assert "accepted 2 / rejected 0 / unreachable 0" in said, said
    run_dir = only_run(tmp_path / "runs")
    figures = pd.read_parquet(run_dir / "measurements.parquet")
    inter = figures[(figures.stage == "multi-node") & (figures.metric == "allreduce_busbw_gbps")]
    assert set(inter.group) == {"node[01-02]"} and (inter.value > 0).all()  # srun inside the held allocation


@pytest.mark.untimed  # preflight, or Slurm alone: runs beside another worker (docs/development.md)
@pytest.mark.xdist_group("test_slurm_testbed")
def test_the_health_check_example_drains_a_failing_node_and_resumes_it(testbed_factory, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """slurmd runs the example (as HealthCheckProgram) when it starts, with an empty environment, and waits for
    it: the faulty node drains itself with the reason, the healthy one stays in service; repaired, the node
    resumes itself."""
    bed = testbed_factory(
        nodes=2, faults={"nodes": {"node02": ["gpu_missing"]}}, prefix="csh", subnet="10.254.132.0/24", slurm=True,
        health_check=str(EXAMPLES / "healthcheck.sh"),
    )  # fmt: skip
    for key, value in bed.slurm_env.items():
        monkeypatch.setenv(key, value)
    wait_for("node02 drained by its health check", lambda: slurm_nodes()["node02"].drained_by_us)
    assert re.fullmatch(r"cluster-accept: gpu_count:count_low \(run check-node02-\d+\)", slurm_nodes()["node02"].reason)
    assert not slurm_nodes()["node01"].drained
    testbed.set_fault(bed, "node02", [])  # repaired: its slurmd starts again and runs the check, which passes
    wait_for("node02 resumed by its health check", lambda: not slurm_nodes()["node02"].drained)
    wait_for("node02 in service", lambda: node_states(bed.state_dir)["node02"] == "idle", 60)


@pytest.mark.soak  # docs/development.md: the soak tier (heavy end to end)
def test_the_prolog_example_keeps_a_job_off_a_faulty_node(testbed_factory, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The prolog checks the node the job was given before the job starts: node01 (the scheduler's first pick)
    has a GPU missing, so it drains itself with the reason and the job goes back to the queue, then runs on
    node02, which passes."""
    bed = testbed_factory(
        nodes=2, faults={"nodes": {"node01": ["gpu_missing"]}}, prefix="csp", subnet="10.254.152.0/24", slurm=True
    )
    for key, value in bed.slurm_env.items():
        monkeypatch.setenv(key, value)
    site = {"CLUSTER_ACCEPT_INVENTORY": str(bed.inventory_path), **node_marks_env(bed.state_dir)}
    prolog = slurm_bed.health_check_wrapper(bed.state_dir, str(EXAMPLES / "prolog.sh"), site, name="prolog")
    conf = Path(bed.slurm_env["SLURM_CONF"])
    conf.write_text(conf.read_text() + f"Prolog={prolog}\n")
    scontrol("reconfigure")
    wait_for("both nodes idle", lambda: all(s == "idle" for s in node_states(bed.state_dir).values()), 60)

    where = "echo ran on $SLURMD_NODENAME"
    job = subprocess.run(
        ["sbatch", "--parsable", "--nodes=1", f"--output={tmp_path}/job-%j.out", "--wrap", where],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip().split(";")[0]  # fmt: skip

    def state() -> str:
        found = re.search(r"JobState=(\S+)", scontrol("show", "job", job))
        return found.group(1) if found else ""

    def completed() -> bool:
        """The job done; meanwhile, as an operator would, released where Slurm held it (a job whose launch failed
        is requeued held, which may come a while after the drain) and made eligible now (a requeued job waits a
        while before it is eligible again; the test does not)."""
        if "held" in scontrol("show", "job", job):
            scontrol("release", job)
            subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], capture_output=True, timeout=60)
        return state() == "COMPLETED"

    wait_for("node01 drained by the prolog", lambda: slurm_nodes()["node01"].drained_by_us, 120)
    assert slurm_nodes()["node01"].reason.startswith("cluster-accept: gpu_count:count_low (run check-node01-")
    subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], capture_output=True, timeout=60)
    wait_for(f"job {job} completed", completed, 180)
    assert (tmp_path / f"job-{job}.out").read_text().strip() == "ran on node02"
    assert re.search(r"Restarts=[1-9]", scontrol("show", "job", job)), scontrol("show", "job", job)
    assert not slurm_nodes()["node02"].drained
