"""The cluster's noise table: each figure's run-to-run spread measured by A=A runs on trusted nodes. Pure.

``cluster-accept calibrate`` runs the chosen stages K times on nodes the operator trusts; every figure (node,
GPU, metric, size, label) measured in two runs or more gets its coefficient of variation across the runs, and the
table keeps, per (GPU model, metric, size tier), the median and the p95 of those coefficients: the p95 is the
noise a relative judgement rests on (:mod:`analysis.noise`), so that 95 % of the trusted figures vary less than
the margin assumes. Collectives vary more at small messages (latency-bound, a few microseconds of jitter), hence
the size tiers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cluster_accept.analysis.noise import Noise
from cluster_accept.inventory.model import Profile
from cluster_accept.vocabulary.lazy import pandas as pd

NOISE_COLUMNS = ["gpu_model", "metric", "size_tier", "runs", "figures", "cv_median", "cv_p95"]
_SMALL_BYTES = 1 << 20
_LARGE_BYTES = 64 << 20
_KEY = ["node", "gpu", "metric", "size", "label"]


def size_tier(size: object, metric: str = "") -> str:
    """``small`` (< 1 MiB: latency-bound), ``medium`` (< 64 MiB), ``large``; empty for a figure with no size in
    bytes (none given, or a GEMM's, whose size is its matrix dimension)."""
    if size is None or (isinstance(size, float) and math.isnan(size)) or "flops" in metric:
        return ""
    nbytes = int(size)  # type: ignore[call-overload]
    return "small" if nbytes < _SMALL_BYTES else "medium" if nbytes < _LARGE_BYTES else "large"


def _p95(values: list[float]) -> float:
    """The 95th percentile by linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = 0.95 * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def figure_cvs(measurements: pd.DataFrame) -> pd.DataFrame:
    """One row per figure measured in two runs or more: its runs and its coefficient of variation across them
    (sample standard deviation over the mean)."""
    df = measurements.copy()
    for column in ("gpu", "size", "label"):
        if column not in df.columns:
            df[column] = None
    df["gpu"], df["size"], df["label"] = df["gpu"].fillna(-1), df["size"].fillna(-1), df["label"].fillna("")
    grouped = df.groupby(_KEY, sort=True)["value"]
    stats = grouped.agg(["count", "mean", "std"]).reset_index()
    stats = stats[(stats["count"] >= 2) & (stats["mean"] > 0)]
    stats["cv"] = stats["std"] / stats["mean"]
    stats["size"] = stats["size"].where(stats["size"] >= 0, None)
    return stats.rename(columns={"count": "runs"})


def noise_table(measurements: pd.DataFrame, model_of: Mapping[str, str]) -> pd.DataFrame:
    """Per (GPU model, metric, size tier): how many runs and figures, and the median and p95 of the figures'
    coefficients of variation. ``measurements``: the A=A runs' figures (``run_id``, ``node``, ``metric``,
    ``value``, and ``gpu``/``size``/``label`` where they have them); ``model_of``: each node's GPU model."""
    cvs = figure_cvs(measurements)
    if cvs.empty:
        return pd.DataFrame(columns=NOISE_COLUMNS)
    cvs["gpu_model"] = [model_of.get(str(node), "") for node in cvs["node"]]
    cvs["size_tier"] = [size_tier(s, str(m)) for s, m in zip(cvs["size"], cvs["metric"], strict=True)]
    rows = []
    for (model, metric, tier), group in cvs.groupby(["gpu_model", "metric", "size_tier"], sort=True):
        values = [float(v) for v in group["cv"]]
        rows.append(
            {
                "gpu_model": str(model),
                "metric": str(metric),
                "size_tier": str(tier),
                "runs": int(group["runs"].max()),
                "figures": len(values),
                "cv_median": float(pd.Series(values).median()),
                "cv_p95": _p95(values),
            }
        )
    return pd.DataFrame(rows, columns=NOISE_COLUMNS)


@dataclass(frozen=True)
class NoiseTable:
    """A calibration as the judgements read it: the noise of (GPU model, metric, size tier), where measured."""

    frame: pd.DataFrame
    calibrated_at: str = ""  # the calibration's id, said with every noise taken from it

    def noise(self, gpu_model: str, metric: str, size: object = None) -> Noise | None:
        if self.frame.empty:
            return None
        tier = size_tier(size, metric)
        df = self.frame
        hit = df[(df["gpu_model"] == gpu_model) & (df["metric"] == metric) & (df["size_tier"] == tier)]
        if hit.empty:
            return None
        row = hit.iloc[0]
        where = f" {self.calibrated_at}" if self.calibrated_at else ""
        source = f"calibration{where}: p95 of {int(row['figures'])} figures over {int(row['runs'])} runs"
        return Noise(float(row["cv_p95"]), source)


def model_key(profile: Profile) -> str:
    """The GPU model a node's figures are calibrated under: its profile's GPU, ``cpu`` for probes on CPU."""
    if profile.probes.device != "cuda":
        return "cpu"
    return (profile.gpu.model if profile.gpu is not None else None) or "unknown GPU"


def annotate(figures: pd.DataFrame, table: NoiseTable | None, profiles: Mapping[str, Profile]) -> pd.DataFrame:
    """``figures`` with each one's calibrated noise beside it (``calibrated_cv``, ``calibrated_source``; empty
    where the calibration did not measure it): what every relative judgement of the figure reads."""
    if table is None or table.frame.empty or figures.empty:
        return figures
    noises = [
        table.noise(model_key(profiles[str(node)]), str(metric), size) if str(node) in profiles else None
        for node, metric, size in zip(figures["node"], figures["metric"], _sizes(figures), strict=True)
    ]
    out = figures.copy()
    out["calibrated_cv"] = pd.Series([n.cv if n is not None else None for n in noises], index=figures.index)
    out["calibrated_source"] = pd.Series([n.source if n is not None else None for n in noises], index=figures.index)
    return out


def calibrated_by_figure(figures: pd.DataFrame) -> dict[tuple[str, str], Noise]:
    """The largest calibrated noise of each (node, metric) among ``figures`` (annotated by :func:`annotate`):
    what a node's key figure (its GPUs' median) is compared with its history by."""
    if figures.empty or "calibrated_cv" not in figures.columns:
        return {}
    found: dict[tuple[str, str], Noise] = {}
    for node, metric, cv, source in zip(
        figures["node"], figures["metric"], figures["calibrated_cv"], figures["calibrated_source"], strict=True
    ):
        key = (str(node), str(metric))
        if cv is not None and not pd.isna(cv) and (key not in found or float(cv) > found[key].cv):
            found[key] = Noise(float(cv), str(source))
    return found


def _sizes(figures: pd.DataFrame) -> list[object]:
    return list(figures["size"]) if "size" in figures.columns else [None] * len(figures)


CALIBRATION_DIR = "calibration"  # HISTORY/calibration/<cluster>/<calibration id>.parquet


def table_path(history: Path, cluster: str, calibration_id: str) -> Path:
    return history / CALIBRATION_DIR / cluster / f"{calibration_id}.parquet"


def write_table(history: Path, cluster: str, calibration_id: str, table: pd.DataFrame) -> Path:
    """The noise table into the history, whole or not at all (written beside, then renamed)."""
    path = table_path(history, cluster, calibration_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".parquet.partial")
    table[NOISE_COLUMNS].to_parquet(partial, index=False)
    partial.replace(path)
    return path


def latest_table(history: Path, cluster: str) -> NoiseTable | None:
    """The cluster's latest calibration in the history (ids sort by time), or None where it has none. A table
    that cannot be read, or lacks a column, is an error naming the file: judging without the calibration the
    operator made would silently change every relative verdict."""
    found = sorted((history / CALIBRATION_DIR / cluster).glob("*.parquet"))
    if not found:
        return None
    path = found[-1]
    try:
        frame = pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for an unreadable file
        raise ValueError(f"calibration {path} cannot be read: {exc}") from exc
    missing = [c for c in NOISE_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"calibration {path} lacks the columns {', '.join(missing)}")
    return NoiseTable(frame[NOISE_COLUMNS], path.stem)
