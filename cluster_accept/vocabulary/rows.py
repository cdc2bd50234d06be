"""The rows every layer passes: a judged item (:class:`CheckRow`) and the same row placed in a run, a stage and a
node (:class:`NodeRow`), typed from the stage that judges it to the Parquet edge."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any, Self, cast

from cluster_accept.vocabulary.figures import Figure
from cluster_accept.vocabulary.status import Status


class Record:
    """A typed row of one of the run's tables (a dataclass deriving from it): typed from the stage that makes it
    to the Parquet edge, where :meth:`record` makes it a plain record, once; :meth:`from_record` reads one back."""

    def record(self) -> dict[str, Any]:
        """The Parquet row."""
        return {f.name: getattr(self, f.name) for f in fields(cast(Any, self))}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Self:
        """A row read back from its table (or any record of its columns); other keys are ignored, and a
        column missing (written before it existed) takes the field's default."""
        known = {f.name for f in fields(cast(Any, cls))}
        return cls(**{key: value for key, value in record.items() if key in known})


@dataclass(frozen=True)
class CheckRow:
    """One judged item: the measured value next to the expected one, and why it passed or not."""

    check: str
    item: str
    status: Status
    reason: str  # a stable code: 'ok', 'version_mismatch', 'count_low', 'nvidia_smi_failed', ...
    observed: str | None = None
    expected: str | None = None
    detail: str = ""
    gpu: int | None = None


class StatusRecord(Record):
    """A typed row with a closed ``status``: its value at the Parquet edge, the enum again when read back."""

    status: Status

    def record(self) -> dict[str, Any]:
        return {**super().record(), "status": self.status.value}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Self:
        return super().from_record({**record, "status": Status(str(record["status"]))})


@dataclass(frozen=True)
class NodeRow(StatusRecord):
    """A judged row of one node in one run and stage, as ``checks.parquet`` holds it: typed from the stage
    that judged it to the Parquet edge (:meth:`record`), where it becomes a plain record once."""

    run_id: str
    cluster: str
    stage: str
    node: str
    check: str
    item: str
    status: Status
    reason: str
    observed: str | None = None
    expected: str | None = None
    detail: str = ""
    gpu: int | None = None
    raw_output: str = ""
    command: str = ""  # the node-side command whose output is the row's evidence (what reproduces it)

    @property
    def code(self) -> str:
        """``check:reason``, as verdicts list it."""
        return f"{self.check}:{self.reason}"


@dataclass(frozen=True, kw_only=True)
class Measurement(Figure, Record):
    """One figure a probe measured (the fields of :class:`Figure`, declared there once) placed on one node (or one
    group of nodes) in one run and stage, as ``measurements.parquet`` holds it: typed from the stage that read it
    to the Parquet edge (:meth:`record`). The place is keyword-only, so a figure's own fields keep their order."""

    run_id: str
    cluster: str
    stage: str
    node: str
    profile: str | None = None  # the profile the figure is judged by

    @classmethod
    def of(cls, figure: Figure, run_id: str, cluster: str, stage: str, node: str, profile: str | None) -> Measurement:
        """``figure`` placed in a run, stage and node, judged by ``profile``."""
        said = {f.name: getattr(figure, f.name) for f in fields(figure)}
        return cls(run_id=run_id, cluster=cluster, stage=stage, node=node, profile=profile, **said)

    def record(self) -> dict[str, Any]:
        """The Parquet row, its place first (``measurements.parquet``'s column order is the schema's)."""
        said = super().record()
        return {name: said[name] for name in MEASUREMENT_COLUMNS}

    @property
    def figure(self) -> Figure:
        """The figure itself, out of its place."""
        return Figure(**{f.name: getattr(self, f.name) for f in fields(Figure)})

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Measurement:
        """A row read back from ``measurements.parquet`` (or a checkpoint); other keys are ignored, and a
        missing column (written before it existed) is null."""
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in record.items() if key in known}
        return cls(**{**values, "value": float(record["value"])})


# A measurement's columns as its records and frames hold them: its place first, then its figure, then its profile.
MEASUREMENT_COLUMNS = ("run_id", "cluster", "stage", "node", *(f.name for f in fields(Figure)), "profile")


@dataclass(frozen=True)
class NcclFact(Record):
    """One thing NCCL said about itself in a run's ``NCCL_DEBUG=INFO`` log, on one node and rank, as
    ``nccl.parquet`` holds it: what a failed collective's cause is read from (fewer channels, a setting NCCL
    took, another plug-in). ``kind`` is ``channels`` (``name``: ``coll``, ``collnet``, ``nvls``, ``p2p``,
    ``p2p_per_peer``), ``communicator`` (``nranks``, ``nnodes``, ``local_ranks``), ``algorithm`` and
    ``protocol`` (``name``: the collective and its bytes, or ``NCCL_ALGO``/``NCCL_PROTO``), ``setting`` (a variable
    NCCL says it took: ``name`` the variable, ``value`` masked when the name is secret-looking), ``version``, or
    ``plugin`` (``net``, ``collnet``, ``tuner``, ``profiler``, ``env``, ``gin``, ``rma``, ``network``: ``none``
    when NCCL found no plug-in of that kind and used its own)."""

    run_id: str
    cluster: str
    stage: str
    node: str
    probe: str  # which run: allreduce, training, collectives, rail0 …
    kind: str
    name: str
    value: str
    group: str | None = None  # multi-node runs: the nodes of the run, folded
    rank: int | None = None  # the rank NCCL gave the process; None where the log never named one
    communicator: str | None = None  # NCCL's commId (else the comm's address); None for what holds per process


@dataclass(frozen=True)
class SettingRow(Record):
    """One setting a probe's run said it ran with on one node (``job_settings.py``), as ``settings.parquet`` holds
    it: what a later run's failing figure is compared with (the node's last accepted run is its known-good
    reference). ``source``: ``env`` or the NCCL config file that set it; ``also``: a file that sets it too."""

    run_id: str
    cluster: str
    stage: str
    node: str
    probe: str  # the node-side script that ran with it: gpu_bench.py, allreduce.py, train_step.py …
    name: str
    value: str  # a secret-looking setting's value masked on the node
    source: str
    also: str = ""


class ValueKind(StrEnum):
    """What a node's value is kept for."""

    COMPARED = "compared"  # compared across the run's nodes (driver version, NCCL settings)
    COUNTER = "counter"  # an error counter, compared with the node's previous run
    MARK = "mark"  # where a check's reading of the node ended, read back by the node's next run


# How ``node_values.parquet`` tells the kinds apart: a prefix of the key (the column kept as it always was).
KEY_PREFIX = {ValueKind.COMPARED: "", ValueKind.COUNTER: "counter:", ValueKind.MARK: "mark:"}


@dataclass(frozen=True)
class NodeValue(Record):
    """One value a check read on a node, of one kind, as ``node_values.parquet`` holds it (its kind as the key's
    prefix there, :data:`KEY_PREFIX`)."""

    run_id: str
    cluster: str
    node: str
    check: str
    key: str  # without its kind's prefix
    value: str
    kind: ValueKind = ValueKind.COMPARED

    @property
    def stored_key(self) -> str:
        """The key as the table holds it: ``counter:gpu0.link3.crc``."""
        return KEY_PREFIX[self.kind] + self.key

    def record(self) -> dict[str, Any]:
        """The Parquet row: the kind folded into the key."""
        fields_ = ("run_id", "cluster", "node", "check", "value")
        return {**{name: getattr(self, name) for name in fields_}, "key": self.stored_key}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> NodeValue:
        """A row read back from ``node_values.parquet`` (or any record of its columns): the kind from the key."""
        stored = str(record["key"])
        kind = next((k for k, prefix in KEY_PREFIX.items() if prefix and stored.startswith(prefix)), ValueKind.COMPARED)
        where = {name: str(record.get(name) or "") for name in ("run_id", "cluster")}
        return cls(
            **where,
            node=str(record["node"]),
            check=str(record["check"]),
            key=stored.removeprefix(KEY_PREFIX[kind]),
            value=str(record["value"]),
            kind=kind,
        )
