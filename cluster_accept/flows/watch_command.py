"""The ``watch`` command: its options, checked before Prefect starts, and its one-line outcome per finding.

Exit codes (:mod:`flows.exits`): 0 nothing named, 1 a node named (confirmed or not), 2 a usage or inventory
error, 3 the tool failed."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cluster_accept.flows.exits import ACCEPTED, NOT_ACCEPTED, TOOL_FAILURE, USAGE_ERROR, inventory_error
from cluster_accept.flows.exits import say as _say
from cluster_accept.watch.places import DEFAULT_WATCH_DIR, SHIM_DIR

if TYPE_CHECKING:
    from cluster_accept.watch.arming import NodeVersions
    from cluster_accept.watch.request import WatchRequest, WatchSpec


def watch_command(
    inventory: Annotated[Path, typer.Option("--inventory", "-i", help="inventory YAML file")],
    nodes: Annotated[str | None, typer.Option("--nodes", help="the job's nodes (hostlist of inventory names)")] = None,
    slurm_job: Annotated[str | None, typer.Option("--slurm-job", help="watch this Slurm job's nodes")] = None,
    job: Annotated[str | None, typer.Option("--job", help="the job's name (CA_WATCH_JOB; a Slurm job: its id)")] = None,
    job_user: Annotated[
        str | None, typer.Option("--job-user", help="the job's user, name or uid (Slurm's by default): only its files")
    ] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="where the watch's directory goes")] = Path("runs"),
    watch_dir: Annotated[
        str, typer.Option("--watch-dir", help="the CA_WATCH_DIR the job was armed with ({node}: the node's name)")
    ] = DEFAULT_WATCH_DIR,
    interval: Annotated[float, typer.Option("--interval", min=0.5, help="seconds between reads")] = 5.0,
    for_s: Annotated[float, typer.Option("--for", min=0, help="seconds to watch (0: one read)")] = 600.0,
    window: Annotated[float, typer.Option("--window", min=1, help="seconds of collectives judged")] = 60.0,
    hang_after: Annotated[
        float, typer.Option("--hang-after", min=1, help="seconds without a completed collective that make a hang")
    ] = 120.0,
    ras_port: Annotated[
        int, typer.Option("--ras-port", min=0, max=65535, help="the port of NCCL's RAS on the nodes (0: not asked)")
    ] = 28028,
    until_named: Annotated[bool, typer.Option("--until-named", help="stop once a node is named")] = False,
    retest: Annotated[bool, typer.Option("--retest/--no-retest", help="re-test a named node")] = True,
    retest_wait: Annotated[
        float, typer.Option("--retest-wait", min=0, help="seconds a re-test waits for the job to leave the nodes")
    ] = 600.0,
    drain: Annotated[bool, typer.Option("--drain", help="drain a node whose re-test confirmed it")] = False,
    apply: Annotated[bool, typer.Option("--apply", help="run the Slurm commands (default: print them)")] = False,
    max_drain: Annotated[int | None, typer.Option("--max-drain", min=0, help="drain at most N nodes")] = None,
    scontrol: Annotated[str, typer.Option("--scontrol", help="the scontrol to use")] = "scontrol",
    history: Annotated[str | None, typer.Option("--history", help="history directory ('-' for none)")] = None,
    prometheus: Annotated[Path | None, typer.Option("--prometheus", help="textfile-collector file")] = None,
    cron: Annotated[
        str | None, typer.Option("--cron", help="serve it as a Prefect deployment on this schedule instead")
    ] = None,
) -> None:
    """Watch a running job from its nodes: name the node behind a dead rank, a hang or a straggler, re-test it
    against its peers, and drain it only when the re-test confirms it. Writes OUT/<id>/ (Parquet, watch.html,
    watch.prom). With --cron, each scheduled run is such a watch (until interrupted)."""
    from cluster_accept.ops.after_run import Operations

    operations = Operations(
        drain=drain, apply=apply, scontrol=scontrol, max_drain=max_drain, fail_streak=1,
        prometheus=str(prometheus.resolve()) if prometheus else None,
    )  # fmt: skip
    fields = dict(
        inventory=inventory.resolve(), nodes=nodes, slurm_job=slurm_job, job=job, job_user=job_user,
        out_dir=out_dir.resolve(), watch_dir=watch_dir, interval_s=interval, for_s=for_s, window_s=window,
        hang_after_s=hang_after, until_named=until_named, retest=retest, retest_wait_s=retest_wait,
        operations=operations, history=history, ras_port=ras_port,
    )  # fmt: skip
    spec, request = _resolve(fields)
    if cron is not None:
        _serve(spec, cron, request.inventory.cluster, request.job)
        return
    _watch_once(spec, request.job, len(request.nodes))


def _resolve(fields: dict[str, Any]) -> tuple[WatchSpec, WatchRequest]:
    """The watch's spec and what it resolves to: every usage and inventory error before Prefect starts (exit 2)."""
    from cluster_accept.inventory.hostlist import HostlistError
    from cluster_accept.inventory.load import InventoryError
    from cluster_accept.watch.request import WatchSpec, resolve

    try:
        spec = WatchSpec(**fields)
        return spec, resolve(spec)
    except InventoryError as exc:
        raise inventory_error(exc) from None
    except (ValueError, HostlistError) as exc:
        _say(f"error: {exc}")
        raise typer.Exit(USAGE_ERROR) from None


def _serve(spec: WatchSpec, cron: str, cluster: str, job: str) -> None:
    from cluster_accept.flows.schedule import serve_watch

    try:
        serve_watch(spec, cron, cluster, job)
    except ValueError as exc:
        _say(f"error: {exc}")
        raise typer.Exit(USAGE_ERROR) from None


def _watch_once(spec: WatchSpec, job: str, nodes: int) -> None:
    from cluster_accept.flows.watch import watch

    try:
        outcome = watch(spec)
    except Exception as exc:  # noqa: BLE001 - the tool failed: one line
        _say(f"error: the watch failed: {type(exc).__name__}: {exc}")
        raise typer.Exit(TOOL_FAILURE) from None
    for finding in outcome.named:
        _say(f"{finding.status.value}: {finding.owner_line} [{finding.action or 'not re-tested'}]")
    _say(f"watched {job} on {nodes} nodes for {outcome.rounds} reads: {outcome.run_dir}")
    raise typer.Exit(NOT_ACCEPTED if outcome.named else ACCEPTED)


def _local_versions() -> NodeVersions:
    """This machine's torch and NCCL, as the job's Python would report them (a Slurm TaskProlog runs here)."""
    import shutil

    from cluster_accept.watch.arming import NodeVersions

    try:
        import torch

        nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
        found: str | None = torch.__version__
    except (ImportError, RuntimeError, AttributeError):
        found, nccl = None, None
    return NodeVersions(socket.gethostname(), found, nccl, None, shutil.which("g++") is not None)


def arm_command(
    watch_dir: Annotated[str, typer.Option("--watch-dir", help="CA_WATCH_DIR on the node")] = DEFAULT_WATCH_DIR,
    shim_dir: Annotated[str, typer.Option("--shim-dir", help="where the shim (sitecustomize.py) is on the node")] = str(
        SHIM_DIR
    ),
    local: Annotated[bool, typer.Option("--local", help="read torch's and NCCL's versions here")] = False,
    torch_version: Annotated[str | None, typer.Option("--torch", help="the job's torch version")] = None,
    nccl_version: Annotated[str | None, typer.Option("--nccl", help="the job's NCCL version")] = None,
    inspector: Annotated[str | None, typer.Option("--inspector", help="a built Inspector plugin (.so)")] = None,
    output: Annotated[str, typer.Option("--format", help="env, taskprolog, srun or pod")] = "taskprolog",
    job: Annotated[str, typer.Option("--job", help="the job's name (srun, pod, env)")] = "job",
    nccl_timing: Annotated[
        bool, typer.Option("--nccl-timing/--no-nccl-timing", help="time each NCCL collective (GPU stragglers)")
    ] = True,
    nccl_diagnostics: Annotated[
        bool, typer.Option("--nccl-diagnostics", help="NCCL's checks at each communicator's creation (2.31 on)")
    ] = False,
) -> None:
    """Print what arms a job for ``watch`` without touching its code: a Slurm TaskProlog, an srun --export, a
    pod's env, or NAME=value lines; each signal the node's versions cannot give is said on stderr. The job's
    name is held to one rule in every format (:func:`watch.arming.safe_job`), so that what is printed is safe
    to paste and to source."""
    from cluster_accept.watch.arming import (
        ArmSettings,
        NodeVersions,
        arm_node,
        env_lines,
        pod_env,
        safe_job,
        srun_export,
        taskprolog_script,
    )

    versions = _local_versions() if local else NodeVersions("node", torch_version, nccl_version, inspector, False)
    if local and inspector:
        versions = NodeVersions(versions.node, versions.torch, versions.nccl, inspector, versions.compiler)
    try:
        job = safe_job(job)  # a TaskProlog takes the job's id from Slurm, but the same name is refused there too
        settings = ArmSettings(watch_dir, shim_dir, nccl_timing=nccl_timing, nccl_diagnostics=nccl_diagnostics)
        plan = arm_node(versions, settings, job)
        text = {
            "taskprolog": lambda: taskprolog_script(plan),
            "srun": lambda: srun_export(plan, job) + "\n",
            "pod": lambda: pod_env(plan, job),
            "env": lambda: env_lines(plan, job),
        }[output]()
    except KeyError:
        _say(f"error: --format {output!r}: give env, taskprolog, srun or pod")
        raise typer.Exit(USAGE_ERROR) from None
    except ValueError as exc:
        _say(f"error: {exc}")
        raise typer.Exit(USAGE_ERROR) from None
    for row in plan.coverage:
        if not row.available:
            _say(f"{row.signal} unavailable: {row.detail}")
    typer.echo(text, nl=False)
