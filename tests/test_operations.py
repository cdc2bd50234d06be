"""Scheduled-check operations, pure: summary.json, the Prometheus file, the Slurm plan, regressions against
a node's own history, suites."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from cluster_accept.analysis.regressions import counter_growth, figure_regressions
from cluster_accept.analysis.verdicts import Verdict, VerdictRow
from cluster_accept.checks.base import NodeRow, Status
from cluster_accept.flows.schedule import deployment_name, deployment_parameters
from cluster_accept.inventory.model import Thresholds
from cluster_accept.ops.after_run import Operations, warnings_by_node
from cluster_accept.ops.slurm import (
    REASON_PREFIX,
    SSH_CHECK,
    SlurmNode,
    SlurmPlan,
    drain_codes,
    drain_reason,
    parse_json_nodes,
    parse_show_nodes,
    plan,
    read_nodes,
)
from cluster_accept.probes.gemm import METRICS as RULES
from cluster_accept.reports.summary import prometheus_text, summary
from cluster_accept.tasks.stages import resolve_suite

RUN = {"run_id": "r9", "cluster": "prod", "started": "2026-11-21T10:00:00+00:00", "ended": "2026-11-21T10:05:00+00:00"}
# summary.json as it was written from plain-string verdicts: the typed rows must give the same text.
PLAIN_SUMMARY = {
    "run_id": "r9",
    "cluster": "prod",
    "started": "2026-11-21T10:00:00+00:00",
    "ended": "2026-11-21T10:05:00+00:00",
    "stages": ["preflight"],
    "suite": None,
    "counts": {"accepted": 2, "rejected": 1, "unreachable": 1, "skipped": 0, "tool_error": 0},
    "all_accepted": False,
    "not_accepted": [
        {"node": "n2", "verdict": "rejected", "reasons": ["gpu_count:count_low"]},
        {"node": "n3", "verdict": "unreachable", "reasons": ["ssh:refused"]},
    ],
    "accepted_with_warnings": [{"node": "n4", "warnings": ["gemm:regression"]}],
}


def verdict(node: str, outcome: Verdict, reasons: list[str] | None = None) -> VerdictRow:
    return VerdictRow("r9", "prod", node, "p", outcome, reasons or [])


VERDICTS = [
    verdict("n1", Verdict.ACCEPTED),
    verdict("n2", Verdict.REJECTED, ["gpu_count:count_low"]),
    verdict("n3", Verdict.UNREACHABLE, ["ssh:refused"]),
    verdict("n4", Verdict.ACCEPTED),
]


def test_summary_counts_and_names_the_nodes_not_accepted() -> None:
    got = summary({**RUN, "stages": ["preflight"]}, VERDICTS, {"n4": ["gemm:regression"], "n2": ["x:y"]})
    assert got["counts"] == {"accepted": 2, "rejected": 1, "unreachable": 1, "skipped": 0, "tool_error": 0}
    assert got["all_accepted"] is False
    assert got["not_accepted"] == [
        {"node": "n2", "verdict": "rejected", "reasons": ["gpu_count:count_low"]},
        {"node": "n3", "verdict": "unreachable", "reasons": ["ssh:refused"]},
    ]
    assert got["accepted_with_warnings"] == [{"node": "n4", "warnings": ["gemm:regression"]}]
    assert summary(RUN, VERDICTS[:1], {})["all_accepted"] is True


def _plain(value: object) -> bool:
    if isinstance(value, dict):
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return value is None or type(value) in (str, int, bool)


def test_summary_json_holds_plain_values_only() -> None:
    """Verdicts go to JSON as their values: the same text as from plain strings, no enum inside."""
    got = summary({**RUN, "stages": ["preflight"]}, VERDICTS, {"n4": ["gemm:regression"]})
    assert json.dumps(got, indent=2, default=str) == json.dumps(PLAIN_SUMMARY, indent=2)
    assert _plain(got)


def test_prometheus_text_has_a_verdict_series_per_node_and_the_figures() -> None:
    """prometheus_client's text: every value in Go's float form (``1.0``, ``1.7952555e+09``), labels by name."""
    text = prometheus_text(RUN, VERDICTS[:2], {("n1", "gemm_bf16_tflops"): 741.25, ("n1", "other"): 1.0})
    lines = text.splitlines()
    assert 'cluster_accept_node_verdict{cluster="prod",node="n1",verdict="accepted"} 1.0' in lines
    assert 'cluster_accept_node_verdict{cluster="prod",node="n1",verdict="rejected"} 0.0' in lines
    assert 'cluster_accept_node_verdict{cluster="prod",node="n2",verdict="rejected"} 1.0' in lines
    assert 'cluster_accept_gemm_bf16_tflops{cluster="prod",node="n1"} 741.25' in lines
    assert 'cluster_accept_nodes{cluster="prod",verdict="rejected"} 1.0' in lines
    assert 'cluster_accept_last_run_timestamp_seconds{cluster="prod"} 1.7952555e+09' in lines
    assert "# TYPE cluster_accept_node_verdict gauge" in lines and 'node="n1"} 1.0' not in text
    assert 'node="a\\"b"' in prometheus_text(RUN, [verdict('a"b', Verdict.ACCEPTED)], {})
    assert "Verdict." not in text


SHOW = (
    "NodeName=n1 Arch=x86_64 State=IDLE Partitions=gpu\n"
    "NodeName=n2 Arch=x86_64 State=IDLE Partitions=gpu\n"
    "NodeName=n4 Arch=x86_64 State=IDLE+DRAIN Partitions=gpu Reason=cluster-accept: gemm:straggler (run r8) "
    "[root@2026-11-20T10:00:00]\n"
    "NodeName=n5 State=MIXED+DRAIN Reason=bad fan, ticket 42 [admin@2026-11-19T09:00:00]\n"
)


def test_parse_show_nodes_reads_state_and_reason() -> None:
    nodes = parse_show_nodes(SHOW)
    assert nodes["n4"] == SlurmNode("n4", "IDLE+DRAIN", "cluster-accept: gemm:straggler (run r8)")
    assert nodes["n4"].drained_by_us and not nodes["n5"].drained_by_us and nodes["n5"].drained
    assert nodes["n5"].reason == "bad fan, ticket 42" and not nodes["n1"].drained


def test_plan_drains_bad_nodes_and_resumes_only_what_we_drained() -> None:
    nodes = parse_show_nodes(SHOW)
    verdicts = VERDICTS + [verdict("n5", Verdict.ACCEPTED)]
    judged = {"n4": {"gemm"}}  # what this run tested again on n4, drained for gemm:straggler
    planned = plan(verdicts, nodes, "r9", drain=True, resume_passing=True, scontrol="/usr/bin/scontrol", judged=judged)
    actions = planned.actions
    assert [(a.node, a.action, a.command) for a in actions] == [
        (
            "n2",
            "drain",
            "/usr/bin/scontrol update nodename=n2 state=drain 'reason=cluster-accept: gpu_count:count_low (run r9)'",
        ),
        ("n4", "resume", "/usr/bin/scontrol update nodename=n4 state=resume"),
    ]  # n5 was drained by an administrator and stays drained
    assert planned.unknown == ["n3"]  # rejected, but Slurm has no such node: named, not silently skipped
    assert plan(verdicts, nodes, "r9", drain=False, resume_passing=False) == SlurmPlan()
    long = drain_reason([f"check{i}:reason" for i in range(40)], "r9")
    assert long.startswith(REASON_PREFIX) and len(long) == 200 and long.endswith("...")


def test_plan_tells_slurm_its_own_node_names() -> None:
    """With a name rule, Slurm is asked about (and told to drain) its own name; the action keeps both names."""
    shown = parse_show_nodes("NodeName=gpu-n2 State=IDLE\nNodeName=gpu-n4 State=IDLE+DRAIN Reason=cluster-accept: x\n")
    verdicts = [verdict("n2", Verdict.REJECTED, ["gpu_count:count_low"]), verdict("n4", Verdict.ACCEPTED)]
    names = {"n2": "gpu-n2", "n4": "gpu-n4"}
    planned = plan(verdicts, shown, "r1", drain=True, resume_passing=True, names=names, judged={"n4": {"x"}})
    assert [(a.node, a.slurm_node, a.argv[2], a.action) for a in planned.actions] == [
        ("n2", "gpu-n2", "nodename=gpu-n2", "drain"),
        ("n4", "gpu-n4", "nodename=gpu-n4", "resume"),
    ]
    unmapped = plan(verdicts, shown, "r1", drain=True, resume_passing=True)
    assert unmapped.actions == [] and unmapped.unknown == ["n2"]


def test_a_node_drained_for_what_this_run_did_not_check_stays_drained() -> None:
    """A preflight-only run (Slurm's health check) passes a node drained for its all-reduce: it stays drained;
    a node drained for a preflight finding and SSH that passes now, reached over SSH, is resumed."""
    shown = parse_show_nodes(
        "NodeName=n1 State=IDLE+DRAIN Reason=cluster-accept: allreduce:below_min, gpu_count:count_low (run r1)\n"
        "NodeName=n2 State=IDLE+DRAIN Reason=cluster-accept: gpu_count:count_low, ssh:refused (run r1)\n"
        "NodeName=n3 State=IDLE+DRAIN Reason=cluster-accept: a:b, c:d, e:f...\n"
    )
    verdicts = [verdict(n, Verdict.ACCEPTED) for n in ("n1", "n2", "n3")]
    judged = {n: {"gpu_count", "driver", SSH_CHECK} for n in ("n1", "n2", "n3")}
    planned = plan(verdicts, shown, "r2", drain=True, resume_passing=True, judged=judged)
    assert [(a.node, a.action) for a in planned.actions] == [("n2", "resume")]
    assert planned.kept == [
        ("n1", "drained for allreduce:below_min, which this run did not check"),
        ("n3", "its drain reason was cut short, so this run cannot tell it checked every finding"),
    ]
    assert drain_codes("cluster-accept: gpu_count:count_low, ssh:refused (run r1)") == [
        "gpu_count:count_low",
        "ssh:refused",
    ]


# ``scontrol show node -o`` as Slurm 22.05.8 prints it (the test-bed's Slurm), fields up to the reason cut
# short: an administrator quoting one of our old reasons, a reason of two lines followed by a comment that looks
# like our reason, and ours.
SLURM_2205 = (
    "NodeName=node01 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=3.93 "
    "OS=Linux 6.18.44-fc-v595 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1 AllocMem=0 FreeMem=22418 Sockets=2 Boards=1 "
    "State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu  "
    "BootTime=2026-11-24T17:53:05 SlurmdStartTime=2026-11-24T20:28:59 LastBusyTime=2026-11-24T20:28:59 "
    "CfgTRES=cpu=2,mem=1M,billing=2 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s "
    "ExtSensorsWatts=0 ExtSensorsTemp=n/s "
    "Reason=vendor hold, was Reason=cluster-accept: ssh:refused (run 1) [root@2026-11-24T20:29:00]\n"
    "NodeName=node02 Arch=x86_64 State=IDLE+DRAIN ThreadsPerCore=1 Partitions=gpu  CurrentWatts=0 AveWatts=0 "
    "Reason=two [root@2026-11-24T20:29:00]        lines Comment=a Reason=cluster-accept: x\n"
    "NodeName=node03 Arch=x86_64 State=MIXED+DRAIN ThreadsPerCore=1 Partitions=gpu  CurrentWatts=0 AveWatts=0 "
    "Reason=cluster-accept: gpu_count:count_low (run r1) [slurm@2026-11-24T20:29:00] Extra=rack=7\n"
    "NodeName=node04 Arch=x86_64 State=IDLE ThreadsPerCore=1 Partitions=gpu  CurrentWatts=0 AveWatts=0\n"
)


def test_a_reason_that_quotes_ours_is_the_administrators() -> None:
    """Slurm's reason field is read where Slurm prints it: ``Reason=`` inside an administrator's text is text,
    so the node is not ours to resume."""
    nodes = parse_show_nodes(SLURM_2205)
    assert nodes["node01"] == SlurmNode(
        "node01", "IDLE+DRAIN", "vendor hold, was Reason=cluster-accept: ssh:refused (run 1)"
    )
    assert nodes["node01"].drained and not nodes["node01"].drained_by_us
    assert nodes["node02"].reason == "two" and not nodes["node02"].drained_by_us
    assert nodes["node03"].reason == "cluster-accept: gpu_count:count_low (run r1)" and nodes["node03"].drained_by_us
    assert nodes["node04"] == SlurmNode("node04", "IDLE", "")
    verdicts = [verdict(n, Verdict.ACCEPTED) for n in ("node01", "node02", "node03", "node04")]
    planned = plan(verdicts, nodes, "r2", drain=True, resume_passing=True, judged={"node03": {"gpu_count"}})
    assert [(a.node, a.action) for a in planned.actions] == [("node03", "resume")]


def test_slurms_json_gives_the_reason_as_a_field() -> None:
    """``scontrol --json show node`` (23.02 and later: state a list) and 22.05's ``sinfo --json`` (state a
    word, flags beside it) read alike; text that is not Slurm's node list is no answer."""
    admin = "vendor hold, was Reason=cluster-accept: ssh:refused (run 1)"
    newer = {"nodes": [{"name": "n1", "state": ["IDLE", "DRAIN"], "reason": admin, "reason_set_by_user": "root"}]}
    older = {"nodes": [{"name": "n1", "state": "idle", "state_flags": ["DRAIN"], "reason": admin}]}
    for shown in (newer, older):
        assert parse_json_nodes(json.dumps(shown)) == {"n1": SlurmNode("n1", "IDLE+DRAIN", admin)}
    ours = {"nodes": [{"name": "n2", "state": ["IDLE", "DRAIN"], "reason": "cluster-accept: x:y (run r1)"}]}
    assert parse_json_nodes(json.dumps(ours))["n2"].drained_by_us  # type: ignore[index]
    summaries = {"sinfo": [{"nodes": {"nodes": ["n1"]}}]}
    assert parse_json_nodes(json.dumps(summaries)) is None
    assert parse_json_nodes(json.dumps({"nodes": ["n1"]})) is None and parse_json_nodes("scontrol: error") is None


@pytest.mark.integration
def test_nodes_are_read_from_slurms_json_when_it_has_one(tmp_path: Path) -> None:
    """22.05's scontrol has no ``--json``: the sinfo beside it answers in JSON; without one, the text is read."""
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --json ]; then echo "scontrol: unrecognized option \'--json\'" >&2; exit 1; fi\n'
        f"printf '%s' '{SLURM_2205.splitlines()[0]}'\n"
    )
    shown = {"nodes": [{"name": "node01", "state": "idle", "state_flags": ["DRAIN"], "reason": "from sinfo"}]}
    sinfo = tmp_path / "sinfo"
    sinfo.write_text(f"#!/bin/sh\necho '{json.dumps(shown)}'\n")
    for program in (scontrol, sinfo):
        program.chmod(0o755)
    assert read_nodes(str(scontrol)) == ({"node01": SlurmNode("node01", "IDLE+DRAIN", "from sinfo")}, "")
    sinfo.unlink()
    nodes, error = read_nodes(str(scontrol))
    assert error == "" and nodes["node01"].reason.startswith("vendor hold, was Reason=")
    nodes, error = read_nodes(str(tmp_path / "missing"))
    assert nodes == {} and error.startswith(f"could not run {tmp_path / 'missing'} show node")


def test_regression_against_the_nodes_own_history() -> None:
    past = pd.DataFrame(
        [
            {"run_id": f"r{i}", "node": n, "metric": "gemm_bf16_tflops", "unit": "TFLOP/s", "value": v}
            for i, values in enumerate([(740, 700), (745, 702), (738, 698), (742, 701), (739, 699), (741, 700)])
            for n, v in zip(("n1", "n2"), values, strict=True)
        ]
    )
    current = pd.DataFrame(
        [
            {"run_id": "r9", "node": "n1", "metric": "gemm_bf16_tflops", "unit": "TFLOP/s", "value": 690.0},
            {"run_id": "r9", "node": "n2", "metric": "gemm_bf16_tflops", "unit": "TFLOP/s", "value": 699.0},
            {"run_id": "r9", "node": "n3", "metric": "gemm_bf16_tflops", "unit": "TFLOP/s", "value": 10.0},
        ]
    )
    thresholds = {"n1": Thresholds(gemm_bf16_tflops_min=600), "n2": Thresholds(gemm_bf16_tflops_min=600)}
    rows = dict(figure_regressions(current, past, thresholds, RULES))
    assert set(rows) == {"n1", "n2"}  # n3 has no history
    n1 = rows["n1"]
    assert (n1.check, n1.item, n1.status, n1.reason) == (
        "gemm",
        "gemm_bf16_tflops_vs_history",
        Status.FAIL,
        "regression",
    )
    assert n1.observed == "690.0" and n1.expected == ">= 703.5 TFLOP/s (own median - 5%)"
    assert "6.8% below this node's own median 740.5 over its last 6 runs (740.0, 745.0, 738.0, 742.0" in n1.detail
    assert rows["n2"].status == Status.PASS
    lenient = {**thresholds, "n1": thresholds["n1"].model_copy(update={"relative_verdict": "warn"})}
    assert dict(figure_regressions(current, past, lenient, RULES))["n1"].status == Status.WARN
    # under three earlier runs a shortfall is inconclusive whatever its size; three runs 0.5 % apart make the
    # small-sample bound 10.8 % (t(2) = 19.2): 6.8 % below is inside it
    shallow = dict(figure_regressions(current, past.head(4), thresholds, RULES))["n1"]
    assert (shallow.status, shallow.reason) == (
        Status.WARN,
        "inconclusive",
    ) and "only 2 earlier run(s)" in shallow.detail
    three = dict(figure_regressions(current, past.head(6), thresholds, RULES))["n1"]
    assert (three.reason, three.expected) == (
        "inconclusive",
        ">= 660.0 TFLOP/s (own median - 10.8% (3 × 3.6%: its own last 3 runs: s 0.5%, t(2) 19.2))",
    )


def test_counters_that_grew_since_the_previous_run_are_flagged() -> None:
    previous = {"n1": {"nvlink.counter:gpu0.link3.crc": "10", "memory.counter:gpu1.remapped_rows": "0"}}
    current = {
        "n1": {"nvlink.counter:gpu0.link3.crc": "25", "memory.counter:gpu1.remapped_rows": "0"},
        "n2": {"nvlink.counter:gpu0.link3.crc": "99"},
    }
    ((node, row),) = counter_growth(current, previous)
    assert node == "n1" and (row.check, row.item, row.status, row.reason) == (
        "nvlink",
        "counter:gpu0.link3.crc",
        Status.WARN,
        "counter_grew",
    )
    assert (row.observed, row.expected) == ("25", "<= 10") and "went from 10 to 25" in row.detail
    ((_, reset),) = counter_growth({"n1": {"nvlink.counter:x": "3"}}, {"n1": {"nvlink.counter:x": "9"}})
    assert (reset.status, reset.reason) == (Status.WARN, "counter_reset")  # cleared: cannot tell, never "no growth"


def test_suites_choose_stages_and_probe_length() -> None:
    assert resolve_suite("light", None) == (["preflight", "single-node", "burn"], True)
    assert resolve_suite("full", None) == (["preflight", "single-node", "burn", "multi-node"], False)
    assert resolve_suite("burn", None) == (["preflight", "burn"], False)
    assert resolve_suite(None, ["multi-node", "preflight"]) == (["preflight", "multi-node"], False)
    with pytest.raises(ValueError, match="unknown suite 'weekly'"):
        resolve_suite("weekly", None)
    with pytest.raises(ValueError, match="a suite or stages, not both"):
        resolve_suite("light", ["preflight"])


def test_deployment_parameters_are_absolute_and_typed(tmp_path: Path) -> None:
    ops = Operations(drain=True, prometheus="/var/lib/node_exporter/ca.prom")
    params = deployment_parameters(Path("inv.yaml"), "light", Path("runs"), None, ops)
    assert Path(params["inventory_path"]).is_absolute() and Path(params["out_dir"]).is_absolute()
    assert params["suite"] == "light" and params["operations"]["drain"] is True
    assert Operations.model_validate(params["operations"]) == ops
    assert deployment_name("prod east/1", "light") == "prod-east-1-light"
    with pytest.raises(ValueError, match="unknown suite"):
        deployment_parameters(Path("inv.yaml"), "hourly", Path("runs"), None, ops)


def test_warnings_by_node_lists_each_reason_once() -> None:
    rows = [
        NodeRow("r9", "prod", "single-node", "n1", check, "item", status, reason)
        for check, status, reason in [
            ("gemm", Status.WARN, "regression"),
            ("gemm", Status.WARN, "regression"),
            ("hbm", Status.FAIL, "straggler"),
        ]
    ]
    assert warnings_by_node(rows) == {"n1": ["gemm:regression"]}


def test_prefect_yaml_deployments_match_the_flow() -> None:
    """The work-pool route's deployments name a real entrypoint and only parameters the flow takes."""
    import inspect

    import yaml

    from cluster_accept.flows.acceptance import acceptance
    from cluster_accept.tasks.stages import SUITES

    config = yaml.safe_load((Path(__file__).resolve().parent.parent / "prefect.yaml").read_text())
    accepted = set(inspect.signature(acceptance.fn).parameters)
    assert [d["name"] for d in config["deployments"]] == ["light", "full"]
    for deployment in config["deployments"]:
        path, _, name = deployment["entrypoint"].partition(":")
        assert (Path(__file__).resolve().parent.parent / path).is_file() and name == acceptance.fn.__name__
        assert set(deployment["parameters"]) <= accepted
        assert deployment["parameters"]["suite"] in SUITES
        Operations.model_validate(deployment["parameters"]["operations"])
        assert deployment["schedules"][0]["cron"].count(" ") == 4
