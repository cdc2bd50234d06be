"""What a resume reads of an interrupted run's ``run.json``, checked before the run goes on.

``run.json`` is a file an operator may edit by hand (a path moved, an option changed). A resume takes its
inventory, nodes, stages and options from it; a value there of the wrong type or out of range would otherwise
surface inside the flow as a traceback and exit 3, as if the tool had failed. Checked here, before Prefect
starts, it is a usage error (exit 2) naming each key and what is wrong with it.
"""

from __future__ import annotations

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

from cluster_accept.inventory.quoting import quoted
from cluster_accept.ops.after_run import Operations
from cluster_accept.rundir.outputs import ResumeError


class RecordedOptions(BaseModel):
    """``run.json``'s ``options``: what the run was started with (``rundir.run.recorded_options``)."""

    model_config = ConfigDict(extra="forbid")

    history: StrictStr | None
    operations: Operations
    concurrency: Annotated[StrictInt, Field(ge=1)]


class ResumedRun(BaseModel):
    """The keys of ``run.json`` a resume reads, with the types it reads them as; other keys are left alone. Its
    stages are held to those the validation's context names (``{"stages": […]}``: the run's stages in order)."""

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

    @field_validator("stages")
    @classmethod
    def _known_stages(cls, stages: list[str], info: ValidationInfo) -> list[str]:
        known = tuple((info.context or {}).get("stages", ()))
        unknown = [name for name in stages if name not in known]
        if unknown:
            raise ValueError(f"{', '.join(map(quoted, unknown))} is no stage (stages: {', '.join(known)})")
        return stages


def _problem(error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "(the whole file)"
    return f"{where}: {error['msg']}"


def check_run_record(run_id: str, path: Path, run_info: dict[str, Any], stages: Sequence[str]) -> dict[str, Any]:
    """``run_info`` (``run.json`` of ``run_id``, read from ``path``) when a resume can read it; ResumeError naming
    each key that is wrong, and how, when not (an exit 2, like any usage error). ``stages``: every stage a run may
    name."""
    try:
        ResumedRun.model_validate(run_info, context={"stages": tuple(stages)})
    except ValidationError as exc:
        said = "; ".join(_problem(error) for error in exc.errors())
        raise ResumeError(f"cannot resume {run_id}: {path} (edited by hand?): {said}") from None
    return run_info
