"""The drain breaker: a run drains at most max(1, fraction x tested nodes), refuses the drain as a whole past that,
and drains nothing when every tested node is unreachable the same way (the controller's fault, likelier)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from cluster_accept.analysis.verdicts import Verdict, VerdictRow
from cluster_accept.ops.after_run import Operations
from cluster_accept.ops.breaker import DrainLimits, allowed_drains, controller_fault, trip
from cluster_accept.ops.slurm import SlurmNode, held_back, plan


def _verdicts(bad: dict[str, tuple[Verdict, list[str]]], good: int) -> list[VerdictRow]:
    rows = [VerdictRow("r1", "c", f"ok{i:02d}", "p", Verdict.ACCEPTED) for i in range(good)]
    return rows + [VerdictRow("r1", "c", node, "p", verdict, reasons) for node, (verdict, reasons) in bad.items()]


def _slurm(verdicts: list[VerdictRow], drained: tuple[str, ...] = ()) -> dict[str, SlurmNode]:
    found = {v.node: SlurmNode(v.node, "IDLE") for v in verdicts}
    return {**found, **{n: SlurmNode(n, "IDLE+DRAIN", "cluster-accept: nvlink:inactive (run r0)") for n in drained}}


@pytest.mark.parametrize(
    ("tested", "limits", "allowed"),
    [
        (4, DrainLimits(), 1),  # 10 % of 4 is 0.4: at least one
        (10, DrainLimits(), 1),
        (25, DrainLimits(), 2),
        (1000, DrainLimits(), 100),
        (1000, DrainLimits(max_fraction=0.02), 20),
        (4, DrainLimits(max_nodes=3), 3),  # --max-drain N overrides the fraction
        (4, DrainLimits(max_nodes=0), 0),
        (4, DrainLimits(force=True), None),
    ],
)
def test_allowed_drains(tested: int, limits: DrainLimits, allowed: int | None) -> None:
    assert allowed_drains(tested, limits) == allowed


def test_three_of_four_are_held_back_as_a_whole_with_their_reasons() -> None:
    bad = {f"n{i}": (Verdict.REJECTED, [f"gpu_count:count_low{i}"]) for i in (1, 2, 3)}
    verdicts = _verdicts(bad, 1)
    planned = plan(verdicts, _slurm(verdicts), "r1", drain=True, resume_passing=False)
    assert [a.node for a in planned.actions] == ["n1", "n2", "n3"]

    held = held_back(planned, verdicts, DrainLimits())

    assert held.actions == [] and held.breaker is not None
    assert [node for node, _ in held.breaker.held] == ["n1", "n2", "n3"]
    assert held.breaker.held[1][1] == "cluster-accept: gpu_count:count_low2 (run r1)"
    assert held.breaker.why.startswith("3 of 4 tested nodes would be drained, more than the breaker allows")
    assert "max(1, 0.1 x 4 tested nodes) = 1" in held.breaker.why and "--max-drain N or --force" in held.breaker.why


def test_one_of_four_is_drained_and_resumes_go_ahead_when_drains_are_held() -> None:
    verdicts = _verdicts({"n1": (Verdict.REJECTED, ["nvlink:inactive"])}, 3)
    one = held_back(plan(verdicts, _slurm(verdicts), "r1", True, False), verdicts, DrainLimits())
    assert [(a.node, a.action) for a in one.actions] == [("n1", "drain")] and one.breaker is None

    many = _verdicts({f"n{i}": (Verdict.REJECTED, ["nvlink:inactive"]) for i in (1, 2)}, 2)
    slurm = _slurm(many, drained=("ok00",))
    held = held_back(plan(many, slurm, "r1", True, True, judged={"ok00": {"nvlink"}}), many, DrainLimits())
    assert [(a.node, a.action) for a in held.actions] == [("ok00", "resume")]
    assert held.breaker is not None and [n for n, _ in held.breaker.held] == ["n1", "n2"]


def test_max_drain_and_force_let_the_drains_through() -> None:
    verdicts = _verdicts({f"n{i}": (Verdict.REJECTED, ["pcie:width_low"]) for i in (1, 2, 3)}, 1)
    planned = plan(verdicts, _slurm(verdicts), "r1", True, False)
    assert held_back(planned, verdicts, DrainLimits(max_nodes=3)).breaker is None
    assert held_back(planned, verdicts, DrainLimits(max_nodes=2)).breaker is not None
    assert len(held_back(planned, verdicts, DrainLimits(force=True)).actions) == 3


def test_every_node_unreachable_the_same_way_names_the_controller_and_drains_nothing() -> None:
    unreachable = {f"n{i}": (Verdict.UNREACHABLE, ["ssh:refused"]) for i in (1, 2, 3, 4)}
    verdicts = _verdicts(unreachable, 0)
    fault = controller_fault(verdicts)
    assert fault is not None and "every tested node (4, n[1-4]) is unreachable the same way (ssh:refused)" in fault
    # even where the count would allow it
    tripped = trip(verdicts, [(v.node, "r") for v in verdicts], DrainLimits(max_nodes=10))
    assert tripped is not None and tripped.why.startswith(fault) and tripped.why.endswith("nothing drained")
    assert trip(verdicts, [(v.node, "r") for v in verdicts], DrainLimits(force=True)) is None


@pytest.mark.parametrize(
    "bad",
    [
        {"n1": (Verdict.UNREACHABLE, ["ssh:refused"]), "n2": (Verdict.UNREACHABLE, ["ssh:timeout"])},
        {"n1": (Verdict.UNREACHABLE, ["ssh:refused"]), "n2": (Verdict.REJECTED, ["ssh:refused"])},
    ],
)
def test_different_faults_are_no_controller_fault(bad: dict[str, tuple[Verdict, list[str]]]) -> None:
    assert controller_fault(_verdicts(bad, 0)) is None
    assert controller_fault(_verdicts({"n1": (Verdict.UNREACHABLE, ["ssh:refused"])}, 0)) is None  # one node alone
    assert controller_fault(_verdicts({"n1": (Verdict.UNREACHABLE, ["ssh:refused"])}, 1)) is None  # one reached


def test_skipped_nodes_are_not_tested_nodes() -> None:
    verdicts = _verdicts({"n1": (Verdict.REJECTED, ["driver:version_mismatch"])}, 1)
    verdicts += [VerdictRow("r1", "c", f"x{i}", "p", Verdict.SKIPPED) for i in range(20)]
    planned = plan(verdicts, _slurm(verdicts), "r1", True, False)
    assert held_back(planned, verdicts, DrainLimits(max_fraction=0.5)).breaker is None  # 1 of 2 tested
    assert trip(verdicts, [], DrainLimits()) is None  # nothing to drain: nothing to hold


def test_under_serve_the_limit_holds_over_the_window(tmp_path: Path) -> None:
    """Two scheduled runs of a ten-node cluster: the first drained one node in the window, so the second may
    drain none (one in ten, over the window); a run outside the window does not count."""
    out = tmp_path / "runs"
    for run, age_h, applied in (("r1", 1.0, True), ("r0", 30.0, True), ("r2", 2.0, False)):
        (out / run).mkdir(parents=True)
        actions = [{"node": "n9", "action": "drain", "applied": applied}]
        (out / run / "slurm.json").write_text(json.dumps({"actions": actions}))
        stamp = time.time() - 3600 * age_h
        os.utime(out / run / "slurm.json", (stamp, stamp))
    (out / "r3").mkdir()
    ops = Operations(drain=True, drain_window_h=24.0)
    limits = ops.drain_limits(out / "r3")
    assert (limits.window_h, limits.drained_in_window) == (24.0, 1)
    verdicts = _verdicts({"n1": (Verdict.REJECTED, ["nvlink:inactive"])}, 9)
    tripped = trip(verdicts, [("n1", "cluster-accept: nvlink:inactive (run r3)")], limits)
    assert tripped is not None and "the runs of the last 24 h drained 1" in tripped.why
    assert trip(verdicts, [("n1", "r")], Operations(drain=True).drain_limits(out / "r3")) is None  # run alone
    assert Operations(drain=True, drain_window_h=24.0).drain_limits(tmp_path / "elsewhere" / "r").drained_in_window == 0
