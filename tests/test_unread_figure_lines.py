"""A figure line the controller cannot read (a key no node script declares, a value of another type) is an error
row, never a silent null and never dropped: in the multi-node stage, whatever the run's outcome (a run is
complete with some of its figures), and in the single-node stage, as a ``probe_error`` row under the run's check."""

from __future__ import annotations

from cluster_accept.checks.base import Status
from cluster_accept.checks.reasons import catalog
from cluster_accept.inventory.model import DEFAULT_SSH, LOCAL_ADDRESS, Inventory, Node, Profile
from cluster_accept.inventory.probe_settings import Rail
from cluster_accept.remote.launch import GroupJob, GroupRun, RankRun
from cluster_accept.remote.result import CommandResult, NodeResult, NodeStatus
from cluster_accept.tasks.multi_node.group_rows import probe_error_rows
from cluster_accept.tasks.multi_node.ranks import ALLREDUCE_JOB, TRAINING_JOB, rail_job, summarize
from cluster_accept.tasks.multi_node.stage import MultiNodeStage, _Stage
from cluster_accept.tasks.probe_runs import judge_nodes

GOOD = '{"probe": "allreduce", "metric": "allreduce_busbw_gbps", "value": 362.9, "unit": "GB/s", "size": 1048576}'
TYPO = '{"probe": "allreduce", "metric": "allreduce_busbw_gbps", "value": 370.1, "unit": "GB/s", "busbw_typo": 2}'
WRONG_TYPE = '{"probe": "allreduce", "metric": "allreduce_busbw_gbps", "value": 371.0, "size": "1 GiB"}'
DONE = '{"info": "rank_done", "rank": 0, "local_rank": 0, "local_world_size": 1}'


def _nodes(count: int = 2) -> list[Node]:
    profile = Profile()
    return [
        Node(name=f"n{i}", ssh=DEFAULT_SSH, profile_name="p", profile=profile, address=LOCAL_ADDRESS)
        for i in range(1, count + 1)
    ]


def _run(nodes: list[Node], first: str, code: int = 0) -> GroupRun:
    """A run of ``nodes`` whose first rank printed ``first`` (exit ``code``), the other ranks completing."""
    names = tuple(n.name for n in nodes)
    ranks = {n: RankRun(n, NodeStatus.OK, None, "", CommandResult("allreduce_inter", 0, DONE, "")) for n in names}
    ranks[names[0]] = RankRun(names[0], NodeStatus.OK, None, "", CommandResult("allreduce_inter", code, first, ""))
    return GroupRun(names, "t", ranks)


def _summarized(first: str, code: int = 0, job: GroupJob = ALLREDUCE_JOB) -> tuple[list[Node], GroupRun]:
    nodes = _nodes()
    run = _run(nodes, first, code)
    summarize(run, nodes, job)
    return nodes, run


def test_a_complete_run_keeps_the_line_it_could_not_read_and_each_node_gets_an_error_row() -> None:
    _, run = _summarized(f"{GOOD}\n{TYPO}\n{WRONG_TYPE}\n{DONE}")
    assert run.ok and len(run.measurements) == 1 and run.detail == ""  # complete with one figure of three
    assert len(run.errors) == 2 and "busbw_typo" in run.errors[0] and "figure.size" in run.errors[1]
    rows = probe_error_rows(run, "allreduce")
    assert [(name, row.check, row.item, row.status, row.reason) for name, row in rows] == [
        (name, "allreduce", "inter_node n[1-2]", Status.ERROR, "probe_error")
        for _ in run.errors
        for name in ("n1", "n2")
    ]
    assert [row.detail for _, row in rows] == [e for e in run.errors for _ in ("n1", "n2")]


def test_a_failed_run_keeps_its_unread_lines_in_its_detail_and_as_rows() -> None:
    _, run = _summarized(f"{TYPO}\nRuntimeError: NCCL error", code=1)
    assert not run.ok and "busbw_typo" in run.detail
    assert {name for name, row in probe_error_rows(run, "allreduce") if "busbw_typo" in row.detail} == {"n1", "n2"}


def test_a_run_that_read_every_line_has_no_error_row() -> None:
    _, run = _summarized(f"{GOOD}\n{DONE}")
    assert run.ok and run.errors == [] and probe_error_rows(run, "allreduce") == []


def test_the_stage_writes_them_under_each_job_check_and_declares_the_reason() -> None:
    nodes = _nodes()
    inventory = Inventory("c", nodes, {"p": nodes[0].profile}, "inventory.yaml", "digest")
    stage = _Stage("r", inventory)
    for job in [ALLREDUCE_JOB, TRAINING_JOB, rail_job(Rail(gpu=0))]:  # the training job reads its own figures
        _, run = _summarized(f"{GOOD}\n{TYPO}\n{DONE}", job=job)
        stage._record(nodes, run, job)
        found = {(r.node, r.stage, r.status, r.detail) for r in stage.out.rows if r.check == job.check}
        assert found == {(n.name, "multi-node", Status.ERROR, run.errors[0]) for n in nodes}, job.name
    declared = catalog(MultiNodeStage().reasons())
    assert all(declared.declared(check, "probe_error") for check in ("allreduce", "rails", "training_scaling"))


def test_a_single_node_line_with_an_undeclared_key_is_a_probe_error_row() -> None:
    (node,) = _nodes(1)
    inventory = Inventory("c", [node], {"p": node.profile}, "inventory.yaml", "digest")
    outcome = NodeResult("n1", NodeStatus.OK, commands=[CommandResult("allreduce", 0, f"{GOOD}\n{TYPO}", "")])
    judged = judge_nodes("r", inventory, [outcome])
    errors = [r for r in judged.rows if r.reason == "probe_error"]
    assert [(r.node, r.check, r.item, r.status) for r in errors] == [("n1", "allreduce", "allreduce", Status.ERROR)]
    assert "busbw_typo" in errors[0].detail and len(judged.measurements) == 1
