"""No silent pass as a rule: every key of the profile model is either an expectation with the check that
judges it, or named here as a setting that is not one; a stage that leaves a stated expectation without a
row on a node it tested gets a ``coverage:no_row`` error there (synthetic rows)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pandas as pd
from pydantic import BaseModel

from cluster_accept.analysis import coverage
from cluster_accept.analysis.scaling import ScalingPoint, judge_steps
from cluster_accept.checks.base import NodeRow, Status
from cluster_accept.inventory.burn_settings import BurnSettings
from cluster_accept.inventory.model import (
    ExpectedTransport,
    GpuSpec,
    ProbeSettings,
    Profile,
    Thresholds,
    TrainingSettings,
)
from cluster_accept.inventory.slurm_settings import SrunSettings
from cluster_accept.tasks.stages import declared_expectations

# Profile keys that configure how the tool runs, not what a node must be (so no row judges them).
DECLARED = declared_expectations()


def missing(stage: str, tested: Any, rows: Any) -> list[Any]:
    """What ``stage`` left unjudged of the expectations the stages' checks and probes declare."""
    return coverage.missing(stage, tested, rows, DECLARED)


NOT_EXPECTATIONS = {
    "probes.device",
    "probes.command_prefix",
    "probes.timeout_s",
    "probes.rendezvous_timeout_s",
    "probes.allreduce_max_bytes",
    "probes.cuda_visible_devices",
    "probes.launcher",
    "probes.max_parallel_nodes",
    "probes.nccl_tests_all_reduce",
    "probes.kept_settings",  # settings never suspected: the job_settings rows say which were
    "probes.prove_causes",  # whether suspects are measured again: the job_settings rows say it
    "probes.prove_arms_extra",  # the bound of re-measurements a search takes: the job_settings rows say it
    *(f"training.{key}" for key in TrainingSettings.model_fields if key != "enabled"),
    "thresholds.straggler_pct",
    "thresholds.noise_k",  # how far past its noise a relative figure must fall: the relative rows say it
    "thresholds.relative_verdict",
    "thresholds.link_flap_clear_h",  # how long a flapped port stays failed: the ib_counters rows say it
    "thresholds.app_xid_max",  # when the application's XIDs fail the node: the xid rows say it
    "thresholds.app_xid_window_h",
    "base",  # resolved into the profile's own keys when loaded (auto: in preflight, with a profile:auto row)
    "fabric",  # resolved into the profile's own keys (named: when loaded; auto: in preflight, with profile:fabric)
    "nccl_harmful",  # site rules: judged by the 'harmful NCCL settings' expectation, stated for every profile
    "burn.sample_interval_s",
    "burn.sdc_repeats",
    "burn.dcgm_timeout_s",
    *(f"probes.slurm.{key}" for key in SrunSettings.model_fields),  # how multi-node runs are launched
    "plugins",  # each added probe's own keys: judged by the expectations that probe declares
}
# Where the coverage table names an expectation differently from the model's path.
ALIASES = {"probes.expected_transport.intra_node": "expected_transport.intra_node", "training.enabled": "training"}
ALIASES["probes.expected_transport.inter_node"] = "expected_transport.inter_node"
# the burn's length in the light suite and its limits are judged by the same per-GPU burn rows
ALIASES |= {f"burn.{k}": "burn.minutes" for k in ("light_minutes", "throughput_drop_max_pct", "clock_drop_max_pct",
                                                   "temp_spread_max_c", "temp_above_median_max_c")}  # fmt: skip
# the firmware pins and the switch count are judged by the firmware and nvswitch checks' rows
ALIASES |= {f"firmware.{k}": "firmware" for k in ("vbios", "inforom", "hca_fw", "ofed")}
ALIASES["nvswitch.count"] = "nvswitch"


def _leaves(model: type[BaseModel], prefix: str = "") -> list[str]:
    found = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        inner: Any = info.annotation
        if (
            isinstance(inner, type)
            and issubclass(inner, BaseModel)
            and path not in ("gpu", "nvlink", "pcie", "infiniband")
        ):
            found += _leaves(inner, f"{path}.")
        else:
            found.append(path)
    return found


def test_every_profile_key_is_an_expectation_or_named_as_a_setting() -> None:
    named = {e.name for e in declared_expectations()}
    for path in _leaves(Profile):
        short = ALIASES.get(path, path.removeprefix("thresholds."))
        per_item = any(name.startswith(f"{short}.") for name in named)  # probes.collectives.all_gather, …
        assert short in named or per_item or path in NOT_EXPECTATIONS or path == "nccl_env", path


def _row(node: str, stage: str, check: str, item: str, status: Status = Status.PASS) -> NodeRow:
    return NodeRow("r", "c", stage, node, check, item, status, "ok")


PROFILE = Profile(
    gpu=GpuSpec(model="H200", count=4),
    nccl_env={"NCCL_NVLS_ENABLE": "0"},
    # the collectives and the pair matrix have their own expectations, tested below
    probes=ProbeSettings(expected_transport=ExpectedTransport(intra_node="P2P"), collectives=[], gpu_pairs=False),
    thresholds=Thresholds(gemm_bf16_tflops_min=600),
    training=TrainingSettings(enabled=False),
)


def test_a_stage_that_left_an_expectation_unjudged_is_named() -> None:
    rows = [
        _row("n1", "preflight", "gpu_count", "count"),
        _row("n1", "preflight", "nccl_harmful", "settings"),
        _row("n1", "preflight", "nccl_env", "NCCL_NVLS_ENABLE"),
        _row("n1", "preflight", "probe", "torch"),
        _row("n1", "preflight", "firmware", "vbios"),
        _row("n1", "preflight", "pcie_aer", "GPU 0000:18:00.0"),
        _row("n2", "preflight", "gpu_count", "count"),
        _row("n2", "preflight", "nccl_harmful", "settings"),
        _row("n2", "preflight", "probe", "python", Status.FAIL),
        _row("n2", "preflight", "firmware", "vbios"),
        _row("n2", "preflight", "pcie_aer", "aer", Status.SKIP),
        _row("n3", "preflight", "ssh", "connect", Status.UNREACHABLE),
    ]
    tested = {"n1": PROFILE, "n2": PROFILE, "n3": PROFILE}
    gaps = [(node, e.name) for node, e in missing("preflight", tested, rows)]
    assert gaps == [("n2", "nccl_env.NCCL_NVLS_ENABLE")]  # n3 could not be reached: its ssh row says so
    row = coverage.gap_row(missing("preflight", tested, rows)[0][1])
    assert (row.check, row.status, row.reason, row.expected) == (
        "coverage",
        Status.ERROR,
        "no_row",
        "nccl_env row for NCCL_NVLS_ENABLE",
    )


def test_a_transport_expectation_is_settled_by_its_row_or_by_a_failed_probe_only() -> None:
    base = [_row("n1", "single-node", "gemm", "gemm_bf16_tflops")]
    tested = {"n1": PROFILE}
    assert [e.name for _, e in missing("single-node", tested, base)] == ["expected_transport.intra_node"]
    passing_probe = base + [_row("n1", "single-node", "allreduce", "nccl_version")]
    assert [e.name for _, e in missing("single-node", tested, passing_probe)] == ["expected_transport.intra_node"]
    failed_probe = base + [_row("n1", "single-node", "allreduce", "probe", Status.ERROR)]
    assert missing("single-node", tested, failed_probe) == []
    read = base + [_row("n1", "single-node", "transport", "intra_node", Status.WARN)]
    assert missing("single-node", tested, read) == []


def test_each_gemm_minimum_needs_its_own_figure_or_a_failed_bench() -> None:
    profile = Profile.model_validate({"thresholds": {"gemm_bf16_tflops_min": 594, "gemm_fp8_tflops_min": 989}})
    tested = {"n1": profile}
    bf16 = _row("n1", "single-node", "gemm", "gemm_bf16_tflops")
    gaps = [e.name for _, e in missing("single-node", tested, [bf16])]
    assert "gemm_fp8_tflops_min" in gaps and "gemm_bf16_tflops_min" not in gaps  # fp8 never measured: a gap
    fp8 = _row("n1", "single-node", "gemm", "gemm_fp8_tflops_vs_cluster")
    assert "gemm_fp8_tflops_min" not in [e.name for _, e in missing("single-node", tested, [bf16, fp8])]
    failed = NodeRow("r", "c", "single-node", "n1", "gemm", "gpu_bench", Status.ERROR, "probe_failed")
    assert not [e.name for _, e in missing("single-node", tested, [failed]) if e.check == "gemm"]
    slow = NodeRow("r", "c", "single-node", "n1", "gemm", "gemm_bf16_tflops", Status.FAIL, "below_threshold")
    assert "gemm_fp8_tflops_min" in [e.name for _, e in missing("single-node", tested, [slow])]


def test_training_expectations_are_settled_by_their_rows_or_a_failed_probe() -> None:
    profile = Profile.model_validate(
        {
            "thresholds": {"training_mfu_min": 0.3, "training_scaling_efficiency_min": 0.9},
            "probes": {"collectives": [], "gpu_pairs": False},  # their own expectations are tested apart
        }
    )
    tested = {"n1": profile}
    model = _row("n1", "single-node", "training", "model")
    # every figure the probe emits is expected to be judged, written or not (its defaults: probes.training.defaults)
    figures = ["training_tokens_per_s_per_gpu_min", "training_solo_tokens_per_s", "training_dp_efficiency_min"]
    assert [e.name for _, e in missing("single-node", tested, [model])] == [*figures, "training_mfu_min"]
    judged = [
        _row("n1", "single-node", "training", item)
        for item in ("mfu", "training_tokens_per_s_per_gpu", "training_solo_tokens_per_s", "training_dp_efficiency")
    ]
    assert missing("single-node", tested, [model, *judged]) == []
    failed = NodeRow("r", "c", "single-node", "n1", "training", "training", Status.ERROR, "probe_failed")
    assert missing("single-node", tested, [failed]) == []
    unrelated = NodeRow("r", "c", "single-node", "n1", "training", "slowest_rank", Status.SKIP, "single_rank")
    assert [e.name for _, e in missing("single-node", tested, [unrelated])] == [*figures, "training_mfu_min"]
    allreduce = _row("n1", "multi-node", "scaling", "2 nodes")
    names = [e.name for _, e in missing("multi-node", tested, [allreduce])]
    assert names == ["multi-node training", "training_scaling_efficiency_min"]
    step = _row("n1", "multi-node", "training_scaling", "2 nodes")
    assert missing("multi-node", tested, [allreduce, step]) == []


def test_every_multi_node_step_is_judged_against_the_smaller_groups() -> None:
    # The test-bed's finding: 0.344 GB/s at 2 nodes, 0.184 at 4, 0.0024 at 8 (one node behind 20 Mbit/s).
    points = [ScalingPoint(2, 0.344, 1), ScalingPoint(4, 0.184, 1), ScalingPoint(8, 0.0024, 1)]
    steps = judge_steps(points, busbw_min_gbps=None, straggler_pct=90)
    assert [(s.nodes, s.ok, s.reason) for s in steps] == [
        (2, True, "ok"),
        (4, True, "ok"),
        (8, False, "below_smaller_groups"),
    ]
    assert steps[2].expected == ">= 0.0344 GB/s (2-node group less 90%)"
    strict = judge_steps(points, busbw_min_gbps=None, straggler_pct=5)
    assert [s.reason for s in strict] == ["ok", "below_smaller_groups", "below_smaller_groups"]
    floor = judge_steps(points, busbw_min_gbps=0.2, straggler_pct=90)
    assert [s.reason for s in floor] == ["ok", "below_min", "below_min"]
    efficiency = judge_steps(points[:2], busbw_min_gbps=None, straggler_pct=90, efficiency_min=0.8)
    assert [s.reason for s in efficiency] == ["ok", "efficiency_low"]


def _figure(node: str, value: float, gpu: int = 0) -> dict[str, object]:
    return {
        "node": node,
        "profile": "h200",
        "metric": "gemm_bf16_tflops",
        "value": value,
        "gpu": gpu,
        "unit": "TFLOP/s",
    }


def test_a_straggler_measured_again_alone_is_confirmed_or_not() -> None:
    from cluster_accept.analysis.stragglers import confirm, flagged
    from cluster_accept.probes import gemm

    before = pd.DataFrame([_figure("n1", 505.0), _figure("n2", 680.0), _figure("n3", 676.0), _figure("n4", 684.0)])
    item = "gemm_bf16_tflops_vs_cluster"
    straggler = NodeRow("r", "c", "single-node", "n1", "gemm", item, Status.FAIL, "straggler", "505.0", gpu=0)
    rows = [straggler, _row("n2", "single-node", "gemm", "gemm_bf16_tflops_vs_cluster")]
    assert flagged(rows) == {"n1": {"gemm"}}
    limits = {n: Thresholds(straggler_pct=5) for n in ("n1", "n2", "n3", "n4")}
    gone = confirm(rows, before, pd.DataFrame([_figure("n1", 679.0)]), gemm.METRICS, limits)
    assert (gone[0].status, gone[0].reason) == (Status.WARN, "straggler_unconfirmed")
    assert gone[0].detail.endswith("measured again alone: 679, at or above 644.1: not confirmed")
    assert gone[1] == rows[1]
    kept = confirm(rows, before, pd.DataFrame([_figure("n1", 510.0)]), gemm.METRICS, limits)
    assert (kept[0].status, kept[0].reason) == (Status.FAIL, "straggler")
    assert kept[0].detail.endswith("still below 644.1: confirmed")
    lost = confirm(rows, before, pd.DataFrame(), gemm.METRICS, limits)
    assert lost[0].reason == "straggler" and lost[0].detail.endswith("no figure (not confirmed)")
    # The floor is the median of the node's own profile: slower GPUs of another profile do not lower it.
    h100 = [{**_figure(f"m{i}", 400.0), "profile": "h100"} for i in range(5)]
    mixed = confirm(rows, pd.concat([before, pd.DataFrame(h100)]), pd.DataFrame([_figure("n1", 510.0)]), gemm.METRICS,
                    limits)  # fmt: skip
    assert mixed[0].detail.endswith("still below 644.1: confirmed")
    # A node with no figure before has no floor to be judged by.
    unknown = replace(straggler, node="n9")
    assert confirm([unknown], before, pd.DataFrame([_figure("n9", 1.0)]), gemm.METRICS, limits)[0].detail.endswith(
        "no figure (not confirmed)"
    )


def test_each_listed_collective_and_the_pair_matrix_need_their_rows() -> None:
    profile = Profile.model_validate(
        {
            "probes": {"collectives": ["all_to_all"], "rails": [{"gpu": 0, "nic": "mlx5_0"}]},
            "thresholds": {"alltoall_intra_busbw_gbps_min": 300, "gpu_pair_copy_gbps_min": 250},
            "training": {"enabled": False},
        }
    )
    tested = {"n1": profile}
    single = [e.name for _, e in missing("single-node", tested, [])]
    assert {"probes.collectives.all_to_all", "alltoall_intra_busbw_gbps_min", "probes.gpu_pairs"} <= set(single)
    assert "gpu_pair_copy_gbps_min" in single and "probes.collectives.all_gather" not in single
    rows = [
        _row("n1", "single-node", "collectives", "all_to_all_intra"),
        _row("n1", "single-node", "collectives", "alltoall_busbw_gbps"),
        _row("n1", "single-node", "gpu_pairs", "pairs"),
    ]
    assert not [e.name for _, e in missing("single-node", tested, rows) if e.check != "allreduce"]
    # A collective the backend lacks: its skip row judges the listing, and settles its minimum
    skipped = [NodeRow("r", "c", "single-node", "n1", "collectives", "all_to_all_intra", Status.SKIP, "unsupported")]
    assert "alltoall_intra_busbw_gbps_min" not in [e.name for _, e in missing("single-node", tested, skipped)]
    across = [e.name for _, e in missing("multi-node", tested, [_row("n1", "multi-node", "scaling", "2 nodes")])]
    assert across == ["probes.collectives.all_to_all across nodes", "probes.rails"]
    done = [_row("n1", "multi-node", "scaling", "2 nodes"), _row("n1", "multi-node", "collectives", "all_to_all_inter")]
    done.append(_row("n1", "multi-node", "rails", "rail0"))
    assert missing("multi-node", tested, done) == []


def test_the_burn_needs_a_row_per_node_and_its_digests_and_dcgm_theirs() -> None:
    profile = PROFILE.model_copy(update={"burn": BurnSettings(dcgm_level=2)})
    rows = [
        _row("n1", "burn", "burn", "gpu0"),
        _row("n1", "burn", "sdc", "gpu0"),
        _row("n1", "burn", "dcgm", "Memory"),
        NodeRow("r", "c", "burn", "n2", "burn", "burn", Status.TIMEOUT, "probe_timeout"),  # killed: no digest came
        _row("n3", "burn", "burn", "gpu0"),
    ]
    tested = {"n1": profile, "n2": profile, "n3": profile}
    gaps = [(node, e.name) for node, e in missing("burn", tested, rows)]
    assert gaps == [("n2", "burn.dcgm_level"), ("n3", "burn.sdc"), ("n3", "burn.dcgm_level")]
    off = PROFILE.model_copy(update={"burn": BurnSettings(minutes=0, light_minutes=0, sdc=False)})
    assert missing("burn", {"n4": off}, []) == []
