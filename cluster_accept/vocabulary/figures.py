"""A figure a probe measured, typed where the node's JSON line is read (:meth:`Figure.from_node`) and carried so
to the Parquet edge (:class:`~cluster_accept.vocabulary.rows.Measurement` places it in a run, node and stage).

A node-side script prints one JSON object per figure. Every key it may print is declared: a figure's own (the
fields of :class:`Figure`) and the conditions it was measured under (``conditions``: :class:`Conditions`) here,
and what one script says for a reader of its raw output that the controller does not keep by the run that prints
it (``NodeScript.unkept``, beside the probe: no table here to edit for a new probe). A key declared nowhere, or a
value of another type, is an error where the line is read (the probe's error row), never a silent null in
``measurements.parquet``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any

from cluster_accept.vocabulary.codec import ShapeError, from_data

# A script that prints nothing beside its figures but their own keys and conditions.
NOTHING_UNKEPT: Mapping[str, tuple[type, ...]] = MappingProxyType({})


@dataclass(frozen=True)
class Conditions:
    """What the GPU ran at while the figure was measured (``nvidia-smi`` sampled alongside, medians; the
    temperature the highest): a slow figure at low clocks or a high temperature is explained by them."""

    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    power_w: float | None = None
    temp_c: float | None = None
    clock_event_reasons: str | None = None  # the reasons the clocks were held down, OR-ed, as hex
    samples: int | None = None  # how many samples the medians are of (not kept)


@dataclass(frozen=True)
class Figure:
    """One figure and the conditions it was measured under, as a probe says it. Units are in the names
    (``algbw_gbps``, ``sm_clock_mhz``); ``value`` is in ``unit``."""

    metric: str
    value: float
    probe: str | None = None  # which run measured it: gemm, allreduce, rail0 …
    gpu: int | None = None
    unit: str | None = None
    dtype: str | None = None
    size: int | None = None  # GEMM: n of an n x n x n product; copies and all-reduce: bytes
    iterations: int | None = None
    label: str | None = None  # all-reduce: intra_node / inter_node; GPU pairs: GPU0->GPU1
    world_size: int | None = None
    algbw_gbps: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    power_w: float | None = None
    temp_c: float | None = None
    clock_event_reasons: str | None = None
    transport: str | None = None  # all-reduce: what NCCL used, e.g. P2P/CUMEM, NET/Socket
    group: str | None = None  # multi-node runs: the nodes of the run, folded (node[01-04])
    model: str | None = None  # training: the model trained
    repeat_cv: float | None = None  # the probe's repeats' coefficient of variation: the figure's own noise

    @classmethod
    def from_node(cls, record: Mapping[str, Any], unkept: Mapping[str, tuple[type, ...]] = NOTHING_UNKEPT) -> Figure:
        """A figure line of a node-side script; :class:`~cluster_accept.vocabulary.codec.ShapeError` names an
        undeclared key or a value of another type. ``unkept``: what the script that printed it declares beside its
        figures and the controller does not keep (the key and the types it may hold): checked, then dropped."""
        said = dict(record)
        for key, kind in unkept.items():
            value = said.pop(key, None)
            if value is not None and type(value) not in kind:
                raise ShapeError(f"figure.{key}: a {type(value).__name__}, not {kind[0].__name__}")
        conditions = said.pop("conditions", None)
        if conditions is not None:
            measured = {k: v for k, v in asdict(from_data(Conditions, conditions, "figure.conditions")).items()}
            measured.pop("samples")
            said.update({k: v for k, v in measured.items() if v is not None})
        return from_data(cls, said, "figure")
