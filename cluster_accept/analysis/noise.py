"""Relative judgements with a known error rate: a figure is called below its reference only when the shortfall
is beyond both the profile's margin and the figure's measured noise. Pure.

A fixed "5 % below the median" rule has an unknown false-positive rate: on a quiet H100 node a GEMM figure moves
by a fraction of a percent between runs, on CPU nodes sharing cores by tens of percent, and 50 figures on 1,000
nodes make 50,000 comparisons a run. So every comparison against peers, history or the node's own earlier
figure takes the largest noise known for that figure:

- the cluster's calibration (``cluster-accept calibrate``): the p95, over the trusted nodes, of each figure's
  coefficient of variation across A=A runs, per (GPU model, metric, size tier);
- the peers' own spread in this run: their robust coefficient of variation (1.4826 × MAD / median, the
  standard deviation a normal spread with that MAD has, untouched by the outliers being looked for);
- the figure's own repeats: the two measurements of a confirmed straggler, the node's own history.

The shortfall must reach ``max(straggler_pct, k × noise)``. Between ``straggler_pct`` and that margin the
difference cannot be called: the outcome is ``inconclusive``, a warning that says the spread and what would
decide it, never a rejection. With a calibrated noise σ and a margin of ``k σ``, the chance that a healthy figure
falls below it is, under a normal spread, the tail ``P(Z > k)`` (a little more: the peers' median moves too);
times the comparisons of a run, the false rejections to expect. The figure is only as good as the calibration: a
p95 over few runs is itself uncertain, and A=A runs measure each node's run-to-run noise, not the spread between
nodes, which the peers' spread in each run adds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

NOISE_K = 3.0  # margins at 3 σ: a healthy figure crosses one with probability 0.13 %
MAD_TO_SIGMA = 1.4826  # σ of a normal spread whose median absolute deviation is 1

DECIDES = "measure again with nothing else running on the nodes, when the peers themselves agree"

Outcome = Literal["ok", "below", "inconclusive"]
INCONCLUSIVE = "inconclusive"  # the reason of a shortfall past straggler_pct, inside the noise (checks.reasons.COMMON)


@dataclass(frozen=True)
class Noise:
    """A figure's run-to-run spread as a coefficient of variation (σ / mean, a fraction), and what measured it."""

    cv: float
    source: str  # "the peers' spread (12 GPUs)", "calibration: p95 of 20 figures over 5 runs", …

    def said(self) -> str:
        return f"{100 * self.cv:.1f}%: {self.source}"


def robust_cv(values: Sequence[float], source: str) -> Noise | None:
    """The peers' spread as a coefficient of variation: 1.4826 × MAD / median; None under three figures (two
    figures' spread is their difference itself: it says nothing of the noise apart from it) or at a median of
    zero."""
    if len(values) < 3:
        return None
    median = statistics.median(values)
    if median <= 0:
        return None
    mad = statistics.median(abs(v - median) for v in values)
    return Noise(MAD_TO_SIGMA * mad / median, source)


def repeat_cv(first: float, again: float, source: str) -> Noise | None:
    """Two measurements of one figure as a coefficient of variation (their standard deviation, |a − b| / √2,
    over their mean)."""
    mean = (first + again) / 2
    if mean <= 0:
        return None
    return Noise(abs(first - again) / math.sqrt(2) / mean, source)


def largest(noises: Iterable[Noise | None]) -> Noise | None:
    known = [n for n in noises if n is not None]
    return max(known, key=lambda n: n.cv) if known else None


@dataclass(frozen=True)
class Call:
    """One relative judgement: how far the figure is below its reference, the shortfall that counts as real
    (``margin_pct``), the noise that set it (None: the profile's margin alone), and the outcome."""

    outcome: Outcome
    shortfall_pct: float
    margin_pct: float
    straggler_pct: float
    k: float
    noise: Noise | None

    @property
    def noise_pct(self) -> float:
        return 100 * self.noise.cv if self.noise is not None else 0.0

    @property
    def widened(self) -> bool:
        """Whether the noise, not ``straggler_pct``, set the margin."""
        return self.margin_pct > self.straggler_pct

    def margin_said(self) -> str:
        """``5%``, or ``24.0% (3 × 8.0%: the peers' spread, 4 nodes)`` where the noise set it."""
        if self.noise is None or not self.widened:
            return f"{self.straggler_pct:g}%"
        return f"{self.margin_pct:.1f}% ({self.k:g} × {self.noise.said()})"

    def inconclusive_said(self) -> str:
        """Why a shortfall past ``straggler_pct`` was not called, and what would decide it."""
        return (
            f"{self.shortfall_pct:.1f}% below, inside the noise: the margin is {self.margin_said()}, so a difference "
            f"this size cannot be told from the spread; to decide it, {DECIDES}"
        )


def call(
    value: float, reference: float, straggler_pct: float, noises: Iterable[Noise | None], k: float = NOISE_K
) -> Call:
    """``value`` against ``reference`` (higher is better): ``ok`` when the shortfall is under ``straggler_pct``,
    ``below`` when it reaches ``max(straggler_pct, k × the largest noise)``, ``inconclusive`` in between."""
    noise = largest(noises)
    shortfall = 100 * (reference - value) / reference if reference > 0 else 0.0
    margin = max(straggler_pct, 100 * k * noise.cv) if noise is not None else straggler_pct
    if shortfall < straggler_pct:
        outcome: Outcome = "ok"
    elif shortfall >= margin:
        outcome = "below"
    else:
        outcome = "inconclusive"
    return Call(outcome, shortfall, margin, straggler_pct, k, noise)


def floor_of(reference: float, margin_pct: float) -> float:
    """The figure under which a shortfall reaches ``margin_pct``: never below zero (a margin past 100 % says the
    noise allows any figure)."""
    return max(0.0, reference * (1 - margin_pct / 100))


def false_rejection_rate(margin_pct: float, noise_cv: float) -> float:
    """The chance a healthy figure with run-to-run spread ``noise_cv`` falls ``margin_pct`` or more below a
    reference known exactly, under a normal spread: the tail beyond ``margin / σ``."""
    if noise_cv <= 0:
        return 0.0
    z = margin_pct / (100 * noise_cv)
    return 0.5 * math.erfc(z / math.sqrt(2))


def expected_false_rejections(margin_pct: float, noise_cv: float, comparisons: int) -> float:
    """False rejections to expect per run, under a normal spread, when ``comparisons`` healthy figures are each
    judged against the median of those same figures: the median of n varies too (by σ √(π / 2n)), which widens
    the spread of the difference to σ √(1 + π / 2n)."""
    if comparisons < 1:
        return 0.0
    widened = noise_cv * math.sqrt(1 + math.pi / (2 * comparisons))
    return comparisons * false_rejection_rate(margin_pct, widened)
