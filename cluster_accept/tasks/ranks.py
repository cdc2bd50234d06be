"""One rank of a multi-node run: its ``torchrun`` command, and the short SSH operations on its node (a free
port for the rendezvous, the detached start, one poll) that the launcher (:mod:`tasks.launcher`) schedules.

Each operation ends as data, never as an exception: the rank's node unreachable or lost mid-session
(``session_lost``), the node refusing a copy (``error``), or the controller failing (``tool_error``: never a
fact about the node).
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster_accept.analysis.nccl_log import nccl_transports
from cluster_accept.analysis.probe_output import parse_json_lines
from cluster_accept.analysis.rank_failures import rank_done, rank_end
from cluster_accept.inventory.model import Node, Rail
from cluster_accept.probes.scripts import gpu_count, job_env
from cluster_accept.probes.training import ranks_per_node, train_arguments
from cluster_accept.remote.detached import PollAnswer, poll_detached
from cluster_accept.remote.fanout import tool_error_detail
from cluster_accept.remote.result import (
    CommandResult,
    NodeRefused,
    NodeStatus,
    RemoteCommand,
    SessionLost,
    UnreachableCause,
)
from cluster_accept.remote.sessions import SessionCache
from cluster_accept.remote.ssh import Unreachable
from cluster_accept.tasks.probe_dir import ProbeDirError, start_in_probe_dir
from cluster_accept.vocabulary.text import keep_head

CPU_BYTES = 1 << 20  # gloo over a test-bed's veths: one size, small enough for a rate-limited link
_PORT_SCRIPT = 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'


# A rank that failed has peers that fail seconds later, of the lost connection: both launchers give them this long
# to end of themselves before the run is stopped, so that the failed rank's own end (its signal, its last lines)
# is read rather than cut short by the stop, and its peers' ends show them as its victims (analysis.rank_failures).
FAILURE_GRACE_S = 15


def killed_at_timeout(exit_code: int | None, ran_s: float, limit_s: float) -> bool:
    """Whether a rank's status is the node-side timeout's: 124 (its TERM), or 137 (its KILL) once the rank's time
    was up — a 137 sooner is a kill on the node (the OOM killer, an operator), the rank's own failure."""
    return exit_code == 124 or (exit_code == 137 and ran_s >= limit_s)


@dataclass
class RankRun:
    """One node's part of a group run. ``stopped``: ended (or never started) because the run was stopped for
    another rank's failure, so its own end says nothing about its node."""

    node: str
    status: NodeStatus
    cause: str | None = None
    detail: str = ""
    result: CommandResult | None = None
    stopped: bool = False

    @property
    def completed(self) -> bool:
        """Every process of the node printed that it finished the run (``rank_done``), whatever came after."""
        return self.result is not None and rank_done(self.result.stdout)

    @property
    def ok(self) -> bool:
        """The node did its part: exit 0, or it finished its work before a teardown error (:attr:`teardown_error`)."""
        return self.status is NodeStatus.OK and self.result is not None and (self.result.ok or self.completed)

    @property
    def said(self) -> str:
        """How this rank ended, in a few words: never a bare missing exit status."""
        result = self.result
        if self.cause is not None:
            return f"unreachable ({self.cause})"
        if self.ok:
            return "finished its part" + (" (then a teardown error)" if self.teardown_error else "")
        if result is None or self.stopped:
            return self.detail or "stopped with the run"
        if result.timed_out:
            return "killed at the probe timeout"
        return rank_end(result.exit_code, result.stdout + "\n" + result.stderr).why

    @property
    def teardown_error(self) -> bool:
        """Finished its work, then did not exit cleanly: a warning, never a failure of the run."""
        return self.completed and self.result is not None and not self.result.ok


@dataclass
class GroupRun:
    nodes: tuple[str, ...]
    tag: str
    ranks: dict[str, RankRun] = field(default_factory=dict)
    measurements: list[dict[str, Any]] = field(default_factory=list)
    transports: dict[str, int] = field(default_factory=dict)
    stdout: str = ""  # the first rank's output, for the job's own parser
    detail: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.ranks) and all(r.ok for r in self.ranks.values()) and bool(self.measurements)

    @property
    def busbw_gbps(self) -> float | None:
        """All-reduce bus bandwidth at the largest message size; None when the run did not complete."""
        return self.busbw_of("allreduce_busbw_gbps")

    def busbw_of(self, metric: str) -> float | None:
        """``metric`` (a collective's bus bandwidth) at its largest size; None when the run did not complete or
        did not measure it."""
        figures = [m for m in self.measurements if m.get("metric") == metric]
        if not self.ok or not figures:
            return None
        return float(max(figures, key=lambda m: m.get("size") or 0)["value"])


def summarize(run: GroupRun, nodes: Sequence[Node], job: GroupJob) -> None:
    """The figures from the first rank's log, transports from every rank's log, and why a failed run failed
    (whichever launcher started it)."""
    first = run.ranks.get(nodes[0].name)
    if first is not None and first.result is not None:
        run.measurements, run.stdout = parse_json_lines(first.result.stdout).measurements, first.result.stdout
    for rank_run in run.ranks.values():
        if rank_run.result is not None:
            for transport, count in nccl_transports(rank_run.result.stdout).items():
                run.transports[transport] = run.transports.get(transport, 0) + count
    if not run.ok:
        failed = [f"{n}: {r.said}" for n, r in run.ranks.items() if not r.ok]
        run.detail = keep_head("; ".join(failed), 2000) or run.detail or f"no {job.name} figure"


RankCommand = Callable[[Node, int, int, str, int, str], RemoteCommand]


@dataclass(frozen=True)
class GroupJob:
    """What a group run starts on each node: the probe files it ships, each rank's command (node, node rank,
    nodes, rendezvous address, port, tag) and the fewest nodes it runs on."""

    name: str
    files: tuple[str, ...]
    command: RankCommand
    min_nodes: int = 2
    collective: bool = False  # runs the collectives script: the stage records its figures and transports
    check: str = "allreduce"  # the check its rows are under (a failed run, a rank's teardown warning)


def rendezvous_address(master: Node) -> str:
    return "127.0.0.1" if master.is_local else master.connect_host


def torchrun_rank(
    node: Node,
    count: str,
    rank: int,
    world: int,
    master_addr: str,
    port: int,
    script: str,
    env: Mapping[str, str] | None = None,
) -> str:
    """One node's ``torchrun`` of a run across ``world`` nodes: ``count`` (``n=…; ``) processes running
    ``script`` (the file and its arguments); NCCL's log on (it names the transport between nodes), gloo on the
    profile's socket interface on CPU, the rendezvous given up after ``probes.rendezvous_timeout_s``; ``env``
    over those (a rail's GPU and NIC)."""
    probes = node.profile.probes
    python = shlex.quote(probes.python)
    run = f"{probes.command_prefix} " if probes.command_prefix else ""
    extra = {"NCCL_DEBUG": "INFO"}
    ifname = node.profile.nccl_env.get("NCCL_SOCKET_IFNAME")
    if probes.device == "cpu" and ifname:
        extra["GLOO_SOCKET_IFNAME"] = ifname
    extra.update(env or {})
    wait = int(probes.rendezvous_timeout_s)
    variables = job_env(node, **extra)  # after the prefix, so they reach ranks inside a container too
    return (
        f'cd "$CA_PROBE_DIR" && {count}exec {run}{variables}{python} -m torch.distributed.run --nnodes={world} '
        f"--nproc_per_node=$n --node_rank={rank} --master_addr={shlex.quote(master_addr)} --master_port={port} "
        f"--rdzv-conf=timeout={wait} {script} --init-timeout-s {wait} 2>&1"
    )


def _sizes(node: Node, cpu_bytes: int = CPU_BYTES, cpu_repeats: int = 2) -> str:
    probes = node.profile.probes
    if probes.device == "cuda":
        return f"--min-bytes {1 << 20} --max-bytes {probes.allreduce_max_bytes or 1 << 30}"
    return f"--min-bytes {cpu_bytes} --max-bytes {cpu_bytes} --repeats {cpu_repeats}"


def rank_command(node: Node, rank: int, world: int, master_addr: str, port: int, tag: str) -> RemoteCommand:
    probes = node.profile.probes
    count = gpu_count(node) if probes.device == "cuda" else "n=1; "
    script = f"allreduce.py --device {probes.device} --label inter_node --tag {shlex.quote(tag)} {_sizes(node)}"
    line = torchrun_rank(node, count, rank, world, master_addr, port, script)
    return RemoteCommand("allreduce_inter", line, timeout_s=probes.timeout_s)


def collectives_rank_command(node: Node, rank: int, world: int, master_addr: str, port: int, tag: str) -> RemoteCommand:
    """All-reduce and the profile's other collectives across the nodes, every GPU of each."""
    probes = node.profile.probes
    count = gpu_count(node) if probes.device == "cuda" else "n=1; "
    ops = ",".join(["all_reduce", *probes.collectives])
    script = (
        f"allreduce.py --device {probes.device} --ops {ops} --label inter_node --tag {shlex.quote(tag)} {_sizes(node)}"
    )
    line = torchrun_rank(node, count, rank, world, master_addr, port, script)
    return RemoteCommand("collectives_inter", line, timeout_s=probes.timeout_s)


def rail_env(node: Node, rail: Rail) -> dict[str, str]:
    """What holds a rank to ``rail``: its GPU, NCCL to its HCA (and interface), gloo to its interface."""
    env = {}
    if node.profile.probes.device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = str(rail.gpu)
        if rail.nic:
            env["NCCL_IB_HCA"] = f"={rail.nic}"  # '=': exactly this HCA, not every name it prefixes
        if rail.ifname:
            env["NCCL_SOCKET_IFNAME"] = f"={rail.ifname}"
    if rail.ifname:
        env["GLOO_SOCKET_IFNAME"] = rail.ifname
    return env


# A rail's run on CPU: small enough, and timed once, so that a rail held to a few Mbit/s still ends in seconds.
RAIL_CPU_BYTES = 1 << 18


def rail_job(rail: Rail) -> GroupJob:
    """One rank per node on ``rail``'s GPU and NIC: the all-reduce of that rail alone across the nodes."""

    def command(node: Node, rank: int, world: int, master_addr: str, port: int, tag: str) -> RemoteCommand:
        probes = node.profile.probes
        script = (
            f"allreduce.py --device {probes.device} --label {rail.name} --tag {shlex.quote(tag)} "
            f"{_sizes(node, RAIL_CPU_BYTES, 1)}"
        )
        line = torchrun_rank(node, "n=1; ", rank, world, master_addr, port, script, rail_env(node, rail))
        return RemoteCommand(f"{rail.name}_inter", line, timeout_s=probes.timeout_s)

    return GroupJob(rail.name, ("allreduce.py",), command, collective=True, check="rails")


def training_rank_command(node: Node, rank: int, world: int, master_addr: str, port: int, tag: str) -> RemoteCommand:
    """One node's ranks of a training run across ``world`` nodes (the profile's model, every GPU)."""
    script = f"train_step.py {train_arguments(node, False)} --label inter_node --tag {shlex.quote(tag)}"
    line = torchrun_rank(node, ranks_per_node(node), rank, world, master_addr, port, script)
    return RemoteCommand("training_inter", line, timeout_s=node.profile.probes.timeout_s)


ALLREDUCE_JOB = GroupJob("allreduce", ("allreduce.py",), rank_command, collective=True)
COLLECTIVES_JOB = GroupJob("collectives", ("allreduce.py",), collectives_rank_command, collective=True)
TRAINING_JOB = GroupJob(
    "training", ("train_step.py", "allreduce.py"), training_rank_command, min_nodes=1, check="training_scaling"
)


def free_port(sessions: SessionCache, master: Node) -> int | RankRun:
    script = f"{shlex.quote(master.profile.probes.python)} -c {shlex.quote(_PORT_SCRIPT)}"
    try:
        answer = sessions.run(master, script, 60)
    except Exception as exc:  # noqa: BLE001 - the controller's failure is data, never the node's fault
        return RankRun(master.name, NodeStatus.TOOL_ERROR, None, tool_error_detail(exc))
    if isinstance(answer, Unreachable):
        return RankRun(master.name, NodeStatus.UNREACHABLE, answer.cause.value, answer.detail)
    code, out, err, _ = answer
    text = out.strip().splitlines()[-1] if out.strip() else ""
    if code != 0 or not (text.isascii() and text.isdigit()):
        return RankRun(master.name, NodeStatus.ERROR, None, f"could not pick a free port: {err.strip() or out}")
    return int(text)


def start_rank(
    sessions: SessionCache,
    node: Node,
    command: RemoteCommand,
    stopping: threading.Event,
    tag: str,
    files: tuple[str, ...] = ("allreduce.py",),
) -> tuple[str, int] | RankRun:
    """Probe directory, wrapper, detached start: (directory, wrapper pid), or why the rank did not start."""
    if stopping.is_set():
        return RankRun(node.name, NodeStatus.ERROR, None, "not started: the run was stopped", stopped=True)
    session, _ = sessions.take(node)
    if isinstance(session, Unreachable):
        return RankRun(node.name, NodeStatus.UNREACHABLE, session.cause.value, session.detail)
    try:
        started = start_in_probe_dir(session, node, files, command, tag)
    except (ProbeDirError, NodeRefused) as exc:
        sessions.give(node, session)
        return RankRun(node.name, NodeStatus.ERROR, None, str(exc))
    except SessionLost as lost:
        session.close()
        return RankRun(node.name, NodeStatus.UNREACHABLE, UnreachableCause.SESSION_LOST.value, lost.detail)
    except Exception as exc:  # noqa: BLE001 - the controller's failure is data, never the node's fault
        session.close()
        return RankRun(node.name, NodeStatus.TOOL_ERROR, None, tool_error_detail(exc))
    sessions.give(node, session)
    return started


def poll_rank(
    sessions: SessionCache, node: Node, remote_dir: str, pid: int, kill_pattern: str | None
) -> PollAnswer | Unreachable | RankRun | str:
    """:func:`~remote.detached.poll_detached`, with a failure of the controller's own as the rank's end."""
    try:
        return poll_detached(sessions, node, remote_dir, pid, kill_pattern)
    except Exception as exc:  # noqa: BLE001 - the controller's failure is data, never the node's fault
        return RankRun(node.name, NodeStatus.TOOL_ERROR, None, tool_error_detail(exc))


def refused(nodes: Sequence[Node], job: GroupJob) -> str:
    """Why a group cannot be launched at all; empty when it can."""
    if len(nodes) < job.min_nodes:
        return f"a multi-node run needs at least {job.min_nodes} nodes" if job.min_nodes > 1 else "no node to run on"
    return ""
