"""``cluster-accept testbed up|down`` and the test-bed of ``cluster-accept demo``.

:mod:`flows.cli` registers the commands. Every test-bed has a name (``--name``); test-beds of different
names run side by side, and a running one is never replaced: an ``up`` onto its name is a usage error
(exit 2) that says how to take it down.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cluster_accept.flows.exits import console

if TYPE_CHECKING:
    from cluster_accept.testbed.bed import Testbed

DEMO_FAULTS = Path(__file__).resolve().parent.parent / "testbed" / "demo-faults.yaml"
TESTBED = "cluster_accept.testbed"  # not in the product's wheel
PACKAGE_DIR = Path(__file__).resolve().parent.parent  # this installation's cluster_accept/
USAGE_ERROR = 2
StateDir = Annotated[
    Path | None, typer.Option("--state-dir", help="state dir (default /tmp/cluster-accept-testbed-NAME)")
]
DemoName = Annotated[str | None, typer.Option("--name", help="test-bed name (default: demo and 4 random hex digits)")]


def _usage_error(exc: Exception) -> typer.Exit:
    console(stderr=True).print(f"error: {exc}", highlight=False, markup=False, soft_wrap=True)
    return typer.Exit(USAGE_ERROR)


def require_testbed() -> None:
    """Exit 2 where the test-bed is not installed: it comes with the source checkout, not the product's wheel."""
    if not (PACKAGE_DIR / "testbed" / "__init__.py").is_file():
        said = f"the test-bed ({TESTBED}) is not installed: it comes with the source checkout (pip install -e .)"
        raise _usage_error(RuntimeError(said))


def testbed_up(
    nodes: Annotated[int, typer.Option("--nodes", min=1, max=1000, help="number of simulated nodes")] = 8,
    faults: Annotated[Path | None, typer.Option("--faults", help="fault plan YAML")] = None,
    name: Annotated[
        str, typer.Option("--name", help="test-bed name, the prefix of its namespaces and interfaces (1-10 a-z0-9)")
    ] = "ca",
    state_dir: StateDir = None,
    subnet: Annotated[str | None, typer.Option("--subnet", help="the nodes' subnet (default: a free one)")] = None,
    rails: Annotated[
        int, typer.Option("--rails", min=0, max=8, help="rail networks per node, each with a simulated HCA")
    ] = 0,
    slurm: Annotated[
        bool, typer.Option("--slurm", help="also run a real Slurm: munged and slurmctld here, slurmd in every node")
    ] = False,
    health_check: Annotated[
        Path | None, typer.Option("--health-check", help="with --slurm: Slurm's HealthCheckProgram for every node")
    ] = None,
) -> None:
    """Start N simulated GPU nodes (network namespaces with real sshd) and write their inventory.

    Test-beds of different --name run side by side; a running test-bed of the same name is never replaced.
    With --slurm, Slurm's clients reach the test-bed's Slurm with the SLURM_CONF printed at the end."""
    require_testbed()
    from cluster_accept.testbed.bed import TestbedError, up
    from cluster_accept.testbed.faults import load_fault_plan
    from cluster_accept.testbed.slurm import SlurmBedError

    try:
        if health_check is not None and not slurm:
            raise ValueError("--health-check needs --slurm")
        program = str(health_check.resolve()) if health_check else None
        plan = load_fault_plan(faults) if faults else None
        bed = up(nodes, plan, state_dir, name, subnet, rails=rails, slurm_on=slurm, health_check=program)
    except (TestbedError, SlurmBedError, ValueError) as exc:
        raise _usage_error(exc) from None
    console().print(bed.summary(), highlight=False, markup=False, soft_wrap=True)


def testbed_down(
    name: Annotated[str | None, typer.Option("--name", help="test-bed name (default: ca)")] = None,
    state_dir: Annotated[
        Path | None, typer.Option("--state-dir", help="its state dir (default: where it recorded it)")
    ] = None,
) -> None:
    """Stop the test-bed's simulated nodes and remove its namespaces, bridge and state; no other test-bed's."""
    require_testbed()
    from cluster_accept.testbed.bed import TestbedError, down
    from cluster_accept.testbed.claim import name_to_take_down

    try:
        prefix = name_to_take_down(name, state_dir)
    except (TestbedError, ValueError) as exc:
        raise _usage_error(exc) from None
    down(state_dir, prefix)
    console().print(f"test-bed {prefix} down", highlight=False, markup=False)


def demo_testbed(name: str | None, state_dir: Path | None) -> Testbed:
    """The demo's own 8-node test-bed with planted faults (a fresh name unless given); exit 2 when it cannot
    be brought up, e.g. because a test-bed of that name is running."""
    require_testbed()
    from cluster_accept.testbed.bed import TestbedError, up
    from cluster_accept.testbed.claim import demo_name
    from cluster_accept.testbed.faults import load_fault_plan
    from cluster_accept.testbed.net import check_name

    name = name or demo_name()
    if importlib.util.find_spec("torch") is None:
        console(stderr=True).print(
            f"warning: torch is not installed for {sys.executable}: the demo's nodes run their probes with it, so "
            "preflight will reject them (probe:torch_missing). Install the CPU build: "
            "python3 -m pip install 'torch==2.13.0+cpu'",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    try:
        check_name(name)
        console().print(
            f"starting the 8-node test-bed {name} (real sshd in network namespaces) with planted faults...",
            highlight=False,
            markup=False,
        )
        return up(8, load_fault_plan(DEMO_FAULTS), state_dir, name)
    except (TestbedError, ValueError) as exc:
        raise _usage_error(exc) from None
