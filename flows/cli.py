"""The ``cluster-accept`` command line.

Exit codes (:mod:`flows.exits`): 0 every tested node accepted; 1 any node rejected or unreachable; 2 a usage
or inventory error (printed without a traceback, naming the file and the key); 3 the tool itself failed (one
line on stderr, the traceback in ``OUT/cluster-accept-errors.log``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cluster_accept.analysis.text import visible
from cluster_accept.flows import testbed_commands
from cluster_accept.flows.exits import TOOL_FAILURE, USAGE_ERROR, failure_line, log_failure
from cluster_accept.flows.exits import inventory_error as _inventory_error
from cluster_accept.flows.exits import say as _say
from cluster_accept.flows.orphans import mark_controller, reap_orphans
from cluster_accept.flows.profile_commands import profile_app
from cluster_accept.inventory.hostlist import HostlistError, fold

if TYPE_CHECKING:
    from cluster_accept.flows.acceptance import RunOutcome
from cluster_accept.inventory.load import InventoryError, as_local, from_slurm_names, load_inventory
from cluster_accept.tasks.after_run import Operations

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Accept GPU clusters: check, probe, isolate, report."
)
inventory_app = typer.Typer(no_args_is_help=True, help="Inventory files.")
testbed_app = typer.Typer(no_args_is_help=True, help="A simulated cluster of real sshd nodes on this machine (root).")
app.add_typer(inventory_app, name="inventory")
app.add_typer(testbed_app, name="testbed")
app.add_typer(profile_app, name="profile")

out = Console()
err = Console(stderr=True)


def _quiet_prefect() -> None:
    """Defaults for an operator's terminal and air-gapped hosts; explicit settings win."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_LOGGING_TO_API_ENABLED", "false")
    # Prefect gives its ephemeral API 20 s to start; a busy controller, or a node checking itself while it
    # works, can need more, and a run that never starts checks nothing.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def _fail_usage(message: str) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}", highlight=False, markup=True, soft_wrap=True)
    return typer.Exit(USAGE_ERROR)


@inventory_app.command("check")
def inventory_check(path: Annotated[Path, typer.Argument(help="inventory YAML file")]) -> None:
    """Validate an inventory and print the nodes that would be tested, folded, per profile."""
    try:
        inventory = load_inventory(path)
    except InventoryError as exc:
        raise _inventory_error(exc) from None
    # Names come from the operator's file: never read as rich markup; control characters shown as escapes (rich
    # drops CR and BEL silently but passes ESC and NUL through to the terminal).
    table = Table(title=Text(visible(f"cluster {inventory.cluster}: {len(inventory.tested)} nodes to test")))
    table.add_column("profile")
    table.add_column("nodes")
    table.add_column("count", justify="right")
    by_profile: dict[str, list[str]] = {}
    for node in inventory.tested:
        by_profile.setdefault(node.profile_name, []).append(node.name)
    for profile, names in sorted(by_profile.items()):
        table.add_row(Text(visible(profile)), Text(visible(fold(names))), str(len(names)))
    out.print(table)
    if inventory.excluded:
        out.print(f"excluded: {fold(n.name for n in inventory.excluded)}", highlight=False, markup=False)


@dataclass
class RunRequest:
    """What ``run`` (and ``demo``) were asked to do."""

    inventory: Path | None
    out_dir: Path = Path("runs")
    nodes: str | None = None
    stages: list[str] | None = None
    concurrency: int = 64
    history: str | None = None
    resume: str | None = None
    suite: str | None = None
    operations: Operations = field(default_factory=Operations)
    slurm_nodes: str | None = None  # the nodes by their Slurm names (a job's SLURM_JOB_NODELIST)
    local: bool = False  # the one selected node is this machine: no SSH


def _check_request(request: RunRequest) -> None:
    """Every usage and inventory error before Prefect starts (~10 s), each as one clear line."""
    from cluster_accept.flows.acceptance import refuse_unresolved_auto, resolve_suite, resumable, select_nodes
    from cluster_accept.tasks.outputs import check_not_held

    if request.resume:
        if (
            request.inventory
            or request.nodes
            or request.stages
            or request.suite
            or request.slurm_nodes
            or request.local
        ):
            raise ValueError("--resume takes the interrupted run's inventory, nodes and stages: give only --out")
        if request.history or request.operations != Operations() or request.concurrency != RunRequest.concurrency:
            raise ValueError(
                "--resume restores the interrupted run's own options (--history, --drain, --resume-passing, "
                "--apply, --prometheus, --concurrency): give only --out"
            )
        resumable(request.out_dir, request.resume)
        check_not_held(request.out_dir / request.resume)
        return
    if request.inventory is None:
        raise ValueError("give --inventory FILE (or --resume RUN_ID to finish an interrupted run)")
    if request.slurm_nodes is not None:
        if request.nodes:
            raise ValueError("give --nodes or --slurm-nodes, not both")
        request.nodes = from_slurm_names(load_inventory(request.inventory), request.slurm_nodes)
    inventory = select_nodes(load_inventory(request.inventory), request.nodes)
    if request.local:
        as_local(inventory)
    refuse_unresolved_auto(inventory, resolve_suite(request.suite, request.stages)[0])
    why = unwritable(request.out_dir)
    if why:
        raise ValueError(f"cannot write run directories under {request.out_dir}: {why}")


def _run(request: RunRequest) -> int:
    from cluster_accept.flows import progress
    from cluster_accept.flows.acceptance import ResumeError, RunLocked, run_acceptance

    try:
        _check_request(request)
    except RunLocked as exc:
        _say(f"error: {exc}")
        return TOOL_FAILURE
    except ResumeError as exc:
        _say(f"error: {exc}")
        return USAGE_ERROR
    except InventoryError as exc:
        return _inventory_error(exc).exit_code
    except (ValueError, HostlistError) as exc:
        _say(f"error: {exc}")
        return USAGE_ERROR
    bars = progress.StageBars(out)
    try:
        with progress.use(bars):
            outcome = run_acceptance(
                request.inventory or "",
                request.out_dir,
                request.stages,
                request.nodes,
                concurrency=request.concurrency,
                history=request.history,
                resume=request.resume,
                suite=request.suite,
                operations=request.operations,
                local=request.local,
            )
    except RunLocked as exc:
        _say(f"error: {exc}")
        return TOOL_FAILURE
    except OSError as exc:  # the disk filled up or went read-only mid-run: what completed is on disk
        log = log_failure(exc, request.out_dir)
        _say(
            f"error: the run could not write its results: {exc}. What completed is kept; finish the run with "
            f"--resume RUN_ID --out {request.out_dir} once the disk is writable (traceback in {log})."
        )
        return TOOL_FAILURE
    except Exception as exc:  # noqa: BLE001 - the tool failed (Prefect's API, a bug): one line, the log
        _say(failure_line(exc, log_failure(exc, request.out_dir)))
        return TOOL_FAILURE
    finally:
        bars.close()
    _print_outcome(outcome)
    return outcome.exit_code


def unwritable(out_dir: Path) -> str | None:
    """Why run directories cannot be written under ``out_dir`` (None when they can): checked before any
    node is touched, so a read-only or full disk is one clear line, not a traceback after an hour."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _print_outcome(outcome: RunOutcome) -> None:
    from cluster_accept.analysis.verdicts import Verdict

    table = Table(title=Text(visible(f"run {outcome.run_id}")))
    for column in ("node", "verdict", "reasons"):
        table.add_column(column)
    for verdict in outcome.verdicts:
        if verdict.verdict != Verdict.ACCEPTED:
            table.add_row(Text(visible(verdict.node)), verdict.verdict.value, Text(visible(", ".join(verdict.reasons))))
    if table.row_count:
        out.print(table)
    out.print(
        f"accepted {outcome.count(Verdict.ACCEPTED)} / rejected {outcome.count(Verdict.REJECTED)} / "
        f"unreachable {outcome.count(Verdict.UNREACHABLE)} / skipped {outcome.count(Verdict.SKIPPED)}",
        highlight=False,
    )
    out.print(f"report: {outcome.run_dir / 'report.html'}", highlight=False, soft_wrap=True)
    failed_on = [v.node for v in outcome.verdicts if v.verdict == Verdict.TOOL_ERROR]
    if failed_on:
        said = f"error: cluster-accept failed on the controller for {fold(failed_on)} (tool:internal_error): "
        _say(said + "not judged, not drained; the traceback is in their rows")
    slurm = outcome.slurm
    if slurm.error:
        _say(f"slurm: nothing changed: {slurm.error}")
    if slurm.unknown:
        _say(f"slurm: not drained, Slurm does not know {fold(slurm.unknown)} (check slurm.node_names)")
    for node, why in slurm.kept:
        out.print(visible(f"slurm: {node} stays drained: {why}"), highlight=False, markup=False, soft_wrap=True)
    for action in slurm.actions:
        if action.exit_code is None and not action.applied:
            dry = visible(f"slurm (dry run, add --apply): {action.command}")
            out.print(dry, highlight=False, markup=False, soft_wrap=True)
        else:
            said = "done" if action.applied else f"failed (exit {action.exit_code}): {action.output}"
            out.print(visible(f"slurm: {action.command}: {said}"), highlight=False, markup=False, soft_wrap=True)


SUITE_HELP = (
    "light (preflight, short probes, a short burn), full (every stage) or burn (preflight and the burn-in), "
    "instead of --stages"
)


def _operations(drain: bool, resume_passing: bool, apply: bool, scontrol: str, prometheus: Path | None) -> Operations:
    return Operations(
        drain=drain,
        resume_passing=resume_passing,
        apply=apply,
        scontrol=scontrol,
        prometheus=str(prometheus) if prometheus else None,
    )


@app.command("run")
def run(
    inventory: Annotated[Path | None, typer.Option("--inventory", "-i", help="inventory YAML file")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="where run directories go")] = Path("runs"),
    nodes: Annotated[str | None, typer.Option("--nodes", help="test only these nodes (hostlist)")] = None,
    stages: Annotated[
        str | None, typer.Option("--stages", help="comma-separated: preflight,single-node,burn,multi-node")
    ] = None,
    suite: Annotated[str | None, typer.Option("--suite", help=SUITE_HELP)] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="nodes in flight at once")] = 64,
    history: Annotated[
        str | None, typer.Option("--history", help="history dataset directory (default OUT/history; '-' for none)")
    ] = None,
    resume: Annotated[
        str | None, typer.Option("--resume", help="finish the interrupted run RUN_ID under --out (no other input)")
    ] = None,
    drain: Annotated[bool, typer.Option("--drain", help="drain rejected/unreachable nodes in Slurm")] = False,
    resume_passing: Annotated[
        bool, typer.Option("--resume-passing", help="resume nodes cluster-accept drained that pass now")
    ] = False,
    apply: Annotated[bool, typer.Option("--apply", help="run the Slurm commands (default: print them)")] = False,
    scontrol: Annotated[str, typer.Option("--scontrol", help="the scontrol to use")] = "scontrol",
    prometheus: Annotated[
        Path | None, typer.Option("--prometheus", help="write a node_exporter textfile-collector file")
    ] = None,
    slurm_nodes: Annotated[
        str | None,
        typer.Option("--slurm-nodes", help='test these nodes, by Slurm name (e.g. "$SLURM_JOB_NODELIST")'),
    ] = None,
    local: Annotated[
        bool, typer.Option("--local", help="the one selected node is this machine: check it without SSH")
    ] = False,
) -> None:
    """Run the acceptance stages and write DIR/<run_id>/ (run.json, Parquet, report, summary.json); append to
    the history.

    A run killed mid-way is finished with --resume RUN_ID: nodes and stages already done are not run again."""
    stage_list = [s.strip() for s in stages.split(",") if s.strip()] if stages else None
    ops = _operations(drain, resume_passing, apply, scontrol, prometheus)
    request = RunRequest(inventory, out_dir, nodes, stage_list, concurrency, history, resume, suite, ops)
    request.slurm_nodes, request.local = slurm_nodes, local
    raise typer.Exit(_run(request))


@app.command("serve")
def serve(
    inventory: Annotated[Path, typer.Option("--inventory", "-i", help="inventory YAML file")],
    cron: Annotated[str, typer.Option("--cron", help='schedule, e.g. "0 */6 * * *"')],
    suite: Annotated[str, typer.Option("--suite", help="light, full or burn")] = "light",
    out_dir: Annotated[Path, typer.Option("--out", help="where run directories go")] = Path("runs"),
    name: Annotated[str | None, typer.Option("--name", help="deployment name (default CLUSTER-SUITE)")] = None,
    history: Annotated[str | None, typer.Option("--history", help="history dataset directory")] = None,
    drain: Annotated[bool, typer.Option("--drain", help="drain rejected/unreachable nodes in Slurm")] = False,
    resume_passing: Annotated[bool, typer.Option("--resume-passing", help="resume nodes we drained")] = False,
    apply: Annotated[bool, typer.Option("--apply", help="run the Slurm commands (default: print them)")] = False,
    scontrol: Annotated[str, typer.Option("--scontrol", help="the scontrol to use")] = "scontrol",
    prometheus: Annotated[Path | None, typer.Option("--prometheus", help="textfile-collector file")] = None,
) -> None:
    """Serve the acceptance flow as a Prefect deployment on a schedule (runs until interrupted)."""
    from cluster_accept.flows.schedule import serve_deployment

    ops = _operations(drain, resume_passing, apply, scontrol, prometheus)
    try:
        request = RunRequest(inventory, out_dir, suite=suite, history=history, operations=ops)
        _check_request(request)
        serve_deployment(inventory, cron, suite, out_dir, name, history, ops)
    except InventoryError as exc:
        raise _inventory_error(exc) from None
    except (ValueError, HostlistError) as exc:
        raise _fail_usage(str(exc)) from None


@app.command("bisect")
def bisect_command(
    inventory: Annotated[Path, typer.Option("--inventory", "-i", help="inventory YAML file")],
    nodes: Annotated[str, typer.Option("--nodes", help="suspect nodes (hostlist), e.g. from a slow job")],
    good: Annotated[str | None, typer.Option("--good", help="nodes known to be good, used as partners")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="where run directories go")] = Path("runs"),
    history: Annotated[
        str | None, typer.Option("--history", help="history dataset directory (default OUT/history; '-' for none)")
    ] = None,
) -> None:
    """Isolate the slow node(s) among suspects with multi-node all-reduce rounds; writes a run directory."""
    from cluster_accept.flows.acceptance import bisect, refuse_unresolved_auto, select_nodes

    try:
        inv = load_inventory(inventory)
        refuse_unresolved_auto(select_nodes(inv, nodes), [])
        if good:
            select_nodes(inv, good)
    except InventoryError as exc:
        raise _inventory_error(exc) from None
    except (ValueError, HostlistError) as exc:
        raise _fail_usage(str(exc)) from None
    outcome = bisect(inventory_path=str(inventory), suspects=nodes, good=good, out_dir=str(out_dir), history=history)
    _print_outcome(outcome)
    raise typer.Exit(outcome.exit_code)


testbed_app.command("up")(testbed_commands.testbed_up)
testbed_app.command("down")(testbed_commands.testbed_down)


@app.command("demo")
def demo(
    out_dir: Annotated[Path, typer.Option("--out", help="where the run directory goes")] = Path("runs"),
    name: testbed_commands.DemoName = None,
    state_dir: testbed_commands.StateDir = None,
) -> None:
    """Bring up an 8-node test-bed of its own with planted faults, accept it, print the report path, take it
    down (that test-bed only)."""
    from cluster_accept.testbed.bed import down

    bed = testbed_commands.demo_testbed(name, state_dir)
    try:
        code = _run(RunRequest(bed.inventory_path, out_dir))
    finally:
        down(bed.state_dir, bed.prefix)
    raise typer.Exit(code)


def main() -> None:
    _quiet_prefect()
    mark_controller()
    reaped = reap_orphans()
    if reaped:
        said = f"stopped {len(reaped)} Prefect API server(s) left by a killed controller (pids {reaped})"
        _say(said)
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the tool failed: one line here, the traceback in the log
        _say(failure_line(exc, log_failure(exc, None)))
        sys.exit(TOOL_FAILURE)


if __name__ == "__main__":
    main()
