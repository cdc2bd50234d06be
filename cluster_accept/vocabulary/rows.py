"""The rows every layer passes: a judged item (:class:`CheckRow`) and the same row placed in a run, a stage and a
node (:class:`NodeRow`), typed from the stage that judges it to the Parquet edge."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from cluster_accept.vocabulary.status import Status


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


@dataclass(frozen=True)
class NodeRow:
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

    def record(self) -> dict[str, Any]:
        """The Parquet row: the status as its value."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "status": self.status.value}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> NodeRow:
        """A row read back from ``checks.parquet`` (or any record of its columns); other keys are ignored."""
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in record.items() if key in known}
        return cls(**{**values, "status": Status(str(record["status"]))})
