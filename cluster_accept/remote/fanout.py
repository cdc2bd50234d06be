"""Run a batch of commands on many nodes at once, with bounded concurrency, one result per node.

One connection per node, reused for all of that node's commands (they travel as one batch script); a
failed, slow or unreachable node never aborts the others, and every node comes back with a
:class:`~remote.result.NodeResult`: a node that went away mid-batch as ``unreachable`` (``session_lost``) with
what completed before, an exception of the controller's own as ``tool_error`` (never a fact about the node).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed

from cluster_accept.inventory.model import Node
from cluster_accept.remote.result import NodeResult, NodeStatus, RemoteCommand, Unreachable
from cluster_accept.remote.session import LocalSession, NodeSession, simulated_session
from cluster_accept.vocabulary.secrets import mask_secrets

DEFAULT_CONCURRENCY = 64


def connect(node: Node) -> NodeSession | Unreachable:
    if node.simulated is not None:  # only an inventory's simulation block sets it: scale work
        return simulated_session(node)
    if node.is_local:
        return LocalSession(node)
    from cluster_accept.remote.ssh import open_session  # SSH (paramiko) only where a node is reached over it

    return open_session(node)


def tool_error_detail(exc: BaseException) -> str:
    """An error of the controller's own, for a node's record: the exception first, then where it came from;
    masked where it is written, as its message may quote whatever the failing code held (an inventory's value)."""
    return mask_secrets(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}")


def run_node(node: Node, commands: Sequence[RemoteCommand]) -> NodeResult:
    """Connect to one node, run its batch, close. Never raises: what failed on the controller's side (not the
    node's) comes back as status ``tool_error``."""
    started = time.monotonic()
    try:
        session = connect(node)
        if isinstance(session, Unreachable):
            return NodeResult(
                node.name,
                NodeStatus.UNREACHABLE,
                cause=session.cause,
                detail=session.detail,
                duration_s=time.monotonic() - started,
            )
        try:
            batch = session.run_batch(commands, node.ssh.command_timeout_s or 120.0)
        finally:
            session.close()
        return NodeResult(
            node.name, batch.status, batch.cause, batch.detail, batch.commands, time.monotonic() - started
        )
    except Exception as exc:  # noqa: BLE001 - one node's bug must not lose the others
        return NodeResult(
            node.name, NodeStatus.TOOL_ERROR, None, tool_error_detail(exc), [], time.monotonic() - started
        )


def fan_out(
    nodes: Iterable[Node],
    commands: Sequence[RemoteCommand] | Callable[[Node], Sequence[RemoteCommand]],
    concurrency: int = DEFAULT_CONCURRENCY,
    on_result: Callable[[NodeResult], None] | None = None,
) -> dict[str, NodeResult]:
    """Run each node's batch, at most ``concurrency`` nodes at a time; results keyed by node, in input order."""
    node_list = list(nodes)
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")

    def commands_for(node: Node) -> Sequence[RemoteCommand]:
        return commands(node) if callable(commands) else commands

    results: dict[str, NodeResult] = {}
    with ThreadPoolExecutor(max_workers=min(concurrency, max(1, len(node_list)))) as pool:
        futures = {pool.submit(run_node, node, commands_for(node)): node for node in node_list}
        for future in as_completed(futures):
            result = future.result()
            results[result.node] = result
            if on_result is not None:
                on_result(result)
    return {node.name: results[node.name] for node in node_list}
