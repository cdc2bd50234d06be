"""A run's ``run.json`` as a typed record: what a new run writes, and what a resume reads of an interrupted one,
checked before the run goes on.

``run.json`` is a file an operator may edit by hand (a path moved, an option changed). A resume takes its
inventory, nodes, stages and options from it; a value there of the wrong type or out of range would otherwise
surface inside the flow as a traceback and exit 3, as if the tool had failed. Checked here, before Prefect
starts, it is a usage error (exit 2) naming each key and what is wrong with it. The record keeps every key it
does not type as it was read, and writes back only the keys the file held or the run set: the file's format is
the same, whoever wrote it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from cluster_accept.analysis.verdicts import Verdict, VerdictRow
from cluster_accept.inventory.quoting import quoted
from cluster_accept.ops.after_run import Operations
from cluster_accept.rundir.outputs import ResumeError


class RecordedOptions(BaseModel):
    """``run.json``'s ``options``: what the run was started with (``rundir.run.recorded_options``)."""

    model_config = ConfigDict(extra="forbid")

    history: StrictStr | None
    operations: Operations
    concurrency: Annotated[StrictInt, Field(ge=1)]


class RunRecord(BaseModel):
    """``run.json``: the keys a run and its resume read and set, with their types; other keys are kept as they
    are. Its stages are held to those the validation's context names (``{"stages": […]}``: the run's stages in
    order), when one is given (a resume's)."""

    model_config = ConfigDict(extra="allow")

    run_id: StrictStr
    cluster: StrictStr
    inventory: StrictStr
    inventory_digest: StrictStr | None = None
    started: StrictStr
    stages: list[StrictStr]
    suite: StrictStr | None = None
    nodes_tested: list[StrictStr] = Field(default_factory=list)
    nodes_excluded: list[StrictStr] = Field(default_factory=list)
    quick_probes: StrictBool = False
    local: StrictBool = False
    simulated: StrictBool = False
    options: RecordedOptions | None = None
    resumed: list[StrictStr] = Field(default_factory=list)
    stage_seconds: dict[str, StrictFloat | StrictInt] = Field(default_factory=dict)
    tools: dict[str, Any] | None = None
    ended: StrictStr | None = None
    sharded: dict[str, Any] | None = None  # a sharded run's shards (flows.sharding), each's state once merged
    history_set_aside: list[dict[str, Any]] | None = None  # history files the run could not read

    @field_validator("stages")
    @classmethod
    def _known_stages(cls, stages: list[str], info: ValidationInfo) -> list[str]:
        if info.context is None:
            return stages  # a new run's: its caller named them
        known = tuple(info.context.get("stages", ()))
        unknown = [name for name in stages if name not in known]
        if unknown:
            raise ValueError(f"{', '.join(map(quoted, unknown))} is no stage (stages: {', '.join(known)})")
        return stages

    def saved(self) -> dict[str, Any]:
        """What ``run.json`` holds: every key the file held or the run set (a key left at its default and never
        set is not written, as the run never wrote it), and every key it does not type, as read."""
        fields = type(self).model_fields
        untouched = {
            name
            for name, field in fields.items()
            if name not in self.model_fields_set and getattr(self, name) == field.get_default(call_default_factory=True)
        }
        return {k: v for k, v in self.model_dump(mode="json").items() if k not in untouched}

    def row(self, verdicts: Sequence[VerdictRow]) -> dict[str, Any]:
        """The run's one row of ``runs.parquet``: when, what, and the verdict counts."""
        from cluster_accept.analysis.schemas import SCHEMA_VERSION

        def count(verdict: Verdict) -> int:
            return sum(1 for v in verdicts if v.verdict == verdict)

        return {
            "run_id": self.run_id,
            "cluster": self.cluster,
            "started": dt.datetime.fromisoformat(self.started),
            "ended": dt.datetime.fromisoformat(self.ended) if self.ended else None,
            "stages": list(self.stages),
            "inventory": self.inventory,
            "inventory_digest": self.inventory_digest,
            "nodes_tested": len(self.nodes_tested),
            "accepted": count(Verdict.ACCEPTED),
            "rejected": count(Verdict.REJECTED),
            "unreachable": count(Verdict.UNREACHABLE),
            "skipped": count(Verdict.SKIPPED),
            "tool_version": (self.tools or {}).get("cluster-accept"),
            "schema_version": SCHEMA_VERSION,
        }


def _problem(error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "(the whole file)"
    return f"{where}: {error['msg']}"


def check_run_record(run_id: str, path: Path, run_info: dict[str, Any], stages: Sequence[str]) -> RunRecord:
    """``run_info`` (``run.json`` of ``run_id``, read from ``path``) as its record when a resume can read it;
    ResumeError naming each key that is wrong, and how, when not (an exit 2, like any usage error). ``stages``:
    every stage a run may name."""
    try:
        return RunRecord.model_validate(run_info, context={"stages": tuple(stages)})
    except ValidationError as exc:
        said = "; ".join(_problem(error) for error in exc.errors())
        raise ResumeError(f"cannot resume {run_id}: {path} (edited by hand?): {said}") from None
