"""The burn-in judged: each GPU's throughput and clocks over minutes of sustained load, its ECC counters and the
XIDs the driver logged meanwhile. Pure functions over the run's time series (data frames).

A one-minute benchmark sees a cold GPU. Under minutes of load a GPU with a failing fan, a clogged heat sink or a
weak power supply heats, and the driver lowers its clocks with a thermal or power reason: its throughput falls
from its first minute while its neighbours keep theirs. Each GPU is judged against its own first part and its
node's other GPUs over the same time, so a node whose GPUs all throttle (its cooling) is named as well as one
GPU among healthy ones.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from cluster_accept.analysis.noise import INCONCLUSIVE, NOISE_K, robust_cv
from cluster_accept.inventory.burn_settings import BurnSettings
from cluster_accept.vocabulary.lazy import pandas as pd

# NVML clock event reasons that mean heat or power, not the application: SW power cap, HW slowdown, SW thermal
# slowdown, HW thermal slowdown, HW power brake.
THERMAL_OR_POWER = {
    0x4: "SW power cap",
    0x8: "HW slowdown",
    0x20: "SW thermal slowdown",
    0x40: "HW thermal slowdown",
    0x80: "HW power brake",
}
# Of those, the ones a healthy GPU never shows under load: SW power cap (0x4) is normal for a GPU at full GEMM
# load (a captured H100 shows it in nearly every loaded sample), thermal and hardware slowdowns are not.
HARDWARE = 0x8 | 0x20 | 0x40 | 0x80
HARDWARE_SHARE_MAX = 0.10  # a slowdown active in more of the late samples than this fails, whatever the clock
PART_MAX_S = 60.0  # the first and last parts compared: a minute each, a quarter of a shorter burn
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[^)]*)\):\s*(?P<code>\d{1,9})(?!\d)")


@dataclass(frozen=True)
class GpuBurn:
    """One GPU's burn summarised: throughput in the first and last parts, clocks, and what was active."""

    gpu: int
    first: float | None  # median throughput in the first part
    last: float | None  # … and in the last part
    unit: str
    first_clock_mhz: float | None
    late_clock_mhz: float | None  # median SM clock after the first part
    floor_mhz: float | None  # the clock it must keep: its first part's or its peers', less the allowed drop
    reasons_seen: int  # thermal/power reason bits active in the late samples below the floor
    reason_samples: int  # late samples below the floor with such a bit active
    hardware_bits: int  # thermal and hardware slowdown bits active in any late sample
    hardware_samples: int  # late samples with one of them active
    late_samples: int
    temp_max_c: float | None
    late_temp_c: float | None  # median temperature after the first part: the GPU under sustained load
    pcie_link: tuple[float, float, float, float] | None  # under load (late medians): gen, its max, width, its max
    power_median_w: float | None
    ecc_corrected_grew: float
    ecc_uncorrected_grew: float
    first_cv: float | None = None  # the first part's windows' robust spread: the throughput's own noise
    windows: tuple[int, int] = (0, 0)  # windows in the first and in the last part

    @property
    def drop_noise(self) -> float | None:
        """The noise of the drop between the two parts' medians, as a fraction: a median of n windows varies by
        1.2533 σ / √n; the difference of two, by 1.2533 σ √(1/n₁ + 1/n₂); doubled in variance, as if half as
        many windows were independent (a GPU's throughput wanders slowly, window to window)."""
        first, last = self.windows
        if self.first_cv is None or first < 1 or last < 1:
            return None
        return 1.2533 * self.first_cv * math.sqrt(2 * (1 / first + 1 / last))

    @property
    def drop_pct(self) -> float | None:
        if not self.first or self.last is None:
            return None
        return 100.0 * (1.0 - self.last / self.first)


def part_s(duration_s: float) -> float:
    return min(PART_MAX_S, duration_s / 4)


def reason_names(bits: int) -> str:
    return ", ".join(name for bit, name in THERMAL_OR_POWER.items() if bits & bit) or "none"


def _median(values: Iterable[float]) -> float | None:
    kept = [float(v) for v in values if v is not None and v == v]
    return statistics.median(kept) if kept else None


def _spread(values: Iterable[float]) -> float | None:
    kept = [float(v) for v in values if v is not None and v == v]
    noise = robust_cv(kept, "the first part's windows")
    return noise.cv if noise is not None else None


def _bits(text: object) -> int:
    try:
        return int(str(text), 16)
    except ValueError:
        return 0


def _grew(samples: pd.DataFrame, column: str) -> float:
    values = [v for v in samples[column] if v is not None and v == v] if column in samples else []
    return max(0.0, float(values[-1]) - float(values[0])) if len(values) >= 2 else 0.0


def summarise(
    windows: pd.DataFrame, samples: pd.DataFrame, duration_s: float, unit: str, clock_drop_max_pct: float = 10.0
) -> list[GpuBurn]:
    """Per GPU: ``windows`` (gpu, t_s, value: throughput per window) and ``samples`` (gpu, t_s, sm_clock_mhz,
    power_w, temp_c, reasons, ecc_corrected, ecc_uncorrected) from one node's burn of ``duration_s``."""
    part = part_s(duration_s)
    gpus = sorted(set(windows.get("gpu", pd.Series(dtype=int))) | set(samples.get("gpu", pd.Series(dtype=int))))
    late_clocks = {}
    for gpu in gpus:
        mine = samples[samples.gpu == gpu] if not samples.empty else samples
        late_clocks[gpu] = _median(mine[mine.t_s > part].sm_clock_mhz) if not mine.empty else None
    return [_summary(int(gpu), windows, samples, duration_s, unit, late_clocks, clock_drop_max_pct) for gpu in gpus]


def _summary(
    gpu: int,
    windows: pd.DataFrame,
    samples: pd.DataFrame,
    duration_s: float,
    unit: str,
    late_clocks: dict[int, float | None],
    clock_drop_max_pct: float,
) -> GpuBurn:
    part = part_s(duration_s)
    w = windows[windows.gpu == gpu] if not windows.empty else windows
    s = samples[samples.gpu == gpu].sort_values("t_s") if not samples.empty else samples
    late = s[s.t_s > part] if not s.empty else s
    reference = _reference_clock(s, part, late_clocks, gpu)
    floor = reference * (1 - clock_drop_max_pct / 100) if reference is not None else None
    low = late[late.sm_clock_mhz < floor] if floor is not None and not late.empty else late.iloc[0:0]
    bits = [_bits(r) & sum(THERMAL_OR_POWER) for r in low.reasons] if not low.empty else []
    hardware = [_bits(r) & HARDWARE for r in late.reasons] if not late.empty else []
    return GpuBurn(
        gpu=gpu,
        first=_median(w[w.t_s <= part].value) if not w.empty else None,
        first_cv=_spread(w[w.t_s <= part].value) if not w.empty else None,
        windows=(int((w.t_s <= part).sum()), int((w.t_s > duration_s - part).sum())) if not w.empty else (0, 0),
        last=_median(w[w.t_s > duration_s - part].value) if not w.empty else None,
        unit=unit,
        first_clock_mhz=_median(s[s.t_s <= part].sm_clock_mhz) if not s.empty else None,
        late_clock_mhz=late_clocks[gpu],
        floor_mhz=floor,
        reasons_seen=_union(bits),
        reason_samples=sum(1 for b in bits if b),
        hardware_bits=_union(hardware),
        hardware_samples=sum(1 for b in hardware if b),
        late_samples=len(late),
        temp_max_c=max((float(t) for t in s.temp_c if t == t and t is not None), default=None) if not s.empty else None,
        late_temp_c=_median(late.temp_c) if not late.empty else None,
        pcie_link=_link(late),
        power_median_w=_median(s.power_w) if not s.empty else None,
        ecc_corrected_grew=_grew(s, "ecc_corrected") if not s.empty else 0.0,
        ecc_uncorrected_grew=_grew(s, "ecc_uncorrected") if not s.empty else 0.0,
    )


def _link(late: pd.DataFrame) -> tuple[float, float, float, float] | None:
    """The PCIe link the GPU kept under load (late-part medians), None where nvidia-smi did not report it."""
    columns = ("pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max")
    if late.empty or not all(c in late for c in columns):
        return None
    gen, gen_max, width, width_max = (_median(late[c]) for c in columns)
    if gen is None or gen_max is None or width is None or width_max is None:
        return None
    return gen, gen_max, width, width_max


def _reference_clock(
    samples: pd.DataFrame, part: float, late_clocks: dict[int, float | None], gpu: int
) -> float | None:
    """The clock a healthy GPU keeps: the higher of its own first part's and its node's other GPUs' late median
    (a GPU throttled from the start has no good first part; a node throttled as a whole has no good peers)."""
    own = _median(samples[samples.t_s <= part].sm_clock_mhz) if not samples.empty else None
    peers = _median(c for g, c in late_clocks.items() if g != gpu and c is not None)
    known = [c for c in (own, peers) if c is not None]
    return max(known) if known else None


def _union(bits: list[int]) -> int:
    found = 0
    for b in bits:
        found |= b
    return found


@dataclass(frozen=True)
class BurnFinding:
    """One judged GPU: ``reason`` (``sustained``, ``throughput_dropped``, ``throttled``, ``clocks_fell``,
    ``ecc_uncorrected_grew``, ``ecc_corrected_grew``, ``no_windows``, ``runs_hot``), the measured value and what
    was expected; ``gpu`` None: the node's GPUs together (``thermal_uniform``, ``thermal_spread``)."""

    gpu: int | None
    reason: str
    observed: str
    expected: str
    detail: str


def judge(burns: list[GpuBurn], settings: BurnSettings, noise_k: float = NOISE_K) -> list[BurnFinding]:
    """Every GPU's findings; a GPU with none gets its ``sustained`` row, the figures it held. A GPU whose
    throughput was not reported gets ``no_windows``, and its clocks and ECC counters are still judged."""
    out: list[BurnFinding] = []
    for burn in burns:
        found = _findings(burn, settings, noise_k)
        if burn.first is None or burn.last is None:
            found.insert(0, BurnFinding(burn.gpu, "no_windows", "no throughput reported", "throughput per window", ""))
        elif not found:
            drop = burn.drop_pct
            said = f"{_fmt(burn.first)} → {_fmt(burn.last)} {burn.unit}" + (f" ({-drop:+.1f} %)" if drop else "")
            found = [
                BurnFinding(
                    burn.gpu, "sustained", said, f"≤ {settings.throughput_drop_max_pct:g} % drop", _conditions(burn)
                )
            ]
        out += found
    return out


def _drop_findings(burn: GpuBurn, settings: BurnSettings, noise_k: float) -> list[BurnFinding]:
    """The throughput's drop from the first part to the last: past the allowed drop and ``noise_k`` times the
    drop's own noise (:attr:`GpuBurn.drop_noise`) it dropped; past the allowed drop only, it is inconclusive."""
    drop, allowed, noise = burn.drop_pct, settings.throughput_drop_max_pct, burn.drop_noise
    if drop is None or drop <= allowed:
        return []
    margin = max(allowed, 100 * noise_k * noise) if noise is not None else allowed
    said = f"{_fmt(burn.first)} → {_fmt(burn.last)} {burn.unit} (-{drop:.1f} %)"
    widened = f" ({allowed:g} %, widened by the windows' spread)" if margin > allowed else ""
    expected = f"≤ {margin:.3g} % drop{widened}"
    if drop > margin:
        return [BurnFinding(burn.gpu, "throughput_dropped", said, expected, _conditions(burn))]
    detail = (
        f"past {allowed:g} % but inside {margin:.3g} %, {noise_k:g} × the drop's own noise "
        f"({100 * (noise or 0):.1f} %, from the first part's windows): the drop cannot be told from the load's "
        f"wobble; {_conditions(burn)}"
    )
    return [BurnFinding(burn.gpu, INCONCLUSIVE, said, expected, detail)]


def _findings(burn: GpuBurn, settings: BurnSettings, noise_k: float = NOISE_K) -> list[BurnFinding]:
    found = _drop_findings(burn, settings, noise_k)
    clock = _clock_finding(burn, settings)
    if clock is not None:
        found.append(clock)
    link = burn.pcie_link
    if link is not None and (link[0] < link[1] or link[2] < link[3]):
        said = f"PCIe Gen{link[0]:g} x{link[2]:g} under load"
        found.append(BurnFinding(burn.gpu, "pcie_downtrained", said, f"Gen{link[1]:g} x{link[3]:g} (its maximum)",
                                 _conditions(burn)))  # fmt: skip
    if burn.ecc_uncorrected_grew:
        said = f"+{burn.ecc_uncorrected_grew:g} uncorrected ECC errors during the burn"
        found.append(
            BurnFinding(burn.gpu, "ecc_uncorrected_grew", said, "no new uncorrected errors", _conditions(burn))
        )
    if burn.ecc_corrected_grew:
        said = f"+{burn.ecc_corrected_grew:g} corrected ECC errors during the burn"
        found.append(BurnFinding(burn.gpu, "ecc_corrected_grew", said, "no new corrected errors", _conditions(burn)))
    return found


def _clock_finding(burn: GpuBurn, settings: BurnSettings) -> BurnFinding | None:
    """Throttled: a thermal or hardware slowdown through the burn (even from its start, on every GPU of the node),
    or a clock under its floor with a thermal or power reason; a clock under its floor with no such reason warns."""
    late = f"{_fmt(burn.late_clock_mhz)} MHz under load"
    if burn.late_samples and burn.hardware_samples > HARDWARE_SHARE_MAX * burn.late_samples:
        active = f"{reason_names(burn.hardware_bits)} active in {burn.hardware_samples} of {burn.late_samples} samples"
        said = f"{late} ({active})"
        expected = f"no thermal or hardware slowdown in more than {HARDWARE_SHARE_MAX:.0%} of the samples"
        expected += f"; ≥ {burn.floor_mhz:.0f} MHz" if burn.floor_mhz is not None else ""
        return BurnFinding(burn.gpu, "throttled", said, expected, _conditions(burn))
    if burn.floor_mhz is None or burn.late_clock_mhz is None or burn.late_clock_mhz >= burn.floor_mhz:
        return None
    expected = f"≥ {burn.floor_mhz:.0f} MHz (first part or the node's other GPUs, - {settings.clock_drop_max_pct:g} %)"
    if burn.reasons_seen:
        why = f"{reason_names(burn.reasons_seen)} active in {burn.reason_samples} of {burn.late_samples} samples"
        return BurnFinding(burn.gpu, "throttled", f"{late} ({why})", expected, _conditions(burn))
    why = "no thermal or power reason active: application clocks, or another process"
    return BurnFinding(burn.gpu, "clocks_fell", f"{late} ({why})", expected, _conditions(burn))


def _fmt(value: float | None) -> str:
    return "?" if value is None else f"{value:,.4g}"


def _conditions(burn: GpuBurn) -> str:
    if burn.first_clock_mhz is None and burn.temp_max_c is None:
        return "no nvidia-smi samples (a CPU node, or the sampler failed)"
    return (
        f"SM clock {_fmt(burn.first_clock_mhz)} MHz first, {_fmt(burn.late_clock_mhz)} MHz later; "
        f"temperature max {_fmt(burn.temp_max_c)} C; power median {_fmt(burn.power_median_w)} W"
    )


def thermal(burns: list[GpuBurn], settings: BurnSettings) -> list[BurnFinding]:
    """The node's GPUs against each other under sustained load: each GPU's temperature (its late median) against
    the node's median, and the spread between the hottest and the coolest. A GPU hotter than its neighbours under
    the same load has a failing fan, a clogged heat sink or poor contact with it; a node whose spread is wide has
    uneven cooling. One row for the node (none with fewer than two GPUs sampled), and one per GPU too hot."""
    temps = {b.gpu: b.late_temp_c for b in burns if b.late_temp_c is not None}
    if len(temps) < 2:
        return []
    median = statistics.median(temps.values())
    hot = [g for g, t in temps.items() if t - median > settings.temp_above_median_max_c]
    found = [
        BurnFinding(
            g,
            "runs_hot",
            f"{temps[g]:.0f} °C under load, {temps[g] - median:+.1f} °C from the node's median {median:.0f} °C",
            f"≤ {settings.temp_above_median_max_c:g} °C above the node's median",
            "late-part median temperature; " + _spread_text(temps),
        )  # fmt: skip
        for g in hot
    ]
    spread = max(temps.values()) - min(temps.values())
    ok = spread <= settings.temp_spread_max_c
    said = f"spread {spread:.1f} °C ({_spread_text(temps)})"
    limit = f"≤ {settings.temp_spread_max_c:g} °C between the node's GPUs"
    found.append(BurnFinding(None, "thermal_uniform" if ok else "thermal_spread", said, limit, "late-part medians"))
    return found


def _spread_text(temps: dict[int, float]) -> str:
    return ", ".join(f"gpu{g} {t:.0f} °C" for g, t in sorted(temps.items()))


def xid_codes(lines: Iterable[str]) -> list[tuple[int, str, str]]:
    """(code, PCI address, line) of each NVRM Xid line logged during the burn."""
    found = []
    for line in lines:
        match = _XID.search(line)
        if match:
            found.append((int(match.group("code")), match.group("pci").strip(), line.strip()))
    return found
