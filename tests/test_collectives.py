"""The collectives beside all-reduce: the node-side sweep's output (a real 2-rank gloo capture, and a live run
checking nccl-tests' bus-bandwidth factors), the probe's rows for each listed collective, its judgement at the
largest size, and what a profile may ask for."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest
from pydantic import ValidationError

from cluster_accept.checks.base import Status
from cluster_accept.checks.samples import SAMPLES_DIR
from cluster_accept.inventory.model import Profile
from cluster_accept.probes import allreduce, collectives
from cluster_accept.remote.launch import GroupRun, RankRun
from cluster_accept.remote.result import CommandResult, NodeStatus
from cluster_accept.tasks.multi_node.rails import collective_rows
from cluster_accept.vocabulary.figures import Figure

DATA = SAMPLES_DIR / "collectives"
ROOT = Path(__file__).resolve().parent.parent
GLOO = (DATA / "gloo_2ranks.txt").read_text()
CPU = Profile.model_validate(
    {"probes": {"device": "cpu", "collectives": ["all_gather", "reduce_scatter", "all_to_all", "send_recv"]}}
)


def test_the_capture_yields_each_collectives_figures_to_its_own_probe() -> None:
    mine = collectives.parse(GLOO)
    by_metric = {(m.metric, m.size): m.value for m in mine.measurements}
    assert by_metric == {
        ("allgather_busbw_gbps", 1048576): 0.1449,
        ("allgather_busbw_gbps", 4194304): 0.3569,
        ("reducescatter_busbw_gbps", 1048576): 0.1008,
        ("reducescatter_busbw_gbps", 4194304): 0.1914,
        ("alltoall_busbw_gbps", 1048576): 0.2288,
        ("alltoall_busbw_gbps", 4194304): 0.4163,
        ("sendrecv_busbw_gbps", 1048576): 0.3878,
        ("sendrecv_busbw_gbps", 4194304): 0.8251,
    }
    assert [m.value for m in allreduce.parse(GLOO).measurements] == [0.3595, 0.6718]  # all-reduce keeps its own
    # nccl-tests' factors with two ranks: 2(n-1)/n = 1 for all-reduce and send/recv, (n-1)/n = 0.5 otherwise
    for record in mine.measurements + allreduce.parse(GLOO).measurements:
        factor = 0.5 if record.metric.startswith(("allgather", "reducescatter", "alltoall")) else 1.0
        assert record.value == pytest.approx(record.algbw_gbps * factor, abs=1e-4), record


def _lone(stdout: str) -> pd.DataFrame:
    return pd.DataFrame(
        [{**asdict(m), "node": "n1", "profile": "p", "gpu": None} for m in collectives.parse(stdout).measurements]
    )


def test_each_listed_collective_measured_alone_on_cpu_is_not_judged_at_its_largest_size() -> None:
    """A lone CPU node: no minimum (no datasheet for gloo between processes) and no peer, so each figure is
    ``not_judged`` (never a pass) at its largest size, naming the key that would judge it; the inspection adds
    nothing for a collective that has its figure."""
    assert collectives.inspect(collectives.parse(GLOO), CPU) == []
    rows = [row for _, row in collectives.evaluate(_lone(GLOO), {"n1": CPU})]
    assert [(r.item, r.status, r.reason, r.observed, r.expected) for r in rows] == [
        ("allgather_busbw_gbps", Status.NOT_JUDGED, "no_expectation", "0.357",
         "none: set thresholds.allgather_intra_busbw_gbps_min"),
        ("alltoall_busbw_gbps", Status.NOT_JUDGED, "no_expectation", "0.416",
         "none: set thresholds.alltoall_intra_busbw_gbps_min"),
        ("reducescatter_busbw_gbps", Status.NOT_JUDGED, "no_expectation", "0.191",
         "none: set thresholds.reducescatter_intra_busbw_gbps_min"),
        ("sendrecv_busbw_gbps", Status.NOT_JUDGED, "no_expectation", "0.825",
         "none: set thresholds.sendrecv_intra_busbw_gbps_min"),
    ]  # fmt: skip
    assert "probes run on CPU" in rows[0].detail


def test_a_collective_the_backend_lacks_or_the_run_lost_says_why() -> None:
    lines = [line for line in GLOO.splitlines() if '"reduce_scatter"' not in line and '"send_recv"' not in line]
    lines.append(
        json.dumps(
            {"info": "skip", "collective": "reduce_scatter", "reason": "reduce_scatter is not supported by gloo: x"}
        )
    )
    rows = {r.item: r for r in collectives.inspect(collectives.parse("\n".join(lines)), CPU)}
    assert set(rows) == {"reducescatter_busbw_gbps", "sendrecv_busbw_gbps"}  # all-gather has its figure
    unsupported, lost = rows["reducescatter_busbw_gbps"], rows["sendrecv_busbw_gbps"]
    assert (unsupported.status, unsupported.reason) == (Status.SKIP, "unsupported")
    assert "not supported by gloo" in unsupported.detail
    assert (lost.status, lost.reason) == (Status.ERROR, "not_measured")
    # the run's own skip (one GPU) is the whole run's, not one collective's
    single = collectives.parse('{"info": "skip", "reason": "fewer than 2 GPUs"}\n')
    assert {r.reason for r in collectives.inspect(single, CPU)} == {"single_gpu"}
    assert single.skip_reason() == "fewer than 2 GPUs"
    assert collectives.inspect(collectives.parse(""), CPU) == []  # the run failed: the all-reduce row says why


def test_each_collective_is_judged_at_its_largest_size_against_its_own_minimum() -> None:
    profile = CPU.model_copy(
        update={"thresholds": CPU.thresholds.model_copy(update={"alltoall_intra_busbw_gbps_min": 0.5})}
    )
    figures = pd.DataFrame(
        [
            {**asdict(m), "node": node, "profile": "p", "gpu": None}
            for node in ("n1", "n2")
            for m in collectives.parse(GLOO).measurements
        ]
    )
    figures.loc[(figures.node == "n2") & (figures.metric == "allgather_busbw_gbps"), "value"] /= 4
    rows = collectives.evaluate(figures, {"n1": profile, "n2": profile})
    threshold = [(node, r.observed, r.reason) for node, r in rows if r.item == "alltoall_busbw_gbps"]
    assert threshold == [("n1", "0.416", "below_threshold"), ("n2", "0.416", "below_threshold")]
    behind = [
        (node, r.reason) for node, r in rows if r.item == "allgather_busbw_gbps_vs_cluster" and r.status != Status.PASS
    ]
    assert behind == [("n2", "straggler")]


@pytest.mark.integration
def test_the_sweep_runs_every_collective_with_nccl_tests_factors() -> None:
    """A live two-rank gloo run of the node-side script: each figure's busbw is its algbw times the factor."""
    script = str(ROOT / "cluster_accept" / "probes" / "node" / "allreduce.py")
    ops = "all_reduce,all_gather,reduce_scatter,all_to_all,send_recv"
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=3", script,
         "--device", "cpu", "--ops", ops, "--min-bytes", "65536", "--max-bytes", "65536", "--repeats", "1"],
        capture_output=True, text=True, timeout=240, check=True,
    ).stdout  # fmt: skip
    lines = [line for line in out.splitlines() if line.startswith("{")]
    parsed = [json.loads(line) for line in lines]  # every rank's line whole: the ranks share one stdout
    done = [r for r in parsed if r.get("info") == "rank_done"]
    assert sorted((r["local_rank"], r["local_world_size"]) for r in done) == [(0, 3), (1, 3), (2, 3)]
    records = [json.loads(line) for line in lines if line.startswith('{"probe"')]
    assert [r["collective"] for r in records] == [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "send_recv",
    ]
    factors = {"all_reduce": 4 / 3, "send_recv": 1.0}
    for r in records:
        assert r["world_size"] == 3 and r["size"] == 65532  # divisible by the world for the sharded collectives
        # both printed to 4 decimals
        assert r["value"] == pytest.approx(r["algbw_gbps"] * factors.get(r["collective"], 2 / 3), abs=2e-4), r


def test_a_profile_refuses_what_the_sweep_cannot_measure() -> None:
    with pytest.raises(ValidationError, match="named twice: all_gather"):
        Profile.model_validate({"probes": {"collectives": ["all_gather", "all_gather"]}})
    with pytest.raises(
        ValidationError, match="alltoall_inter_busbw_gbps_min name a collective not in probes.collectives"
    ):
        Profile.model_validate({"probes": {"collectives": []}, "thresholds": {"alltoall_inter_busbw_gbps_min": 20}})
    with pytest.raises(ValidationError, match="nccl_tests_all_reduce measures all-reduce only"):
        Profile.model_validate(
            {
                "probes": {"nccl_tests_all_reduce": "/opt/all_reduce_perf"},
                "thresholds": {"allgather_intra_busbw_gbps_min": 200},
            }
        )
    with pytest.raises(ValidationError, match="broadcast"):
        Profile.model_validate({"probes": {"collectives": ["broadcast"]}})


@pytest.mark.integration
def test_lines_of_ranks_sharing_one_stdout_stay_whole() -> None:
    """Four processes writing JSON lines to one pipe at once, as a node's ranks do: no two lines run together."""
    code = (
        "import os, sys; sys.path.insert(0, sys.argv[1]); from allreduce import emit\n"
        "kids = [os.fork() for _ in range(2)]\n"
        "for i in range(500): emit({'info': 'rank_done', 'rank': os.getpid(), 'pad': 'x' * 200, 'i': i})\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "cluster_accept" / "probes" / "node")],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    lines = out.splitlines()
    assert len(lines) == 4 * 500 and all(json.loads(line)["info"] == "rank_done" for line in lines)


def test_a_collective_across_nodes_is_judged_against_its_minimum_or_not_judged_without_one() -> None:
    """Between nodes one run of the whole group measures each collective: no peer compares it, so without the
    profile's ``*_inter_busbw_gbps_min`` it is not judged (never the pass it once was), naming the key."""
    figures = [
        Figure("allgather_busbw_gbps", 4.6, size=1 << 30),
        Figure("alltoall_busbw_gbps", 2.3, size=1 << 30),
        Figure("allreduce_busbw_gbps", 3.6, size=1 << 30),
    ]
    done = CommandResult("allreduce_inter", 0, "", "")
    ranks = {n: RankRun(n, NodeStatus.OK, result=done) for n in ("n1", "n2")}
    run = GroupRun(("n1", "n2"), "t", ranks, figures)
    profile = Profile.model_validate(
        {"probes": {"collectives": ["all_gather", "all_to_all"]}, "thresholds": {"alltoall_inter_busbw_gbps_min": 2}}
    )
    rows = {r.item: r for r in collective_rows(run, profile)}
    gather, a2a = rows["all_gather_inter"], rows["all_to_all_inter"]
    assert (gather.status, gather.reason, gather.observed) == (Status.NOT_JUDGED, "no_expectation", "4.6")
    assert gather.expected == "none: set thresholds.allgather_inter_busbw_gbps_min"
    assert (a2a.status, a2a.reason, a2a.expected) == (Status.PASS, "ok", ">= 2 GB/s")
    strict = profile.model_copy(
        update={"thresholds": profile.thresholds.model_copy(update={"alltoall_inter_busbw_gbps_min": 5})}
    )
    assert [r.reason for r in collective_rows(run, strict) if r.item == "all_to_all_inter"] == ["below_threshold"]
