"""The cluster's noise table: each figure's run-to-run spread measured by A=A runs on trusted nodes. Pure.

``cluster-accept calibrate`` runs the chosen stages K times on nodes the operator trusts; every figure (node,
GPU, metric, size, label) measured in two runs or more gets its coefficient of variation across the runs, and the
table keeps, per (GPU model, metric, size tier), the median and the p95 of those coefficients: the p95 is the
noise a relative judgement rests on (:mod:`analysis.noise`), so that 95 % of the trusted figures vary less than
the margin assumes. Collectives vary more at small messages (latency-bound, a few microseconds of jitter), hence
the size tiers.
"""

from __future__ import annotations

import logging
import math
import os
import re
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster_accept.analysis.noise import Noise
from cluster_accept.inventory.model import Profile, path_part
from cluster_accept.inventory.quoting import quoted
from cluster_accept.vocabulary.lazy import pandas as pd

if TYPE_CHECKING:  # pyarrow is imported where a file is read or written: the CLI starts without it
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cluster_accept.analysis.history_files import HistoryFiles
    from cluster_accept.analysis.table_files import UnfitTable

log = logging.getLogger(__name__)

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
    (sample standard deviation over the mean). A value that is not a finite number measured nothing."""
    df = measurements.copy()
    for column in ("gpu", "size", "label"):
        if column not in df.columns:
            df[column] = None
    df["gpu"], df["size"], df["label"] = df["gpu"].fillna(-1), df["size"].fillna(-1), df["label"].fillna("")
    df = df[pd.to_numeric(df["value"], errors="coerce").abs() < math.inf]  # inf or nan measured nothing
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


# The table in the history. It is data to check, not to trust: a file there may have been edited, copied under
# another name, cut short or written by an earlier version, and a noise read from it widens every relative margin
# of the figures it keys (a noise of inf or 1e6 calls nothing below, so a GPU at a tenth of its peers would pass
# as inconclusive). So each file is held to its schema from its footer, the latest is chosen by the calibration
# id inside it (never by its name: ``backup-old.parquet`` sorts after every id), and the chosen one is read whole
# and every value checked before a run uses it. A file that does not hold up is named with its problem and not
# used; the run judges by the latest that does, or by the peers alone.

CALIBRATION_DIR = "calibration"  # HISTORY/calibration/<cluster>/<calibration id>.parquet
# The largest noise a calibration may say (a coefficient of variation, for cv_p95 and cv_median): at the default
# noise_k of 3 a larger one widens the margin past 100 %, where no figure, not even zero, is ever called below: it
# switches the relative judgement off rather than measuring anything (a healthy figure varying by a third of
# itself between runs is a broken probe or a shared node). ``calibrate`` leaves such a row out, saying so.
CV_CEILING = 1 / 3
MAX_ROWS = 100_000  # GPU models × metrics × size tiers: a few hundred rows; more is no calibration
TIERS = ("", "small", "medium", "large")
_ID = re.compile(r"\d{8}T\d{6}Z(?:-[0-9a-f]{1,32})?")  # a UTC start time, as run ids are: ids sort by time
_SCHEMA_NAME = b"calibration"
_SCHEMA_VERSION = b"1"
_TABLE_KEY = ["gpu_model", "metric", "size_tier"]
_NOISES = ("cv_median", "cv_p95")
_SAID_PROBLEMS = 3  # a file's problems named at most, each naming its row
_KINDS = {  # what each column holds, as its file's schema says: any width of integer, any text
    "gpu_model": ("text",),
    "metric": ("text",),
    "size_tier": ("text",),
    "runs": ("an integer",),
    "figures": ("an integer",),
    "cv_median": ("a number", "an integer"),
    "cv_p95": ("a number", "an integer"),
}
_NO_ID = (
    "no calibration id in its footer (written by an earlier version, or not by cluster-accept calibrate): when it "
    "was made cannot be told, and its file name is no record of that; calibrate again"
)
_ITS_VERSION = "for the version that wrote it"


def _schema() -> pa.Schema:
    import pyarrow as pa

    text, count, ratio = pa.string(), pa.int64(), pa.float64()
    kinds = [text, text, text, count, count, ratio, ratio]
    metadata = {b"cluster_accept_schema": _SCHEMA_NAME, b"version": _SCHEMA_VERSION}
    return pa.schema(list(zip(NOISE_COLUMNS, kinds, strict=True)), metadata=metadata)


def _row_said(index: int, row: Mapping[str, Any]) -> str:
    tier = row.get("size_tier")
    return f"row {index} ({quoted(row.get('gpu_model'))}, {quoted(row.get('metric'))}{f', {tier}' if tier else ''})"


def _noise_problem(column: str, value: object) -> str | None:
    """Why ``value`` is no noise: not a finite number, negative, or above :data:`CV_CEILING`."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return f"{column} is {quoted(value)}: a noise is a finite number"
    if value < 0:
        return f"{column} is {value:g}: a coefficient of variation is never below 0"
    if value > CV_CEILING:
        return (
            f"{column} is {value:g}, above the ceiling of {CV_CEILING:.3f} (at noise_k 3 a margin past 100 %: no "
            "figure could ever be called below its peers)"
        )
    return None


def row_problems(row: Mapping[str, Any]) -> list[str]:
    """What makes one row of a noise table no calibration: a key empty or unknown, fewer than two runs or no
    figure, a noise that is not finite, negative or above :data:`CV_CEILING`."""
    found = [f"{c} is empty" for c in ("gpu_model", "metric") if not isinstance(row.get(c), str) or not row.get(c)]
    if row.get("size_tier") not in TIERS:
        found.append(f"size_tier is {quoted(row.get('size_tier'))}, not small, medium, large or empty")
    for column, least in (("runs", 2), ("figures", 1)):
        value = row.get(column)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            found.append(f"{column} is {quoted(value)}, not a count of at least {least}")
    found += [p for p in (_noise_problem(c, row.get(c)) for c in _NOISES) if p is not None]
    return found


def _records(table: pd.DataFrame) -> list[dict[str, Any]]:
    """The table's rows with plain Python values (an integer column as ints, a null as None)."""
    return [
        {k: (None if v is None or (isinstance(v, float) and math.isnan(v) and k not in _NOISES) else v)
         for k, v in zip(NOISE_COLUMNS, values, strict=True)}
        for values in table[NOISE_COLUMNS].astype(object).itertuples(index=False, name=None)
    ]  # fmt: skip


def table_problems(table: pd.DataFrame) -> list[str]:
    """What makes a noise table no calibration, each problem naming its row and its key (the first
    :data:`_SAID_PROBLEMS`): a column missing, a row's problem (:func:`row_problems`), a key twice."""
    missing = [c for c in NOISE_COLUMNS if c not in table.columns]
    if missing:
        return [f"no column {', '.join(missing)}"]
    found: list[str] = []
    seen: set[tuple[object, ...]] = set()
    for index, row in enumerate(_records(table)):
        key = tuple(row[c] for c in _TABLE_KEY)
        said = [*row_problems(row), *(["a second row of this GPU model, metric and size tier"] if key in seen else [])]
        seen.add(key)
        found += [f"{_row_said(index, row)}: {problem}" for problem in said]
        if len(found) >= _SAID_PROBLEMS:
            return found[:_SAID_PROBLEMS]
    return found


def plausible_rows(table: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """``table`` without the rows a run would refuse (:func:`row_problems`), and a line for each left out: a
    figure too noisy to calibrate is judged by its peers' spread alone, never by a margin that calls nothing."""
    kept, notes = [], []
    for index, row in enumerate(_records(table)):
        problems = row_problems(row)
        kept.append(not problems)
        if problems:
            notes.append(f"{_row_said(index, row)} left out of the calibration: {'; '.join(problems)}")
    plausible = table[pd.Series(kept, index=table.index, dtype=bool)].reset_index(drop=True)
    return plausible.astype({c: "float64" for c in _NOISES}), notes


def _inside(history: Path, path: Path) -> None:
    """ValueError unless ``path``'s folder, every link followed, is ``HISTORY/calibration/<its name>``."""
    expected = history.resolve() / CALIBRATION_DIR / path.parent.name
    if path.parent.resolve() != expected:
        raise ValueError(f"calibration {path} would be written outside {history / CALIBRATION_DIR} (to {expected})")


def table_path(history: Path, cluster: str, calibration_id: str) -> Path:
    """``HISTORY/calibration/<cluster>/<calibration id>.parquet``; ValueError where the cluster is no folder's name
    (:func:`inventory.model.path_part`), the id no calibration id, or the path leaves the history."""
    path_part(cluster)
    if not _ID.fullmatch(calibration_id):
        raise ValueError(f"calibration id {quoted(calibration_id)} is no UTC time as run ids start with")
    path = history / CALIBRATION_DIR / cluster / f"{calibration_id}.parquet"
    _inside(history, path)
    return path


def write_table(history: Path, cluster: str, calibration_id: str, table: pd.DataFrame) -> Path:
    """The noise table into the history, whole or not at all (a new file of a random name, never through a link,
    renamed into place), its calibration id and cluster in the file's footer: what a reader chooses the latest
    by, never the file's name. ValueError for a table a run would refuse (:func:`table_problems`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    problems = table_problems(table)
    if problems:
        raise ValueError(f"calibration {calibration_id} not written: {'; '.join(problems)}")
    path = table_path(history, cluster, calibration_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    _inside(history, path)  # again, the folders made: a link among them is seen now
    schema = _schema()
    said = {**(schema.metadata or {}), b"calibration_id": calibration_id.encode(), b"cluster": cluster.encode()}
    arrow = pa.Table.from_pandas(table[NOISE_COLUMNS], schema=schema, preserve_index=False)
    buffer = pa.BufferOutputStream()
    pq.write_table(arrow.replace_schema_metadata(said), buffer)
    partial = path.with_name(f".{path.name}.{secrets.token_hex(8)}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(buffer.getvalue().to_pybytes())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path


def _kind_problems(found: pa.Schema) -> list[str]:
    """Each column of the table the file lacks or holds another kind of value in (text where a number goes)."""
    import pyarrow as pa

    def kind(column: str) -> str:
        of = found.field(column).type
        of = of.value_type if pa.types.is_dictionary(of) else of
        if pa.types.is_string(of) or pa.types.is_large_string(of):
            return "text"
        return "an integer" if pa.types.is_integer(of) else "a number" if pa.types.is_floating(of) else str(of)

    problems = [f"no column {c}" for c in NOISE_COLUMNS if c not in found.names]
    twice = sorted({n for n in found.names if found.names.count(n) > 1})
    problems += [f"the column {n} twice" for n in twice]
    return problems or [f"{c} holds {kind(c)}, not {_KINDS[c][0]}" for c in NOISE_COLUMNS if kind(c) not in _KINDS[c]]


def _footer_id(parquet: pq.ParquetFile, path: Path, cluster: str) -> str:
    """The calibration id the file's footer says, once its footer holds up: the calibration schema of this
    version, the id of a calibration, this cluster, at most :data:`MAX_ROWS` rows, columns of their kind, and
    unpacking within what one history file may take. Raises :class:`analysis.table_files.UnfitTable`."""
    from cluster_accept.analysis.table_files import FILE_BUDGET_BYTES, UnfitTable, read_cost_bytes

    said = parquet.schema_arrow.metadata or {}
    version = said.get(b"version", _SCHEMA_VERSION)
    if said.get(b"cluster_accept_schema") != _SCHEMA_NAME or b"calibration_id" not in said:
        raise UnfitTable(path, _NO_ID)
    if version != _SCHEMA_VERSION:
        written = f"calibration schema version {quoted(version.decode(errors='replace'))}"
        raise UnfitTable(path, f"{written}, this version reads {_SCHEMA_VERSION.decode()}", left=_ITS_VERSION)
    found_id, found_cluster = (said[k].decode(errors="replace") for k in (b"calibration_id", b"cluster"))
    if not _ID.fullmatch(found_id):
        raise UnfitTable(path, f"its calibration id {quoted(found_id)} is no UTC time as a run id starts")
    if found_cluster != cluster:
        raise UnfitTable(path, f"a calibration of cluster {quoted(found_cluster)}, not of {quoted(cluster)}")
    rows = parquet.metadata.num_rows
    if rows > MAX_ROWS:
        raise UnfitTable(path, f"{rows:,} rows, more than a calibration has ({MAX_ROWS:,})")
    problems = _kind_problems(parquet.schema_arrow)
    if problems:
        raise UnfitTable(path, f"another schema: {'; '.join(problems[:_SAID_PROBLEMS])}")
    cost = read_cost_bytes(parquet.metadata, NOISE_COLUMNS, len(NOISE_COLUMNS))
    if cost > FILE_BUDGET_BYTES:
        raise UnfitTable(path, f"it unpacks to {cost:,} bytes, more than a file may take here ({FILE_BUDGET_BYTES:,})")
    return found_id


def _opened(path: Path, cluster: str, whole: bool) -> tuple[str, pd.DataFrame | None]:
    """The file's calibration id (:func:`_footer_id`) and, when ``whole``, its table read and every value checked
    (:func:`table_problems`). Only a plain file is opened: a link, a pipe or a device is never followed nor
    waited on. Raises :class:`analysis.table_files.UnfitTable` naming the file and the problem."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cluster_accept.analysis.table_files import UnfitTable

    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise UnfitTable(path, "not a plain file (a link, a pipe or a device): no calibration calibrate wrote")
        with pq.ParquetFile(path) as parquet:
            calibration_id = _footer_id(parquet, path, cluster)
            read = parquet.read(columns=NOISE_COLUMNS) if whole else None
    except UnfitTable:
        raise
    except (OSError, ValueError, TypeError, KeyError, pa.ArrowException) as exc:
        said = " ".join(str(exc).split())[:200]
        raise UnfitTable(path, f"cannot be read as a calibration ({type(exc).__name__}: {said})") from None
    if read is None:
        return calibration_id, None
    schema = _schema()
    frame = pa.table([read.column(c).cast(schema.field(c).type) for c in NOISE_COLUMNS], schema=schema).to_pandas()
    problems = table_problems(frame)
    if problems:
        raise UnfitTable(path, "; ".join(problems))
    return calibration_id, frame


@dataclass(frozen=True)
class Calibrations:
    """A cluster's calibrations in the history as one reader found them: the latest that holds up as data, and
    each file that does not, with its problem."""

    table: NoiseTable | None
    unfit: tuple[UnfitTable, ...]


def read_calibrations(history: Path, cluster: str) -> Calibrations:
    """Every file of ``HISTORY/calibration/<cluster>/`` held to its footer, then the latest by the id inside it
    read whole and checked, and the next latest where it does not hold up. Moves nothing."""
    from cluster_accept.analysis.table_files import UnfitTable

    folder = history / CALIBRATION_DIR / cluster
    candidates: list[tuple[str, Path]] = []
    unfit: list[UnfitTable] = []
    for path in sorted(folder.glob("*.parquet")) if folder.is_dir() else []:
        try:
            candidates.append((_opened(path, cluster, whole=False)[0], path))
        except UnfitTable as exc:
            unfit.append(exc)
    for _, path in sorted(candidates, reverse=True):  # the latest id first; one id twice (a copy): by name
        try:
            calibration_id, frame = _opened(path, cluster, whole=True)
        except UnfitTable as exc:
            unfit.append(exc)
            continue
        return Calibrations(NoiseTable(frame if frame is not None else pd.DataFrame(), calibration_id), tuple(unfit))
    return Calibrations(None, tuple(unfit))


def latest_table(history: Path, cluster: str, files: HistoryFiles | None = None) -> NoiseTable | None:
    """The cluster's latest calibration in the history that holds up as data (:func:`read_calibrations`), or None.

    A file that does not is named with its problem and not used: with ``files`` (a run's reader of the history),
    set aside as every history file that cannot be read (moved to ``HISTORY/_set_aside/``, listed in the run's
    ``run.json``); without (the check before a run starts, ``profile suggest``), warned of and left. One bad
    file never stops a run, nor every later run: they judge by the latest calibration that holds up, or by the
    peers alone."""
    found = read_calibrations(history, cluster)
    for unfit in found.unfit:
        if files is not None:
            files.skip(unfit)
        else:
            log.warning("calibration file %s not used: %s", unfit.path, unfit.problem)
    return found.table
