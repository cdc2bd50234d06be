"""The ``cluster-accept`` command line.

Exit codes (:mod:`flows.exits`): 0 every tested node accepted; 1 any node rejected or unreachable; 2 a usage
or inventory error (printed without a traceback, naming the file and the key), or no node to test (every
selected node excluded); 3 the tool itself failed (one line on stderr, the traceback in
``OUT/cluster-accept-errors.log``).

Each command imports what it uses when it runs (Prefect, pandas, the inventory's models …), so that ``--help``
starts with typer alone and a node's own check (:mod:`.check_command`, before every job) with its own modules.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cluster_accept.flows import testbed_commands
from cluster_accept.flows.check_command import check
from cluster_accept.flows.exits import TOOL_FAILURE, USAGE_ERROR, console, failure_line, log_failure
from cluster_accept.flows.exits import inventory_error as _inventory_error
from cluster_accept.flows.exits import say as _say
from cluster_accept.flows.exits import usage_error as _fail_usage
from cluster_accept.flows.orphans import mark_controller, reap_orphans
from cluster_accept.flows.profile_commands import profile_app
from cluster_accept.flows.watch_command import arm_command, watch_command
from cluster_accept.ops.defaults import DEFAULT_MAX_DRAIN_FRACTION, FAIL_SHARE, FAIL_STREAK, FAIL_WINDOW

if TYPE_CHECKING:
    import pandas as pd

    from cluster_accept.flows.run_request import RunRequest, ShardRequest
    from cluster_accept.ops.after_run import Operations


def _root() -> typer.Typer:
    """The command line's root: the whole one's, or a node's own check's alone (:func:`_app_for`)."""
    return typer.Typer(
        add_completion=False, no_args_is_help=True, help="Accept GPU clusters: check, probe, isolate, report."
    )


app = _root()
inventory_app = typer.Typer(no_args_is_help=True, help="Inventory files.")
testbed_app = typer.Typer(no_args_is_help=True, help="A simulated cluster of real sshd nodes on this machine (root).")
app.add_typer(inventory_app, name="inventory")
app.add_typer(testbed_app, name="testbed")
app.add_typer(profile_app, name="profile")
app.command("watch")(watch_command)
app.command("arm")(arm_command)


def _quiet_prefect() -> None:
    """Defaults for an operator's terminal and air-gapped hosts; explicit settings win."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_LOGGING_TO_API_ENABLED", "false")
    # Prefect gives its ephemeral API 20 s to start; a busy controller, or a node checking itself while it
    # works, can need more, and a run that never starts checks nothing.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


@inventory_app.command("check")
def inventory_check(path: Annotated[Path, typer.Argument(help="inventory YAML file")]) -> None:
    """Validate an inventory and print the nodes that would be tested, folded, per profile."""
    from rich.table import Table
    from rich.text import Text

    from cluster_accept.inventory.hostlist import fold
    from cluster_accept.inventory.load import InventoryError
    from cluster_accept.probes.base import load_checked_inventory
    from cluster_accept.vocabulary.text import visible

    try:
        inventory = load_checked_inventory(path)
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
    console().print(table)
    if inventory.excluded:
        console().print(f"excluded: {fold(n.name for n in inventory.excluded)}", highlight=False, markup=False)


def _run(request: RunRequest) -> int:
    from cluster_accept.flows import progress
    from cluster_accept.flows.exits import keep_run_tracebacks_off_the_console
    from cluster_accept.flows.outcome_text import print_outcome
    from cluster_accept.flows.run_request import check_request, outcome_of
    from cluster_accept.inventory.hostlist import HostlistError
    from cluster_accept.inventory.load import InventoryError
    from cluster_accept.rundir.outputs import ResumeError, RunLocked
    from cluster_accept.rundir.run import NothingToTest

    try:
        check_request(request)
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
    keep_run_tracebacks_off_the_console()
    bars = progress.StageBars(console())
    try:
        with progress.use(bars):
            outcome = outcome_of(request)
    except RunLocked as exc:
        _say(f"error: {exc}")
        return TOOL_FAILURE
    except NothingToTest as exc:  # the inventory changed between the check and the run
        _say(f"error: {exc}")
        return USAGE_ERROR
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
    print_outcome(outcome)
    return outcome.exit_code


SUITE_HELP = (
    "light (preflight, short probes, a short burn), full (every stage) or burn (preflight and the burn-in), "
    "instead of --stages"
)


DrainOption = Annotated[bool, typer.Option("--drain", help="drain rejected/unreachable nodes in Slurm")]
ApplyOption = Annotated[bool, typer.Option("--apply", help="run the Slurm commands (default: print them)")]
ScontrolOption = Annotated[str, typer.Option("--scontrol", help="the scontrol to use")]
MaxDrainOption = Annotated[
    int | None,
    typer.Option("--max-drain", min=0, help="drain at most N nodes (default: 10% of the tested nodes, at least 1)"),
]
MaxDrainFractionOption = Annotated[
    float, typer.Option("--max-drain-fraction", min=0.0, max=1.0, help="drain at most this share of the tested nodes")
]
ForceOption = Annotated[
    bool, typer.Option("--force", help="drain every rejected node, past the breaker (recorded in run.json)")
]
FailStreakOption = Annotated[
    int,
    typer.Option(
        "--fail-streak",
        min=1,
        help="drain a node rejected for relative findings only (a straggler, a figure below its floor) once it "
        "failed N consecutive runs (1: at once; a hard fault always drains at once)",
    ),
]
FailShareOption = Annotated[
    float, typer.Option("--fail-share", max=1.0, help="... or once it failed this share of its last --fail-window runs")
]
FailWindowOption = Annotated[int, typer.Option("--fail-window", min=1, help="the runs --fail-share counts")]
ResumePassingOption = Annotated[
    bool, typer.Option("--resume-passing", help="resume nodes cluster-accept drained that pass now")
]
PrometheusOption = Annotated[
    Path | None, typer.Option("--prometheus", help="write a node_exporter textfile-collector file")
]


def _operations(
    drain: bool,
    resume_passing: bool,
    apply: bool,
    scontrol: str,
    prometheus: Path | None,
    breaker: tuple[int | None, float, bool] = (None, DEFAULT_MAX_DRAIN_FRACTION, False),
    repeats: tuple[int, float, int] = (FAIL_STREAK, FAIL_SHARE, FAIL_WINDOW),
) -> Operations:
    """The run's operations; ``breaker``: (--max-drain, --max-drain-fraction, --force); ``repeats``:
    (--fail-streak, --fail-share, --fail-window), when a relative finding drains (ops.repeats)."""
    max_drain, fraction, force = breaker
    streak, share, window = repeats
    if (max_drain is not None or force) and not drain:
        raise _fail_usage("--max-drain and --force go with --drain")
    if fraction <= 0:
        raise _fail_usage("--max-drain-fraction must be above 0 (use --max-drain 0 to drain nothing)")
    if share <= 0 or window < streak:
        raise _fail_usage("--fail-share must be above 0, and --fail-window at least --fail-streak")
    from cluster_accept.ops.after_run import Operations

    return Operations(
        drain=drain,
        resume_passing=resume_passing,
        apply=apply,
        scontrol=scontrol,
        prometheus=str(prometheus) if prometheus else None,
        max_drain_fraction=fraction,
        max_drain=max_drain,
        force=force,
        fail_streak=streak,
        fail_share=share,
        fail_window=window,
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
    drain: DrainOption = False,
    resume_passing: ResumePassingOption = False,
    apply: ApplyOption = False,
    max_drain: MaxDrainOption = None,
    max_drain_fraction: MaxDrainFractionOption = DEFAULT_MAX_DRAIN_FRACTION,
    force: ForceOption = False,
    fail_streak: FailStreakOption = FAIL_STREAK,
    fail_share: FailShareOption = FAIL_SHARE,
    fail_window: FailWindowOption = FAIL_WINDOW,
    scontrol: ScontrolOption = "scontrol",
    prometheus: PrometheusOption = None,
    slurm_nodes: Annotated[
        str | None,
        typer.Option("--slurm-nodes", help='test these nodes, by Slurm name (e.g. "$SLURM_JOB_NODELIST")'),
    ] = None,
    local: Annotated[
        bool, typer.Option("--local", help="the one selected node is this machine: check it without SSH")
    ] = False,
    shard_by: Annotated[
        str | None, typer.Option("--shard-by", help="split the run by this node label (rack, pod) over Prefect workers")
    ] = None,
    work_pool: Annotated[
        str | None, typer.Option("--work-pool", help="the work pool whose workers run the shards")
    ] = None,
    queue_per_shard: Annotated[
        bool, typer.Option("--queue-per-shard", help="send each shard to the work queue named after its label value")
    ] = False,
    shard_start_wait: Annotated[
        float, typer.Option("--shard-start-wait", min=1, help="seconds a shard may wait for a worker")
    ] = 900.0,
) -> None:
    """Run the acceptance stages and write DIR/<run_id>/ (run.json, Parquet, report, summary.json); append to
    the history.

    A run killed mid-way is finished with --resume RUN_ID: nodes and stages already done are not run again."""
    from cluster_accept.flows.run_request import RunRequest

    stage_list = [s.strip() for s in stages.split(",") if s.strip()] if stages else None
    breaker, repeats = (max_drain, max_drain_fraction, force), (fail_streak, fail_share, fail_window)
    ops = _operations(drain, resume_passing, apply, scontrol, prometheus, breaker, repeats)
    request = RunRequest(inventory, out_dir, nodes, stage_list, concurrency, history, resume, suite, ops)
    request.slurm_nodes, request.local = slurm_nodes, local
    request.shards = _shards(shard_by, work_pool, queue_per_shard, shard_start_wait)
    raise typer.Exit(_run(request))


def _shards(by: str | None, work_pool: str | None, queue_per_shard: bool, start_wait: float) -> ShardRequest | None:
    """``run --shard-by LABEL``'s sharding; --work-pool and --queue-per-shard without it are a usage error."""
    from cluster_accept.flows.run_request import ShardRequest

    if by is not None:
        return ShardRequest(by, work_pool, queue_per_shard, start_wait)
    if work_pool or queue_per_shard:
        raise _fail_usage("--work-pool and --queue-per-shard go with --shard-by LABEL")
    return None


@app.command("serve")
def serve(
    inventory: Annotated[Path, typer.Option("--inventory", "-i", help="inventory YAML file")],
    cron: Annotated[str, typer.Option("--cron", help='schedule, e.g. "0 */6 * * *"')],
    suite: Annotated[str, typer.Option("--suite", help="light, full or burn")] = "light",
    out_dir: Annotated[Path, typer.Option("--out", help="where run directories go")] = Path("runs"),
    name: Annotated[str | None, typer.Option("--name", help="deployment name (default CLUSTER-SUITE)")] = None,
    history: Annotated[str | None, typer.Option("--history", help="history dataset directory")] = None,
    drain: DrainOption = False,
    resume_passing: Annotated[bool, typer.Option("--resume-passing", help="resume nodes we drained")] = False,
    apply: ApplyOption = False,
    max_drain: MaxDrainOption = None,
    max_drain_fraction: MaxDrainFractionOption = DEFAULT_MAX_DRAIN_FRACTION,
    drain_window: Annotated[
        float, typer.Option("--drain-window", min=0.01, help="hours over which the runs together drain no more")
    ] = 24.0,
    fail_streak: FailStreakOption = FAIL_STREAK,
    fail_share: FailShareOption = FAIL_SHARE,
    fail_window: FailWindowOption = FAIL_WINDOW,
    scontrol: ScontrolOption = "scontrol",
    prometheus: Annotated[Path | None, typer.Option("--prometheus", help="textfile-collector file")] = None,
) -> None:
    """Serve the acceptance flow as a Prefect deployment on a schedule (runs until interrupted). The drain
    breaker's limit holds over --drain-window hours of runs, not each run alone; a node rejected for relative
    findings only (a straggler, a figure below its floor) is drained once they repeat (--fail-streak,
    --fail-share, --fail-window), one with a hard fault at once."""
    from cluster_accept.flows.run_request import RunRequest, check_request
    from cluster_accept.flows.schedule import serve_deployment
    from cluster_accept.inventory.hostlist import HostlistError
    from cluster_accept.inventory.load import InventoryError

    breaker, repeats = (max_drain, max_drain_fraction, False), (fail_streak, fail_share, fail_window)
    ops = _operations(drain, resume_passing, apply, scontrol, prometheus, breaker, repeats)
    ops.drain_window_h = drain_window
    try:
        request = RunRequest(inventory, out_dir, suite=suite, history=history, operations=ops)
        check_request(request)
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
    from cluster_accept.flows.acceptance import bisect
    from cluster_accept.flows.exits import keep_run_tracebacks_off_the_console
    from cluster_accept.flows.outcome_text import print_outcome
    from cluster_accept.inventory.hostlist import HostlistError
    from cluster_accept.inventory.load import InventoryError
    from cluster_accept.probes.base import load_checked_inventory
    from cluster_accept.rundir.run import BisectChoices

    try:
        BisectChoices(inventory, nodes, good).selection(load_checked_inventory)  # the refusals bisect begins with
    except InventoryError as exc:
        raise _inventory_error(exc) from None
    except (ValueError, HostlistError) as exc:
        raise _fail_usage(str(exc)) from None
    keep_run_tracebacks_off_the_console()
    outcome = bisect(inventory_path=str(inventory), suspects=nodes, good=good, out_dir=str(out_dir), history=history)
    print_outcome(outcome)
    raise typer.Exit(outcome.exit_code)


@app.command("calibrate")
def calibrate_command(
    inventory: Annotated[Path, typer.Option("--inventory", "-i", help="inventory YAML file")],
    runs: Annotated[int, typer.Option("--runs", min=2, help="A=A runs to make (each figure measured K times)")] = 5,
    stages: Annotated[
        str | None, typer.Option("--stages", help="comma-separated, as run takes them (default: single-node)")
    ] = None,
    nodes: Annotated[
        str | None, typer.Option("--nodes", help="the trusted nodes to calibrate on (hostlist; default: every node)")
    ] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="where run directories go")] = Path("runs"),
    history: Annotated[
        str | None, typer.Option("--history", help="history dataset directory (default OUT/history)")
    ] = None,
) -> None:
    """Measure the cluster's noise: K ordinary runs on trusted nodes, each figure's spread across them, the p95 per
    GPU model, metric and size tier written to the history, where later runs widen their relative margins by it.
    Prints each row's margin and the false rejections it costs per run at the inventory's size."""
    from cluster_accept.flows.calibrate import CalibrationRequest, calibrate

    stage_list = [s.strip() for s in stages.split(",") if s.strip()] if stages else None
    request = CalibrationRequest(inventory, runs, stage_list, nodes, out_dir, history)
    raise typer.Exit(calibrate(request, _run, console()))


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
    testbed_commands.require_testbed()
    from cluster_accept.flows.run_request import RunRequest
    from cluster_accept.testbed.bed import down

    bed = testbed_commands.demo_testbed(name, state_dir)
    try:
        code = _run(RunRequest(bed.inventory_path, out_dir))
    finally:
        down(bed.state_dir, bed.prefix)
    raise typer.Exit(code)


@app.command("history")
def history_command(
    history: Annotated[Path, typer.Option("--history", help="the history dataset directory (OUT/history)")],
    cluster: Annotated[str | None, typer.Option("--cluster", help="the cluster (needed when it holds several)")] = None,
    runs: Annotated[int, typer.Option("--runs", min=2, help="read the cluster's last N runs")] = 10,
    min_bad: Annotated[int, typer.Option("--min-bad", min=1, help="a repeat offender failed K of them")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="print the tables as JSON (--format json)")] = False,
    lemons: Annotated[
        bool, typer.Option("--lemons", help="only the lemon nodes, ranked: leave them out of big jobs")
    ] = False,
    output: Annotated[str, typer.Option("--format", help="table, json or hostlist (the lemons, folded)")] = "table",
    min_score: Annotated[float, typer.Option("--min-score", min=0, max=1, help="lemons scoring this or more")] = 0.0,
    inventory: Annotated[
        Path | None, typer.Option("--inventory", "-i", help="--format hostlist: only nodes of this inventory")
    ] = None,
) -> None:
    """The fleet over its recent runs: repeat offenders, flaky checks and figures sliding down; with --lemons the
    nodes likeliest to fail a large job, ranked (--format hostlist: one folded line for a scheduler's exclude, of
    the lemons that are host names, and nodes of --inventory when given; any other name is named on stderr, left
    out of the line; exit 0 either way)."""
    import json

    from cluster_accept.analysis.fleet import read_fleet
    from cluster_accept.analysis.history_files import HistoryFiles
    from cluster_accept.probes.base import discover as discover_probes

    output = "json" if as_json else output
    if output not in ("table", "json", "hostlist") or (output == "hostlist" and not lemons):
        raise _fail_usage(f"--format {output!r}: give table, json or hostlist (hostlist with --lemons)")
    if inventory is not None and output != "hostlist":
        raise _fail_usage("--inventory: only with --lemons --format hostlist (the nodes its line may name)")
    files = HistoryFiles(history)  # a file that does not read is skipped with a warning and set aside
    clusters = sorted({run.cluster for run in files.cluster_runs()})
    if not clusters:
        raise _fail_usage(f"{history} holds no run (is it a history directory, OUT/history?)")
    if cluster is None and len(clusters) > 1:
        raise _fail_usage(f"{history} holds several clusters ({', '.join(clusters)}): give --cluster")
    name = cluster or clusters[0]
    rules = {metric: rule for probe in discover_probes() for metric, rule in probe.metrics.items()}
    fleet = read_fleet(files, name, rules, runs, min_bad)
    tables = {"repeat_offenders": fleet.offenders, "flaky_checks": fleet.flaky, "drifting_figures": fleet.drifting}
    if lemons:
        tables = {"lemons": fleet.lemons[fleet.lemons["score"] >= min_score]}
    if output == "hostlist":
        _print_lemon_line([str(node) for node in tables["lemons"]["node"]], inventory)
        return
    if output == "json":
        print(json.dumps({k: v.to_dict("records") for k, v in tables.items()}, default=str, indent=1))
        return
    console().print(f"{name}: the last {fleet.runs} runs", highlight=False)
    _print_tables(tables)


def _print_tables(tables: dict[str, pd.DataFrame]) -> None:
    """The fleet's tables, each titled by its name (its values never read as rich markup), or ``NAME: none``."""
    from rich.table import Table
    from rich.text import Text

    from cluster_accept.vocabulary.text import visible

    for title, frame in tables.items():
        table = Table(title=title.replace("_", " "), title_justify="left")
        for column in frame.columns:
            table.add_column(str(column))
        for record in frame.itertuples(index=False):
            table.add_row(*(Text(visible(str(value))) for value in record))
        console().print(table if len(frame) else f"{title.replace('_', ' ')}: none", highlight=False)


def _print_lemon_line(lemons: list[str], inventory: Path | None) -> None:
    """The lemons' one line for a scheduler (``sbatch --exclude=…``) on stdout: only the names that are nodes
    (:func:`analysis.lemons.scheduler_line`); each name left out is said on stderr, as text, never in the line."""
    from cluster_accept.analysis.lemons import scheduler_line
    from cluster_accept.inventory.load import InventoryError
    from cluster_accept.probes.base import load_checked_inventory

    nodes = None
    if inventory is not None:
        try:
            nodes = {node.name for node in load_checked_inventory(inventory).nodes}
        except InventoryError as exc:
            raise _inventory_error(exc) from None
    found = scheduler_line(lemons, nodes)
    for name, why in found.apart:
        _say(f"history: lemon {name!r} left out of the hostlist: {why}")
    print(found.line)


app.command("check")(check)


def _app_for(args: list[str]) -> typer.Typer:
    """The command line, or for a node's own check (``check …``, before every job) the same root holding that
    command alone: it parses, helps and refuses as the whole one does, without building every other command."""
    if not _is_node_check(args):
        return app
    alone = _root()
    alone.callback()(_no_options)  # a callback keeps the root a group: ``check`` stays its subcommand
    alone.command("check")(check)
    return alone


def _is_node_check(args: list[str]) -> bool:
    """``check …``: a node checking itself before a job, whose start is the job's."""
    return args[:1] == ["check"]


def _no_options() -> None:
    """The root takes no option of its own."""


def main() -> None:
    _quiet_prefect()
    # No pydantic plug-in (an observability package's) watches this tool's models; left on, pydantic reads every
    # installed distribution's entry points at the first model, tens of milliseconds of a node's own check.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    mark_controller()
    if not _is_node_check(sys.argv[1:]):  # a node's own check starts no Prefect server, so it has none to reap
        reaped = reap_orphans()
        if reaped:
            said = f"stopped {len(reaped)} Prefect API server(s) left by a killed controller (pids {reaped})"
            _say(said)
    try:
        _app_for(sys.argv[1:])()
    except KeyboardInterrupt:
        console(stderr=True).print("interrupted")
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the tool failed: one line here, the traceback in the log
        _say(failure_line(exc, log_failure(exc, None)))
        sys.exit(TOOL_FAILURE)


if __name__ == "__main__":
    main()
