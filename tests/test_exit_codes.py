"""Exit codes automation can trust (0 accepted, 1 not accepted, 2 usage, 3 the tool failed, with one line on
stderr and the traceback in a log), a resume that is locked and faithful, and no Prefect API server left
behind by a killed controller."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster_accept.analysis.verdicts import Verdict, VerdictRow
from cluster_accept.flows.exits import ERROR_LOG
from cluster_accept.flows.finish import RunOutcome
from cluster_accept.flows.orphans import MARK, SERVER_APP, reap_orphans
from cluster_accept.ops.after_run import Operations
from cluster_accept.rundir.outputs import hold_run
from cluster_accept.rundir.run import recorded_options, restored_options
from cluster_accept.rundir.run_record import RecordedOptions
from tests.processes import run_cli, start_cli


def local_inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text("cluster: c\ndefaults: {profile: p}\nnodes: [{hosts: here, address: local}]\nprofiles: {p: {}}\n")
    return path


@pytest.mark.integration
def test_prefect_api_that_does_not_answer_is_a_tool_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # nothing listens on the discard port
    monkeypatch.setenv("PREFECT_CLIENT_MAX_RETRIES", "0")
    out = tmp_path / "out"
    proc = run_cli("run", "--inventory", str(local_inventory(tmp_path)), "--out", str(out), "--stages", "preflight")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("stopped ")]
    assert len(lines) == 1 and lines[0].startswith("error: cluster-accept failed (") and ERROR_LOG in lines[0]
    assert "Traceback" not in proc.stderr
    assert "Traceback (most recent call last)" in (out / ERROR_LOG).read_text()


@pytest.mark.integration
def test_a_failure_inside_the_run_is_one_line_without_prefects_traceback(tmp_path: Path) -> None:
    """A tool failure once the flow runs (its results cannot be written): Prefect logs the flow's exception with
    its traceback on its console; the terminal gets the CLI's one line, the error log the traceback."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    out = tmp_path / "out"
    proc = run_cli(
        "run", "--inventory", str(local_inventory(tmp_path)), "--out", str(out), "--stages", "preflight",
        "--prometheus", str(blocker / "ca.prom"),
    )  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode == 3, said
    assert "Traceback" not in said and "Encountered exception" not in said, said
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("stopped ")]
    assert len(lines) == 1 and lines[0].startswith("error: the run could not write its results: "), said
    assert str(out / ERROR_LOG) in lines[0]
    log = (out / ERROR_LOG).read_text()
    assert "Traceback (most recent call last)" in log and "not-a-directory" in log


def all_excluded_inventory(tmp_path: Path) -> Path:
    path = tmp_path / "excluded.yaml"
    path.write_text(
        "cluster: c\ndefaults: {profile: p}\nnodes: [{hosts: 'here[1-2]'}, {hosts: there}]\n"
        "exclude: ['here[1-2]']\nprofiles: {p: {}}\n"
    )
    return path


@pytest.mark.integration
def test_a_run_with_no_node_to_test_is_refused(tmp_path: Path) -> None:
    """Every node excluded, or ``--nodes`` naming only excluded ones: nothing would be tested, and 0 would say
    "accepted"; exit 2 with one line, before any run directory is made."""
    inventory = all_excluded_inventory(tmp_path)
    out = tmp_path / "out"
    every = tmp_path / "every.yaml"
    every.write_text(inventory.read_text().replace("exclude: ['here[1-2]']", "exclude: ['here[1-2]', there]"))
    for path, selection, named in (
        (inventory, ["--nodes", "here[1-2]"], "here[1-2]"),
        (inventory, ["--nodes", "here1"], "here1"),
        (every, [], "here[1-2],there"),
    ):
        proc = run_cli("run", "--inventory", str(path), "--out", str(out), *selection, timeout=120, ephemeral=True)
        lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("stopped ")]
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert lines == [f"error: no node to test: every selected node is excluded in the inventory ({named})"]
    assert not out.exists()  # refused before anything is written


def test_an_outcome_with_every_node_skipped_is_not_accepted() -> None:
    """A run that tested nothing (resumed from a ``run.json`` older than the refusal) exits 2, never 0."""
    skipped = VerdictRow("r1", "c", "n1", "p", Verdict.SKIPPED, ["excluded_in_inventory"])
    assert RunOutcome("r1", Path("r1"), [skipped]).exit_code == 2
    assert RunOutcome("r1", Path("r1"), []).exit_code == 2
    accepted = VerdictRow("r1", "c", "n2", "p", Verdict.ACCEPTED)
    assert RunOutcome("r1", Path("r1"), [skipped, accepted]).exit_code == 0


def interrupted_run(out: Path, inventory: Path, run_id: str = "r1") -> Path:
    """A run directory as a killed controller leaves it: run.json without an end."""
    from cluster_accept.inventory.load import load_inventory

    digest = load_inventory(inventory).digest
    run_dir = out / run_id
    run_dir.mkdir(parents=True)
    info = {
        "run_id": run_id,
        "cluster": "c",
        "inventory": str(inventory),
        "inventory_digest": digest,
        "stages": ["preflight"],
        "nodes_tested": ["here"],
        "nodes_excluded": [],
        "started": "x",
        "ended": None,
    }
    (run_dir / "run.json").write_text(json.dumps(info))
    return run_dir


@pytest.mark.integration
def test_a_run_held_by_another_controller_is_not_resumed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run_dir = interrupted_run(out, local_inventory(tmp_path))
    lock = hold_run(run_dir)  # a controller still running (or resuming) it
    try:
        proc = run_cli("run", "--resume", "r1", "--out", str(out), timeout=60)
    finally:
        lock.close()
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"run r1 is in use by pid {os.getpid()}" in proc.stderr
    assert json.loads((run_dir / "run.json").read_text()).get("resumed") is None  # nothing written
    drain = run_cli("run", "--resume", "r1", "--out", str(out), "--drain", timeout=60)
    assert drain.returncode == 2 and "restores the interrupted run's own options" in drain.stderr


def test_resume_restores_the_options_the_run_started_with(tmp_path: Path) -> None:
    ops = Operations(drain=True, apply=True, prometheus="metrics/ca.prom")
    recorded = recorded_options(tmp_path / "hist", ops, 16)
    assert recorded["operations"]["prometheus"] == str(Path("metrics/ca.prom").resolve())
    info = json.loads(json.dumps({"options": recorded}))  # as run.json keeps it
    kept = RecordedOptions.model_validate(info["options"])  # as the run's record reads it
    history, restored, concurrency = restored_options(kept, None, Operations(), 64)
    assert (history, concurrency) == (tmp_path / "hist", 16)
    assert restored.drain and restored.apply and restored.prometheus == str(Path("metrics/ca.prom").resolve())
    assert restored_options(None, None, Operations(), 64) == (None, Operations(), 64)  # an older run.json


def fake_server(owner: int) -> subprocess.Popen[bytes]:
    """A process that looks like the Prefect API server a controller ``owner`` started."""
    env = {**os.environ, MARK: str(owner)}
    script = "import time; time.sleep(120)"
    return subprocess.Popen([sys.executable, "-c", script, SERVER_APP.decode()], env=env)


@pytest.mark.integration
@pytest.mark.serial  # every controller start reaps orphans: no other worker beside it
def test_only_servers_of_dead_controllers_are_reaped() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # another live controller
    orphan, kept, mine = fake_server(gone.pid), fake_server(other.pid), fake_server(os.getpid())
    try:
        time.sleep(0.3)
        assert orphan.pid in reap_orphans()
        assert orphan.wait(timeout=10) is not None and kept.poll() is None and mine.poll() is None
    finally:
        for proc in (orphan, kept, mine, other):
            proc.kill()
            proc.wait()


def server_of(pid: int) -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) == pid and SERVER_APP in (entry / "cmdline").read_bytes():
                    return int(entry.name)
            except (OSError, IndexError, ValueError):
                continue
    return None


@pytest.mark.integration
@pytest.mark.serial  # every controller start reaps orphans: no other worker beside it
def test_a_killed_controllers_prefect_server_is_stopped_by_the_next_start(tmp_path: Path) -> None:
    proc = start_cli(
        "run", "--inventory", str(local_inventory(tmp_path)), "--out", str(tmp_path / "out"), ephemeral=True
    )
    server = None
    try:
        deadline = time.monotonic() + 60
        while server is None and time.monotonic() < deadline and proc.poll() is None:
            server = server_of(proc.pid)
            time.sleep(0.05)
        assert server is not None, "the controller started no Prefect API server"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert Path(f"/proc/{server}").exists()  # orphaned: nobody stops it
        later = run_cli("inventory", "check", str(local_inventory(tmp_path)), timeout=60)
        assert later.returncode == 0 and f"pids [{server}]" in later.stderr, later.stderr
        deadline = time.monotonic() + 10
        while Path(f"/proc/{server}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        stat = Path(f"/proc/{server}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    finally:
        if proc.poll() is None:
            proc.kill()
        if server is not None and Path(f"/proc/{server}").exists():
            os.kill(server, signal.SIGKILL)
