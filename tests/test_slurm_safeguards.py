"""Slurm's safeguards fail closed: a drain is lifted only where every one of its reasons was tested again (a
node's own check tests no SSH), and the drain breaker counts a drain record it cannot read as unknown drains,
holding this run's drains back and naming the record, never as none."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from cluster_accept.analysis.verdicts import Verdict, VerdictRow
from cluster_accept.checks.base import NodeRow, Status
from cluster_accept.flows.node_check import NodeCheck, SlurmOps, slurm_actions
from cluster_accept.inventory.model import LOCAL_ADDRESS, Node, Profile, SshSettings
from cluster_accept.ops import slurm
from cluster_accept.ops.after_run import Operations, after_run
from cluster_accept.ops.breaker import trip
from cluster_accept.ops.slurm import SlurmNode

pytestmark = pytest.mark.unit

CHECKED = ("gpu_count", "driver", "nvlink", "xid")  # what a node's own check judged: its preflight checks
RUN = {"cluster": "c", "started": "2026-11-27T10:00:00+00:00", "ended": "2026-11-27T10:05:00+00:00"}


def _rows(node: str, checks: tuple[str, ...] = CHECKED) -> list[NodeRow]:
    return [NodeRow("r2", "c", "preflight", node, check, "x", Status.PASS, "ok") for check in checks]


def _slurm_knows(monkeypatch: pytest.MonkeyPatch, reasons: dict[str, str]) -> None:
    """Slurm, as ``scontrol`` would list it: each node drained with its reason ('' for a node in service)."""
    nodes = {n: SlurmNode(n, "IDLE+DRAIN" if r else "IDLE", r) for n, r in reasons.items()}
    monkeypatch.setattr(slurm, "read_nodes", lambda scontrol="scontrol": (nodes, ""))


# A node's own check and SSH ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "left"),
    [
        ("cluster-accept: ssh:host-key (run r1)", "ssh:host-key"),
        ("cluster-accept: ssh:refused (run r1)", "ssh:refused"),
        ("cluster-accept: gpu_count:count_low, ssh:auth (run r1)", "ssh:auth"),
        ("cluster-accept: allreduce:below_threshold (run r1)", "allreduce:below_threshold"),  # a stage it never runs
    ],
)
def test_a_nodes_own_check_never_resumes_a_drain_it_did_not_test_again(
    monkeypatch: pytest.MonkeyPatch, reason: str, left: str
) -> None:
    """``check --local --resume-passing --apply`` on a passing node: a drain for SSH (or for a stage the check
    does not run) stays; the check reached nothing over SSH."""
    _slurm_knows(monkeypatch, {"node01": reason})
    found = NodeCheck("node01", _rows("node01"), VerdictRow("r2", "c", "node01", "p", Verdict.ACCEPTED))
    planned = slurm_actions(found, "node01", SlurmOps(resume_passing=True))  # what --apply would run
    assert planned.actions == []
    assert planned.kept == [("node01", f"drained for {left}, which this run did not check")]


def test_a_nodes_own_check_resumes_a_drain_for_what_it_tested_again(monkeypatch: pytest.MonkeyPatch) -> None:
    _slurm_knows(monkeypatch, {"node01": "cluster-accept: gpu_count:count_low, nvlink:inactive (run r1)"})
    found = NodeCheck("node01", _rows("node01"), VerdictRow("r2", "c", "node01", "p", Verdict.ACCEPTED))
    planned = slurm_actions(found, "node01", SlurmOps(resume_passing=True))
    assert [(a.node, a.action, a.command) for a in planned.actions] == [
        ("node01", "resume", "scontrol update nodename=node01 state=resume")
    ]
    assert planned.kept == []


def test_a_run_tests_ssh_again_only_on_the_nodes_it_reached_over_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A run that reached n1 over SSH lifts its ``ssh:refused`` drain; n2, checked on the controller itself
    (``address: local``), was reached by no SSH, so its drain for SSH stays."""
    drained = "cluster-accept: gpu_count:count_low, ssh:refused (run r1)"
    _slurm_knows(monkeypatch, {"n1": drained, "n2": drained})
    verdicts = [VerdictRow("r2", "c", n, "p", Verdict.ACCEPTED) for n in ("n1", "n2")]
    nodes = [Node("n1", SshSettings(), "p", Profile()), Node("n2", SshSettings(), "p", Profile(), LOCAL_ADDRESS)]
    over_ssh = {n.name for n in nodes if n.reached_over_ssh}
    assert over_ssh == {"n1"}
    ops = Operations(resume_passing=True)
    planned = after_run(
        tmp_path, {**RUN, "run_id": "r2"}, verdicts, _rows("n1") + _rows("n2"), [], ops, over_ssh=over_ssh
    )
    assert [(a.node, a.action) for a in planned.actions] == [("n1", "resume")]
    assert planned.kept == [("n2", "drained for ssh:refused, which this run did not check")]
    record = json.loads((tmp_path / "slurm.json").read_text())
    assert record["kept_drained"] == [{"node": "n2", "why": "drained for ssh:refused, which this run did not check"}]


# The drain breaker's window ---------------------------------------------------------------------------------

CUT_SHORT = '{\n  "apply": true,\n  "error": "",\n  "actions": [\n    {\n      "node": "n9",\n      "action": "dr'


def _record(out: Path, run: str, text: str | bytes, age_h: float = 1.0) -> None:
    (out / run).mkdir(parents=True, exist_ok=True)
    path = out / run / "slurm.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    stamp = time.time() - 3600 * age_h
    os.utime(path, (stamp, stamp))


def _ten_nodes_one_bad() -> list[VerdictRow]:
    good = [VerdictRow("r3", "c", f"ok{i}", "p", Verdict.ACCEPTED) for i in range(9)]
    return [*good, VerdictRow("r3", "c", "n1", "p", Verdict.REJECTED, ["nvlink:inactive"])]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (CUT_SHORT, "not JSON, cut short or corrupt: Unterminated string starting at"),
        ("null", "not a record of actions"),
        ("[]", "not a record of actions"),
        ('{"actions": "drain n9"}', "not a record of actions"),
        ('{"actions": [{"node": "n9", "action": "drain"}]}', "not a record of actions"),  # applied or not: unknown
        (b"\xff\xfe{", "invalid start byte"),
    ],
)
def test_a_drain_record_that_cannot_be_read_holds_the_drains_back_naming_it(
    tmp_path: Path, text: str | bytes, why: str
) -> None:
    """Ten nodes, one bad, under ``serve`` with a 24-h window: one drain is allowed over the window. A record of
    the window cut short (the disk filled, the controller died writing it) is not a record of zero drains."""
    out = tmp_path / "runs"
    _record(out, "r1", text)
    _record(out, "r0", '{"actions": [{"node": "n8", "action": "drain", "applied": true}]}', age_h=30.0)  # outside
    (out / "r3").mkdir()
    limits = Operations(drain=True, drain_window_h=24.0).drain_limits(out / "r3")
    tripped = trip(_ten_nodes_one_bad(), [("n1", "cluster-accept: nvlink:inactive (run r3)")], limits)
    assert tripped is not None and tripped.held == (("n1", "cluster-accept: nvlink:inactive (run r3)"),)
    assert tripped.why.startswith(
        "1 nodes would be drained, and 1 drain record(s) of the runs of the last 24 h cannot be read (r1/slurm.json ("
    )
    assert why in tripped.why
    assert tripped.why.endswith(
        "how many nodes those runs drained is unknown, so the breaker holds every drain; nothing drained; repair the "
        "record or set it aside out of the runs' directory, or drain with --force"
    )
    forced = Operations(drain=True, drain_window_h=24.0, force=True).drain_limits(out / "r3")
    assert trip(_ten_nodes_one_bad(), [("n1", "r")], forced) is None  # --force lifts it, as it lifts the breaker


def test_a_run_that_died_applying_its_drains_counts_them(tmp_path: Path) -> None:
    """A record left ``applying`` (the run died between its drain commands and its final record) counts every
    drain it planned: whether each went through is not known."""
    out = tmp_path / "runs"
    planned = [
        {"node": "n9", "action": "drain", "applied": False},
        {"node": "n8", "action": "resume", "applied": False},
    ]
    _record(out, "r1", json.dumps({"state": "applying", "actions": planned}))
    (out / "r3").mkdir()
    limits = Operations(drain=True, drain_window_h=24.0).drain_limits(out / "r3")
    assert limits.drained_in_window == 1
    tripped = trip(_ten_nodes_one_bad(), [("n1", "r")], limits)
    assert tripped is not None and "the runs of the last 24 h drained 1" in tripped.why


def test_the_drain_record_says_applying_before_the_first_drain_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _slurm_knows(monkeypatch, {"n1": "", **{f"ok{i}": "" for i in range(9)}})
    seen: list[dict[str, Any] | None] = []

    def scontrol(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        record = tmp_path / "slurm.json"
        seen.append(json.loads(record.read_text()) if record.exists() else None)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(slurm.subprocess, "run", scontrol)
    rows = [r for v in _ten_nodes_one_bad() for r in _rows(v.node)]
    ops = Operations(drain=True, apply=True)
    planned = after_run(tmp_path, {**RUN, "run_id": "r3"}, _ten_nodes_one_bad(), rows, [], ops)
    assert [r and (r["state"], [(a["node"], a["action"], a["applied"]) for a in r["actions"]]) for r in seen] == [
        ("applying", [("n1", "drain", False)])
    ]
    assert [(a.node, a.action, a.applied) for a in planned.actions] == [("n1", "drain", True)]
    final = json.loads((tmp_path / "slurm.json").read_text())
    assert (final["state"], final["actions"][0]["applied"]) == ("done", True)


def test_a_drain_that_names_no_reason_is_never_lifted_by_a_pass() -> None:
    """``cluster-accept: not accepted`` (a verdict drained without its codes) names nothing any run tests
    again: kept, as a drain cut short is."""
    slurm_nodes = {"n1": SlurmNode("n1", "IDLE+DRAIN", "cluster-accept: not accepted (run r1)")}
    verdicts = [VerdictRow("r2", "c", "n1", "p", Verdict.ACCEPTED)]
    planned = slurm.plan(verdicts, slurm_nodes, "r2", False, True, judged={"n1": {"gpu_count", "ssh"}})
    assert (planned.actions, planned.kept) == ([], [("n1", "drained for not accepted, which this run did not check")])
