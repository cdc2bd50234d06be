"""The GPU-pair matrix judged: each ordered pair's copy bandwidth against the profile's minimum, the node's own
median and the same pair on the other nodes. Pure.

A node-wide all-reduce averages its links: one weak NVLink or NVSwitch port costs it a few percent, while a
tensor-parallel job pinned to that pair runs at its speed. Judging pairs against the node's own median names the
pair (or the GPU, when every pair to and from it is slow); judging against the cluster's median for the same
pair catches a node whose pairs are all equally slow (a 2-GPU node, a board-wide fault).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from cluster_accept.analysis.noise import INCONCLUSIVE, Noise, call, floor_of, robust_cv
from cluster_accept.inventory.model import Thresholds
from cluster_accept.vocabulary.lazy import pandas as pd

METRIC = "gpu_pair_copy_gbps"
_LABEL = re.compile(r"^GPU(\d{1,3})->GPU(\d{1,3})$")


@dataclass(frozen=True)
class PairFinding:
    """One problem: ``reason`` (below_threshold, weak_gpu, weak_link, weak_direction, straggler) on ``item``."""

    node: str
    item: str
    reason: str
    measured: float
    expected: str
    detail: str
    relative: bool  # judged against peers (softened by ``relative_verdict: warn``), not a profile minimum


def pair_of(label: str) -> tuple[int, int] | None:
    match = _LABEL.match(label)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _fmt(value: float) -> str:
    return f"{value:.1f}"


def _calibrated(group: pd.DataFrame) -> Noise | None:
    """The cluster's calibrated noise of the pair copies in ``group`` (annotated by
    :func:`analysis.calibration.annotate`), where a calibration measured them."""
    if "calibrated_cv" not in group.columns:
        return None
    known = group.dropna(subset=["calibrated_cv"])
    if known.empty:
        return None
    return Noise(float(known["calibrated_cv"].max()), str(known["calibrated_source"].iloc[0]))


def _weak_in_node(
    node: str, pairs: dict[tuple[int, int], float], limits: Thresholds, calibrated: Noise | None = None
) -> list[PairFinding]:
    """Pairs far below the node's own median, each named by its most likely cause: a GPU whose every pair is
    slow, a link slow both ways, or one direction only. "Far" is beyond ``straggler_pct`` and ``noise_k`` times
    the spread of the pairs within ``straggler_pct`` of the median; a pair in between is ``inconclusive``."""
    if len(pairs) < 3:  # two GPUs: both directions share one link, nothing to compare with inside the node
        return []
    median = statistics.median(pairs.values())
    # A slow GPU touches 2/n of the node's pairs (half on a 4-GPU node), more than a median absolute deviation
    # tolerates: the spread is taken over the pairs within straggler_pct of the median.
    kept = [v for v in pairs.values() if v >= floor_of(median, limits.straggler_pct)]
    spread = robust_cv(kept, f"the spread of the node's {len(kept)} pairs within {limits.straggler_pct:g}%")
    noises = [spread, calibrated]
    calls = {pair: call(value, median, limits.straggler_pct, noises, limits.noise_k) for pair, value in pairs.items()}
    margin = max(c.margin_pct for c in calls.values())
    weak = {pair for pair, judged in calls.items() if judged.outcome == "below"}
    gpus = {g for pair in pairs for g in pair}
    bad_gpus = {g for g in gpus if all(p in weak for p in pairs if g in p)}
    expected = f">= {_fmt(floor_of(median, margin))} GB/s (node median {_fmt(median)} - {margin:.3g}%)"
    findings = []
    for gpu in sorted(bad_gpus):
        worst = min(v for p, v in pairs.items() if gpu in p)
        said = f"every copy to and from GPU{gpu} is below the node's median: its NVLinks or NVSwitch ports"
        findings.append(PairFinding(node, f"GPU{gpu}", "weak_gpu", worst, expected, said, True))
    for i, j in sorted(weak):
        if i in bad_gpus or j in bad_gpus:
            continue
        both = (j, i) in weak
        if both and i > j:
            continue  # named once, lower index first
        reason = "weak_link" if both else "weak_direction"
        said = f"GPU{i}<->GPU{j} slow both ways: the link between them" if both else f"GPU{i}->GPU{j} slow one way only"
        item = f"GPU{i}<->GPU{j}" if both else f"GPU{i}->GPU{j}"
        findings.append(PairFinding(node, item, reason, pairs[(i, j)], expected, said, True))
    for (i, j), judged in sorted(calls.items()):
        if judged.outcome == "inconclusive":
            said = f"GPU{i}->GPU{j} {judged.inconclusive_said()}"
            findings.append(PairFinding(node, f"GPU{i}->GPU{j}", INCONCLUSIVE, pairs[(i, j)], expected, said, True))
    return findings


def judge_pairs(figures: pd.DataFrame, thresholds: Mapping[str, Thresholds]) -> list[PairFinding]:
    """Every problem in the pair figures (``node``, ``profile``, ``label``, ``value``): below the profile's
    minimum, weak inside the node, or far below the same pair on the cluster's other nodes of the profile."""
    df = figures[figures["metric"] == METRIC] if not figures.empty else figures
    if df.empty:
        return []
    if "profile" not in df.columns:
        df = df.assign(profile="")
    findings: list[PairFinding] = []
    for node, group in df.groupby("node", sort=True):
        limits = thresholds.get(str(node), Thresholds())
        pairs = {
            p: float(v) for label, v in zip(group["label"], group["value"], strict=True) if (p := pair_of(str(label)))
        }
        minimum = limits.gpu_pair_copy_gbps_min
        for (i, j), value in sorted(pairs.items()):
            if minimum is not None and value < minimum:
                said = f"GPU{i}->GPU{j} copies at {_fmt(value)} GB/s"
                findings.append(
                    PairFinding(
                        str(node), f"GPU{i}->GPU{j}", "below_threshold", value, f">= {minimum:g} GB/s", said, False
                    )
                )
        findings += _weak_in_node(str(node), pairs, limits, _calibrated(group))
    for (_, label), group in df.groupby(["profile", "label"], sort=True):
        if group["node"].nunique() >= 2:
            findings += _behind_cluster(str(label), group, thresholds)
    return findings


def _behind_cluster(label: str, group: pd.DataFrame, thresholds: Mapping[str, Thresholds]) -> list[PairFinding]:
    """One pair (``label``) on each node against the same pair's median over the nodes, beyond the noise."""
    values = [float(v) for v in group["value"]]
    median = statistics.median(values)
    spread = robust_cv(values, f"the same pair's spread over {len(values)} nodes")
    calibrated = _calibrated(group)
    findings = []
    for node, value in zip(group["node"], values, strict=True):
        limits = thresholds.get(str(node), Thresholds())
        judged = call(value, median, limits.straggler_pct, [spread, calibrated], limits.noise_k)
        if judged.outcome == "ok":
            continue
        floor = floor_of(median, judged.margin_pct)
        expected = f">= {_fmt(floor)} GB/s (cluster median {_fmt(median)} - {judged.margin_said()})"
        said = f"{label} is {judged.shortfall_pct:.0f}% below the same pair's cluster median"
        reason = "straggler" if judged.outcome == "below" else INCONCLUSIVE
        if judged.outcome == "inconclusive":
            said = f"{label} {judged.inconclusive_said()}"
        findings.append(PairFinding(str(node), label, reason, value, expected, said, True))
    return findings


def summary(group: pd.DataFrame) -> str:
    """``12 pairs: min 312.4, median 318.0 GB/s (GPU2->GPU0 slowest)``."""
    values = [float(v) for v in group["value"]]
    slowest = min(zip(values, (str(label) for label in group["label"]), strict=True))[1]
    median = statistics.median(values)
    return f"{len(values)} pairs: min {_fmt(min(values))}, median {_fmt(median)} GB/s ({slowest} slowest)"
