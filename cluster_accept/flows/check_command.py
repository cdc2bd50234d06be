"""The ``check`` command: a node checks itself (:mod:`flows.node_check`), the way a Slurm Prolog or
HealthCheckProgram runs it before every job.

Its time is the job's start, so this module imports only typer and what a usage error needs; the check's own
modules are imported when it runs, and none of Prefect, pandas, pyarrow or jinja2 (the report's templates) is
among them. :func:`flows.cli.main` runs it under a root holding it alone. Exit codes (:mod:`flows.exits`): 0
healthy, 1 not, 2 a usage or inventory error, 3 the tool failed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cluster_accept.flows.exits import inventory_error, usage_error
from cluster_accept.flows.exits import say as _say

if TYPE_CHECKING:
    from cluster_accept.inventory.model import Inventory
    from cluster_accept.ops.slurm import SlurmPlan

SITE_INVENTORY = "/etc/cluster-accept/inventory.yaml"


def check(
    local: Annotated[bool, typer.Option("--local", help="check this machine, without SSH (the only mode)")] = False,
    inventory: Annotated[
        Path | None,
        typer.Option("--inventory", "-i", help=f"inventory (default $CLUSTER_ACCEPT_INVENTORY, else {SITE_INVENTORY})"),
    ] = None,
    node: Annotated[
        str | None, typer.Option("--node", help="this machine's inventory name (default: SLURMD_NODENAME, hostname)")
    ] = None,
    prometheus: Annotated[
        Path | None, typer.Option("--prometheus", help="write the verdict as a node_exporter textfile")
    ] = None,
    drain: Annotated[bool, typer.Option("--drain", help="drain this node in Slurm when it fails")] = False,
    resume_passing: Annotated[
        bool, typer.Option("--resume-passing", help="resume it when cluster-accept drained it and it passes")
    ] = False,
    apply: Annotated[bool, typer.Option("--apply", help="run the Slurm commands (default: print them)")] = False,
    scontrol: Annotated[str, typer.Option("--scontrol", help="the scontrol to use")] = "scontrol",
    fresh: Annotated[
        bool, typer.Option("--fresh", help="start torch's CUDA now, not taken from the last good check of this boot")
    ] = False,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir",
            help="where this node's checks keep their marks between checks, so a kernel-log event is judged once "
            "(default $CLUSTER_ACCEPT_STATE_DIR, else /var/lib/cluster-accept for root, ~/.local/state/cluster-accept)",
        ),
    ] = None,
) -> None:
    """This node checks itself now, synchronously: the preflight on this machine, no SSH, no Prefect. Prints one
    line as Slurm's reason field takes it; exits 0 healthy, 1 not, 2 usage, 3 tool failure (a Slurm Prolog or
    HealthCheckProgram: docs/slurm.md)."""
    if not local:
        raise usage_error("check runs on the node it checks: give --local")
    from cluster_accept.flows.node_gather import start_check
    from cluster_accept.flows.node_marks import state_dir as marks_dir

    loaded, name = _this_node(inventory or Path(os.environ.get("CLUSTER_ACCEPT_INVENTORY") or SITE_INVENTORY), node)
    started = start_check(loaded, name, fresh)
    # imported while the node's commands run (flows.node_gather): the judgement's modules, the probes' causes
    from cluster_accept.flows.node_check import SlurmOps, finish_check, slurm_actions, write_prometheus

    run_id = f"check-{name}-{os.getpid()}"
    found = finish_check(started, run_id, marks_dir(state_dir, os.environ))
    print(found.reason_line, flush=True)
    for note in found.notes:
        _say(f"check: {note}")
    if prometheus is not None:
        write_prometheus(prometheus, found, loaded.cluster, run_id)
    if drain or resume_passing:
        slurm = slurm_actions(found, loaded.node(name).slurm_node, SlurmOps(drain, resume_passing, apply, scontrol))
        _say_slurm(slurm)
    raise typer.Exit(found.exit_code)


def _this_node(path: Path, node: str | None) -> tuple[Inventory, str]:
    """This node's part of the inventory at ``path`` and its name there; exit 2 on an inventory or usage error."""
    from cluster_accept.flows.node_gather import this_node
    from cluster_accept.inventory.hostlist import HostlistError
    from cluster_accept.inventory.load import InventoryError
    from cluster_accept.inventory.node_part import WantedNode
    from cluster_accept.probes.base import load_checked_inventory

    try:
        loaded = load_checked_inventory(path, WantedNode.for_check(node, os.environ))  # this node's part only
        return loaded, this_node(loaded, node, os.environ)
    except InventoryError as exc:
        raise inventory_error(exc) from None
    except (ValueError, HostlistError) as exc:
        raise usage_error(str(exc)) from None


def _say_slurm(slurm: SlurmPlan) -> None:
    """What a node's own check asked of Slurm, on stderr (stdout holds its one line)."""
    if slurm.error:
        _say(f"slurm: nothing changed: {slurm.error}")
    for node, why in slurm.kept:
        _say(f"slurm: {node} stays drained: {why}")
    for action in slurm.actions:
        done = "done" if action.applied else f"failed (exit {action.exit_code}): {action.output}"
        _say(f"slurm: {action.command}: {done if action.exit_code is not None else 'dry run, add --apply'}")
