"""Marks: where a check's reading of a node ended, kept for the node's next run (``mark:`` keys of the history,
or the node's own marks file). A mark is read back from files anyone may have edited: one that cannot be right
is named and never passes an event, a ``since`` that raises on one is an error row (never a crashed stage), and
a check that passed an event only as seen before has not looked at it again (a drain for it is not lifted)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cluster_accept.analysis.verdicts import Verdict, VerdictRow, marks_by_node, node_verdict
from cluster_accept.checks import xid
from cluster_accept.checks.base import Check, CheckRow, NodeRow, Status
from cluster_accept.inventory.model import DEFAULT_SSH, Inventory, Node, Profile
from cluster_accept.ops.after_run import judged_checks
from cluster_accept.ops.slurm import parse_show_nodes, plan
from cluster_accept.remote.result import CommandResult, NodeResult, NodeStatus
from cluster_accept.tasks.preflight.check_batch import NodePreflight
from cluster_accept.tasks.preflight.evaluate import evaluate_preflight, since_previous
from cluster_accept.vocabulary.rows import NodeValue

BOOT = "6c1f0c4e-5b7a-4a53-9d1e-0f0e4b2f3a10"
PROFILE = Profile()
INVENTORY = Inventory("c", [Node("node01", DEFAULT_SSH, "p", PROFILE)], {"p": PROFILE}, "inventory.yaml", "digest")


def _kernel_log(*lines: str, uptime: str = "3000.25") -> str:
    body = "[    0.000000] Linux version 6.8.0\n" + "".join(lines)
    count = body.count("\n")
    return (
        f"### boot={BOOT}\n### uptime={uptime}\n### source=dmesg\n{body}### rc=0\n"
        f"### lines={count} xid={count - 1}\n### done\n"
    )


def _outcome(check: Check, stdout: str) -> NodePreflight:
    result = NodeResult("node01", NodeStatus.OK, commands=[CommandResult(check.name, 0, stdout, "")])
    return NodePreflight("node01", result, {check.name: check.parse(stdout, 0)})


def _history(check: str, **marks: str) -> list[NodeValue]:
    """The previous run's ``node_values`` rows holding ``marks`` for ``check`` on node01, as read back from it."""
    return [
        NodeValue.from_record(
            {"run_id": "r0", "cluster": "c", "node": "node01", "check": check, "key": f"mark:{k}", "value": v}
        )
        for k, v in marks.items()
    ]


def _judged(outcome: NodePreflight, check: Check, history: list[NodeValue]) -> list[tuple[str, str, str]]:
    since_previous([outcome], [check], marks_by_node(history))
    return [(r.item, r.status.value, r.reason) for r in evaluate_preflight("r1", INVENTORY, [outcome], [check])]


XID_79 = "[ 1234.500000] NVRM: Xid (PCI:0000:18:00): 79, pid=0, name=swapper/0, GPU has fallen off the bus.\n"
XID_13 = "[ 2000.500000] NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python3, Graphics Exception\n"


def test_a_run_never_passes_an_xid_as_seen_before_on_an_impossible_mark_in_the_history() -> None:
    outcome = _outcome(xid.CHECK, _kernel_log(XID_79))
    assert _judged(outcome, xid.CHECK, _history("xid", boot_id=BOOT, uptime_s="inf")) == [
        ("xid_79", "fail", "xid_79"),
        ("mark", "warn", "mark_impossible"),
    ]
    future = _outcome(xid.CHECK, _kernel_log(XID_79))
    assert _judged(future, xid.CHECK, _history("xid", boot_id=BOOT, uptime_s="4000.0")) == [
        ("xid_79", "fail", "xid_79"),
        ("mark", "warn", "mark_impossible"),
    ]
    sound = _outcome(xid.CHECK, _kernel_log(XID_13))  # an application XID under a mark of this boot: judged before
    assert _judged(sound, xid.CHECK, _history("xid", boot_id=BOOT, uptime_s="2500.0")) == [
        ("kernel_log", "pass", "ok"),
        ("xid_13", "pass", "seen_before"),
    ]
    past = _outcome(xid.CHECK, _kernel_log(XID_79))  # a hardware XID: no run marks past it, a mark never passes it
    assert _judged(past, xid.CHECK, _history("xid", boot_id=BOOT, uptime_s="2500.0")) == [("xid_79", "fail", "xid_79")]


def test_a_run_passes_a_node_whose_only_xid_is_the_applications() -> None:
    outcome = _outcome(xid.CHECK, _kernel_log(XID_13))
    since_previous([outcome], [xid.CHECK], {})
    rows = evaluate_preflight("r1", INVENTORY, [outcome], [xid.CHECK])
    assert [(r.item, r.status.value, r.reason) for r in rows] == [("xid_13", "warn", "xid_13")]
    assert node_verdict("node01", rows, ()).verdict == Verdict.ACCEPTED


def _raising_since(model: Any, previous: Mapping[str, str]) -> Any:
    raise ValueError(f"cannot read mark {previous['count']!r}")


RAISING = Check(
    name="counted",
    command="echo 3",
    parse=lambda stdout, rc: int(stdout),
    evaluate=lambda model, profile, cluster: [CheckRow("counted", "count", Status.PASS, "ok", str(model))],
    reasons={},
    marks=lambda model: {"count": str(model)},
    since=_raising_since,
)


def test_a_since_that_raises_on_a_mark_is_an_error_row_not_a_stopped_stage() -> None:
    outcome = _outcome(RAISING, "3\n")
    since_previous([outcome], [RAISING], marks_by_node(_history("counted", count="x" * 5)))
    (row,) = evaluate_preflight("r1", INVENTORY, [outcome], [RAISING])
    assert (row.item, row.status, row.reason) == ("output", Status.ERROR, "parser_crashed")
    assert row.detail.startswith("reading the previous run's marks raised ValueError: cannot read mark 'xxxxx'\n3\n"), (
        row.detail
    )


def _row(check: str, reason: str, status: Status = Status.PASS, node: str = "n1") -> NodeRow:
    return NodeRow("r2", "c", "preflight", node, check, "x", status, reason)


def test_a_drain_for_an_xid_passed_as_seen_before_is_not_lifted() -> None:
    """The node was drained for XID 79; the next run passes the same event as seen before: whether the GPU was
    repaired is not known, so the node stays drained (the next boot's log, or a person, lifts it)."""
    rows = [_row("xid", "seen_before"), _row("xid", "ok"), _row("gpu_count", "ok"), _row("xid", "ok", node="n2")]
    assert judged_checks(rows) == {"n1": {"gpu_count"}, "n2": {"xid"}}
    shown = parse_show_nodes(
        "NodeName=n1 State=IDLE+DRAIN Reason=cluster-accept: xid:xid_79 (run r1)\n"
        "NodeName=n2 State=IDLE+DRAIN Reason=cluster-accept: xid:xid_79 (run r1)\n"
    )
    verdicts = [VerdictRow("r2", "c", n, "p", Verdict.ACCEPTED) for n in ("n1", "n2")]
    planned = plan(verdicts, shown, "r2", drain=True, resume_passing=True, judged=judged_checks(rows))
    assert [(a.node, a.action) for a in planned.actions] == [("n2", "resume")]
    assert planned.kept == [("n1", "drained for xid:xid_79, which this run did not check")]


def test_a_mark_is_a_time_no_later_than_now_or_it_is_named() -> None:
    from cluster_accept.checks.base import read_mark  # the helper every check's ``since`` reads its marks with

    assert read_mark({}, "now_s", 100.0).value is None and read_mark({}, "now_s", 100.0).problem is None
    assert read_mark({"now_s": "99.5"}, "now_s", 100.0).value == 99.5
    assert read_mark({"now_s": "100"}, "now_s", 100.0).value == 100.0
    assert read_mark({"now_s": "1" * 60}, "now_s", 100.0).problem == (
        f"now_s='{'1' * 40}...' is after this reading (100.000): from the future"
    )
    assert read_mark({"now_s": "5"}, "now_s", float("inf")).problem == (
        "now_s='5' cannot be checked: this reading has no now_s of its own"
    )
