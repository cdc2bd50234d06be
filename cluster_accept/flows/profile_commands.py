"""``cluster-accept profile suggest``: a commented profile to start from, read off the nodes.

:mod:`flows.cli` registers the ``profile`` sub-app. The profile goes to stdout alone (``> profile.yaml``);
what the command does meanwhile (each node as it answers, the nodes not read) goes to stderr. Exit codes as
everywhere (:mod:`flows.exits`): 0 a profile was printed, 1 no node answered, 2 a usage or inventory error.
"""

from __future__ import annotations

import enum
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cluster_accept.flows.exits import NOT_ACCEPTED, USAGE_ERROR, inventory_error
from cluster_accept.flows.exits import say as _say

if TYPE_CHECKING:
    from cluster_accept.analysis.calibration import NoiseTable
    from cluster_accept.remote.result import NodeResult

profile_app = typer.Typer(no_args_is_help=True, help="Profiles: suggest one from what the nodes have.")


class Device(str, enum.Enum):
    cuda = "cuda"
    cpu = "cpu"


def _progress(result: NodeResult) -> None:
    from cluster_accept.remote.result import NodeStatus

    if result.status is NodeStatus.OK:
        _say(f"{result.node}: read ({result.duration_s:.1f} s)")
    else:
        cause = f" ({result.cause.value})" if result.cause else ""
        _say(f"{result.node}: {result.status.value}{cause}")


DEFAULT_HISTORY = Path("runs/history")  # run's default: --out runs, its history beside the runs


def calibration_of(history: Path | None, cluster: str) -> NoiseTable | None:
    """The cluster's latest calibration in ``history`` (default: the run's default history, where it exists);
    a history named that does not exist is an error; a calibration that does not hold up is warned of and not
    used (:func:`analysis.calibration.latest_table`)."""
    from cluster_accept.analysis.calibration import latest_table

    if history is not None and not history.is_dir():
        raise ValueError(f"--history {history} is not a directory")
    found = latest_table(history or DEFAULT_HISTORY, cluster)
    if found is not None:
        _say(f"calibration {found.calibrated_at} of cluster {cluster} read from {history or DEFAULT_HISTORY}")
    return found


@profile_app.command("suggest")
def suggest(
    inventory: Annotated[Path, typer.Option("--inventory", "-i", help="inventory YAML file (how to reach the nodes)")],
    nodes: Annotated[str | None, typer.Option("--nodes", help="read only these nodes (hostlist)")] = None,
    device: Annotated[
        Device | None, typer.Option("--device", help="what the probes run on (default: cuda when nodes list GPUs)")
    ] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="nodes in flight at once")] = 64,
    history: Annotated[
        Path | None,
        typer.Option(
            "--history",
            help="history directory whose latest calibration of the cluster (cluster-accept calibrate) the profile "
            f"shows, with the margins it gives (default {DEFAULT_HISTORY}, where it exists)",
        ),
    ] = None,
) -> None:
    """Read driver, CUDA, GPUs, NVLink, PCIe, persistence mode, the NCCL environment and the probe interpreter
    from the nodes, and print a commented profile of what most of them have, marking where nodes disagree. With
    a calibration of the cluster in the history: each key figure's noise and margin, and the straggler_pct and
    noise_k it suggests."""
    from cluster_accept.inventory.hostlist import HostlistError
    from cluster_accept.inventory.load import InventoryError, select_nodes
    from cluster_accept.probes.base import load_checked_inventory
    from cluster_accept.tasks.preflight.suggest import read_cluster

    try:
        inv = load_checked_inventory(inventory)
        chosen = select_nodes(inv, nodes).tested
        calibration = calibration_of(history, inv.cluster)
    except InventoryError as exc:
        raise inventory_error(exc) from None
    except (ValueError, HostlistError) as exc:
        _say(f"error: {exc}")
        raise typer.Exit(USAGE_ERROR) from None
    if not chosen:
        _say("error: no node to read (all excluded, or --nodes names only excluded nodes)")
        raise typer.Exit(USAGE_ERROR)
    started = time.monotonic()
    reading = read_cluster(inv, chosen, concurrency, _progress)
    if not reading.models:
        _say(f"error: no node answered, so there is nothing to suggest ({len(reading.unread)} not read)")
        raise typer.Exit(NOT_ACCEPTED)
    _say(f"read {len(reading.models)} of {len(chosen)} nodes in {time.monotonic() - started:.1f} s")
    sys.stdout.write(reading.profile_text(device.value if device else None, calibration))
    sys.stdout.flush()
