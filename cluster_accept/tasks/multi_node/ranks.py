"""The jobs a multi-node run starts (each rank's ``torchrun`` command: the all-reduce, the collectives, one rail,
training), the run started on its groups by the profile's launcher (:func:`launch_groups`), and what the run
measured, read from its ranks' outputs (:func:`summarize`).
"""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Mapping, Sequence
from functools import cache
from types import MappingProxyType

from cluster_accept.analysis.nccl_log import nccl_transports
from cluster_accept.analysis.probe_output import parse_json_lines
from cluster_accept.inventory.model import Node, Rail
from cluster_accept.probes.base import unkept_by_any
from cluster_accept.probes.scripts import SETTINGS_FILE, gpu_count, job_env, settings_prelude
from cluster_accept.probes.training import TRAIN_STEP_SCRIPT, ranks_per_node, train_arguments
from cluster_accept.remote.launch import GroupJob, GroupRun, refused
from cluster_accept.remote.launchers import launcher_for
from cluster_accept.remote.result import RemoteCommand, Rendezvous
from cluster_accept.remote.ssh_launcher import DEFAULT_CONCURRENCY
from cluster_accept.vocabulary.text import keep_head

CPU_BYTES = 1 << 20  # gloo over a test-bed's veths: one size, small enough for a rate-limited link


@cache
def group_unkept() -> Mapping[str, tuple[type, ...]]:
    """What a group run's ranks may print beside a figure (every probe's run declares its own), gathered once per
    process: a multi-node stage reads hundreds of group runs, discovery need not walk the probes for each."""
    return MappingProxyType(unkept_by_any())


def summarize(run: GroupRun, nodes: Sequence[Node], job: GroupJob) -> None:
    """The figures from the first rank's log, and the lines of it that gave none (kept on the run, each a row of
    the group's: :func:`~cluster_accept.tasks.multi_node.group_rows.probe_error_rows`), transports from every
    rank's log, and why a failed run failed (whichever launcher started it)."""
    first = run.ranks.get(nodes[0].name)
    if first is not None and first.result is not None:
        parsed = parse_json_lines(first.result.stdout, group_unkept())
        run.measurements, run.stdout, run.errors = parsed.measurements, first.result.stdout, parsed.errors
    for rank_run in run.ranks.values():
        if rank_run.result is not None:
            for transport, count in nccl_transports(rank_run.result.stdout).items():
                run.transports[transport] = run.transports.get(transport, 0) + count
    if not run.ok:
        failed = [f"{n}: {r.said}" for n, r in run.ranks.items() if not r.ok] + run.errors
        run.detail = keep_head("; ".join(failed), 2000) or run.detail or f"no {job.name} figure"


def rendezvous_address(master: Node) -> str:
    return "127.0.0.1" if master.is_local else master.connect_host


def meeting(node: Node, rank: int, world: int, master_addr: str, port: int, tag: str) -> Rendezvous:
    """Where ``node``'s rank meets its peers, waiting ``probes.rendezvous_timeout_s`` for them."""
    return Rendezvous(world, rank, master_addr, port, tag, float(int(node.profile.probes.rendezvous_timeout_s)))


def torchrun_rank(
    name: str, node: Node, count: str, meet: Rendezvous, script: str, env: Mapping[str, str] | None = None
) -> RemoteCommand:
    """One node's ``torchrun`` of a run across ``meet.world`` nodes: ``count`` (``n=…; ``) processes running
    ``script`` (the file and its arguments, the run's tag among them); NCCL's log on (it names the transport
    between nodes), gloo on the profile's socket interface on CPU, the rendezvous given up after
    ``probes.rendezvous_timeout_s``; ``env`` over those (a rail's GPU and NIC)."""
    probes = node.profile.probes
    python = shlex.quote(probes.python)
    run = f"{probes.command_prefix} " if probes.command_prefix else ""
    extra = {"NCCL_DEBUG": "INFO"}
    ifname = node.profile.nccl_env.get("NCCL_SOCKET_IFNAME")
    if probes.device == "cpu" and ifname:
        extra["GLOO_SOCKET_IFNAME"] = ifname
    extra.update(env or {})
    wait = int(meet.wait_s)
    variables = job_env(node, **extra)  # after the prefix, so they reach ranks inside a container too
    line = settings_prelude(node, on_stdout=True) + (
        f'cd "$CA_PROBE_DIR" && {count}exec {run}{variables}{python} -m torch.distributed.run --nnodes={meet.world} '
        f"--nproc_per_node=$n --node_rank={meet.rank} --master_addr={shlex.quote(meet.addr)} "
        f"--master_port={meet.port} --rdzv-conf=timeout={wait} {script} --init-timeout-s {wait} 2>&1"
    )
    return RemoteCommand(name, line, timeout_s=probes.timeout_s, rendezvous=meet)


def _sizes(node: Node, cpu_bytes: int = CPU_BYTES, cpu_repeats: int = 2) -> str:
    probes = node.profile.probes
    if probes.device == "cuda":
        return f"--min-bytes {1 << 20} --max-bytes {probes.allreduce_max_bytes or 1 << 30}"
    return f"--min-bytes {cpu_bytes} --max-bytes {cpu_bytes} --repeats {cpu_repeats}"


def rank_command(node: Node, rank: int, world: int, master_addr: str, port: int, tag: str) -> RemoteCommand:
    probes = node.profile.probes
    count = gpu_count(node) if probes.device == "cuda" else "n=1; "
    script = f"allreduce.py --device {probes.device} --label inter_node --tag {shlex.quote(tag)} {_sizes(node)}"
    return torchrun_rank("allreduce_inter", node, count, meeting(node, rank, world, master_addr, port, tag), script)


def collectives_rank_command(node: Node, rank: int, world: int, master_addr: str, port: int, tag: str) -> RemoteCommand:
    """All-reduce and the profile's other collectives across the nodes, every GPU of each."""
    probes = node.profile.probes
    count = gpu_count(node) if probes.device == "cuda" else "n=1; "
    ops = ",".join(["all_reduce", *probes.collectives])
    script = (
        f"allreduce.py --device {probes.device} --ops {ops} --label inter_node --tag {shlex.quote(tag)} {_sizes(node)}"
    )
    meet = meeting(node, rank, world, master_addr, port, tag)
    return torchrun_rank("collectives_inter", node, count, meet, script)


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
        meet = meeting(node, rank, world, master_addr, port, tag)
        return torchrun_rank(f"{rail.name}_inter", node, "n=1; ", meet, script, rail_env(node, rail))

    return GroupJob(rail.name, ("allreduce.py", SETTINGS_FILE), command, collective=True, check="rails")


def training_rank_command(node: Node, rank: int, world: int, master_addr: str, port: int, tag: str) -> RemoteCommand:
    """One node's ranks of a training run across ``world`` nodes (the profile's model, every GPU)."""
    script = f"train_step.py {train_arguments(node, False)} --label inter_node --tag {shlex.quote(tag)}"
    meet = meeting(node, rank, world, master_addr, port, tag)
    return torchrun_rank("training_inter", node, ranks_per_node(node), meet, script)


ALLREDUCE_JOB = GroupJob("allreduce", ("allreduce.py", SETTINGS_FILE), rank_command, collective=True)
COLLECTIVES_JOB = GroupJob("collectives", ("allreduce.py", SETTINGS_FILE), collectives_rank_command, collective=True)
TRAINING_JOB = GroupJob(
    "training",
    (TRAIN_STEP_SCRIPT, "allreduce.py", SETTINGS_FILE),
    training_rank_command,
    min_nodes=1,
    check="training_scaling",
)


def launch_groups(
    groups: Sequence[Sequence[Node]],
    concurrency: int = DEFAULT_CONCURRENCY,
    tags: Sequence[str | None] | None = None,
    job: GroupJob = ALLREDUCE_JOB,
) -> list[GroupRun]:
    """One run of ``job`` per group (rank order = list order), all groups at once: they must be disjoint.

    At most ``concurrency`` operations are in flight for all of them together, however many ranks the groups
    have; a group the job cannot run on is not started and says why. Never raises for a node's failure."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    tags = tags if tags is not None else [None] * len(groups)
    pairs = zip(groups, tags, strict=True)
    runs = [GroupRun(tuple(n.name for n in nodes), tag or secrets.token_hex(6)) for nodes, tag in pairs]
    for nodes, run in zip(groups, runs, strict=True):
        run.detail = refused(nodes, job)
    runnable = [(nodes, run) for nodes, run in zip(groups, runs, strict=True) if not run.detail]
    if runnable:
        launcher = launcher_for(runnable[0][0][0], concurrency)
        launcher.launch([nodes for nodes, _ in runnable], [run for _, run in runnable], job)
    for nodes, run in runnable:
        if run.ranks or not run.detail:  # else no free port: the run never started, its detail says why
            summarize(run, nodes, job)
    return runs


def launch_group(
    nodes: Sequence[Node], tag: str | None = None, concurrency: int = DEFAULT_CONCURRENCY, job: GroupJob = ALLREDUCE_JOB
) -> GroupRun:
    """One run of ``job`` (the all-reduce unless told) across ``nodes`` (rank order = list order). Never raises
    for a node's failure."""
    return launch_groups([nodes], concurrency, [tag], job)[0]
