"""The training probe's report section: tokens/s per node, slowest first, with each node's slowest GPU, and the
scaling table as the field reports print it (nodes, GPUs, tokens/s, per GPU, efficiency, MFU)."""

from __future__ import annotations

import pytest

from cluster_accept.checks.base import NodeRow, Status
from cluster_accept.probes.training.report import training_section
from cluster_accept.reports.figures import ReportView
from cluster_accept.vocabulary.rows import Measurement

MODEL = "gpt 355.7M L24 d1024 h16 s2048 mb8 v50304 ddp bf16 eager"


def figure(node: str, metric: str, value: float, gpu: int | None = None) -> Measurement:
    return Measurement(run_id="r", cluster="c", stage="single-node", node=node, metric=metric, value=value,
                       probe="training", gpu=gpu, model=MODEL, world_size=8, profile="p", unit="tokens/s")  # fmt: skip


def node_figures(node: str, per_gpu: float, solo: list[float]) -> list[Measurement]:
    out = [figure(node, "training_tokens_per_s_per_gpu", per_gpu), figure(node, "training_tokens_per_s", per_gpu * 8)]
    out.append(figure(node, "training_mfu", round(per_gpu * 2_725_588_992 / 989.4e12, 4)))
    return out + [figure(node, "training_solo_tokens_per_s", v, g) for g, v in enumerate(solo)]


def test_per_node_table_slowest_first_and_the_scaling_table() -> None:
    measurements = node_figures("node001", 143_000.0, [158_000.0] * 8)
    measurements += node_figures("node005", 71_000.0, [158_000.0] * 7 + [79_000.0])  # one GPU at half speed
    rows = [NodeRow("r", "c", "single-node", "node005", "training", "slowest_rank", Status.FAIL, "slow_rank", gpu=7)]
    scaling = [
        {"nodes": 1, "gpus": 8, "tokens_per_s": 331_840.0, "tokens_per_s_per_gpu": 41_480.0, "efficiency": 1.0,
         "mfu": 0.11, "step_ms": 395.0, "transport": None, "model": MODEL, "below_min": False},
        {"nodes": 2, "gpus": 16, "tokens_per_s": 136_976.0, "tokens_per_s_per_gpu": 8_561.0,
         "efficiency": 8_561.0 / 41_480.0, "mfu": 0.024, "step_ms": 1914.0, "transport": "NET/Socket",
         "model": MODEL, "below_min": True},
    ]  # fmt: skip
    thresholds = {"p": {"training_tokens_per_s_per_gpu_min": 100_000.0, "training_scaling_efficiency_min": 0.9}}
    view = ReportView(measurements, rows, thresholds, {"training_scaling": scaling})
    section = training_section(view)
    assert section is not None and len(section.charts) == 2
    per_node, scale = section.tables
    assert [r[0] for r in per_node.rows] == ["node005", "node001"]  # slowest first
    slow = per_node.rows[0]
    assert slow[1:4] == (8, 568_000.0, 71_000.0) and slow[7] == 7 and slow[8] == pytest.approx(50.0)
    assert MODEL in per_node.title
    assert scale.columns == ("nodes", "GPUs", "tokens/s", "per GPU", "efficiency %", "MFU", "step ms")
    assert scale.rows[1][:5] == ("2", 16, 136_976.0, 8_561.0, pytest.approx(100 * 8_561.0 / 41_480.0))
    assert "NCCL between nodes: NET/Socket" in scale.title
    chart = str(section.charts[0])
    assert chart.count('<g class="bar bad"><title>node005:') == 1 and chart.count('class="bar bad"') == 1


def test_no_training_figures_no_section() -> None:
    assert training_section(ReportView()) is None


def test_the_per_node_table_shows_each_nodes_data_parallel_efficiency() -> None:
    healthy = node_figures("node001", 139_715.0, [154_600.0] * 8)
    crippled = node_figures("node002", 100_222.0, [154_600.0] * 8)
    measurements = [*healthy, figure("node001", "training_dp_efficiency", 0.9037)]
    measurements += [*crippled, figure("node002", "training_dp_efficiency", 0.6483)]
    section = training_section(ReportView(measurements, [], {}, {}))
    assert section is not None
    per_node = section.tables[0]
    assert per_node.columns[-1] == "together / solo"
    assert [(r[0], r[-1]) for r in per_node.rows] == [("node002", 0.6483), ("node001", 0.9037)]
