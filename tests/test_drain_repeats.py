"""A relative finding (a straggler, a figure below its floor) drains a node only once it repeats: in fail_streak
consecutive runs, or in ceil(fail_share x fail_window) of the node's last fail_window runs; a hard fault (a GPU
missing, an XID, the node out of reach) drains at once. Held drains are listed with their count so far, and the
drain breaker counts only what is drained."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pydantic
import pytest
import yaml

from cluster_accept.analysis import coverage
from cluster_accept.analysis.schemas import VERDICTS, write_table
from cluster_accept.analysis.verdicts import Verdict, VerdictRow
from cluster_accept.checks.reasons import (
    COMMON,
    SSH_REASONS,
    TOOL_CHECK,
    TOOL_REASONS,
    Action,
    FindingKind,
    Reason,
    declare,
)
from cluster_accept.flows.schedule import deployment_parameters
from cluster_accept.flows.shard_results import SHARD_CHECK, SHARD_REASONS
from cluster_accept.ops import slurm
from cluster_accept.ops.after_run import Operations, after_run
from cluster_accept.ops.breaker import DrainLimits
from cluster_accept.ops.repeats import (
    HeldDrain,
    RepeatRule,
    count_repeats,
    held_drains,
    holds_for_run,
    outcomes_by_node,
    read_past_verdicts,
)
from cluster_accept.ops.slurm import SlurmNode, held_back, plan
from cluster_accept.tasks.stages import STAGES, reason_catalog
from cluster_accept.vocabulary.status import Status
from tests.processes import ROOT, run_cli

RULE = RepeatRule()  # 3 consecutive, or 3 of the last 6
STRAGGLER = ["gemm:straggler", "hbm:straggler"]
RUN = {"cluster": "c", "started": "2026-11-27T10:00:00+00:00", "ended": "2026-11-27T10:05:00+00:00"}


# Which reasons are relative ------------------------------------------------------------------------------------

# The run's declarations, as the flow gathers them (a sharded run's own ``shards`` check included).
CATALOG = reason_catalog([(SHARD_CHECK, SHARD_REASONS)])
# Codes that mean the same relative judgement whichever module declares them: a figure against its peers or its
# floor, the node against its own history, a value against the cluster's majority, and the noise-aware call that
# cannot decide.
RELATIVE_EVERYWHERE = ("straggler", "straggler_unconfirmed", "below_threshold", "regression", "drift", "inconclusive")


@pytest.mark.parametrize(
    "reason",
    [
        "gemm:straggler",
        "allreduce:below_threshold",
        "gemm:regression",
        "driver:drift",
        "hbm:straggler_unconfirmed",
        "isolation:slow_pair",
        "rails:below_other_rails",
        "scaling:below_floor_together",
        "training:slow_rank",
        "training_scaling:efficiency_low",
        "burn:throttled",
        "job_settings:suspect",
        # every relative finding of one check, and each probe's judgement against its peers and its floor
        *("burn:throughput_dropped", "burn:runs_hot", "burn:thermal_spread", "burn:clocks_fell", "burn:inconclusive"),
        *("gpu:clocks_low", "dcgm:performance_error", "roce_qos:differs", "nccl_env:drift", "shards:drift"),
        "gpu:busy",  # another process on the GPU: often gone by the next run
        *("gpu_pairs:weak_gpu", "gpu_pairs:weak_link", "gpu_pairs:weak_direction", "rails:below_min"),
        *("scaling:below_min", "scaling:below_smaller_groups", "scaling:efficiency_low"),
        *("isolation:slow_node", "isolation:slow_rail", "isolation:unresolved"),
        *("training:dp_efficiency_low", "training_scaling:unattributed"),
        *("job_settings:confirmed", "job_settings:confirmed_together"),
        *("nccl_mechanism:channels_below_majority", "nccl_mechanism:channels_below_nvlinks"),
        *("nccl_mechanism:algorithm_differs", "nccl_mechanism:protocol_differs"),
        *(
            f"{probe}:{code}"
            for probe in ("gemm", "hbm", "host_bw", "allreduce", "collectives", "gpu_pairs", "training", "burn")
            for code in ("straggler", "below_threshold")
        ),
    ],
)
def test_figures_judged_against_a_floor_peers_or_history_are_relative(reason: str) -> None:
    assert CATALOG.kind(reason) is FindingKind.RELATIVE


@pytest.mark.parametrize(
    "reason",
    [
        "gpu_count:count_low",
        "memory:uncorrected_ecc",
        "burn:ecc_uncorrected_grew",
        "xid:xid_79",
        "xid:xid_48",
        "infiniband:port_down",
        "ssh:refused",
        "ssh:timeout",
        "gemm:probe_failed",
        "allreduce:collective_failed",
        "training:numerics",
        "coverage:no_row",
        "tool:run_unattributed",
        "not accepted",
        "a_plugin:something_new",  # declared by nobody: drains at once, as every finding did
        "gpu_count:straggler",  # a code relative elsewhere, on a check that does not declare it
    ],
)
def test_hardware_faults_reach_and_crashes_are_hard(reason: str) -> None:
    assert CATALOG.kind(reason) is FindingKind.HARD


def _declarations() -> list[tuple[str, Reason]]:
    """Each reason as the module that declares it says, before the catalogue merges the modules that speak for
    one check (``*``: the common ones, any check's)."""
    pairs = [pair for stage in STAGES for pair in stage.reasons()]
    pairs += [(coverage.NAME, coverage.REASONS), (SHARD_CHECK, SHARD_REASONS), ("ssh", SSH_REASONS)]
    pairs += [(TOOL_CHECK, TOOL_REASONS), ("*", COMMON)]
    return [(check, reason) for check, reasons in pairs for reason in reasons.values()]


def test_every_relative_reason_is_declared_relative_by_each_module_that_declares_it() -> None:
    """Several modules may speak for one check: none of them declares hard what the run classifies relative, and
    a code that means the same judgement everywhere (a straggler, a figure below its floor, drift) is relative in
    every module that declares it, so a new probe's stragglers wait for a repeat like the others'."""
    declared = _declarations()
    relative = {
        f"{check}:{r.code}" for check, r in declared if CATALOG.kind(f"{check}:{r.code}") is FindingKind.RELATIVE
    }
    assert relative, "no reason is declared relative"
    said_hard = sorted(
        f"{check}:{r.code}" for check, r in declared if f"{check}:{r.code}" in relative and r.kind is FindingKind.HARD
    )
    assert said_hard == []
    uneven = sorted(
        f"{check}:{r.code}" for check, r in declared if r.code in RELATIVE_EVERYWHERE and r.kind is FindingKind.HARD
    )
    assert uneven == []
    assert {r.code for check, r in declared if r.code in RELATIVE_EVERYWHERE} == set(RELATIVE_EVERYWHERE)


def test_a_plug_in_classifies_its_own_findings_where_it_declares_them() -> None:
    """No list to edit: a check added beside the others makes its finding relative by declaring it so."""
    own = declare(
        Reason("slow_widget", Status.FAIL, "slower than its peers", Action.CHECK_NODE, kind=FindingKind.RELATIVE),
        Reason("widget_gone", Status.FAIL, "the widget is missing", Action.CHECK_NODE),
    )
    plugged = reason_catalog([("widget", own)])
    assert plugged.kind("widget:slow_widget") is FindingKind.RELATIVE
    assert plugged.kind("widget:widget_gone") is FindingKind.HARD
    assert CATALOG.kind("widget:slow_widget") is FindingKind.HARD  # a run without the plug-in does not know it
    verdicts = [_verdict("n1", Verdict.REJECTED, ["widget:slow_widget"])]
    assert list(held_drains(verdicts, {}, RULE, plugged)) == ["n1"]
    assert held_drains(verdicts, {}, RULE, CATALOG) == {}


# The rule over a node's runs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outcomes", "streak", "failed", "due"),
    [
        ([True], 1, 1, False),  # the first failure: held
        ([True, True], 2, 2, False),
        ([True, True, True], 3, 3, True),  # three in a row
        ([False, False, False, True, True], 2, 2, False),
        ([True, False, True], 1, 2, False),  # 2 of the last 6: held
        ([True, False, True, False, True], 1, 3, True),  # 3 of the last 6, never two in a row: intermittent
        ([True, False, False, False, False, False, True, False, True], 1, 2, False),  # the first left the window
        ([False] * 8 + [True, True, True], 3, 3, True),
    ],
)
def test_the_streak_and_the_share_over_synthetic_histories(
    outcomes: list[bool], streak: int, failed: int, due: bool
) -> None:
    count = count_repeats(outcomes, RULE.window)
    assert (count.streak, count.failed, count.seen) == (streak, failed, min(len(outcomes), 6))
    assert count.due(RULE) is due


def test_the_share_counts_failures_of_the_whole_window() -> None:
    assert RULE.failures_in_window == 3  # ceil(0.5 x 6)
    assert RepeatRule(streak=4, share=0.25, window=8).failures_in_window == 2
    assert RepeatRule(streak=2, share=1.0, window=2).failures_in_window == 2
    assert count_repeats([True, False, True], 8).due(RepeatRule(streak=4, share=0.25, window=8))
    assert not count_repeats([True, False, True], 6).due(RepeatRule(streak=3, share=1.0, window=6))


def _verdict(node: str, verdict: Verdict, reasons: list[str], run: str = "r9") -> VerdictRow:
    return VerdictRow(run, "c", node, "p", verdict, reasons)


def test_only_a_node_sent_back_for_relative_findings_alone_is_held() -> None:
    verdicts = [
        _verdict("slow", Verdict.REJECTED, STRAGGLER),
        _verdict("mixed", Verdict.REJECTED, ["gemm:straggler", "gpu_count:count_low"]),  # any hard reason: at once
        _verdict("gone", Verdict.UNREACHABLE, ["ssh:refused"]),
        _verdict("nameless", Verdict.REJECTED, []),  # names nothing: at once
        _verdict("good", Verdict.ACCEPTED, []),
        _verdict("again", Verdict.REJECTED, ["allreduce:below_threshold"]),
    ]
    past = {"slow": [False, True], "again": [True, True], "good": [True, True]}
    held = held_drains(verdicts, past, RULE, CATALOG)
    assert list(held) == ["slow"]  # "again" failed its third run in a row: due
    assert held["slow"] == HeldDrain("slow", tuple(STRAGGLER), count_repeats([False, True, True], 6), RULE)
    said = "slow held: gemm:straggler, hbm:straggler 2 of 3 consecutive runs (2 of 3 in its last 6 runs)"
    assert held["slow"].said == said
    record = held["slow"].record()
    assert {k: record[k] for k in ("streak", "streak_to_drain", "failed_in_window", "failed_to_drain", "window")} == {
        "streak": 2,
        "streak_to_drain": 3,
        "failed_in_window": 2,
        "failed_to_drain": 3,
        "window": 6,
    }


def test_a_held_drain_names_its_first_reasons_and_counts_the_rest() -> None:
    reasons = ["gemm:straggler", "hbm:straggler", "allreduce:straggler", "gpu_pairs:weak_gpu", "burn:throttled"]
    held = held_drains([_verdict("n1", Verdict.REJECTED, reasons)], {}, RULE, CATALOG)["n1"]
    assert held.said == (
        "n1 held: gemm:straggler, hbm:straggler, allreduce:straggler and 2 more 1 of 3 consecutive runs "
        "(1 of 3 in its last 6 runs)"
    )
    assert held.record()["reasons"] == reasons


def test_runs_that_did_not_judge_the_node_are_no_runs_of_it() -> None:
    records = [
        ("r3", "n1", "rejected"),
        ("r1", "n1", "rejected"),
        ("r2", "n1", "skipped"),
        ("r4", "n1", "tool_error"),
        ("r2", "n2", "accepted"),
        ("r5", "n1", "unreachable"),
    ]
    assert outcomes_by_node(records) == {"n1": [True, True, True], "n2": [False]}


# The runs on disk ----------------------------------------------------------------------------------------------


def _run_on_disk(out: Path, run_id: str, verdicts: dict[str, str], cluster: str = "c") -> None:
    (out / run_id).mkdir(parents=True, exist_ok=True)
    record = {"run_id": run_id, "cluster": cluster, "started": "2026-11-01T00:00:00+00:00", "stages": ["preflight"]}
    (out / run_id / "run.json").write_text(json.dumps(record))
    rows = [
        VerdictRow(run_id, cluster, node, "p", Verdict(v), ["gemm:straggler"] if v == "rejected" else [])
        for node, v in verdicts.items()
    ]
    write_table(out / run_id / "verdicts.parquet", rows, VERDICTS)


def test_the_earlier_runs_beside_this_one_are_read_of_its_cluster_only(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    _run_on_disk(out, "20261101T000000Z-a", {"n1": "rejected", "n2": "accepted"})
    _run_on_disk(out, "20261102T000000Z-b", {"n1": "rejected", "n2": "rejected"}, cluster="other")
    _run_on_disk(out, "20261103T000000Z-c", {"n1": "skipped", "n2": "accepted"})
    (out / "20261104T000000Z-d").mkdir()  # interrupted: no verdicts
    (out / "20261105T000000Z-e").mkdir()
    (out / "20261105T000000Z-e" / "verdicts.parquet").write_bytes(b"PAR1 cut short")
    _run_on_disk(out, "20261107T000000Z-g", {"n1": "rejected"})  # later than this run: not counted
    this = out / "20261106T000000Z-f"
    this.mkdir()
    records, unread = read_past_verdicts(out, this, "c", ["n1", "n2"], 5)
    assert sorted(records) == [
        ("20261101T000000Z-a", "n1", "rejected"),
        ("20261101T000000Z-a", "n2", "accepted"),
        ("20261103T000000Z-c", "n2", "accepted"),
    ]
    assert len(unread) == 1 and unread[0].startswith("20261105T000000Z-e/verdicts.parquet (")
    held, unread_again = holds_for_run(this, "c", [_verdict("n1", Verdict.REJECTED, ["gemm:straggler"])], RULE, CATALOG)
    assert held["n1"].repeats.streak == 2 and unread_again == unread


def test_with_a_streak_of_one_nothing_is_read_and_nothing_held(tmp_path: Path) -> None:
    (tmp_path / "r2").mkdir()
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "verdicts.parquet").write_bytes(b"not parquet")
    verdicts = [_verdict("n1", Verdict.REJECTED, STRAGGLER)]
    assert holds_for_run(tmp_path / "r2", "c", verdicts, RepeatRule(1), CATALOG) == ({}, ())


# The Slurm plan and the breaker -------------------------------------------------------------------------------


def test_a_held_drain_is_listed_not_drained_and_the_breaker_counts_only_drains() -> None:
    """Ten nodes, two stragglers held and one GPU missing: one drain, within the breaker's one in ten."""
    verdicts = [_verdict(f"ok{i}", Verdict.ACCEPTED, []) for i in range(7)]
    verdicts += [_verdict(n, Verdict.REJECTED, STRAGGLER) for n in ("s1", "s2")]
    verdicts += [_verdict("hw", Verdict.REJECTED, ["gpu_count:count_low"])]
    known = {v.node: SlurmNode(v.node, "IDLE") for v in verdicts}
    known["s2"] = SlurmNode("s2", "IDLE+DRAIN", "bad fan, ticket 42")  # drained already: nothing to hold
    hold = held_drains(verdicts, {}, RULE, CATALOG)
    planned = held_back(plan(verdicts, known, "r9", True, False, hold=hold), verdicts, DrainLimits())
    assert [(a.node, a.action) for a in planned.actions] == [("hw", "drain")] and planned.breaker is None
    assert [h.node for h in planned.held] == ["s1"]
    assert [a.node for a in plan(verdicts, known, "r9", True, False).actions] == ["s1", "hw"]  # without: at once


def test_after_run_records_each_held_drain_with_its_count(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    _run_on_disk(out, "20261101T000000Z-a", {"n1": "rejected", "n2": "accepted", "n3": "accepted"})
    this = out / "20261102T000000Z-b"
    this.mkdir()
    nodes = {n: SlurmNode(n, "IDLE") for n in ("n1", "n2", "n3")}
    monkeypatch.setattr(slurm, "read_nodes", lambda scontrol="scontrol": (nodes, ""))
    verdicts = [
        _verdict("n1", Verdict.REJECTED, STRAGGLER, this.name),
        _verdict("n2", Verdict.REJECTED, ["xid:xid_79"], this.name),
        _verdict("n3", Verdict.ACCEPTED, [], this.name),
    ]
    ops = Operations(drain=True, max_drain=2)
    planned = after_run(this, {**RUN, "run_id": this.name}, verdicts, [], [], ops, reasons=CATALOG)
    assert [(a.node, a.action) for a in planned.actions] == [("n2", "drain")]
    record = json.loads((this / "slurm.json").read_text())
    assert record["repeat_rule"] == {"fail_streak": 3, "fail_share": 0.5, "fail_window": 6}
    assert [h["said"] for h in record["held_until_repeated"]] == [
        "n1 held: gemm:straggler, hbm:straggler 2 of 3 consecutive runs (2 of 3 in its last 6 runs)"
    ]
    assert record["repeats_unread"] == []
    twice = Operations(drain=True, max_drain=2, fail_streak=2)
    again = after_run(this, {**RUN, "run_id": this.name}, verdicts, [], [], twice, reasons=CATALOG)
    assert [a.node for a in again.actions] == ["n1", "n2"] and again.held == []  # 2 in a row: due
    undeclared = after_run(this, {**RUN, "run_id": this.name}, verdicts, [], [], ops)  # no declarations: all hard
    assert [a.node for a in undeclared.actions] == ["n1", "n2"] and undeclared.held == []


# The keys ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "keys",
    [{"fail_streak": 0}, {"fail_share": 0.0}, {"fail_share": 1.5}, {"fail_window": 2}, {"fail_streak": 7}],
)
def test_the_keys_are_checked(keys: dict[str, float]) -> None:
    with pytest.raises(pydantic.ValidationError):
        Operations(**keys)  # type: ignore[arg-type]


def test_a_served_deployment_carries_the_keys(tmp_path: Path) -> None:
    ops = Operations(drain=True, fail_streak=4, fail_share=0.25, fail_window=8)
    params = deployment_parameters(tmp_path / "i.yaml", "light", tmp_path / "runs", None, ops)
    restored = Operations.model_validate(params["operations"])
    assert restored.repeat_rule() == RepeatRule(4, 0.25, 8)
    assert Operations.model_validate({"drain": True}).repeat_rule() == RULE  # a run recorded before the keys


# Through the real CLI ------------------------------------------------------------------------------------------

FAKE_SCONTROL = """#!{python}
import json, sys
with open({log!r}, "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1:] == ["--json", "show", "node"]:
    print(json.dumps({{"nodes": [{{"name": f"gpu{{i:02d}}", "state": ["IDLE"], "reason": ""}} for i in range(1, 7)]}}))
"""


def _simulated_inventory(tmp_path: Path) -> Path:
    """Six simulated nodes: gpu03 slow (its figures halved: a straggler, relative), gpu05 without a GPU (hard)."""
    from cluster_accept.simulator.nodes import Recording
    from cluster_accept.testbed.profile import base_profile

    recording = ROOT / "bench" / "sim" / "testbed-h200x4.json"
    profile = base_profile("h200x4", python=Recording.load(recording).python)
    profile["thresholds"].update({"straggler_pct": 25, "relative_verdict": "fail"})
    inventory = {
        "cluster": "sim",
        "defaults": {"profile": "p"},
        "nodes": [{"hosts": "gpu[01-06]"}],
        "simulation": {
            "recording": str(recording),
            "latency_ms": 0,
            "faults": {"gpu03": "slow", "gpu05": "gpu_missing"},
        },
        "profiles": {"p": profile},
    }
    path = tmp_path / "sim.yaml"
    path.write_text(yaml.safe_dump(inventory))
    return path


@pytest.mark.integration
def test_a_straggler_is_held_until_its_third_run_and_a_missing_gpu_drained_at_once(tmp_path: Path) -> None:
    inventory, out, log = _simulated_inventory(tmp_path), tmp_path / "runs", tmp_path / "scontrol.log"
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(FAKE_SCONTROL.format(python=sys.executable, log=str(log)))
    scontrol.chmod(0o755)
    args = ["run", "-i", str(inventory), "--out", str(out), "--stages", "preflight,single-node", "--history", "-"]
    args += ["--drain", "--apply", "--max-drain", "2", "--scontrol", str(scontrol)]
    said = []
    for _ in range(3):
        done = run_cli(*args)
        assert done.returncode == 1, done.stdout + done.stderr
        said.append(done.stdout)
    runs = sorted(p for p in out.iterdir() if p.is_dir() and p.name != "history")
    records = [json.loads((run / "slurm.json").read_text()) for run in runs]
    drained = [[a["node"] for a in r["actions"] if a["action"] == "drain" and a["applied"]] for r in records]
    assert drained == [["gpu05"], ["gpu05"], ["gpu03", "gpu05"]]
    held = [[(h["node"], h["streak"], h["failed_in_window"]) for h in r["held_until_repeated"]] for r in records]
    assert held == [[("gpu03", 1, 1)], [("gpu03", 2, 2)], []]
    assert "slurm: gpu03 held: gemm:straggler" in said[0]
    assert "1 of 3 consecutive runs (1 of 3 in its last 6 runs)" in said[0]
    assert "2 of 3 consecutive runs" in said[1] and "gpu03 held" not in said[2]
    updates = [json.loads(line) for line in log.read_text().splitlines() if "update" in line]
    assert [u[1] for u in updates] == ["nodename=gpu05", "nodename=gpu05", "nodename=gpu03", "nodename=gpu05"]
    streak_one = run_cli(*args, "--fail-streak", "1")  # held nothing: at once, as before
    assert streak_one.returncode == 1 and "gpu03 held" not in streak_one.stdout


@pytest.mark.integration
@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--fail-streak", "4"], "--fail-window at least --fail-streak"),
        (["--fail-share", "0"], "--fail-share must be above 0"),
    ],
)
def test_rules_that_cannot_hold_are_usage_errors(tmp_path: Path, options: list[str], said: str) -> None:
    inventory = _simulated_inventory(tmp_path)
    args = ["run", "-i", str(inventory), "--out", str(tmp_path / "runs"), "--drain", "--fail-window", "3"]
    done = run_cli(*args, *options)
    assert done.returncode == 2 and said in done.stderr, done.stdout + done.stderr
