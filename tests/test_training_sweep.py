"""The training sweep's rows, below the SSH line: group runs are made from the real H200 capture with the
per-GPU figure changed, so the sweep's arithmetic, its rows and its call for isolation are checked exactly."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from cluster_accept.analysis.isolation import IsolationPolicy, IsolationVerdict
from cluster_accept.analysis.probe_output import parse_json_lines
from cluster_accept.analysis.scaling import TrainingScalingRow
from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.inventory.model import Node, Profile, SshSettings
from cluster_accept.remote.launch import GroupJob, GroupRun, RankRun
from cluster_accept.remote.result import CommandResult, NodeStatus
from cluster_accept.tasks.multi_node.training_sweep import isolate_training, training_sweep

CAPTURE = (Path(__file__).resolve().parent / "data" / "training" / "h200x2_350m_ddp.txt").read_text()
PER_GPU = '"metric": "training_tokens_per_s_per_gpu", "value": 143572.3'


def run_of(nodes: Sequence[Node], per_gpu: float | None) -> GroupRun:
    """A group run whose first rank printed the capture with ``per_gpu`` tokens/s per GPU (None: it failed)."""
    names = tuple(n.name for n in nodes)
    if per_gpu is None:
        failed = CommandResult("training_inter", 1, "RuntimeError: NCCL error", "")
        return GroupRun(names, "t", {n: RankRun(n, NodeStatus.OK, None, "", failed) for n in names})
    stdout = CAPTURE.replace(PER_GPU, f'"metric": "training_tokens_per_s_per_gpu", "value": {per_gpu}')
    ok = CommandResult("training_inter", 0, stdout, "")
    ranks = {n: RankRun(n, NodeStatus.OK, None, "", ok) for n in names}
    between = {"NET/IB": 8} if len(nodes) > 1 else {}
    return GroupRun(names, "t", ranks, parse_json_lines(stdout).measurements, between, stdout)


class FakeStage:
    """The multi-node stage as the sweep sees it: per-GPU figures by group size, rows collected."""

    def __init__(self, per_gpu_by_size: dict[int, float | None], verdict: IsolationVerdict) -> None:
        self.run_id, self.unreachable = "r", set()
        self.per_gpu_by_size, self.verdict = per_gpu_by_size, verdict
        self.rows: list[tuple[str, CheckRow]] = []
        self.isolated: list[tuple[list[str], IsolationPolicy]] = []

    @property
    def cluster(self) -> str:
        return "c"

    def launch(self, nodes: Sequence[Node], job: GroupJob) -> GroupRun:
        return run_of(nodes, self.per_gpu_by_size[len(nodes)])

    def row(self, node: str, row: CheckRow, raw: str = "") -> None:
        self.rows.append((node, row))

    def failed_run(self, run: GroupRun, check: str = "allreduce", what: str = "all-reduce") -> None:
        for name in run.nodes:
            self.rows.append((name, CheckRow(check, "inter_node", Status.ERROR, "collective_failed", None, None)))

    def isolate_with(
        self, nodes: list[Node], job: GroupJob, figure: Any, policy: IsolationPolicy, item: str
    ) -> IsolationVerdict:
        self.isolated.append(([n.name for n in nodes], policy))
        return self.verdict


def nodes(count: int) -> list[Node]:
    profile = Profile.model_validate({"thresholds": {"training_scaling_efficiency_min": 0.9, "straggler_pct": 5}})
    return [Node(f"n{i}", SshSettings(), "p", profile) for i in range(1, count + 1)]


NOTHING = IsolationVerdict([], [], ["n1", "n2", "n3"], [], 2, "n[1-3] unresolved")


def test_a_healthy_sweep_has_one_row_per_step_and_node() -> None:
    stage = FakeStage({1: 150_000.0, 2: 143_382.4, 3: 141_000.0}, NOTHING)
    table, trouble = training_sweep(stage, nodes(3))
    assert not trouble and [r.nodes for r in table] == [1, 2, 3]
    assert table[1].efficiency == 143_382.4 / 150_000.0 and table[1].transport == "NET/IB"
    assert table[1].gpus == 2  # the capture's world size
    steps = [(n, r.item, r.status, r.reason) for n, r in stage.rows]
    assert steps == [
        ("n1", "1 node", Status.PASS, "ok"),
        *[(n, "2 nodes", Status.PASS, "ok") for n in ("n1", "n2")],
        *[(n, "3 nodes", Status.PASS, "ok") for n in ("n1", "n2", "n3")],
    ]
    assert stage.rows[1][1].observed == "95.6%" and stage.rows[1][1].expected == ">= 90%"


def test_low_efficiency_asks_for_isolation_and_no_culprit_fails_the_steps() -> None:
    stage = FakeStage({1: 41_480.0, 2: 8_561.0, 3: 8_000.0}, NOTHING)
    group = nodes(3)
    table, trouble = training_sweep(stage, group)
    assert trouble and [r.below_min for r in table] == [False, True, True]
    isolate_training(stage, group, table)
    ((names, policy),) = stage.isolated
    assert names == ["n1", "n2", "n3"] and policy.min_busbw_gbps == pytest.approx(41_480.0 * 0.9)
    failed = [(n, r.item) for n, r in stage.rows if r.reason == "unattributed"]
    assert failed == [("n1", "2 nodes"), ("n2", "2 nodes"), ("n1", "3 nodes"), ("n2", "3 nodes"), ("n3", "3 nodes")]
    assert all(r.status is Status.FAIL for _, r in stage.rows if r.reason == "unattributed")


def test_a_named_node_leaves_the_steps_to_isolation() -> None:
    named = IsolationVerdict(["n3"], [], [], ["n1", "n2"], 3, "n3 slow")
    stage = FakeStage({1: 150_000.0, 2: 149_000.0, 3: 60_000.0}, named)
    group = nodes(3)
    table, trouble = training_sweep(stage, group)
    isolate_training(stage, group, table)
    assert trouble and not [r for _, r in stage.rows if r.reason == "unattributed"]


def test_a_failed_run_is_trouble_and_nodes_it_left_out_are_skipped_with_why() -> None:
    stage = FakeStage({1: 150_000.0, 2: None, 3: None}, NOTHING)
    table, trouble = training_sweep(stage, nodes(3))
    assert trouble and [r.nodes for r in table] == [1]
    reasons = {(n, r.reason) for n, r in stage.rows}
    assert ("n1", "collective_failed") in reasons and ("n3", "collective_failed") in reasons
    assert ("n2", "collective_failed") in reasons


def test_without_a_one_node_run_the_minimum_is_answered_with_why() -> None:
    stage = FakeStage({1: None, 2: 140_000.0, 3: 139_000.0}, NOTHING)
    table, trouble = training_sweep(stage, nodes(3))
    assert trouble and [r.efficiency for r in table] == [None, None]
    steps = {(n, r.item): (r.status, r.reason) for n, r in stage.rows if r.check == "training_scaling"}
    assert steps[("n1", "inter_node")] == (Status.ERROR, "collective_failed")
    assert steps[("n3", "3 nodes")] == (Status.SKIP, "no_baseline")


def test_a_slow_pair_alone_still_fails_the_slow_steps() -> None:
    pair = IsolationVerdict([], [("n1", "n2")], [], ["n3"], 3, "n1+n2 slow together")
    stage = FakeStage({1: 41_480.0, 2: 8_561.0, 3: 8_000.0}, pair)
    group = nodes(3)
    table, _ = training_sweep(stage, group)
    isolate_training(stage, group, table)
    failed = {n for n, r in stage.rows if r.reason == "unattributed"}
    assert failed == {"n1", "n2", "n3"} and all(
        "n1+n2 slow together" in r.detail for _, r in stage.rows if r.reason == "unattributed"
    )


def test_nodes_that_train_differently_sweep_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    from cluster_accept.inventory.model import Inventory
    from cluster_accept.tasks.multi_node import stage as multi_node

    small = Profile.model_validate({"training": {"preset": "125m"}})
    big = Profile.model_validate({"training": {"preset": "350m"}})
    off = Profile.model_validate({"training": {"enabled": False}})
    members = [Node(f"n{i}", SshSettings(), "p", p) for i, p in enumerate([small, big, small, off, big], 1)]
    inventory = Inventory("c", members, {}, "inv.yaml", "d")
    swept: list[list[str]] = []

    def sweep(stage: object, group: list[Node]) -> tuple[list[TrainingScalingRow], bool]:
        swept.append([n.name for n in group])
        row = TrainingScalingRow(1, 1, group[0].name, 1.0, 1.0, None, None, None, None, False, None, None)
        return [row], False

    monkeypatch.setattr(multi_node, "training_sweep", sweep)
    stage = multi_node._Stage("r", inventory)
    stage.train(members)
    assert swept == [["n1", "n3"], ["n2", "n5"]]  # n4 does not train
    assert [r.group for r in stage.out.training_scaling] == ["n1", "n2"]


def test_the_failing_scaling_row_carries_its_figure_into_the_cause_sentence() -> None:
    """Two "nodes" of one 4 x H100 host under their own NCCL_HOSTID: training kept 20.9 % of one node's tokens/s
    per GPU across NCCL's socket transport, against the 60 % auto derives; the row that fails the nodes (and that
    the cause sentence starts with) says both."""
    from cluster_accept.analysis.between_nodes import CAUSES
    from cluster_accept.analysis.causes import explain, node_cause
    from cluster_accept.tasks.rows import node_row

    profile = Profile.model_validate({"thresholds": {"training_scaling_efficiency_min": 0.6}})
    halves = [Node(f"n{i}", SshSettings(), "p", profile) for i in (1, 2)]
    stage = FakeStage({1: 150_000.0, 2: 31_350.0}, IsolationVerdict([], [], ["n1", "n2"], [], 1, "n[1-2] unresolved"))
    table, trouble = training_sweep(stage, halves)
    isolate_training(stage, halves, table)
    assert trouble
    ((_, failed),) = [(n, r) for n, r in stage.rows if n == "n1" and r.reason == "unattributed"]
    assert (failed.item, failed.observed, failed.expected) == ("2 nodes", "20.9%", ">= 60%")
    fabric = CheckRow("profile", "fabric", Status.WARN, "no_rdma_fabric", "no RDMA port", "an RDMA fabric", "auto")
    rows = [node_row("r", "c", "preflight", "n1", fabric), node_row("r", "c", "multi-node", "n1", failed)]
    said = node_cause(rows, explain(rows, CAUSES))
    assert said.startswith("training_scaling 2 nodes 20.9% (expected >= 60%): profile:no_rdma_fabric no RDMA port")
