"""Start one all-reduce across several nodes: ``torchrun`` on every node at once, over SSH.

The first node hosts the rendezvous (its address, a port it reports free for this run, node ranks in
order). Every node gets the probe in a private temp directory and runs it under the node-side timeout; the
first failure anywhere (unreachable node, crash, timeout) stops the run on every node — found by the run's
tag in the process list and killed — so nothing is left waiting on a rendezvous that will never complete.
Each node's ``NCCL_DEBUG=INFO`` log comes back and names the transport used between nodes.

The launcher is chosen by the profile (``probes.launcher``): ``ssh`` is implemented here; ``slurm`` (srun
in an allocation) plugs in behind the same :func:`launch_group` signature.
"""

from __future__ import annotations

import secrets
import shlex
import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from cluster_accept.analysis.probe_output import nccl_transports, parse_json_lines
from cluster_accept.inventory.model import Node
from cluster_accept.remote.fanout import connect
from cluster_accept.remote.result import CommandResult, NodeStatus, RemoteCommand
from cluster_accept.remote.ssh import Unreachable
from cluster_accept.tasks.probe_dir import run_in_probe_dir

CPU_BYTES = 1 << 20
STOP_RETRY_S = 3.0  # gloo over a test-bed's veths: one size, small enough for a rate-limited link


@dataclass
class RankRun:
    node: str
    status: NodeStatus
    cause: str | None = None
    detail: str = ""
    result: CommandResult | None = None

    @property
    def ok(self) -> bool:
        return self.status is NodeStatus.OK and self.result is not None and self.result.ok


@dataclass
class GroupRun:
    nodes: tuple[str, ...]
    tag: str
    ranks: dict[str, RankRun] = field(default_factory=dict)
    measurements: list[dict[str, Any]] = field(default_factory=list)
    transports: dict[str, int] = field(default_factory=dict)
    detail: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.ranks) and all(r.ok for r in self.ranks.values()) and bool(self.measurements)

    @property
    def busbw_gbps(self) -> float | None:
        """Bus bandwidth at the largest message size; None when the run did not complete."""
        if not self.ok:
            return None
        largest = max(self.measurements, key=lambda m: m.get("size") or 0)
        return float(largest["value"])


def rendezvous_address(master: Node) -> str:
    return "127.0.0.1" if master.is_local else master.connect_host


def _rank_command(node: Node, rank: int, world: int, master_addr: str, port: int, tag: str) -> RemoteCommand:
    probes = node.profile.probes
    python = shlex.quote(probes.python)
    run = f"{probes.command_prefix} " if probes.command_prefix else ""
    env: dict[str, str] = {"NCCL_DEBUG": "INFO"}
    if probes.cuda_visible_devices:
        env["CUDA_VISIBLE_DEVICES"] = probes.cuda_visible_devices
    ifname = node.profile.nccl_env.get("NCCL_SOCKET_IFNAME")
    if probes.device == "cpu" and ifname:
        env["GLOO_SOCKET_IFNAME"] = ifname
    if probes.device == "cuda":
        count = (
            f"n={len(probes.cuda_visible_devices.split(','))}; "
            if probes.cuda_visible_devices
            else "n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); "
        )
        sizes = f"--min-bytes {1 << 20} --max-bytes {probes.allreduce_max_bytes or 1 << 30}"
    else:
        count = "n=1; "
        sizes = f"--min-bytes {CPU_BYTES} --max-bytes {CPU_BYTES} --repeats 2"
    script = (
        f'cd "$CA_PROBE_DIR" && {count}exec {run}{python} -m torch.distributed.run --nnodes={world} '
        f"--nproc_per_node=$n --node_rank={rank} --master_addr={shlex.quote(master_addr)} --master_port={port} "
        f"allreduce.py --device {probes.device} --label inter_node --tag {shlex.quote(tag)} {sizes} 2>&1"
    )
    return RemoteCommand("allreduce_inter", script, env=env, timeout_s=probes.timeout_s)


def _free_port(master: Node) -> int | RankRun:
    session = connect(master)
    if isinstance(session, Unreachable):
        return RankRun(master.name, NodeStatus.UNREACHABLE, session.cause.value, session.detail)
    try:
        script = (
            f"{shlex.quote(master.profile.probes.python)} -c "
            "'import socket; s = socket.socket(); s.bind((\"\", 0)); print(s.getsockname()[1])'"
        )
        code, out, err, _ = session.run_script(script, 60)
    finally:
        session.close()
    text = out.strip().splitlines()[-1] if out.strip() else ""
    if code != 0 or not (text.isascii() and text.isdigit()):
        return RankRun(master.name, NodeStatus.ERROR, None, f"could not pick a free port: {err.strip() or out}")
    return int(text)


def _run_rank(node: Node, command: RemoteCommand, stopped: threading.Event) -> RankRun:
    if stopped.is_set():
        return RankRun(node.name, NodeStatus.ERROR, None, "not started: the run was stopped")
    run = run_in_probe_dir(node, ("allreduce.py",), [command])
    return RankRun(node.name, run.status, run.cause, run.detail, run.results[0] if run.results else None)


def stop_run(nodes: Sequence[Node], tag: str) -> None:
    """Kill every process of run ``tag`` on every node (the bracket keeps pkill from matching its own shell)."""
    pattern = shlex.quote(f"[-]-tag {tag}")

    def stop(node: Node) -> None:
        session = connect(node)
        if isinstance(session, Unreachable):
            return
        try:
            session.run_script(f"pkill -KILL -f -- {pattern}; true", 30)
        finally:
            session.close()

    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        list(pool.map(stop, nodes))


def launch_group(nodes: Sequence[Node], tag: str | None = None) -> GroupRun:
    """One all-reduce across ``nodes`` (rank order = list order). Never raises."""
    tag = tag or secrets.token_hex(6)
    run = GroupRun(tuple(n.name for n in nodes), tag)
    if len(nodes) < 2:
        run.detail = "a multi-node run needs at least two nodes"
        return run
    slurm = [n.name for n in nodes if n.profile.probes.launcher != "ssh"]
    if slurm:
        run.detail = f"launcher 'slurm' is not available in this version (nodes {', '.join(slurm)})"
        return run
    port = _free_port(nodes[0])
    if isinstance(port, RankRun):
        run.ranks[nodes[0].name] = port
        run.detail = port.detail
        return run
    master = rendezvous_address(nodes[0])
    stopped = threading.Event()
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        futures = {
            pool.submit(_run_rank, node, _rank_command(node, rank, len(nodes), master, port, tag), stopped): node
            for rank, node in enumerate(nodes)
        }
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=STOP_RETRY_S, return_when=FIRST_COMPLETED)
            for future in done:
                rank_run = future.result()
                run.ranks[rank_run.node] = rank_run
                if not rank_run.ok:
                    stopped.set()  # the others would wait for a rendezvous that never completes
            if stopped.is_set() and pending:
                # Again until every rank has returned: a rank still starting up missed the first stop.
                stop_run([futures[f] for f in pending], tag)
    first = run.ranks.get(nodes[0].name)
    if first is not None and first.result is not None:
        run.measurements = parse_json_lines(first.result.stdout).measurements
    for rank_run in run.ranks.values():
        if rank_run.result is not None:
            for transport, count in nccl_transports(rank_run.result.stdout).items():
                run.transports[transport] = run.transports.get(transport, 0) + count
    if not run.ok:
        failed = [
            f"{n}: {r.cause or r.detail or ('timeout' if r.result and r.result.timed_out else 'failed')}"
            for n, r in run.ranks.items()
            if not r.ok
        ]
        run.detail = "; ".join(failed)[:2000] or "no all-reduce figure"
    return run
