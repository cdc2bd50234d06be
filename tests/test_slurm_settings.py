"""Slurm's side of the inventory and of ``launcher: slurm``, without a Slurm: node names by label or rule (and
the refusals when loading), the script every srun task runs (run here by a real /bin/sh), and reading srun's
labelled output back into nodes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cluster_accept.inventory.load import InventoryError, as_local, from_slurm_names, load_inventory
from cluster_accept.inventory.slurm_settings import SrunSettings
from cluster_accept.remote import srun_script
from cluster_accept.remote.srun_script import (
    granted_job,
    probe_script,
    salloc_argv,
    split_tasks,
    srun_argv,
    srun_errors_for,
)

INVENTORY = """\
cluster: c
defaults: {profile: p}
nodes:
  - hosts: node[01-03]
  - hosts: node04
    labels: {slurm: gpu-x4}
profiles:
  p:
    probes: {device: cpu, launcher: slurm}
"""


def load(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    return load_inventory(path, check_files=False)


def test_slurm_names_by_label_or_rule(tmp_path: Path) -> None:
    same = load(tmp_path, INVENTORY)
    assert [n.slurm_node for n in same.nodes] == ["node01", "node02", "node03", "node04"]  # no rule: the same
    labelled = load(tmp_path, INVENTORY + "slurm: {node_names: {label: slurm}}\n")
    assert [n.slurm_node for n in labelled.nodes] == ["node01", "node02", "node03", "gpu-x4"]
    ruled = load(tmp_path, INVENTORY + "slurm: {node_names: {match: 'node0(\\d)', replace: 'gpu\\1.rack2'}}\n")
    assert [n.slurm_node for n in ruled.nodes] == ["gpu1.rack2", "gpu2.rack2", "gpu3.rack2", "gpu4.rack2"]
    assert from_slurm_names(ruled, "gpu[2-3].rack2") == "node[02-03]"
    with pytest.raises(ValueError, match=r"Slurm nodes no inventory node maps to: gpu9.rack2"):
        from_slurm_names(ruled, "gpu9.rack2")


@pytest.mark.parametrize(
    ("rule", "said"),
    [
        ("{match: 'node0[12]', replace: x}", "node node03 does not match 'node0[12]'"),
        ("{match: 'node0(\\d)', replace: 'gpu'}", "nodes node01, node02, node03, node04 all map to Slurm node gpu"),
        ("{match: 'node(', replace: x}", "is not a regular expression"),
        ("{match: 'node(\\d+)', replace: '\\2'}", "replace"),
        ("{label: slurm, match: x, replace: y}", "give either label, or match with replace"),
        ("{match: 'node(\\d+)'}", "match and replace go together"),
        ("{match: 'node(\\d+)', replace: 'a b\\1'}", "not a Slurm node name"),
    ],
)
def test_a_name_rule_that_cannot_name_every_node_is_refused(tmp_path: Path, rule: str, said: str) -> None:
    with pytest.raises(InventoryError) as error:
        load(tmp_path, INVENTORY + f"slurm: {{node_names: {rule}}}\n")
    assert said in str(error.value) and "slurm.node_names" in str(error.value)


def test_local_takes_exactly_one_node(tmp_path: Path) -> None:
    inventory = load(tmp_path, INVENTORY)
    with pytest.raises(ValueError, match="select exactly one node"):
        as_local(inventory)
    one = as_local(inventory.__class__(**{**inventory.__dict__, "nodes": inventory.nodes[1:2]}))
    assert [(n.name, n.is_local) for n in one.tested] == [("node02", True)]


def run_task(script: str, node: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": node, "TMPDIR": str(tmp_path)}
    return subprocess.run(["/bin/sh", "-s"], input=script, capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.integration
def test_each_task_runs_its_own_nodes_command_among_the_shipped_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {"probe.py": b"print('from the probe')\n", "data.bin": bytes(range(256))}
    commands = {
        "gpu-a1": ('cd "$CA_PROBE_DIR" && cat probe.py && od -An -tx1 data.bin | head -1 && echo rank0', 30.0),
        "gpu-a2": ("echo rank1; exit 3", None),
        "gpu-a3": ("sleep 30", 1.0),
    }
    # A failed task waits for its peers before srun kills the step: here, where no peer runs, it need not wait.
    assert f'[ "$code" = 0 ] || sleep {srun_script.FAILURE_GRACE_S}' in probe_script(files, commands)
    monkeypatch.setattr(srun_script, "FAILURE_GRACE_S", 0)
    script = probe_script(files, commands)
    first = run_task(script, "gpu-a1", tmp_path)
    lines = first.stdout.splitlines()
    assert (
        first.returncode == 0 and lines[0] == "@@cluster-accept-node gpu-a1" and lines[-1] == "@@cluster-accept-exit 0"
    )
    assert lines[1:4] == ["print('from the probe')", " 00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f", "rank0"]
    second = run_task(script, "gpu-a2", tmp_path)
    assert second.returncode == 3 and second.stdout.splitlines()[1:] == ["rank1", "", "@@cluster-accept-exit 3"]
    slow = run_task(script, "gpu-a3", tmp_path)
    assert slow.returncode == 124 and slow.stdout.splitlines()[-1] == "@@cluster-accept-exit 124"  # timed out
    stranger = run_task(script, "gpu-b9", tmp_path)
    assert stranger.returncode == 97 and "gpu-b9 is not in this run" in stranger.stdout
    half = probe_script(files, {"gpu-a1": ("printf 'no newline at the end'", None)})
    assert run_task(half, "gpu-a1", tmp_path).stdout.splitlines()[-2:] == [
        "no newline at the end",
        "@@cluster-accept-exit 0",
    ]  # the exit marker is on a line of its own
    assert list(tmp_path.iterdir()) == []  # every task removed its probe directory


def test_labelled_output_is_split_back_into_nodes() -> None:
    stdout = (
        '1: @@cluster-accept-node gpu-a2\n0: @@cluster-accept-node gpu-a1\n0: {"metric": 1}\n'
        "1: NCCL INFO Channel 00 : 1[0] -> 0[0] [send] via NET/Socket/0\n 0: @@cluster-accept-exit 0\n"
        "2: @@cluster-accept-node gpu-a3\n2: still going\n"
    )
    tasks = split_tasks(stdout)
    assert tasks["gpu-a1"].lines == ['{"metric": 1}'] and tasks["gpu-a1"].exit_code == 0
    assert tasks["gpu-a2"].exit_code is None and "via NET/Socket/0" in tasks["gpu-a2"].lines[0]
    assert tasks["gpu-a3"].lines == ["still going"] and tasks["gpu-a3"].exit_code is None
    stderr = (
        "srun: error: Task launch for StepId=12.1 failed on node gpu-a12: Communication connection failure\n"
        "srun: error: gpu-a1: task 0: Exited with exit code 1\n"
    )
    assert srun_errors_for(stderr, "gpu-a1") == "srun: error: gpu-a1: task 0: Exited with exit code 1"
    assert "failed on node gpu-a12" in srun_errors_for(stderr, "gpu-a12")


def test_salloc_and_srun_are_asked_for_exactly_the_nodes() -> None:
    settings = SrunSettings(partition="gpu", reservation="acceptance", srun_args=["--mpi=none"])
    salloc = salloc_argv(["gpu-a1", "gpu-a2"], settings, "cluster-accept-abc", 8)
    assert salloc == [
        "salloc", "--no-shell", "--nodes=2", "--nodelist=gpu-a1,gpu-a2", "--job-name=cluster-accept-abc",
        "--time=60", "--immediate=120", "--exclusive", "--partition=gpu", "--reservation=acceptance",
        "--gpus-per-node=8",
    ]  # fmt: skip
    assert "--gpus-per-node=8" not in salloc_argv(["a"], SrunSettings(gpus_per_node=False), "n", 8)
    assert granted_job("salloc: Pending job allocation 17\nsalloc: Granted job allocation 17\n") == "17"
    assert granted_job("salloc: error: Unable to allocate resources: Requested node configuration") is None
    srun = srun_argv("17", ["gpu-a1", "gpu-a2"], settings, 17)
    assert srun[:6] == [
        "srun",
        "--jobid=17",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--nodelist=gpu-a1,gpu-a2",
    ]
    assert {"--label", "--input=all", "--kill-on-bad-exit=1", "--time=17"} <= set(srun)
    assert srun[-3:] == ["--mpi=none", "/bin/sh", "-s"]


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("{partition: 'gpu east'}", "one word"),
        ("{srun_args: [mpi=none]}", "holds options only"),
        ("{time_limit_min: 0}", "greater than or equal to 1"),
        ("{queue: gpu}", "unknown key"),
    ],
)
def test_srun_settings_that_cannot_work_are_refused(tmp_path: Path, setting: str, said: str) -> None:
    text = INVENTORY.replace("launcher: slurm}", f"launcher: slurm, slurm: {setting}}}")
    with pytest.raises(InventoryError) as error:
        load(tmp_path, text)
    assert said in str(error.value) and "probes.slurm" in str(error.value)


def test_an_allocation_shorter_than_a_run_is_refused(tmp_path: Path) -> None:
    text = INVENTORY.replace("launcher: slurm}", "launcher: slurm, timeout_s: 900, slurm: {time_limit_min: 5}}")
    with pytest.raises(InventoryError, match=r"slurm.time_limit_min 5 is shorter than timeout_s 900.*at least 18"):
        load(tmp_path, text)
    with pytest.raises(InventoryError, match="time_limit_min 15 is shorter"):  # no room for start-up and kill
        load(tmp_path, text.replace("time_limit_min: 5", "time_limit_min: 15"))
    assert load(tmp_path, text.replace("time_limit_min: 5", "time_limit_min: 18")).nodes
