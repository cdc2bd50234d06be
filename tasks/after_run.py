"""What happens once a run's verdicts are known: ``summary.json``, the optional Prometheus text file, and
the optional Slurm step (drain the bad nodes, resume the ones we drained that pass again).

The choices travel as one typed :class:`Operations` value, so a served deployment carries them as a flow
parameter like any other.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict

from cluster_accept.analysis.history import key_figures
from cluster_accept.reports.summary import prometheus_text, summary
from cluster_accept.tasks.slurm import SlurmPlan, slurm_step


class Operations(BaseModel):
    model_config = ConfigDict(extra="forbid")

    drain: bool = False  # drain rejected and unreachable nodes in Slurm
    resume_passing: bool = False  # resume nodes drained by cluster-accept that pass now
    apply: bool = False  # without it the Slurm commands are only listed (a dry run)
    scontrol: str = "scontrol"
    prometheus: str | None = None  # a node_exporter textfile-collector file to (re)write


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def warnings_by_node(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for row in rows:
        if row["status"] == "warn":
            reason = f"{row['check']}:{row['reason']}"
            if reason not in found.setdefault(str(row["node"]), []):
                found[str(row["node"])].append(reason)
    return found


def after_run(
    run_dir: Path,
    run_info: Mapping[str, Any],
    verdicts: Sequence[Mapping[str, Any]],
    rows: Sequence[Mapping[str, Any]],
    measurements: Sequence[Mapping[str, Any]],
    operations: Operations,
) -> SlurmPlan:
    """Write ``summary.json`` (and the Prometheus file), then the Slurm step, recorded in ``slurm.json``."""
    _write_atomic(
        run_dir / "summary.json",
        json.dumps(summary(run_info, verdicts, warnings_by_node(rows)), indent=2, default=str) + "\n",
    )
    if operations.prometheus:
        figures = key_figures(pd.DataFrame(list(measurements)))
        values = {
            (str(n), str(m)): float(v)
            for n, m, v in zip(figures["node"], figures["metric"], figures["value"], strict=True)
        }
        _write_atomic(Path(operations.prometheus), prometheus_text(run_info, verdicts, values))
    plan = slurm_step(
        verdicts,
        str(run_info["run_id"]),
        operations.drain,
        operations.resume_passing,
        operations.apply,
        operations.scontrol,
    )
    if operations.drain or operations.resume_passing:
        record = {"apply": operations.apply, "error": plan.error, "actions": [asdict(a) for a in plan.actions]}
        _write_atomic(run_dir / "slurm.json", json.dumps(record, indent=2) + "\n")
    return plan
