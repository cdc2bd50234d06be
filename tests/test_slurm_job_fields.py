"""A Slurm job's nodes and user are read from Slurm's own fields, never from text the job's user wrote: a job
named ``train NodeList=victim[01-08]`` (with a comment and output path naming more) is watched on its own node,
by ``scontrol --json`` (23.02 and later) and by ``squeue``'s fields (older); a node's free text cannot pass for
another node's line. The captures are real Slurm 22.05 answers (``tests/data/slurm/README.md``)."""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from cluster_accept.ops.after_run import Operations
from cluster_accept.ops.slurm import SlurmNode, job_nodes, parse_show_nodes, read_nodes
from cluster_accept.watch.request import WatchSpec, resolve

DATA = Path(__file__).parent / "data" / "slurm"
SHOW_JOB = DATA / "show_job_hostile_name.txt"
ROWS = DATA / "squeue_rows.txt"
SQUEUE_ARGS = "--noheader --states=all --jobs=9 --format=%i|%A|%U|%T|%N|%u"
INVENTORY = (
    "cluster: c\ndefaults: {profile: p}\nnodes: [{hosts: 'node[01-02]'}, {hosts: 'victim[01-13]'}]\nprofiles: {p: {}}\n"
)


def captured_json() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / "squeue_json_22.05.json").read_text())
    return loaded


def newer_json(data: dict[str, Any]) -> dict[str, Any]:
    """The 22.05 capture in the shape ``scontrol --json show job`` gives from 23.02 on: the ids of arrays and
    components as ``{"set", "infinite", "number"}``, ``job_state`` a list (23.11 on)."""
    newer = copy.deepcopy(data)
    for job in newer["jobs"]:
        for key in ("array_job_id", "array_task_id", "het_job_id", "het_job_offset"):
            value = job[key]
            job[key] = {"set": value is not None, "infinite": False, "number": value or 0}
        job["job_state"] = [job["job_state"]]
    return newer


@pytest.mark.parametrize("shape", ["22.05", "23.02"])
def test_json_gives_the_jobs_own_nodes_and_user_whatever_its_name_says(shape: str) -> None:
    from cluster_accept.ops.slurm import SlurmJob, parse_json_job

    data = captured_json() if shape == "22.05" else newer_json(captured_json())
    text = json.dumps(data)
    named = {job["job_id"]: job["name"] for job in data["jobs"]}
    assert "NodeList=victim[01-08]" in named[9] and "\nJobId=1 JobName=b" in named[2]
    assert parse_json_job(text, "9") == SlurmJob("9", "node02", 0, "root", "RUNNING")
    assert parse_json_job(text, "2").nodes == "node01"  # its name forges a whole record
    assert parse_json_job(text, "8") == SlurmJob("8", "node02", 65534, "nobody", "FAILED")
    assert parse_json_job(text, "10_1") == SlurmJob("10_1", "node01", 0, "root", "RUNNING")
    assert parse_json_job(text, "11").state == "PENDING" and parse_json_job(text, "11").nodes == ""
    assert parse_json_job(text, "11+1") == SlurmJob("11+1", "", 0, "root", "PENDING")
    assert parse_json_job(text, "12") == SlurmJob("12", "", 0, "root", "PENDING")  # component 11+1's own id
    with pytest.raises(ValueError, match="Slurm does not know job 7"):
        parse_json_job(text, "7")


def test_squeue_rows_give_the_jobs_own_nodes_and_user() -> None:
    from cluster_accept.ops.slurm import SlurmJob, parse_squeue_job

    rows = ROWS.read_text()
    assert parse_squeue_job(rows, "9") == SlurmJob("9", "node02", 0, "root", "RUNNING")
    assert parse_squeue_job(rows, "8") == SlurmJob("8", "node02", 65534, "nobody", "FAILED")
    assert parse_squeue_job(rows, "10").nodes == "node01" and parse_squeue_job(rows, "10_1").nodes == "node01"
    assert parse_squeue_job(rows, "11") == SlurmJob("11", "", 0, "root", "PENDING")
    assert parse_squeue_job(rows, "3_3") == SlurmJob("3_3", "node02", 0, "root", "CANCELLED")
    with pytest.raises(ValueError, match="Slurm does not know job 99"):
        parse_squeue_job(rows, "99")
    with pytest.raises(ValueError, match="squeue's row for job 9 is not"):
        parse_squeue_job("JobId=9 JobName=x NodeList=victim01\n", "9")


def test_a_job_of_two_users_or_an_id_that_is_none_is_refused() -> None:
    from cluster_accept.ops.slurm import parse_json_job, parse_squeue_job

    with pytest.raises(ValueError, match="more than one user"):
        parse_squeue_job("11+0|11|0|RUNNING|node01|root\n11+1|12|1000|RUNNING|node02|alice\n", "11")
    for bad in ("0", "9; id", "9_1+2", "", "x"):
        with pytest.raises(ValueError, match="is not a Slurm job id"):
            parse_squeue_job("", bad)
    with pytest.raises(ValueError, match="without job_id or user_id"):
        parse_json_job(json.dumps({"jobs": [{"job_id": 9, "nodes": "node02"}]}), "9")


def fake_slurm(tmp: Path, json_text: str | None) -> str:
    """An scontrol (with ``--json`` when ``json_text`` is given, as 23.02 on; refusing it as 22.05 does) and an
    squeue beside it that answer job 9 as the capture does; squeue fails unless asked as ``read_job`` asks."""
    (tmp / "job.json").write_text(json_text or "")
    refuse = "echo \"scontrol: unrecognized option '--json'\" >&2; exit 1"
    json_branch = f"cat {tmp / 'job.json'}; exit 0" if json_text else refuse
    scontrol = tmp / "scontrol"
    scontrol.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = --json ]; then {json_branch}; fi\n'
        f'if [ "$*" = "show job -o 9" ]; then cat {SHOW_JOB}; exit 0; fi\n'
        "exit 1\n"
    )
    squeue = tmp / "squeue"
    squeue.write_text(
        "#!/bin/sh\n"
        f'[ "$*" = {shlex.quote(SQUEUE_ARGS)} ] || {{ echo "unexpected: $*" >&2; exit 1; }}\n'
        f"grep '^9|' {ROWS}\n"
    )
    for program in (scontrol, squeue):
        program.chmod(0o755)
    return str(scontrol)


@pytest.mark.integration
@pytest.mark.parametrize("slurm", ["22.05", "23.02"])
def test_watch_slurm_job_is_the_jobs_own_node_never_one_its_name_gives(slurm: str, tmp_path: Path) -> None:
    """``scontrol show job -o 9`` (the capture) names ``victim[01-08]`` first; the job runs on node02 only."""
    job9 = {"jobs": [j for j in newer_json(captured_json())["jobs"] if j["job_id"] == 9]}
    scontrol = fake_slurm(tmp_path, json.dumps(job9) if slurm == "23.02" else None)
    assert " NodeList=victim[01-08] " in SHOW_JOB.read_text()
    assert job_nodes("9", scontrol) == "node02"
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    spec = WatchSpec(inventory=inventory, slurm_job="9", operations=Operations(scontrol=scontrol))
    request = resolve(spec)
    assert [n.name for n in request.nodes] == ["node02"] and request.job == "9"
    from cluster_accept.ops.slurm import SlurmJob, read_job  # the job's user, for its directory's owner

    assert read_job("9", scontrol) == SlurmJob("9", "node02", 0, "root", "RUNNING") == request.slurm
    assert request.job_user == "0"  # the node readers trust only the files of the user Slurm runs the job as
    given = resolve(spec.model_copy(update={"job_user": "alice"}))
    assert given.job_user == "alice"  # the operator's word wins over Slurm's


@pytest.mark.integration
def test_a_slurm_without_squeue_or_job_is_a_clear_error(tmp_path: Path) -> None:
    scontrol = fake_slurm(tmp_path, None)
    with pytest.raises(ValueError, match="Slurm does not know job 8: unexpected"):
        job_nodes("8", scontrol)
    (tmp_path / "squeue").unlink()
    with pytest.raises(ValueError, match="cannot ask Slurm for job 9"):
        job_nodes("9", scontrol)


def test_a_nodes_free_text_cannot_pass_for_another_nodes_line() -> None:
    """Slurm prints a reason's line break inside the node's own line (the capture: node02's reason holds
    ``State=IDLE`` and a line ``NodeName=node01 ... Reason=cluster-accept: ...``); a ``Comment=`` or ``Extra=``
    it prints as written, so a node named on two lines is refused, never read as the later (or first) one."""
    shown = parse_show_nodes((DATA / "show_node_reason_line_break.txt").read_text())
    assert shown["node01"] == SlurmNode("node01", "IDLE", "")
    assert shown["node02"].state == "IDLE+DRAIN" and shown["node02"].reason == "disk State=IDLE"
    forged = (
        "NodeName=node01 State=IDLE+DRAIN Reason=bad fan [admin@2026-11-19T09:00:00] Comment=x\n"
        "NodeName=node02 State=IDLE+DRAIN Reason=cluster-accept: gpu_count:count_low (run r1) Extra=y\n"
        "NodeName=node01 State=IDLE+DRAIN Reason=cluster-accept: gpu_count:count_low (run r1)\n"
    )
    with pytest.raises(ValueError, match="names node node01 on two lines"):
        parse_show_nodes(forged)


@pytest.mark.integration
def test_nodes_read_from_text_with_a_forged_line_are_not_read(tmp_path: Path) -> None:
    text = "NodeName=n1 State=IDLE+DRAIN Reason=admin Comment=a\nNodeName=n1 State=IDLE+DRAIN Reason=cluster-accept: x"
    (tmp_path / "nodes.txt").write_text(text)
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f'#!/bin/sh\n[ "$1" = --json ] && exit 1\ncat {tmp_path / "nodes.txt"}\n')
    scontrol.chmod(0o755)
    nodes, error = read_nodes(str(scontrol))
    assert nodes == {} and "names node n1 on two lines" in error
