"""Verdicts on probe measurements: absolute thresholds and stragglers relative to the cluster. Pure.

A GPU can pass its profile's threshold and still run at half the speed of its peers (the seed reports
found such nodes only by comparing per-node TFLOPS), so each figure is judged twice: against its minimum and
against the cluster's median — per GPU for per-GPU figures, per node for node figures. The spread is the
median absolute deviation (robust to the very outliers we look for), reported with the median.

A figure's minimum is the profile's ``*_min`` where it sets one; where it sets none, the probe's
:class:`Default` for that figure applied to the node's GPU (a fraction of a datasheet figure, calibrated on
measurements), said as such in the row with the key that changes it. A figure with neither a minimum nor a
peer to compare with (a CPU node alone, a GPU no built-in profile describes, a minimum turned off with ``null``)
is never a pass: its row is ``not_judged`` and names the key to write.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel

from cluster_accept.analysis.noise import INCONCLUSIVE, Call, Noise, call, floor_of, robust_cv
from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.inventory.gpus import GpuModel, Rating, model_for_name
from cluster_accept.inventory.model import Profile, Thresholds
from cluster_accept.vocabulary.lazy import pandas as pd
from cluster_accept.vocabulary.rows import MEASUREMENT_COLUMNS, Measurement

NO_EXPECTATION = "no_expectation"  # the reason of a not-judged figure (checks.reasons.COMMON)
DEVICES = frozenset({"cuda", "cpu"})


@dataclass(frozen=True)
class Default:
    """How a figure's minimum derives from the node's GPU where the profile sets none: ``fraction`` of one
    figure of the GPU model's datasheet (``datasheet``: None where the model has no such figure), chosen on what
    the probes measured on healthy and faulty machines (``calibration``); ``otherwise``: the derivation for a
    model without that figure (PCIe where no NVLink joins every GPU)."""

    basis: str  # what the minimum is a fraction of, in words: "NVLink bandwidth per GPU and direction"
    fraction: float
    datasheet: Callable[[GpuModel], Rating | None]
    calibration: str  # the measurements the fraction was chosen on, healthy and faulty
    otherwise: Default | None = None

    def floor(self, model: GpuModel) -> tuple[float, str] | None:
        """(minimum, how it was derived: ``0.4 × NVLink 478 GB/s``) for ``model``; None when nothing derives."""
        rating = self.datasheet(model)
        if rating is None:
            return self.otherwise.floor(model) if self.otherwise is not None else None
        return float(round(rating.value * self.fraction)), f"{self.fraction:g} × {rating}"


@dataclass(frozen=True)
class MetricRule:
    """How a probe's figure is judged: the profile threshold holding its minimum (if any), the minimum derived
    from the node's GPU where the profile sets none (``default``), whether it is a per-GPU figure, and what being
    far below the cluster's median means for it. ``devices``: where the figure is measured (``probes.device``);
    ``emitted_by``: the GPU models whose nodes measure it (None: every one; fp8 needs fp8 tensor cores)."""

    check: str  # the verdict reason's prefix: gemm, hbm, host_bw, allreduce
    threshold: str | None  # the key holding the minimum, if any: of the profile's thresholds or the probe's settings
    per_gpu: bool
    straggler: Status = Status.FAIL  # the worst a relative finding can be for this figure
    default: Default | None = None
    devices: frozenset[str] = DEVICES
    emitted_by: Callable[[GpuModel], bool] | None = None


@dataclass(frozen=True)
class Floor:
    """A figure's minimum on one node: the profile's own (``source`` empty) or derived by a :class:`Default`
    (``source`` says how, and which key changes it)."""

    value: float
    source: str = ""

    def expected(self, unit: str) -> str:
        said = f">= {_fmt(self.value)} {unit}"
        return f"{said} ({self.source})" if self.source else said


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
    profiles: Mapping[str, Profile | Thresholds],
    own: Mapping[str, BaseModel] | None = None,
) -> list[tuple[str, CheckRow]]:
    """(node, row) for every figure ``rules`` judge: threshold rows and straggler rows, pass or not, and a
    ``not_judged`` row for a figure with neither.

    ``profiles``: each node's profile (its minimums, the GPU its defaults derive from, its straggler margin and
    how a relative finding counts), or only its thresholds (no default derived); ``own``: each node's settings
    of the probe, where its minimums are its own keys. A figure below its peers is a straggler only beyond its
    noise (:mod:`analysis.noise`): the peers' spread, the figure's repeats (``repeat_cv``, at most the peers'
    typical repeats) and the cluster's calibration (``calibrated_cv``, :func:`analysis.calibration.annotate`)."""
    df = judged_figures(measurements, rules)
    out: list[tuple[str, CheckRow]] = []
    if "profile" not in df.columns:
        df = df.assign(profile="")
    # Peers are GPUs of the same profile: an H100 is no straggler among H200s.
    for (_, metric), group in df.groupby(["profile", "metric"], sort=True):
        rule = rules[str(metric)]
        values, unit = [float(v) for v in group["value"]], str(group["unit"].iloc[0])
        peers = _Peers.of(str(metric), rule, values, unit)
        typical = typical_repeats(group)
        minimums: dict[str, tuple[Floor | None, str]] = {}  # once per node, not per GPU
        for record in group.to_dict("records"):
            node = str(record["node"])
            gpu = None if pd.isna(record["gpu"]) else int(record["gpu"])
            given = profiles.get(node)
            if node not in minimums:
                minimums[node] = minimum_of(rule, given, (own or {}).get(node))
            limits = given if isinstance(given, Thresholds) else given.thresholds if given else Thresholds()
            figure = _Figure(float(record["value"]), gpu, figure_noises(record, typical))
            out += [(node, row) for row in peers.rows(figure, limits, *minimums[node])]
    return out


def typical_repeats(figures: pd.DataFrame) -> float | None:
    """The median of the peers' own repeat spreads (``repeat_cv``): how much this figure's repeats wobble on a
    healthy GPU of this run; None where the probe does not report it."""
    if "repeat_cv" not in figures.columns:
        return None
    known = [float(v) for v in figures["repeat_cv"] if v is not None and not pd.isna(v)]
    return statistics.median(known) if known else None


def figure_noises(record: Mapping[Any, Any], typical: float | None = None) -> tuple[Noise | None, ...]:
    """The noises a figure's row carries: its repeats' spread (``repeat_cv``) — no wider than the peers' typical
    repeats (``typical``), since a GPU whose own figure wobbles more than its peers' is itself the finding, not
    a reason to excuse it — and the cluster's calibration (``calibrated_cv``, said by ``calibrated_source``)."""
    found: list[Noise | None] = []
    repeats = record.get("repeat_cv")
    if repeats is not None and not pd.isna(repeats):
        own = float(repeats) if typical is None else min(float(repeats), typical)
        found.append(Noise(own, "its repeats" if typical is None else "its repeats, at most the peers' median"))
    calibrated = record.get("calibrated_cv")
    if calibrated is not None and not pd.isna(calibrated):
        found.append(Noise(float(calibrated), str(record.get("calibrated_source") or "the calibration")))
    return tuple(found)


def minimum_of(
    rule: MetricRule, given: Profile | Thresholds | None, own: BaseModel | None = None
) -> tuple[Floor | None, str]:
    """The figure's minimum on a node — the probe's own setting of that name where it has one, else the
    profile's threshold, else the rule's default for the node's GPU — or None and why there is none. A key the
    profile writes as ``null`` turns the default off."""
    key = rule.threshold
    if key and own is not None and key in type(own).model_fields:
        value = getattr(own, key)
        return (Floor(float(value)), "") if value is not None else (None, f"plugins.{rule.check}.{key} is not set")
    limits = given if isinstance(given, Thresholds) else given.thresholds if given is not None else Thresholds()
    if key and key in Thresholds.model_fields:
        value = getattr(limits, key)
        if value is not None:
            return Floor(float(value)), ""
        if key in limits.model_fields_set:
            return None, f"thresholds.{key} is null in the profile (its minimum turned off)"
    if not isinstance(given, Profile):
        return None, "the profile sets no minimum"
    model, why = gpu_model(given)
    derived = rule.default.floor(model) if rule.default is not None and model is not None else None
    if rule.default is None:
        why = why or "no datasheet figure bounds it"
    elif model is not None and derived is None:
        why = f"the {model.key} datasheet gives no {rule.default.basis} to derive it from"
    if derived is not None and _swept_short(rule, given):
        top = given.probes.allreduce_max_bytes or 0
        derived, why = (
            None,
            f"the sweep stops at {top >> 20} MiB, under the {CALIBRATED_BYTES >> 20} MiB its default holds at",
        )
    if derived is None:
        return None, f"the profile sets no minimum and none derives: {why}"
    value, how = derived
    return Floor(value, f"{how}; set {key_path(rule)} to change"), ""


# A collective's bus bandwidth approaches its link's only at large messages: the defaults are calibrated at 1 GiB
# (healthy all-reduce 263 GB/s at 16 MiB on 4 x H200, under the 287 floor), and hold from 256 MiB on.
CALIBRATED_BYTES = 256 << 20


def _swept_short(rule: MetricRule, profile: Profile) -> bool:
    """Whether ``rule`` judges a swept bus bandwidth the profile stops short of where its default holds."""
    top = profile.probes.allreduce_max_bytes
    return (
        bool(rule.threshold and rule.threshold.endswith("_busbw_gbps_min"))
        and top is not None
        and top < CALIBRATED_BYTES
    )


def gpu_model(profile: Profile) -> tuple[GpuModel | None, str]:
    """The built-in GPU model a node's default minimums derive from — the profile's GPU by its nvidia-smi name,
    with the NVLink and PCIe the profile states over the datasheet's (``nvlink: null``: none) — or None and
    why: probes on CPU, no GPU model named, or one no built-in profile describes."""
    if profile.probes.device != "cuda":
        return None, "the probes run on CPU, which no datasheet describes"
    if profile.gpu is None or profile.gpu.model is None:
        return None, "the profile names no GPU model (gpu.model)"
    model = model_for_name(profile.gpu.model)
    if model is None:
        return None, f"no built-in datasheet describes {profile.gpu.model!r}"
    if profile.nvlink is not None:
        model = replace(
            model, nvlink_links=profile.nvlink.links_per_gpu, nvlink_link_gbps=profile.nvlink.link_speed_gbps
        )
    elif "nvlink" in profile.model_fields_set:
        model = replace(model, nvlink_links=0)
    if profile.pcie is not None:
        model = replace(model, pcie_gen=profile.pcie.gen, pcie_width=profile.pcie.width)
    return model, ""


def key_path(rule: MetricRule) -> str | None:
    """Where the figure's minimum is written: ``thresholds.<key>``, or a probe's own ``plugins.<probe>.<key>``;
    None for a figure no key bounds."""
    if rule.threshold is None:
        return None
    if rule.threshold in Thresholds.model_fields:
        return f"thresholds.{rule.threshold}"
    return f"plugins.{rule.check}.{rule.threshold}"


def to_write(rule: MetricRule) -> str:
    """A not-judged row's expected column: the key that would judge the figure, or how to compare it."""
    key = key_path(rule)
    return f"none: set {key}" if key else "none: no key bounds it; measure it on two or more to compare them"


@dataclass(frozen=True)
class _Figure:
    """One figure being judged: its value, its GPU (None: a node figure) and the noises known for it besides the
    peers' spread (the calibration's, its own repeats')."""

    value: float
    gpu: int | None
    noises: tuple[Noise | None, ...] = ()


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
    noise: Noise | None  # the spread as a robust coefficient of variation

    @classmethod
    def of(cls, metric: str, rule: MetricRule, values: list[float], unit: str) -> _Peers:
        what = f"{len(values)} {'GPUs' if rule.per_gpu else 'nodes'}"
        spread = robust_cv(values, f"the peers' spread, {what}")
        return cls(metric, rule, unit, len(values), statistics.median(values), mad(values), spread)

    def rows(self, figure: _Figure, limits: Thresholds, minimum: Floor | None, why: str = "") -> list[CheckRow]:
        """The figure against its minimum (where it has one) and against its peers' median; with neither,
        a not-judged row saying why and what to write."""
        value, gpu = figure.value, figure.gpu
        rows = []
        if minimum is not None:
            ok = value >= minimum.value
            status, reason = (Status.PASS, "ok") if ok else (Status.FAIL, "below_threshold")
            said = "" if ok else f"{_fmt(value)} {self.unit}"
            expected = minimum.expected(self.unit)
            rows.append(CheckRow(self.rule.check, self.metric, status, reason, _fmt(value), expected, said, gpu=gpu))
        straggler = self._against_median(figure, limits)
        if straggler is not None:
            rows.append(straggler)
        elif minimum is None:
            what = "GPU" if self.rule.per_gpu else "node"
            said = f"{_fmt(value)} {self.unit}: {why}; no other {what} measured it to compare with"
            expected = to_write(self.rule)
            rows.append(
                CheckRow(
                    self.rule.check,
                    self.metric,
                    Status.NOT_JUDGED,
                    NO_EXPECTATION,
                    _fmt(value),
                    expected,
                    said,
                    gpu=gpu,
                )
            )
        return rows

    def _against_median(self, figure: _Figure, limits: Thresholds) -> CheckRow | None:
        median, value = self.median, figure.value
        if self.count < 2 or median <= 0:
            return None
        judged = call(value, median, limits.straggler_pct, (self.noise, *figure.noises), limits.noise_k)
        detail = (
            f"{_fmt(value)} {self.unit}, {judged.shortfall_pct:.1f}% below the cluster median {_fmt(median)} "
            f"(MAD {_fmt(self.spread)}, {self.count} {'GPUs' if self.rule.per_gpu else 'nodes'})"
        )
        status, reason = _relative_outcome(judged, self.rule, limits)
        if judged.outcome == "inconclusive":
            detail = f"{detail}: {judged.inconclusive_said()}"
        expected = f">= {_fmt(floor_of(median, judged.margin_pct))} {self.unit} (median - {judged.margin_said()})"
        return CheckRow(
            self.rule.check, f"{self.metric}_vs_cluster", status, reason, _fmt(value), expected, detail, gpu=figure.gpu
        )


def _relative_outcome(judged: Call, rule: MetricRule, limits: Thresholds) -> tuple[Status, str]:
    """A relative call as a row's status and reason: ``straggler`` beyond the noise, ``inconclusive`` (a warning)
    inside it."""
    if judged.outcome == "below":
        return relative_status(rule, limits), "straggler"
    if judged.outcome == "inconclusive":
        return Status.WARN, INCONCLUSIVE
    return Status.PASS, "ok"


def node_medians(measurements: pd.DataFrame, metric: str) -> dict[str, float]:
    """Per-node median of a per-GPU figure (the seed's per-node TFLOPS table)."""
    df = measurements[measurements["metric"] == metric]
    return {str(k): float(v) for k, v in df.groupby("node")["value"].median().items()}


def measurement_frame(measurements: Sequence[Measurement]) -> pd.DataFrame:
    """A stage's figures as the one frame its judgement reads (every column present, even with no figure)."""
    return pd.DataFrame([m.record() for m in measurements], columns=list(MEASUREMENT_COLUMNS))
