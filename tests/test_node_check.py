"""``cluster-accept check --local``: a node checks itself synchronously, with the run's checks and verdict rules,
prints one line as Slurm's reason field takes it and exits with its verdict; no Prefect, no SSH."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cluster_accept.analysis.verdicts import Verdict, VerdictRow
from cluster_accept.checks.base import NodeRow, Status
from cluster_accept.flows.node_check import NodeCheck, SlurmOps, slurm_actions, slurm_reason
from cluster_accept.flows.node_gather import this_node
from cluster_accept.inventory.load import load_inventory
from cluster_accept.remote.result import RemoteCommand
from cluster_accept.remote.session import LocalSession
from tests.processes import ROOT, cli_env, run_cli

INVENTORY = """cluster: c
defaults: {profile: p}
slurm: {node_names: {match: 'node(\\d+)', replace: 'gpu-\\1'}}
nodes: [{hosts: 'node[01-03]'}]
profiles: {p: {}}
"""


LOCAL = "cluster: c\ndefaults: {profile: p}\nnodes: [{hosts: here, address: local}]\nprofiles: {p: {}}\n"


def _row(check: str, reason: str, gpu: int | None = None, status: Status = Status.FAIL) -> NodeRow:
    return NodeRow("r", "c", "preflight", "node01", check, "x", status, reason, gpu=gpu)


def test_the_reason_line_names_each_code_with_its_gpus_cause_first() -> None:
    rows = [_row("nvlink", "inactive", 3), _row("nvlink", "inactive", 1), _row("persistence", "off", 0)]
    rows.append(_row("gpu", "ok", 2, Status.PASS))
    line = slurm_reason(["persistence:off", "nvlink:inactive"], rows)
    assert line == "cluster-accept: persistence:off gpu0, nvlink:inactive gpu1 gpu3"
    many = slurm_reason([f"check{i}:reason_{i}" for i in range(40)], [])
    assert len(many) == 200 and many.endswith("...") and many.startswith("cluster-accept: check0:reason_0, ")


def test_the_exit_status_is_the_verdict() -> None:
    def found(verdict: Verdict | None, reasons: list[str] | None = None) -> NodeCheck:
        row = None if verdict is None else VerdictRow("r", "c", "node01", "p", verdict, reasons or [])
        return NodeCheck("node01", [], row)

    assert (found(Verdict.ACCEPTED).exit_code, found(Verdict.ACCEPTED).reason_line) == (0, "cluster-accept: ok")
    rejected = found(Verdict.REJECTED, ["driver:version_mismatch"])
    assert (rejected.exit_code, rejected.reason_line) == (1, "cluster-accept: driver:version_mismatch")
    assert found(Verdict.UNREACHABLE, ["ssh:refused"]).exit_code == 1
    assert found(Verdict.TOOL_ERROR, ["tool:internal_error"]).exit_code == 3
    assert found(None).exit_code == 3


def test_the_node_is_named_by_option_then_slurm_then_the_host(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    inventory = load_inventory(path)
    assert this_node(inventory, "node02", {"SLURMD_NODENAME": "gpu-03"}) == "node02"
    assert this_node(inventory, None, {"SLURMD_NODENAME": "gpu-03"}) == "node03"  # Slurm's name, mapped back
    with pytest.raises(ValueError, match="'gpu-09', from SLURMD_NODENAME"):
        this_node(inventory, None, {"SLURMD_NODENAME": "gpu-09"})
    with pytest.raises(ValueError, match="'node07', from --node, is no node of the inventory"):
        this_node(inventory, "node07", {})
    with pytest.raises(ValueError, match="from this host's short name"):
        this_node(inventory, None, {})  # this test machine is none of node[01-03]
    one = tmp_path / "one.yaml"
    one.write_text("cluster: c\ndefaults: {profile: p}\nnodes: [{hosts: solo}]\nprofiles: {p: {}}\n")
    assert this_node(load_inventory(one), None, {}) == "solo"  # one node: nothing to name
    one.write_text("cluster: c\ndefaults: {profile: p}\nnodes: [{hosts: solo}]\nexclude: [solo]\nprofiles: {p: {}}\n")
    with pytest.raises(ValueError, match="solo is excluded in the inventory"):
        this_node(load_inventory(one), None, {})


@pytest.mark.integration
def test_a_reading_batch_runs_at_once_in_order_with_timeouts_and_masks(tmp_path: Path) -> None:
    inventory = tmp_path / "local.yaml"
    inventory.write_text(LOCAL)
    session = LocalSession(load_inventory(inventory).nodes[0])
    commands = [
        RemoteCommand("slow", "sleep 1; echo slow", reads_only=True),
        RemoteCommand("secret", "echo note ghp_S3KR1Tgithub000000000000000000000000; echo err >&2", reads_only=True),
        RemoteCommand("hung", "sleep 30", timeout_s=1, reads_only=True),
        RemoteCommand("fails", "exit 4", reads_only=True),
        RemoteCommand("env", 'echo "$CA_X"', env={"CA_X": "a b"}, reads_only=True),
    ]
    started = time.monotonic()
    result = session.run_batch(commands, 20.0)
    took = time.monotonic() - started
    assert [c.name for c in result.commands] == ["slow", "secret", "hung", "fails", "env"]
    slow, secret, hung, fails, env = result.commands
    assert (slow.exit_code, slow.stdout) == (0, "slow\n")
    assert "S3KR1T" not in secret.stdout and "ghp_***" in secret.stdout and secret.stderr == "err\n"
    assert hung.timed_out and hung.exit_code in (124, 137) and not hung.ok
    assert fails.exit_code == 4 and not fails.timed_out
    assert env.stdout == "a b\n"
    assert took < 2 + 1 + 1.5  # the 1-s sleep and the 1-s timeout (with its kill) overlap
    marker = tmp_path / "marker"
    order = [RemoteCommand("a", f"sleep 1; echo 1 > {marker}"), RemoteCommand("b", f"cat {marker}", reads_only=True)]
    ran = session.run_batch(order, 20.0)  # a batch that changes something runs in order, as over SSH
    assert ran.commands[1].stdout == "1\n"


@pytest.mark.integration
def test_check_local_on_this_machine_prints_the_line_and_exits_with_the_verdict(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(LOCAL)
    prom = tmp_path / "textfile" / "ca.prom"
    state = ["--state-dir", str(tmp_path / "state")]  # not this machine's /var/lib/cluster-accept
    done = run_cli("check", "--local", "--inventory", str(inventory), "--prometheus", str(prom), *state, timeout=120)
    if Path("/usr/bin/nvidia-smi").exists():
        pytest.skip("this machine has a GPU: its verdict is its own")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cluster-accept: driver:nvidia_smi_failed"), done.stdout
    assert 'cluster_accept_node_verdict{cluster="c",node="here",verdict="rejected"} 1' in prom.read_text()

    assert run_cli("check", "--inventory", str(inventory)).returncode == 2  # only --local
    missing = run_cli("check", "--local", "--inventory", str(tmp_path / "none.yaml"))
    assert missing.returncode == 2 and "none.yaml" in missing.stderr
    other = run_cli("check", "--local", "--inventory", str(inventory), "--node", "elsewhere")
    assert other.returncode == 2 and "'elsewhere', from --node, is no node of the inventory" in other.stderr


@pytest.mark.integration
def test_check_local_starts_neither_prefect_nor_ssh_nor_loads_frames(tmp_path: Path) -> None:
    """A prolog's budget: no Prefect, no SSH library, and none of pandas, numpy, pyarrow (0.6 s of imports)."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(LOCAL)
    script = (
        "import sys\n"
        f"sys.argv = ['cluster-accept', 'check', '--local', '--inventory', {str(inventory)!r}, "
        f"'--state-dir', {str(tmp_path / 'state')!r}]\n"
        "from cluster_accept.flows.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = ('prefect', 'paramiko', 'fabric', 'pandas', 'numpy', 'pyarrow')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr


def test_the_node_check_judges_with_the_links_the_stages_declare() -> None:
    """The node check gathers the cause links without importing the stages (and Prefect): the same links, in
    the same order, as the run's verdicts use."""
    from cluster_accept.checks.base import discover
    from cluster_accept.flows.node_check import preflight_links
    from cluster_accept.tasks.stages import declared_links

    assert preflight_links(discover()) == declared_links()


def _node_check(rows: list[NodeRow]) -> NodeCheck:
    return NodeCheck("here", rows, VerdictRow("check-here-1", "c", "here", "p", Verdict.ACCEPTED))


@pytest.mark.integration
def test_the_nodes_own_check_does_not_resume_a_drain_for_an_xid_it_passed_as_seen_before(tmp_path: Path) -> None:
    scontrol = tmp_path / "scontrol"
    shown = {"nodes": [{"name": "here", "state": ["IDLE", "DRAIN"], "reason": "cluster-accept: xid:xid_79 (run r1)"}]}
    scontrol.write_text(f"#!/bin/sh\necho '{json.dumps(shown)}'\n")
    scontrol.chmod(0o755)
    ops = SlurmOps(resume_passing=True, scontrol=str(scontrol))
    seen = NodeRow("check-here-1", "c", "preflight", "here", "xid", "xid_79", Status.PASS, "seen_before")
    gpus = NodeRow("check-here-1", "c", "preflight", "here", "gpu_count", "gpus", Status.PASS, "ok")
    planned = slurm_actions(_node_check([seen, gpus]), "here", ops)
    assert (planned.actions, planned.kept) == ([], [("here", "drained for xid:xid_79, which this run did not check")])
    clean = NodeRow("check-here-1", "c", "preflight", "here", "xid", "kernel_log", Status.PASS, "ok")
    assert [a.action for a in slurm_actions(_node_check([clean, gpus]), "here", ops).actions] == ["resume"]


def _uptime_s() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def _plant(node: Path, code: int, at_s: float, gpu_pci: str, message: str) -> None:
    """A line of the driver's in the test-bed node's kernel log (what its dmesg stand-in prints)."""
    line = f"[{at_s:12.6f}] NVRM: Xid (PCI:{gpu_pci}): {code}, pid=4242, name=python3, {message}\n"
    with (node / "data" / "dmesg.txt").open("a", encoding="utf-8") as log:
        log.write(line)


@pytest.mark.integration
def test_check_local_judges_an_application_xid_once_and_still_fails_a_hardware_one(tmp_path: Path) -> None:
    """What a prolog sees before each job: XID 13 (a user's faulty kernel) warns in the first check, the next
    checks pass without judging it again, and an XID 79 logged after them fails the node in every later check of
    the boot, whether or not its drain reached the controller."""
    if Path("/usr/bin/nvidia-smi").exists():
        pytest.skip("this machine has a GPU: its verdict is its own")
    from cluster_accept.testbed.nodedata import build_node, write_node_data
    from cluster_accept.testbed.profile import base_profile, testbed_nccl_env
    from cluster_accept.testbed.standins import write_standins

    node = tmp_path / "node"
    write_node_data(build_node("h200x4", [], testbed_nccl_env(0)), node / "data", seed="n")
    write_standins(node / "bin", node / "data")
    inventory = tmp_path / "inventory.yaml"
    nodes = [{"hosts": "here", "address": "local"}]
    profiles = {"p": base_profile("h200x4")}
    inventory.write_text(
        yaml.safe_dump({"cluster": "c", "defaults": {"profile": "p"}, "nodes": nodes, "profiles": profiles})
    )
    env = {**(cli_env() or os.environ), **testbed_nccl_env(0), "CLUSTER_ACCEPT_STATE_DIR": str(tmp_path / "state")}
    env["PATH"] = f"{node / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"

    def check(*extra: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "cluster_accept.flows.cli", "check", "--local", "--inventory", str(inventory)]
        return subprocess.run([*argv, *extra], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)

    thirteen_s = float(f"{_uptime_s() - 50:.6f}")
    _plant(node, 13, thirteen_s, "0000:00:06", "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)")
    first = check()
    line = first.stdout.strip()
    assert (first.returncode, line.startswith("cluster-accept: ok (warn: ")) == (0, True), first.stdout + first.stderr
    assert "xid:xid_13" in line
    for _ in range(3):
        again = check()
        assert (again.returncode, "xid" in again.stdout) == (0, False), again.stdout + again.stderr
    assert json.loads((tmp_path / "state" / "marks-here.json").read_text())["checks"]["xid"]["boot_id"]

    _plant(node, 79, _uptime_s(), "0000:00:07", "GPU has fallen off the bus.")
    unreachable = tmp_path / "scontrol"  # the drain never reaches the controller: the next check must fail again
    unreachable.write_text("#!/bin/sh\necho 'slurm_load_node error: Unable to contact slurm controller' >&2\nexit 1\n")
    unreachable.chmod(0o755)
    for _ in range(2):
        failed = check("--drain", "--apply", "--scontrol", str(unreachable))
        assert (failed.returncode, failed.stdout.strip()) == (1, "cluster-accept: xid:xid_79"), failed.stderr
    assert check().returncode == 1  # a hardware XID fails every check of its boot, until the node reboots

    (tmp_path / "state" / "marks-here.json").write_text("null")  # a broken file: named, every event new again
    broken = check("--state-dir", str(tmp_path / "state"))
    assert broken.returncode == 1 and broken.stdout.strip().startswith("cluster-accept: xid:xid_79")
    assert f"check: marks file {tmp_path / 'state' / 'marks-here.json'} holds no marks" in broken.stderr
    healed = check("--state-dir", str(tmp_path / "state"))
    assert (healed.returncode, healed.stdout.strip(), "marks file" in healed.stderr) == (
        1, "cluster-accept: xid:xid_79", False)  # fmt: skip
    kept = json.loads((tmp_path / "state" / "marks-here.json").read_text())["checks"]["xid"]
    assert kept["uptime_s"] == f"{math.floor(thirteen_s * 1000) / 1000:.3f}"  # held at the XID 13 before the 79
