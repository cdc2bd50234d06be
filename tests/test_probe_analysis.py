"""Probe output parsing (real NCCL logs) and probe verdicts (synthetic figures): thresholds, stragglers."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from cluster_accept.analysis.nccl_log import nccl_transports, nccl_version, transport_matches
from cluster_accept.analysis.probe_output import parse_json_lines
from cluster_accept.analysis.probe_verdicts import judge, mad, node_medians
from cluster_accept.checks.base import Status
from cluster_accept.inventory.model import (
    DEFAULT_SSH,
    LOCAL_ADDRESS,
    ExpectedTransport,
    Node,
    ProbeSettings,
    Profile,
    Thresholds,
)
from cluster_accept.probes import allreduce, nccl_tests
from cluster_accept.probes.base import discover, unkept_by_any
from cluster_accept.probes.gpu_pairs import SCRIPT as GPU_PAIRS
from cluster_accept.probes.scripts import ALLREDUCE, GPU_BENCH
from cluster_accept.probes.training import SCRIPT as TRAINING
from cluster_accept.remote.result import CommandResult
from cluster_accept.tasks.probe_stage import judged_rules
from tests.capture import CAPTURES

RULES = judged_rules(discover())  # every figure the built-in probes judge


def test_transport_and_version_from_real_nccl_logs() -> None:
    nvlink = (CAPTURES / "h200x4" / "torch-allreduce-nvlink.txt").read_text()
    socket = (CAPTURES / "h200x4" / "torch-allreduce-socket.txt").read_text()
    assert nccl_transports(nvlink) == {"P2P/CUMEM": 96}
    assert nccl_transports(socket) == {"NET/Socket": 32}
    assert nccl_version(nvlink) == "2.28.9+cuda13.0"
    assert transport_matches("P2P/CUMEM", "P2P") and transport_matches("NET/IB", "NET/IB")
    assert not transport_matches("NET/Socket", "NET/IB") and not transport_matches("SHM", "P2P")


def _node(expected: str | None) -> Node:
    profile = Profile(probes=ProbeSettings(expected_transport=ExpectedTransport(intra_node=expected)))
    return Node(name="n1", ssh=DEFAULT_SSH, profile_name="p", profile=profile, address=LOCAL_ADDRESS)


def test_socket_fallback_fails_the_transport_check() -> None:
    socket = (CAPTURES / "h200x4" / "torch-allreduce-socket.txt").read_text()
    rows = allreduce.inspect(allreduce.parse(socket), _node("P2P").profile)
    assert rows[0].observed == "NET/Socket"
    assert [(r.check, r.status, r.reason, r.observed, r.expected) for r in rows] == [
        ("transport", Status.FAIL, "unexpected", "NET/Socket", "P2P"),
        ("allreduce", Status.PASS, "recorded", "2.28.9+cuda13.0", None),
    ]
    nvlink = (CAPTURES / "h200x4" / "torch-allreduce-nvlink.txt").read_text()
    rows = allreduce.inspect(allreduce.parse(nvlink), _node("P2P").profile)
    assert [(r.check, r.status, r.reason) for r in rows] == [
        ("transport", Status.PASS, "ok"),
        ("allreduce", Status.PASS, "recorded"),  # NCCL's version
    ]


def test_json_lines_keep_errors_and_skip_noise() -> None:
    text = "\n".join(
        [
            "W1121 torch/distributed/run.py:851] noise",
            '{"info": "probe", "probe": "gpu_bench"}',
            '{"metric": "gemm_bf16_tflops", "value": 692.3, "gpu": 0}',
            '{"error": "CUDA error: out of memory", "gpu": 1}',
            '{"metric": "x", "value": "fast"}',
            "{not json",
        ]
    )
    out = parse_json_lines(text)
    assert [m.value for m in out.measurements] == [692.3]
    assert len(out.info) == 1
    assert out.errors[0] == "gpu 1: CUDA error: out of memory"
    assert len(out.errors) == 3


def test_an_info_line_is_its_kind_and_its_members_read_only() -> None:
    line = parse_json_lines('{"info": "skip", "reason": "fewer than 2 GPUs", "collective": "all_gather"}').info[0]
    assert (line.kind, line.get("reason"), "info" in line.members) == ("skip", "fewer than 2 GPUs", False)
    with pytest.raises(TypeError):
        line.members["reason"] = "changed"  # type: ignore[index]
    assert parse_json_lines('{"info": "skip", "reason": "fewer than 2 GPUs"}').skip_reason() == "fewer than 2 GPUs"
    assert parse_json_lines('{"info": "skip", "collective": "x", "reason": "r"}').skip_reason() is None


def figures(values: dict[tuple[str, int], float], metric: str = "gemm_bf16_tflops") -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"node": n, "gpu": g, "metric": metric, "value": v, "unit": "TFLOP/s", "size": 8192, "profile": "h200"}
            for (n, g), v in values.items()
        ]
    )


# The seed's captured figures: bf16 8192^3 per GPU without and with a co-tenant GEMM loop on GPU 0.
NO_HOG = {("n1", 0): 692.3, ("n1", 1): 686.0, ("n1", 2): 699.4, ("n1", 3): 678.8}
HOG = {("n1", 0): 269.4, ("n1", 1): 692.5, ("n1", 2): 681.3, ("n1", 3): 675.5}


def test_planted_straggler_is_named_and_healthy_node_passes() -> None:
    limits = {"n1": Thresholds(gemm_bf16_tflops_min=600, straggler_pct=5)}
    bad = [(n, r) for n, r in judge(figures(HOG), RULES, limits) if r.status is not Status.PASS]
    assert [(n, r.check, r.reason, r.gpu, r.observed) for n, r in bad] == [
        ("n1", "gemm", "below_threshold", 0, "269.4"),
        ("n1", "gemm", "straggler", 0, "269.4"),
    ]
    assert "60.3% below the cluster median 678.4" in bad[1][1].detail
    assert all(r.status is Status.PASS for _, r in judge(figures(NO_HOG), RULES, limits))


def test_stragglers_across_nodes_and_profiles() -> None:
    values = {(f"n{i}", g): 700.0 + g for i in range(1, 9) for g in range(8)}
    values[("n5", 3)] = 640.0  # 8.6% below: a straggler at 5%, not at 10%
    df = figures(values)
    at5 = {n: Thresholds(straggler_pct=5) for n in {k[0] for k in values}}
    flagged = [(n, r.gpu) for n, r in judge(df, RULES, at5) if r.reason == "straggler"]
    assert flagged == [("n5", 3)]
    at10 = {n: t.model_copy(update={"straggler_pct": 10}) for n, t in at5.items()}
    assert not [r for _, r in judge(df, RULES, at10) if r.reason == "straggler"]
    # A slower GPU model is judged among its own kind, not as a straggler among H200s.
    h100 = figures({("h1", 0): 500.0, ("h1", 1): 505.0})
    h100["profile"] = "h100"
    mixed = pd.concat([df, h100])
    assert [(n, r.gpu) for n, r in judge(mixed, RULES, at5) if r.reason == "straggler"] == [("n5", 3)]
    assert node_medians(df, "gemm_bf16_tflops")["n1"] == 703.5


def test_host_bandwidth_stragglers_are_warnings_and_allreduce_uses_largest_size() -> None:
    host = figures({("n1", 0): 55.0, ("n1", 1): 55.0, ("n1", 2): 30.0, ("n1", 3): 55.0}, metric="h2d_gbps")
    rows = [r for _, r in judge(host, RULES, {"n1": Thresholds()}) if r.reason == "straggler"]
    assert [(r.status, r.gpu) for r in rows] == [(Status.WARN, 2)]
    sweep = pd.DataFrame(
        [
            {"node": "n1", "gpu": None, "metric": "allreduce_busbw_gbps", "value": v, "unit": "GB/s", "size": s}
            for s, v in [(1 << 20, 35.0), (1 << 30, 350.0), (4 << 30, 362.4)]
        ]
    )
    rows = [r for _, r in judge(sweep, RULES, {"n1": Thresholds(allreduce_intra_busbw_gbps_min=300)})]
    assert [(r.item, r.status, r.observed) for r in rows] == [("allreduce_busbw_gbps", Status.PASS, "362.4")]
    assert mad([1.0, 2.0, 3.0, 100.0]) == 1.0


def test_nccl_tests_table_becomes_the_same_measurements() -> None:
    from cluster_accept.analysis.probe_output import parse_nccl_tests
    from cluster_accept.tasks.probe_runs import probe_commands

    nvlink = parse_nccl_tests((CAPTURES / "h200x4" / "nccl-tests-allreduce-nvlink.txt").read_text())
    assert len(nvlink.measurements) == 30 and not nvlink.errors
    last = nvlink.measurements[-1]
    assert (last.size, last.value, last.algbw_gbps, last.world_size) == (4294967296, 362.86, 241.91, 4)
    socket = parse_nccl_tests((CAPTURES / "h200x4" / "nccl-tests-allreduce-socket.txt").read_text())
    assert (socket.measurements[-1].size, socket.measurements[-1].value) == (1073741824, 4.3)
    assert parse_nccl_tests("garbage\n").errors == ["no all_reduce_perf result rows in the output"]

    profile = Profile(probes=ProbeSettings(nccl_tests_all_reduce="/opt/nccl-tests/build/all_reduce_perf"))
    node = Node(name="n1", ssh=DEFAULT_SSH, profile_name="p", profile=profile, address=LOCAL_ADDRESS)
    allreduce = probe_commands(node)[1]
    assert "exec env NCCL_DEBUG=INFO /opt/nccl-tests/build/all_reduce_perf -b 1M -e 1073741824 -f 4 -g $n" in (
        allreduce.script
    )
    text = (CAPTURES / "h200x4" / "nccl-tests-allreduce-nvlink.txt").read_text()
    parsed = nccl_tests.parse(text)
    assert len(parsed.measurements) == 30


def test_cpu_mode_stragglers_only_warn() -> None:
    lenient = {"n1": Thresholds(relative_verdict="warn")}  # the test-bed's profile: CPU nodes share cores
    rows = [(n, r) for n, r in judge(figures(HOG), RULES, lenient) if r.reason == "straggler"]
    assert [(r.status, r.gpu) for _, r in rows] == [(Status.WARN, 0)]


def _bench_and_sweep(busbw: float) -> list[CommandResult]:
    bench = "\n".join(
        f'{{"probe": "gpu_bench", "metric": "{m}", "value": {v}, "unit": "{u}", "gpu": {g}}}'
        for g in (0, 1)
        for m, v, u in (("gemm_bf16_tflops", 700.0, "TFLOP/s"), ("hbm_copy_gbps", 4200.0, "GB/s"))
    )
    sweep = f'{{"probe": "allreduce", "metric": "allreduce_busbw_gbps", "value": {busbw}, "unit": "GB/s", "size": 1}}'
    return [CommandResult("gpu_bench", 0, bench, ""), CommandResult("allreduce", 0, sweep, "")]


def test_each_figure_is_judged_once_per_node_by_the_probe_that_ran() -> None:
    """Two probes speak for the all-reduce (torch and nccl-tests): only the one that ran judges a node."""
    from cluster_accept.inventory.model import Inventory
    from cluster_accept.remote.result import NodeResult, NodeStatus
    from cluster_accept.tasks.probe_runs import judge_nodes

    profile = Profile(thresholds=Thresholds(gemm_bf16_tflops_min=600))
    nodes = [
        Node(name=f"n{i}", ssh=DEFAULT_SSH, profile_name="p", profile=profile, address=LOCAL_ADDRESS) for i in (1, 2)
    ]
    inventory = Inventory("c", nodes, {"p": profile}, "inventory.yaml", "digest")
    outcomes = [NodeResult(n.name, NodeStatus.OK, commands=_bench_and_sweep(300.0)) for n in nodes]
    judged = judge_nodes("r", inventory, outcomes)
    rows, measurements = judged.rows, judged.measurements
    keys = [(r.node, r.check, r.item, r.gpu, r.reason) for r in rows]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
    judged = {(r.node, r.item) for r in rows if r.check == "allreduce"}
    assert judged == {(n, "allreduce_busbw_gbps_vs_cluster") for n in ("n1", "n2")}
    assert {(r.node, r.gpu) for r in rows if r.item == "gemm_bf16_tflops"} == {
        (n, g) for n in ("n1", "n2") for g in (0, 1)
    }
    assert len(measurements) == 2 * 5


def test_a_figure_line_with_an_undeclared_key_or_a_wrong_type_is_an_error_never_a_null() -> None:
    text = "\n".join(
        [
            '{"metric": "gemm_bf16_tflops", "value": 692.3, "gpu": 0, "sm_clokc_mhz": 1980}',
            '{"metric": "gemm_bf16_tflops", "value": 692.3, "gpu": "0"}',
            '{"metric": "gemm_bf16_tflops", "value": 692.3, "gpu": 0, "conditions": {"power_w": "high"}}',
            '{"metric": "gpu_pair_copy_gbps", "value": 371.2, "gpu": 0, "peer": "1"}',
        ]
    )
    out = parse_json_lines(text, unkept_by_any())  # a key a run declares is held to its type too
    assert out.measurements == []
    assert all(e.startswith("probe line of another shape (figure") for e in out.errors) and len(out.errors) == 4
    assert "sm_clokc_mhz" in out.errors[0] and "figure.gpu" in out.errors[1]
    assert "figure.conditions.power_w" in out.errors[2] and "figure.peer" in out.errors[3]


def test_what_every_node_script_prints_beside_a_figure_is_declared() -> None:
    """The keys the node-side scripts print (gpu_bench with its conditions, gpu_pairs, the all-reduce sweep, the
    training step) read as figures, the conditions kept and what is not kept dropped."""
    conditions = {"sm_clock_mhz": 1980.0, "mem_clock_mhz": 2619.0, "power_w": 690.5, "temp_c": 61.0}
    lines = [
        {"metric": "gemm_bf16_tflops", "value": 692.3, "unit": "TFLOP/s", "dtype": "bf16", "size": 8192,
         "iterations": 350, "repeat_cv": 0.004, "gpu": 0, "probe": "gpu_bench",
         "conditions": {**conditions, "clock_event_reasons": "0x0000000000000000", "samples": 12}},
        {"probe": "gpu_pairs", "metric": "gpu_pair_copy_gbps", "label": "GPU0->GPU1", "gpu": 0, "peer": 1,
         "value": 371.2, "unit": "GB/s", "size": 268435456, "iterations": 20, "p2p": True},
        {"probe": "allreduce", "metric": "allreduce_busbw_gbps", "collective": "all_reduce", "label": "intra_node",
         "value": 362.9, "unit": "GB/s", "algbw_gbps": 241.9, "size": 1 << 30, "dtype": "fp32", "iterations": 25,
         "world_size": 4, "gpu": None},
        {"probe": "training", "label": "intra_node", "world_size": 4, "iterations": 20, "gpu": 1, "node_rank": 0,
         "hostname": "node01", "metric": "training_solo_tokens_per_s", "value": 154600.0, "unit": "tokens/s"},
    ]  # fmt: skip
    out = parse_json_lines("\n".join(json.dumps(line) for line in lines), unkept_by_any())
    assert not out.errors and len(out.measurements) == 4
    for line, script in zip(lines, (GPU_BENCH, GPU_PAIRS, ALLREDUCE, TRAINING), strict=True):  # each by its own run
        assert not parse_json_lines(json.dumps(line), script.unkept).errors, script.name
    assert parse_json_lines(json.dumps(lines[1])).errors  # a key only gpu_pairs declares is no other run's
    gemm = out.measurements[0]
    assert (gemm.sm_clock_mhz, gemm.power_w, gemm.clock_event_reasons) == (1980.0, 690.5, "0x0000000000000000")
    assert (out.measurements[2].algbw_gbps, out.measurements[3].gpu) == (241.9, 1)
