"""``launcher: slurm``: multi-node runs started by Slurm's ``srun`` instead of torchrun over SSH.

Each group gets an allocation of exactly its nodes — the one the operator holds (cluster-accept run inside
``sbatch``/``salloc``: ``SLURM_JOB_ID`` is set and must cover the group) or one made here with ``salloc
--no-shell`` and cancelled afterwards — then two steps: a one-task step on the first node that picks a free
rendezvous port, and the run itself, one task per node (:mod:`remote.srun_script`). Every node runs the same
``torchrun`` line as under the SSH launcher, so the figures, logs and rows are the same; only what can go
wrong in Slurm is new, and it is named on the node it concerns: a node Slurm would not allocate, a task that
did not start there, a step that ran past its time.

Groups of one round run at once (they are disjoint), each in a thread of its own waiting on its srun.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from cluster_accept.inventory.hostlist import HostlistError, expand
from cluster_accept.inventory.model import Node
from cluster_accept.remote.batch import output_limit, taken_in
from cluster_accept.remote.channel import Keep, Kept
from cluster_accept.remote.fanout import tool_error_detail
from cluster_accept.remote.launch import (
    GroupJob,
    GroupRun,
    RankRun,
    killed_at_timeout,
    rendezvous_address,
)
from cluster_accept.remote.local import finished, pump
from cluster_accept.remote.probe_dir import PROBES_DIR
from cluster_accept.remote.rank_end import rank_done
from cluster_accept.remote.result import CommandResult, NodeStatus, RemoteCommand
from cluster_accept.remote.shell import port_command
from cluster_accept.remote.srun_script import (
    CHDIR,
    EndsKept,
    TaskKept,
    TaskOutput,
    granted_job,
    probe_script,
    salloc_argv,
    split_tasks,
    srun_argv,
    srun_errors_for,
)
from cluster_accept.vocabulary.secrets import MaskedText, mask_secrets
from cluster_accept.vocabulary.text import keep_tail

SLURM_TIMEOUT_S = 120.0  # salloc, scancel and the port step: Slurm answers these in seconds
SLURM_TEXT_CHARS = 4 * 1024 * 1024  # of Slurm's own answers (sinfo over every node), and of each end of a stderr
STOP_WAIT_S = 15.0


class Stream(Protocol):
    """A step's stdout as it is kept while it arrives."""

    def feed(self, data: bytes) -> None: ...

    def text(self) -> str: ...


@dataclass
class Allocation:
    job_id: str = ""
    ours: bool = False  # made here: cancelled when the group is done
    error: str = ""
    culprits: tuple[str, ...] = ()  # Slurm names of the nodes that kept it from being granted


class Live:
    """What one launch has running in Slurm (srun processes, allocations it made), so that a launch the
    controller abandons (an interrupt, an error) stops its steps and gives its allocations back at once
    instead of leaving them to their time limit."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.procs: set[subprocess.Popen[bytes]] = set()
        self.jobs: set[str] = set()
        self.stopping = False  # set once: nothing new starts

    def stop_all(self) -> None:
        with self.lock:
            self.stopping = True
            procs, jobs = list(self.procs), list(self.jobs)
        for proc in procs:
            _interrupt(proc)
        for job_id in jobs:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=SLURM_TIMEOUT_S, check=False)


def _interrupt(proc: subprocess.Popen[bytes]) -> None:
    """srun (``--quit-on-interrupt``) ends its step on an interrupt; salloc and the rest end on it too."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)


def _run(
    argv: Sequence[str],
    timeout_s: float,
    stdin: str | None = None,
    live: Live | None = None,
    out: Stream | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client; on the timeout it is interrupted (srun then ends its step) and reaped. A launch being
    abandoned starts nothing new. Its streams are kept as they arrive, never read whole first: stdout as ``out``
    keeps it (a step's tasks, :class:`~remote.srun_script.TaskKept`; else Slurm's own answer, up to
    :data:`SLURM_TEXT_CHARS`), stderr its start and end. What it said on stderr (Slurm's words, a node's among
    them) is masked here, where it enters the controller; its stdout, a step's tasks, is taken in per task
    (:func:`_task_run`)."""
    if live is not None and live.stopping:
        return subprocess.CompletedProcess(list(argv), None, "", "cluster-accept: the launch was abandoned")  # type: ignore[arg-type]
    proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if live is not None:
        with live.lock:
            live.procs.add(proc)
            if live.stopping:
                _interrupt(proc)
    kept = out if out is not None else Kept(Keep(SLURM_TEXT_CHARS))
    err = EndsKept(SLURM_TEXT_CHARS, SLURM_TEXT_CHARS)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    streams = [_write(proc.stdin, (stdin or "").encode()), pump(proc.stdout, kept), pump(proc.stderr, err)]
    try:
        if finished(proc, streams, timeout_s):
            return subprocess.CompletedProcess(list(argv), proc.returncode, kept.text(), mask_secrets(err.text()))
        _interrupt(proc)
        if not finished(proc, streams, STOP_WAIT_S):
            proc.kill()
            proc.wait()
            for stream in streams:
                stream.join()
        said = mask_secrets(err.text()) + f"\ncluster-accept: {argv[0]} ran past {timeout_s:.0f} s and was stopped"
        return subprocess.CompletedProcess(list(argv), None, kept.text(), said)  # type: ignore[arg-type]
    finally:
        if live is not None:
            with live.lock:
                live.procs.discard(proc)


def _write(pipe: IO[bytes], data: bytes) -> threading.Thread:
    """A started thread writing ``data`` to ``pipe`` and closing it (a client that exits first is no error)."""

    def run() -> None:
        try:
            with pipe:
                pipe.write(data)
        except (BrokenPipeError, ValueError):
            pass

    thread = threading.Thread(target=run, name="ca-srun-stdin", daemon=True)
    thread.start()
    return thread


def _held_allocation(slurm_names: Sequence[str]) -> Allocation | None:
    """The allocation this process runs in (SLURM_JOB_ID), when there is one; an error when it lacks nodes."""
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    try:
        held = set(expand(os.environ.get("SLURM_JOB_NODELIST", "")))
    except HostlistError:
        held = set()
    missing = tuple(n for n in slurm_names if n not in held)
    if missing:
        return Allocation(job_id, error=f"not in the held allocation {job_id}: {', '.join(missing)}", culprits=missing)
    return Allocation(job_id)


UNAVAILABLE = ("down", "drain", "fail", "unk", "maint", "reserved", "not_responding", "inval", "future")


def unavailable(slurm_names: Sequence[str]) -> dict[str, str]:
    """Slurm name -> state for the nodes Slurm would not allocate now (down, drained, failing, unknown)."""
    done = _run(["sinfo", "-h", "-N", "-n", ",".join(slurm_names), "-o", "%N %T"], SLURM_TIMEOUT_S)
    states = dict(line.split(maxsplit=1) for line in done.stdout.splitlines() if len(line.split()) == 2)
    missing = {name: "unknown to Slurm" for name in slurm_names if name not in states}
    bad = {n: s for n, s in states.items() if n in slurm_names and any(w in s.lower() for w in UNAVAILABLE)}
    return {**missing, **bad} if done.returncode == 0 else {}


def allocate(nodes: Sequence[Node], tag: str, live: Live | None = None) -> Allocation:
    """The held allocation, or a new one of exactly these nodes (``salloc --no-shell``)."""
    names = [n.slurm_node for n in nodes]
    held = _held_allocation(names)
    if held is not None:
        return held
    profile = nodes[0].profile
    gpus = profile.gpu.count if profile.gpu is not None and profile.probes.device == "cuda" else None
    argv = salloc_argv(names, profile.probes.slurm, f"cluster-accept-{tag}", gpus)
    done = _run(argv, profile.probes.slurm.allocation_wait_s + SLURM_TIMEOUT_S, live=live)
    job_id = granted_job(done.stderr)
    if job_id is not None and live is not None:
        with live.lock:
            live.jobs.add(job_id)
    if job_id is not None and done.returncode != 0:
        release(Allocation(job_id, ours=True), live)  # granted, then salloc failed: never keep it
    if done.returncode != 0 or job_id is None:
        said = keep_tail(" ".join(done.stderr.split()), 500) or f"exit {done.returncode}"
        states = unavailable(names)
        if states:
            named = ", ".join(f"{n} is {s}" for n, s in states.items())
            return Allocation(error=f"Slurm cannot allocate it: {named} (salloc: {said})", culprits=tuple(states))
        return Allocation(error=f"salloc refused {','.join(names)}: {said}")
    return Allocation(job_id, ours=True)


def release(allocation: Allocation, live: Live | None = None) -> str:
    """Cancel an allocation made here (tried twice); what went wrong, empty when it is gone."""
    if not (allocation.ours and allocation.job_id):
        return ""
    said = ""
    for _ in range(2):
        done = subprocess.run(["scancel", allocation.job_id], capture_output=True, text=True, timeout=SLURM_TIMEOUT_S)
        if done.returncode == 0:
            said = ""
            break
        said = f"scancel {allocation.job_id} failed (exit {done.returncode}): {mask_secrets(done.stderr.strip())}"
    if live is not None and not said:
        with live.lock:
            live.jobs.discard(allocation.job_id)
    return said


def _port(job_id: str, master: Node, live: Live | None = None) -> int | str:
    """A free port on the first node, from a one-task step there; or why there is none."""
    argv = [
        "srun", f"--jobid={job_id}", "--nodes=1", "--ntasks=1", f"--nodelist={master.slurm_node}", "--overlap",
        CHDIR, "/bin/sh", "-c", port_command(master.profile.probes.python),
    ]  # fmt: skip
    done = _run(argv, SLURM_TIMEOUT_S, live=live)
    text = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode != 0 or not (text.isascii() and text.isdigit()):
        return f"could not pick a free port on {master.name} through srun: {keep_tail(done.stderr.strip(), 400)}"
    return int(text)


def _file_bytes(files: Sequence[str]) -> dict[str, bytes]:
    return {Path(name).name: (PROBES_DIR / name).read_bytes() for name in files}


def _not_started(
    run: GroupRun, nodes: Sequence[Node], why: str, at: Sequence[str] = (), status: NodeStatus = NodeStatus.ERROR
) -> None:
    """The run never started: each node named in ``at`` carries ``why``; the rest say which node stopped it.
    ``status``: ``TOOL_ERROR`` where it is no finding about the nodes (Slurm did not grant the allocation)."""
    for node in nodes:
        detail = why if (not at or node.name in at) else f"not started because of {', '.join(at)}: {why}"
        run.ranks[node.name] = RankRun(node.name, status, None, detail)
    run.detail = why


def _step(job: GroupJob, nodes: Sequence[Node], run: GroupRun, job_id: str, live: Live | None = None) -> None:
    """The run itself, in ``job_id``: one task per node, each with its own node's command."""
    port = _port(job_id, nodes[0], live)
    if isinstance(port, str):
        _not_started(run, nodes, port, [nodes[0].name])
        return
    master, world = rendezvous_address(nodes[0]), len(nodes)
    commands = {n.slurm_node: job.command(n, i, world, master, port, run.tag) for i, n in enumerate(nodes)}
    script = probe_script(_file_bytes(job.files), {k: (c.script, c.timeout_s) for k, c in commands.items()})
    longest = max((c.timeout_s or 3600.0) for c in commands.values())
    minutes = int(longest // 60) + 2
    settings = nodes[0].profile.probes.slurm
    argv = srun_argv(job_id, [n.slurm_node for n in nodes], settings, minutes)
    began = time.monotonic()
    tasks_kept = TaskKept(max(output_limit(c) for c in commands.values()))
    done = _run(argv, longest + SLURM_TIMEOUT_S, script, live, tasks_kept)
    elapsed_s = time.monotonic() - began
    tasks = split_tasks(done.stdout)
    for node in nodes:
        task = tasks.get(node.slurm_node)
        if task is None:
            said = srun_errors_for(done.stderr, node.slurm_node) or keep_tail(done.stderr.strip(), 400)
            detail = f"srun did not start it: {said}" if said else "srun did not start it"
            run.ranks[node.name] = RankRun(node.name, NodeStatus.ERROR, None, detail)
            continue
        run.ranks[node.name] = _task_run(node, commands[node.slurm_node], task, done.returncode is None, elapsed_s)


def _task_run(node: Node, command: RemoteCommand, task: TaskOutput, step_stopped: bool, elapsed_s: float) -> RankRun:
    """One task's end as a rank's: timed out at 124, or at 137 once its time was up (a 137 sooner is a kill on
    the node); without an exit status it was stopped — by us at the step's time limit, else by srun for another
    task's bad exit — and complete nonetheless when it had printed that it finished its work."""
    code = task.exit_code
    stdout = taken_in(command, "\n".join(task.lines) + "\n")  # where it enters the controller
    limit = command.timeout_s or 3600.0  # as the step's time limit takes it (_step)
    timed_out = killed_at_timeout(code, elapsed_s, limit) or (code is None and step_stopped)
    result = CommandResult(command.name, code, stdout, MaskedText(""), timed_out=timed_out)
    if code is not None:
        return RankRun(node.name, NodeStatus.OK, None, "", result)
    if rank_done(stdout):
        return RankRun(node.name, NodeStatus.OK, None, "stopped after it finished its work", result, stopped=True)
    if step_stopped:
        return RankRun(node.name, NodeStatus.ERROR, None, "ran past its time and was stopped", result)
    return RankRun(node.name, NodeStatus.ERROR, None, "stopped with the run", result, stopped=True)


def launch_group(job: GroupJob, nodes: Sequence[Node], run: GroupRun, live: Live | None = None) -> None:
    """Allocate, run and release one group; every outcome is recorded in ``run``, never raised.

    Slurm not granting the allocation is not a finding about the nodes (another job holds them, an
    administrator drained one, the account or QOS is wrong): the group is not judged (a tool error, never
    drained), each node saying what Slurm said of it."""
    allocation = Allocation()
    try:
        allocation = allocate(nodes, run.tag, live)
        if allocation.error:
            culprits = [n.name for n in nodes if n.slurm_node in allocation.culprits]
            _not_started(run, nodes, allocation.error, culprits, NodeStatus.TOOL_ERROR)
            return
        _step(job, nodes, run, allocation.job_id, live)
    except Exception as exc:  # noqa: BLE001 - the controller's failure is data, never the nodes' fault
        for node in nodes:
            run.ranks[node.name] = RankRun(node.name, NodeStatus.TOOL_ERROR, None, tool_error_detail(exc))
    finally:
        left = release(allocation, live)
        if left:
            run.detail = f"{run.detail}; {left}" if run.detail else left


class SrunLauncher:
    """The :class:`~remote.launch.Launcher` of ``srun`` in a Slurm allocation: every group at once (disjoint
    groups), at most ``workers`` allocations at a time; abandoned (an interrupt), every step is stopped and every
    allocation made here cancelled before the exception goes on."""

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def launch(self, groups: Sequence[Sequence[Node]], runs: Sequence[GroupRun], job: GroupJob) -> None:
        live = Live()
        pool = ThreadPoolExecutor(max_workers=max(1, min(self.workers, len(groups))), thread_name_prefix="ca-srun")
        try:
            list(pool.map(lambda nodes, run: launch_group(job, nodes, run, live), groups, runs))
        except BaseException:
            live.stop_all()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
