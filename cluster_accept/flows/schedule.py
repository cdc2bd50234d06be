"""Scheduled health checks: the acceptance flow served as a Prefect deployment with a cron schedule.

``cluster-accept serve`` runs ``flow.serve`` in the foreground: the deployment is registered with the
Prefect API (``PREFECT_API_URL``: a Prefect server, which schedules the runs) and this process executes
them. Teams running workers use ``prefect.yaml`` and ``prefect deploy`` instead (see the README).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from prefect.client.schemas.schedules import CronSchedule

from cluster_accept.flows.acceptance import acceptance
from cluster_accept.flows.watch import watch
from cluster_accept.ops.after_run import Operations
from cluster_accept.probes.base import load_checked_inventory
from cluster_accept.tasks.stages import SUITES
from cluster_accept.watch.request import WatchSpec


def deployment_parameters(
    inventory: Path, suite: str, out_dir: Path, history: str | None, operations: Operations
) -> dict[str, Any]:
    """The flow's parameters for every scheduled run: absolute paths, since runs start in other processes."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; suites are: {', '.join(SUITES)}")
    return {
        "inventory_path": str(inventory.resolve()),
        "out_dir": str(out_dir.resolve()),
        "suite": suite,
        "history": str(Path(history).resolve()) if history and history != "-" else history,
        "operations": operations.model_dump(),
    }


def deployment_name(cluster: str, suite: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", f"{cluster}-{suite}").strip("-")


def _checked_cron(cron: str) -> None:
    try:
        CronSchedule(cron=cron)
    except ValueError as exc:
        raise ValueError(f"--cron {cron!r} is not a cron expression: {exc}") from None


def serve_watch(spec: WatchSpec, cron: str, cluster: str, job: str) -> None:
    """Serve the watch of ``spec`` on ``cron`` until interrupted: each run watches ``spec.for_s`` seconds (a
    Slurm job's nodes asked of Slurm again at each run); a bad cron is a ValueError."""
    _checked_cron(cron)
    watch.serve(
        name=deployment_name(cluster, f"watch-{job}"),
        cron=cron,
        parameters={"spec": spec.model_dump(mode="json")},
        description=f"watch of job {job} on {cluster} ({spec.inventory})",
        tags=["cluster-accept", "watch"],
    )


def serve_deployment(
    inventory: Path,
    cron: str,
    suite: str,
    out_dir: Path,
    name: str | None,
    history: str | None,
    operations: Operations,
) -> None:
    """Register the deployment and execute its runs until interrupted; a bad cron is a ValueError."""
    _checked_cron(cron)
    parameters = deployment_parameters(inventory, suite, out_dir, history, operations)
    cluster = load_checked_inventory(inventory).cluster
    acceptance.serve(
        name=name or deployment_name(cluster, suite),
        cron=cron,
        parameters=parameters,
        description=f"{suite} health check of {cluster} ({inventory.resolve()})",
        tags=["cluster-accept", suite],
    )
