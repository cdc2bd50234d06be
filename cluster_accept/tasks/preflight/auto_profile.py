"""``profile: auto``: each node judged by the built-in profile of the GPU model its preflight read.

Resolved in the preflight stage, once every node has answered and before anything is judged, so that every
check and every later stage sees the node's real profile. A node whose GPUs no built-in profile describes (or
of several models, or unreadable) keeps its own keys only and fails ``profile:*`` with what to write.

NVLink is expected by the rule ``profile suggest`` writes (:func:`checks.nvlink.expected_nvlink`), from the GPU
count and the links the node lists: a GPU alone on its node (a one-GPU slice of an HGX board) has no peer to join,
so none is expected of it (its profile is named ``auto:h200-sxm:no-nvlink``); GPUs with peers that list none keep
the datasheet's links and fail ``nvlink:no_nvlink``. The ``profile:auto`` row's detail says which applied.

Between nodes every profile on a built-in base (``auto`` or named), and every profile with ``fabric: auto``, is
completed by the cluster's fabric (:mod:`inventory.fabric`): the RDMA ports (or Ethernet links) most nodes show,
read by the ``infiniband`` check, give the inter-node transport, the ports every node must have active at their
rate, an all-reduce floor and, with the training sweep, a scaling minimum, under the profile's own keys. Each such
node gets a ``profile:fabric`` row saying what was derived and from what.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from cluster_accept.checks.base import CheckRow, NodeRow, Status
from cluster_accept.checks.gpu_count import GpuList
from cluster_accept.checks.infiniband import fabric_of
from cluster_accept.checks.nvlink import ExpectedLinks, NvlinkState, node_expected_nvlink
from cluster_accept.checks.reasons import Action, Reason, declare
from cluster_accept.inventory.builtin import (
    AutoChoice,
    derives_fabric,
    fabric_under,
    is_auto,
    named_fabric_data,
    resolve_auto,
)
from cluster_accept.inventory.fabric import BUILTIN_FABRICS, NodeFabric, cluster_fabric, derivation, fabric_data
from cluster_accept.inventory.model import Inventory, Node, NvlinkSpec, Profile
from cluster_accept.tasks.rows import node_row

CHECK = "profile"
GPU_CHECK = "gpu_count"  # the check whose parsed model lists each GPU's name
NVLINK_CHECK = "nvlink"  # the check whose parsed model lists each GPU's NVLinks
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
    Reason("fabric_named", Status.PASS, "the profile names a built-in fabric: what is expected between nodes"),
    Reason("fabric_none", Status.SKIP, "the profile says fabric: none: nothing is expected between nodes"),
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


def auto_name(own: str, builtin: str, links: ExpectedLinks | None = None) -> str:
    """``auto:h100-sxm``; a profile with ``base: auto`` keeps its own name in front (``gpu-a:h100-sxm``). A node
    expected to show no NVLink where its model has links (one GPU, no peer) is on another profile than its
    model's other nodes, under its own name (``auto:h100-sxm:no-nvlink``): thresholds and peers go by name."""
    alone = links is not None and links.spec.links_per_gpu == 0
    return f"{own}:{builtin}" + (":no-nvlink" if alone else "")


def _expected_links(gpu_model: Any, nvlink_model: Any) -> ExpectedLinks | None:
    """What the node's GPUs should show for NVLink, from what its preflight read (either may be absent)."""
    gpus = gpu_model if isinstance(gpu_model, GpuList) else None
    return node_expected_nvlink(gpus, nvlink_model if isinstance(nvlink_model, NvlinkState) else None)


def _gpu_names(model: Any) -> list[str]:
    return [gpu.name for gpu in getattr(model, "gpus", None) or []]


def _row(outcome_problem: str | None, picked: str | None, names: tuple[str, ...], said: str = "") -> CheckRow:
    """The node's ``profile:auto`` row; ``said``: why the node's NVLink is not simply its model's datasheet links
    judged on what it lists (a GPU without a peer; GPUs whose links are down), if so."""
    observed = ", ".join(names) or None
    if outcome_problem is None:
        return CheckRow(CHECK, "auto", Status.PASS, "picked", observed, picked, said)
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


@dataclass(frozen=True)
class _Fabric:
    """The cluster's fabric as preflight read it: each node's, the majority's, and how it was derived."""

    nodes: Mapping[str, NodeFabric]
    cluster: NodeFabric | None
    said: str

    def between(self, profile: Profile) -> dict[str, Any] | None:
        """What ``profile``'s nodes are expected to show between nodes: derived, named, or nothing."""
        if not derives_fabric(profile):
            return named_fabric_data(profile)
        return fabric_data(self.cluster, profile.training.enabled) if self.cluster is not None else None

    def row(self, node: str, profile: Profile) -> CheckRow:
        """The node's ``profile:fabric`` row: what its profile expects between nodes, and whence."""
        own = self.nodes.get(node)
        if derives_fabric(profile):
            return _fabric_row(own, self.cluster, self.said)
        observed = own.describe() if own is not None else None
        named = BUILTIN_FABRICS.get(profile.fabric or "")
        if named is None:
            said = "fabric: none: the profile expects nothing between nodes"
            return CheckRow(CHECK, "fabric", Status.SKIP, "fabric_none", observed, None, said)
        said = f"fabric {profile.fabric}: {named.source}; inter-node transport {named.fabric.transport}"
        return CheckRow(CHECK, "fabric", Status.PASS, "fabric_named", observed, named.fabric.describe(), said)


def _says_fabric(profile: Profile) -> bool:
    """Whether a profile expects something of the fabric (derived or named), or says it expects nothing."""
    return profile.fabric is not None or derives_fabric(profile)


def _read_fabric(answered: Iterable[str], nic_models: Mapping[str, Any]) -> _Fabric:
    fabrics = {n: f for n in sorted(answered) if (f := fabric_of(nic_models.get(n))) is not None}
    fabric = cluster_fabric(list(fabrics.values()))
    said = derivation(fabric, len(fabrics), len(list(answered))) if fabric is not None else ""
    return _Fabric(fabrics, fabric, said)


@dataclass
class _Resolved:
    """Each profile resolved once, however many nodes it has: by profile name and the GPU models read (auto), or
    by profile name (the fabric under a named base); the profile, or why there is none. An auto node's NVLink,
    expected from its GPU count and links (:func:`checks.nvlink.expected_nvlink`), is part of its key."""

    picks: dict[tuple[str, tuple[str, ...], NvlinkSpec | None], AutoChoice] = field(default_factory=dict)
    under: dict[str, Profile | str] = field(default_factory=dict)

    def pick(self, node: Node, gpu_names: list[str], fabric: _Fabric, links: ExpectedLinks | None) -> AutoChoice:
        spec = links.spec if links is not None else None
        key = (node.profile_name, tuple(sorted(set(gpu_names))), spec)
        if key not in self.picks:
            self.picks[key] = resolve_auto(node.profile, gpu_names, fabric.between(node.profile), spec)
        return self.picks[key]

    def with_fabric(self, node: Node, between: dict[str, Any]) -> Profile | str:
        if node.profile_name not in self.under:
            try:
                self.under[node.profile_name] = fabric_under(node.profile, between)
            except ValueError as exc:
                self.under[node.profile_name] = (
                    f"the profile's keys over the fabric the nodes show are not valid: {exc}"
                )
        return self.under[node.profile_name]


def _auto_node(
    node: Node, read: tuple[Any, Any], fabric: _Fabric, resolved: _Resolved
) -> tuple[Node, Profile | None, list[CheckRow]]:
    """An ``auto`` node on the profile its GPU model picks (renamed ``auto:h100-sxm``), or as it was. ``read``:
    the node's parsed ``gpu_count`` and ``nvlink`` models (None where not read)."""
    links = _expected_links(*read)
    choice = resolved.pick(node, _gpu_names(read[0]), fabric, links)
    rows = [_row(choice.problem, choice.name, choice.gpu_names, (links.why or "") if links is not None else "")]
    if choice.problem is None:  # else its auto row says why it keeps its keys
        rows.append(fabric.row(node.name, node.profile))
    if choice.problem is None and choice.name is not None:
        name = auto_name(node.profile_name, choice.name, links)
        return replace(node, profile_name=name, profile=choice.profile), choice.profile, rows
    return node, None, rows


def _derived_node(node: Node, fabric: _Fabric, resolved: _Resolved) -> tuple[Node, Profile | None, list[CheckRow]]:
    """A node on a named base, or with ``fabric: auto``, with the cluster's fabric under its profile's keys (a
    named fabric was laid under them when the inventory loaded)."""
    between = fabric.between(node.profile) if derives_fabric(node.profile) else None
    if between is None:
        return node, None, [fabric.row(node.name, node.profile)]
    profile = resolved.with_fabric(node, between)
    if isinstance(profile, str):
        return node, None, [CheckRow(CHECK, "fabric", Status.FAIL, "invalid_override", None, None, profile)]
    return replace(node, profile=profile), profile, [fabric.row(node.name, node.profile)]


def resolve_auto_nodes(
    run_id: str,
    inventory: Inventory,
    gpu_models: Mapping[str, Any],
    answered: Iterable[str],
    nic_models: Mapping[str, Any] | None = None,
    nvlink_models: Mapping[str, Any] | None = None,
) -> tuple[Inventory, list[NodeRow]]:
    """The inventory with every answering ``auto`` node on its picked profile, every answering node whose profile
    derives the fabric with it under its keys, and ``profile:auto`` / ``profile:fabric`` rows per such node.
    ``gpu_models``: node -> the parsed ``gpu_count`` model (absent when it did not run); ``nic_models``: node ->
    the parsed ``infiniband`` model, whose majority is the fabric; ``nvlink_models``: node -> the parsed
    ``nvlink`` model, which with the GPU count says whether the node's GPUs should show NVLink."""
    answered = set(answered)
    touched = [n for n in inventory.tested if n.name in answered and (is_auto(n.profile) or _says_fabric(n.profile))]
    if not touched:
        return inventory, []
    fabric = _read_fabric(answered, nic_models or {})
    profiles, rows, changed, resolved = dict(inventory.profiles), list[NodeRow](), {}, _Resolved()
    for node in touched:
        if is_auto(node.profile):
            read = (gpu_models.get(node.name), (nvlink_models or {}).get(node.name))
            new, profile, said = _auto_node(node, read, fabric, resolved)
        else:
            new, profile, said = _derived_node(node, fabric, resolved)
        rows.extend(node_row(run_id, inventory.cluster, "preflight", node.name, row, "") for row in said)
        if profile is not None:
            profiles[new.profile_name] = profile
        changed[node.name] = new
    nodes = [changed.get(n.name, n) for n in inventory.nodes]
    return replace(inventory, nodes=nodes, profiles=profiles), rows
