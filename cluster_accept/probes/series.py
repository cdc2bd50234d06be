"""A probe's series too long for the run's tables, declared on the probe (``Probe.series``), written by its stage.

The burn samples every GPU every second: ~10,000 rows a node, ~10 M for 1,000 nodes. Such a series goes whole to
one Parquet file per node in the run directory, as each node is judged (a cluster's series never sit in memory at
once); the report keeps a thinned copy in the run's table of the same name, for its charts. Its rows are typed
(a :class:`~cluster_accept.vocabulary.rows.Record` the probe declares, with its table's columns) until they are
written or handed to the report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from cluster_accept.analysis.probe_output import ProbeOutput
from cluster_accept.vocabulary.rows import Record

RowT_co = TypeVar("RowT_co", bound=Record, covariant=True)


@dataclass(frozen=True)
class SeriesPlace:
    """Where a node's series was measured: what each of its rows names."""

    run_id: str
    cluster: str
    node: str


@dataclass(frozen=True)
class NodeSeries(Generic[RowT_co]):
    """What a probe keeps of each node's output beside its figures, as rows of its own type.

    ``table``: the schema's name (``analysis.schemas.TABLES``) and the run's table the thinned copy joins; each
    node's whole series goes to ``<table>/<node>.parquet`` in the run directory. ``rows(place, output, points)``:
    the series' rows, with ``points`` at most that many per GPU (``None``: all of them); ``points``: what the
    report's charts draw per GPU."""

    table: str
    rows: Callable[[SeriesPlace, ProbeOutput, int | None], Sequence[RowT_co]]
    points: int
