"""``profile: auto``: each node judged by the built-in profile of the GPU model its preflight read.

Resolved in the preflight stage, once every node has answered and before anything is judged, so that every
check and every later stage sees the node's real profile. A node whose GPUs no built-in profile describes (or
of several models, or unreadable) keeps its own keys only and fails ``profile:*`` with what to write.

Between nodes the built-in profile is completed by the cluster's fabric (:mod:`inventory.fabric`): the RDMA ports
(or Ethernet links) most nodes show, read by the ``infiniband`` check, give the inter-node transport, the ports
every node must have active at their rate, an all-reduce floor and, with the training sweep, a scaling minimum.
Each auto node gets a ``profile:fabric`` row saying what was derived and from what.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from cluster_accept.checks.base import CheckRow, NodeRow, Status
from cluster_accept.checks.infiniband import fabric_of
from cluster_accept.checks.reasons import Action, Reason, declare
from cluster_accept.inventory.builtin import is_auto, resolve_auto
from cluster_accept.inventory.fabric import NodeFabric, cluster_fabric, derivation, fabric_data
from cluster_accept.inventory.model import Inventory, Node
from cluster_accept.tasks.rows import node_row

CHECK = "profile"
GPU_CHECK = "gpu_count"  # the check whose parsed model lists each GPU's name
NIC_CHECK = "infiniband"  # the check whose parsed model lists each node's RDMA ports and Ethernet links
REASONS = declare(
    Reason("picked", Status.PASS, "profile auto: the built-in profile of the node's GPU model"),
    Reason(
        "unknown_gpu",
        Status.FAIL,
        "profile auto: no built-in profile for this GPU model; write one (the detail lists the keys)",
        Action.FIX_CONFIG,
    ),
    Reason(
        "mixed_gpus",
        Status.FAIL,
        "profile auto: GPUs of several models on one node; give the node its own profile",
        Action.CHECK_NODE,
    ),
    Reason(
        "invalid_override",
        Status.FAIL,
        "profile auto: the inventory's keys over the picked profile do not make a valid profile",
        Action.FIX_CONFIG,
    ),
    Reason(
        "fabric_derived",
        Status.PASS,
        "profile auto: what is expected between nodes, derived from the fabric most nodes show (the detail says how)",
    ),
    Reason(
        "no_rdma_fabric",
        Status.WARN,
        "profile auto: the cluster has no RDMA fabric (no InfiniBand, RoCE or EFA port on most nodes): NCCL can only "
        "use sockets between nodes, far below what training across nodes needs",
        Action.CHECK_NODE,
    ),
    Reason(
        "fabric_unreadable",
        Status.SKIP,
        "profile auto: no node's network ports were read (infiniband says why): nothing is derived between nodes",
    ),
    Reason(
        "gpu_unreadable",
        Status.SKIP,
        "profile auto: no GPU model read (gpu_count says why); the node is judged by the inventory's keys only",
    ),
)


def auto_name(own: str, builtin: str) -> str:
    """``auto:h100-sxm``; a profile with ``base: auto`` keeps its own name in front (``gpu-a:h100-sxm``)."""
    return f"{own}:{builtin}"


def _gpu_names(model: Any) -> list[str]:
    return [gpu.name for gpu in getattr(model, "gpus", None) or []]


def _row(outcome_problem: str | None, picked: str | None, names: tuple[str, ...]) -> CheckRow:
    observed = ", ".join(names) or None
    if outcome_problem is None:
        return CheckRow(CHECK, "auto", Status.PASS, "picked", observed, picked)
    if not names:
        return CheckRow(CHECK, "auto", Status.SKIP, "gpu_unreadable", None, None, outcome_problem)
    if len(names) > 1:
        return CheckRow(CHECK, "auto", Status.FAIL, "mixed_gpus", observed, "one GPU model", outcome_problem)
    if picked is not None:
        return CheckRow(CHECK, "auto", Status.FAIL, "invalid_override", observed, picked, outcome_problem)
    return CheckRow(CHECK, "auto", Status.FAIL, "unknown_gpu", observed, "a built-in GPU model", outcome_problem)


def _fabric_row(own: NodeFabric | None, cluster: NodeFabric | None, said: str) -> CheckRow:
    """The node's ``profile:fabric`` row: its own fabric beside the cluster's, and ``said``, how the expectations
    were derived (the same for every node)."""
    observed = own.describe() if own is not None else None
    if cluster is None:
        return CheckRow(CHECK, "fabric", Status.SKIP, "fabric_unreadable", observed, None, "no node's ports were read")
    if cluster.rdma:
        return CheckRow(CHECK, "fabric", Status.PASS, "fabric_derived", observed, cluster.describe(), said)
    return CheckRow(CHECK, "fabric", Status.WARN, "no_rdma_fabric", observed, "an RDMA fabric", said)


def resolve_auto_nodes(
    run_id: str,
    inventory: Inventory,
    gpu_models: Mapping[str, Any],
    answered: Iterable[str],
    nic_models: Mapping[str, Any] | None = None,
) -> tuple[Inventory, list[NodeRow]]:
    """The inventory with every answering ``auto`` node on its picked profile, and ``profile:auto`` and
    ``profile:fabric`` rows per such node. ``gpu_models``: node -> the parsed ``gpu_count`` model (absent when it
    did not run); ``nic_models``: node -> the parsed ``infiniband`` model, whose majority is the fabric."""
    answered = set(answered)
    if not any(is_auto(n.profile) for n in inventory.tested):
        return inventory, []
    fabrics = {n: f for n in sorted(answered) if (f := fabric_of((nic_models or {}).get(n))) is not None}
    fabric = cluster_fabric(list(fabrics.values()))
    derived = derivation(fabric, len(fabrics), len(answered)) if fabric is not None else ""
    nodes: list[Node] = []
    profiles = dict(inventory.profiles)
    rows: list[NodeRow] = []
    for node in inventory.nodes:
        if node.excluded or not is_auto(node.profile) or node.name not in answered:
            nodes.append(node)
            continue
        between = fabric_data(fabric, node.profile.training.enabled) if fabric is not None else None
        choice = resolve_auto(node.profile, _gpu_names(gpu_models.get(node.name)), between)
        row = _row(choice.problem, choice.name, choice.gpu_names)
        rows.append(node_row(run_id, inventory.cluster, "preflight", node.name, row, ""))
        if choice.problem is None:  # else the node keeps its own keys, and its auto row says why
            said = _fabric_row(fabrics.get(node.name), fabric, derived)
            rows.append(node_row(run_id, inventory.cluster, "preflight", node.name, said, ""))
        if choice.problem is None and choice.name is not None:
            name = auto_name(node.profile_name, choice.name)
            profiles[name] = choice.profile
            node = replace(node, profile_name=name, profile=choice.profile)
        nodes.append(node)
    return replace(inventory, nodes=nodes, profiles=profiles), rows
