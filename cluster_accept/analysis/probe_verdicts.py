"""Verdicts on probe measurements: absolute thresholds and stragglers relative to the cluster. Pure.

A GPU can pass its profile's threshold and still run at half the speed of its peers (the seed reports
found such nodes only by comparing per-node TFLOPS), so each figure is judged twice: against the profile's
``*_min`` and against the cluster's median — per GPU for per-GPU figures, per node for node figures. The
spread is the median absolute deviation (robust to the very outliers we look for), reported with the median.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from pydantic import BaseModel

from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.inventory.model import Thresholds
from cluster_accept.vocabulary.lazy import pandas as pd
from cluster_accept.vocabulary.rows import Measurement


@dataclass(frozen=True)
class MetricRule:
    """How a probe's figure is judged: the profile threshold holding its minimum (if any), whether it is a
    per-GPU figure, and what being far below the cluster's median means for it."""

    check: str  # the verdict reason's prefix: gemm, hbm, host_bw, allreduce
    threshold: str | None  # the key holding the minimum, if any: of the profile's thresholds or the probe's settings
    per_gpu: bool
    straggler: Status = Status.FAIL  # the worst a relative finding can be for this figure


def relative_status(rule: MetricRule, limits: Thresholds) -> Status:
    """The status of a figure far below its peers or its own history: the rule's, softened to a warning
    where the profile says relative figures are only indicative (``relative_verdict: warn``)."""
    return Status.WARN if limits.relative_verdict == "warn" else rule.straggler


def mad(values: list[float]) -> float:
    med = statistics.median(values)
    return statistics.median(abs(v - med) for v in values)


def _fmt(value: float) -> str:
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"


def judged_figures(measurements: pd.DataFrame, rules: Mapping[str, MetricRule]) -> pd.DataFrame:
    """One figure per (node, gpu, metric): collectives only at their largest size (where bandwidth saturates)."""
    if measurements.empty:
        return measurements
    df = measurements[measurements["metric"].isin(list(rules))].copy()
    swept = df["metric"].astype(str).str.endswith("_busbw_gbps")
    if swept.any():
        largest = df[swept].groupby(["node", "metric"])["size"].transform("max")
        keep = df[swept]["size"] == largest
        df = pd.concat([df[~swept], df[swept][keep]])
    return df


def judge(
    measurements: pd.DataFrame,
    rules: Mapping[str, MetricRule],
    thresholds: Mapping[str, Thresholds],
    own: Mapping[str, BaseModel] | None = None,
) -> list[tuple[str, CheckRow]]:
    """(node, row) for every figure ``rules`` judge: threshold rows and straggler rows, pass or not.

    ``thresholds``: each node's profile thresholds (its minimums, its straggler margin and how a relative
    finding counts); ``own``: each node's settings of the probe, where its minimums are its own keys."""
    df = judged_figures(measurements, rules)
    out: list[tuple[str, CheckRow]] = []
    if "profile" not in df.columns:
        df = df.assign(profile="")
    # Peers are GPUs of the same profile: an H100 is no straggler among H200s.
    for (_, metric), group in df.groupby(["profile", "metric"], sort=True):
        values, unit = [float(v) for v in group["value"]], str(group["unit"].iloc[0])
        peers = _Peers.of(str(metric), rules[str(metric)], values, unit)
        for record in group.to_dict("records"):
            node = str(record["node"])
            gpu = None if pd.isna(record["gpu"]) else int(record["gpu"])
            limits = thresholds.get(node, Thresholds())
            minimum = _minimum(rules[str(metric)], limits, (own or {}).get(node))
            out += [(node, row) for row in peers.rows(float(record["value"]), gpu, limits, minimum)]
    return out


def _minimum(rule: MetricRule, limits: Thresholds, own: BaseModel | None) -> float | None:
    """The figure's minimum: the probe's own setting of that name where it has one, else the profile's."""
    if not rule.threshold:
        return None
    if own is not None and rule.threshold in type(own).model_fields:
        value = getattr(own, rule.threshold)
    else:
        value = getattr(limits, rule.threshold)
    return None if value is None else float(value)


@dataclass(frozen=True)
class _Peers:
    """One metric's figures among peers (GPUs or nodes of one profile): what each is judged against, their
    median and spread computed once for the group."""

    metric: str
    rule: MetricRule
    unit: str
    count: int
    median: float
    spread: float  # median absolute deviation

    @classmethod
    def of(cls, metric: str, rule: MetricRule, values: list[float], unit: str) -> _Peers:
        return cls(metric, rule, unit, len(values), statistics.median(values), mad(values))

    def rows(self, value: float, gpu: int | None, limits: Thresholds, minimum: float | None) -> list[CheckRow]:
        """The figure against the profile's minimum (where it sets one) and against its peers' median."""
        rows = []
        if minimum is not None:
            ok = value >= minimum
            status, reason = (Status.PASS, "ok") if ok else (Status.FAIL, "below_threshold")
            said = "" if ok else f"{_fmt(value)} {self.unit}"
            expected = f">= {_fmt(minimum)} {self.unit}"
            rows.append(CheckRow(self.rule.check, self.metric, status, reason, _fmt(value), expected, said, gpu=gpu))
        straggler = self._against_median(value, gpu, limits)
        return rows + ([straggler] if straggler is not None else [])

    def _against_median(self, value: float, gpu: int | None, limits: Thresholds) -> CheckRow | None:
        median = self.median
        if self.count < 2 or median <= 0:
            return None
        floor = median * (1 - limits.straggler_pct / 100)
        below_pct = 100 * (median - value) / median
        detail = (
            f"{_fmt(value)} {self.unit}, {below_pct:.1f}% below the cluster median {_fmt(median)} "
            f"(MAD {_fmt(self.spread)}, {self.count} {'GPUs' if self.rule.per_gpu else 'nodes'})"
        )
        expected = f">= {_fmt(floor)} {self.unit} (median - {limits.straggler_pct:g}%)"
        status, reason = (relative_status(self.rule, limits), "straggler") if value < floor else (Status.PASS, "ok")
        return CheckRow(
            self.rule.check, f"{self.metric}_vs_cluster", status, reason, _fmt(value), expected, detail, gpu=gpu
        )


def node_medians(measurements: pd.DataFrame, metric: str) -> dict[str, float]:
    """Per-node median of a per-GPU figure (the seed's per-node TFLOPS table)."""
    df = measurements[measurements["metric"] == metric]
    return {str(k): float(v) for k, v in df.groupby("node")["value"].median().items()}


def measurement_row(
    run_id: str,
    cluster: str,
    stage: str,
    node: str,
    profile: str,
    record: Mapping[str, Any],
    **placed: Any,
) -> Measurement:
    """A probe's JSON record as a typed ``measurements.parquet`` row; ``placed``: what the stage knows of the
    figure that the record does not say (the group that measured it, the transport NCCL used)."""
    conditions = record.get("conditions") or {}
    return Measurement(
        run_id=run_id,
        cluster=cluster,
        stage=stage,
        node=node,
        metric=str(record["metric"]),
        value=float(record["value"]),
        probe=record.get("probe"),
        profile=profile,
        gpu=record.get("gpu"),
        unit=record.get("unit"),
        dtype=record.get("dtype"),
        size=record.get("size"),
        iterations=record.get("iterations"),
        label=record.get("label"),
        world_size=record.get("world_size"),
        algbw_gbps=record.get("algbw_gbps"),
        sm_clock_mhz=conditions.get("sm_clock_mhz"),
        mem_clock_mhz=conditions.get("mem_clock_mhz"),
        power_w=conditions.get("power_w"),
        temp_c=conditions.get("temp_c"),
        clock_event_reasons=conditions.get("clock_event_reasons"),
        model=record.get("model"),
        **placed,
    )


MEASUREMENT_COLUMNS = tuple(f.name for f in fields(Measurement))


def measurement_frame(measurements: Sequence[Measurement]) -> pd.DataFrame:
    """A stage's figures as the one frame its judgement reads (every column present, even with no figure)."""
    return pd.DataFrame([m.record() for m in measurements], columns=list(MEASUREMENT_COLUMNS))
