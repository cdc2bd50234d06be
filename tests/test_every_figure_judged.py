"""Every figure the default path measures is judged: on ``profile: auto`` with no threshold written, each figure
each probe can emit on a GPU node of each built-in model is held against a minimum (the built-in profile's or
the probe's default derived from the datasheet) even on a one-node run, where no peer compares it. A figure
with nothing to judge it against is ``not_judged`` (never a pass) and names the key to write; the derived
floors sit between what healthy and crippled machines measured."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from cluster_accept.analysis.probe_verdicts import MetricRule, measurement_frame
from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.checks.reasons import COMMON
from cluster_accept.inventory.builtin import resolve_auto
from cluster_accept.inventory.gpus import BY_KEY, MODELS, GpuModel
from cluster_accept.inventory.model import Profile
from cluster_accept.probes.base import Probe, discover
from cluster_accept.vocabulary.rows import Measurement

pytestmark = pytest.mark.unit

JUDGED = {Status.PASS, Status.FAIL}


def _auto(model: GpuModel) -> Profile:
    choice = resolve_auto(Profile(base="auto"), [model.smi_name])
    assert choice.problem is None, choice.problem
    return choice.profile


def _figures(metric: str, rule: MetricRule, values: Mapping[str, float]) -> list[Measurement]:
    """One figure per node as the stage reads it: per GPU on GPU 0, a collective at 1 GiB, a GPU pair labelled."""
    pair = metric == "gpu_pair_copy_gbps"
    unit = {"_tflops": "TFLOP/s", "_gflops": "GFLOP/s", "_gbps": "GB/s"}.get(metric[metric.rfind("_") :], "")
    return [
        Measurement(
            run_id="r",
            cluster="c",
            stage="single-node",
            node=node,
            metric=metric,
            value=value,
            profile="auto",
            unit=unit,
            gpu=0 if rule.per_gpu else None,
            size=1 << 30 if metric.endswith("_busbw_gbps") else None,
            label="GPU0->GPU1" if pair else None,
        )  # fmt: skip
        for node, value in values.items()
    ]


def _judge(probe: Probe, metric: str, values: Mapping[str, float], profile: Profile) -> list[CheckRow]:
    frame = measurement_frame(_figures(metric, probe.metrics[metric], values))
    return [row for _, row in probe.evaluate(frame, dict.fromkeys(values, profile))]


def _gpu_cases() -> list[tuple[Probe, str, GpuModel]]:
    """Every (probe, metric, built-in model) a GPU node of that model can emit."""
    return [
        (probe, metric, model)
        for probe in discover()
        for metric, rule in probe.metrics.items()
        if "cuda" in rule.devices
        for model in MODELS
        if rule.emitted_by is None or rule.emitted_by(model)
    ]


@pytest.mark.parametrize(
    ("probe", "metric", "model"), _gpu_cases(), ids=lambda c: c.name if isinstance(c, Probe) else getattr(c, "key", c)
)
def test_every_figure_of_a_one_node_auto_run_is_judged(probe: Probe, metric: str, model: GpuModel) -> None:
    rows = _judge(probe, metric, {"n1": 1.0}, _auto(model))
    assert rows, f"{probe.name} wrote no row for {metric} on a lone {model.key}"
    assert not [r for r in rows if r.status == Status.NOT_JUDGED], [(r.item, r.expected, r.detail) for r in rows]
    assert {r.status for r in rows} & JUDGED, [(r.item, r.status) for r in rows]
    # a pass or a fail says what it was held against: nothing passes without a comparison
    assert all(r.expected for r in rows if r.status in JUDGED), [(r.item, r.reason, r.expected) for r in rows]


def test_the_walk_covers_every_probe_that_judges_figures_and_every_model() -> None:
    cases = _gpu_cases()
    assert {p.name for p, _, _ in cases} >= {"gemm", "hbm", "host_bw", "allreduce", "collectives", "gpu_pairs", "burn"}
    assert {m.key for _, _, m in cases} == set(BY_KEY)
    # fp8 is left out only where the bench cannot measure it
    assert not [m for p, metric, m in cases if metric == "gemm_fp8_tflops" and m.fp8_tflops is None]


def _probe(name: str) -> Probe:
    return next(p for p in discover() if p.name == name)


# 4 x H200 at 1 GiB, healthy and with one NCCL line in /etc/nccl.conf (P2P off: SHM); 2-GPU healthy figures
# (264-272) from bench/results/h200x2-fabric-auto/ and h100x4-floors/.
@pytest.mark.parametrize(
    ("metric", "healthy", "crippled"),
    [
        ("allgather_busbw_gbps", [319.0, 329.0, 263.8], 19.9),
        ("reducescatter_busbw_gbps", [325.0, 271.6], 25.9),
        ("alltoall_busbw_gbps", [320.0, 308.3], 19.7),
        ("sendrecv_busbw_gbps", [352.8, 355.2], 23.6),
        ("allreduce_busbw_gbps", [361.7, 324.8], 25.0),
    ],
)
def test_derived_floors_pass_healthy_collectives_and_fail_crippled_ones(
    metric: str, healthy: list[float], crippled: float
) -> None:
    probe = _probe("allreduce" if metric == "allreduce_busbw_gbps" else "collectives")
    profile = _auto(BY_KEY["h200-sxm"])
    for value in healthy:
        (row,) = [r for r in _judge(probe, metric, {"n1": value}, profile) if r.item == metric]
        assert (row.status, row.reason) == (Status.PASS, "ok"), (value, row.expected)
    (row,) = _judge(probe, metric, {"n1": crippled}, profile)
    assert (row.status, row.reason) == (Status.FAIL, "below_threshold")
    floor = float(row.expected.split()[1])
    assert crippled * 3 < floor < min(healthy) * 0.9  # well between: not a hair under the healthy figures
    if metric != "allreduce_busbw_gbps":  # the built-in profile writes the all-reduce minimum itself
        assert "× NVLink 478 GB/s; set thresholds." in row.expected


def test_the_expected_column_says_where_a_derived_minimum_comes_from() -> None:
    (row,) = _judge(_probe("collectives"), "allgather_busbw_gbps", {"n1": 19.9}, _auto(BY_KEY["h200-sxm"]))
    assert row.expected == (
        ">= 191.0 GB/s (0.4 × NVLink 478 GB/s; set thresholds.allgather_intra_busbw_gbps_min to change)"
    )
    assert row.observed == "19.9"


def test_without_nvlink_joining_every_gpu_the_floors_derive_from_pcie() -> None:
    (row,) = _judge(_probe("collectives"), "alltoall_busbw_gbps", {"n1": 5.0}, _auto(BY_KEY["h200-nvl"]))
    assert (row.status, row.expected.split()[1]) == (Status.FAIL, "16.0")
    assert "PCIe Gen5 x16 63 GB/s" in row.expected
    (row,) = _judge(_probe("allreduce"), "allreduce_busbw_gbps", {"n1": 9.0}, _auto(BY_KEY["l40s"]))
    assert (row.status, row.expected.split()[1]) == (Status.PASS, "8")  # 0.25 of Gen4 x16's 31.5 GB/s


def test_host_links_and_gpu_pairs_and_burn_have_floors_under_every_healthy_figure() -> None:
    h200, gb200 = _auto(BY_KEY["h200-sxm"]), _auto(BY_KEY["gb200"])
    for value, status in ((30.0, Status.PASS), (55.5, Status.PASS), (12.0, Status.FAIL)):  # 4 x H200's lowest: 30
        (row,) = _judge(_probe("host_bw"), "h2d_gbps", {"n1": value}, h200)
        assert row.status == status, (value, row.expected)
    (row,) = _judge(_probe("host_bw"), "d2h_gbps", {"n1": 55.0}, gb200)
    assert (row.status, row.expected.split()[1]) == (Status.FAIL, "180.0")  # NVLink-C2C, no PCIe to the host
    assert "NVLink-C2C 450 GB/s" in row.expected
    (row,) = _judge(_probe("gpu_pairs"), "gpu_pair_copy_gbps", {"n1": 381.5}, h200)
    assert (row.item, row.status, row.reason) == ("pairs", Status.PASS, "ok")
    (pairs, below) = _judge(_probe("gpu_pairs"), "gpu_pair_copy_gbps", {"n1": 24.0}, h200)
    assert (pairs.status, below.reason, below.item) == (Status.FAIL, "below_threshold", "GPU0->GPU1")
    burn = _probe("burn")
    assert [r.status for r in _judge(burn, "burn_tflops", {"n1": 615.0}, h200)] == [Status.PASS]
    assert [r.status for r in _judge(burn, "burn_tflops", {"n1": 284.0}, h200)] == [Status.FAIL]


CPU = Profile.model_validate({"probes": {"device": "cpu"}})


def test_a_cpu_figure_alone_is_not_judged_and_names_the_key_to_write() -> None:
    (row,) = _judge(_probe("gemm"), "gemm_fp32_gflops", {"n1": 41.5}, CPU)
    assert (row.status, row.reason, row.observed) == (Status.NOT_JUDGED, "no_expectation", "41.5")
    assert row.expected == "none: set thresholds.gemm_fp32_gflops_min"
    assert "probes run on CPU" in row.detail and "no other GPU measured it" in row.detail
    assert COMMON["no_expectation"].severity == Status.NOT_JUDGED


def test_a_cpu_figure_is_judged_where_the_key_is_written_or_peers_measured_it() -> None:
    written = Profile.model_validate({"probes": {"device": "cpu"}, "thresholds": {"mem_copy_gbps_min": 5}})
    (row,) = _judge(_probe("hbm"), "mem_copy_gbps", {"n1": 4.0}, written)
    assert (row.status, row.reason, row.expected) == (Status.FAIL, "below_threshold", ">= 5 GB/s")
    rows = _judge(_probe("hbm"), "mem_copy_gbps", {"n1": 4.0, "n2": 4.1}, CPU)
    assert [(r.item, r.status) for r in rows] == [("mem_copy_gbps_vs_cluster", Status.PASS)] * 2


def test_a_minimum_written_as_null_turns_the_default_off() -> None:
    off = resolve_auto(
        Profile.model_validate({"base": "auto", "thresholds": {"alltoall_intra_busbw_gbps_min": None}}),
        ["NVIDIA H200"],
    ).profile
    (row,) = _judge(_probe("collectives"), "alltoall_busbw_gbps", {"n1": 19.7}, off)
    assert (row.status, row.expected) == (Status.NOT_JUDGED, "none: set thresholds.alltoall_intra_busbw_gbps_min")
    assert "is null in the profile" in row.detail
    (row,) = _judge(_probe("collectives"), "allgather_busbw_gbps", {"n1": 19.9}, off)  # the others keep theirs
    assert row.status == Status.FAIL


def test_a_profile_saying_its_nodes_have_no_nvlink_derives_from_pcie() -> None:
    own = Profile.model_validate({"base": "auto", "nvlink": None})
    (row,) = _judge(
        _probe("collectives"), "allgather_busbw_gbps", {"n1": 20.0}, resolve_auto(own, ["NVIDIA H200"]).profile
    )
    assert (row.status, row.expected.split()[1]) == (Status.PASS, "16.0")


def test_a_gpu_no_datasheet_describes_is_not_judged_alone() -> None:
    unknown = Profile.model_validate({"gpu": {"model": "NVIDIA Future GPU"}})
    (row,) = _judge(_probe("collectives"), "allgather_busbw_gbps", {"n1": 300.0}, unknown)
    assert row.status == Status.NOT_JUDGED
    assert "no built-in datasheet describes 'NVIDIA Future GPU'" in row.detail


def test_a_sweep_stopping_short_of_where_the_default_holds_derives_no_floor() -> None:
    """The collectives' defaults are calibrated at 1 GiB: a profile whose sweep stops at 16 MiB (healthy all-reduce
    263 GB/s there on 4 x H200) derives none, and its figures say why, not_judged, rather than failing a healthy
    node."""
    auto = _auto(BY_KEY["h200-sxm"])
    short = auto.model_copy(update={"probes": auto.probes.model_copy(update={"allreduce_max_bytes": 16 << 20})})
    [row] = _judge(_probe("collectives"), "allgather_busbw_gbps", {"n1": 189.3}, short)
    assert (row.status, row.reason) == (Status.NOT_JUDGED, "no_expectation"), row
    assert "the sweep stops at 16 MiB" in row.detail, row.detail
    [full] = _judge(_probe("collectives"), "allgather_busbw_gbps", {"n1": 189.3}, _auto(BY_KEY["h200-sxm"]))
    assert full.status == Status.FAIL  # at 1 GiB, 189.3 is under the 191 floor
