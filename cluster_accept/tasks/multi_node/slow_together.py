"""A sweep step below the all-reduce floor that isolation cannot pin on any node: the nodes are slow together.

Isolation compares groups with each other; when every pair is equally slow (NCCL fell back to sockets on every
node, a fabric trained at half rate everywhere, a wrong ``NCCL_IB_HCA`` in the image) no group stands out and it
blames nobody. Left at that, the step's warning would leave every node accepted while the cluster moves a
fraction of what its fabric carries. So each node of such a step fails ``scaling:below_floor_together``, with the
floor (derived from the NICs' line rate under ``profile: auto``) in the expected column and the transport NCCL
used beside the one expected, as the first cause to look at.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cluster_accept.analysis.isolation import IsolationVerdict
from cluster_accept.analysis.scaling import StepVerdict
from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.checks.reasons import Action, FindingKind, Reason
from cluster_accept.inventory.hostlist import fold
from cluster_accept.inventory.model import Node
from cluster_accept.vocabulary.rows import Measurement

REASON = Reason(
    "below_floor_together",
    Status.FAIL,
    "the all-reduce between these nodes is below the floor and isolation blames no node: they are slow together. "
    "Check the transport NCCL used between nodes (sockets instead of RDMA), NCCL's environment (NCCL_IB_HCA, "
    "NCCL_SOCKET_IFNAME, NCCL_IB_DISABLE, the net plugin) and the fabric's port rates",
    Action.FIX_CONFIG,
    kind=FindingKind.RELATIVE,
)


def _transports(measurements: Sequence[Measurement], group: Sequence[Node]) -> str:
    """The transports NCCL used in the sweep's runs of ``group``, as its measurements recorded them."""
    name = fold([node.name for node in group])
    used = {m.transport for m in measurements if m.transport and m.group == name}
    return ", ".join(sorted(used)) or "not read (CPU ranks, or no NCCL log)"


def slow_together_rows(
    steps: Sequence[StepVerdict],
    groups: Mapping[int, Sequence[Node]],
    verdict: IsolationVerdict | None,
    measurements: Sequence[Measurement],
) -> list[tuple[str, CheckRow]]:
    """(node, row) for every node of every step below the floor, when isolation named no bad node."""
    if verdict is not None and (verdict.bad_nodes or verdict.bad_pairs):
        return []  # named: each fails or warns in its isolation row
    found = []
    for step in steps:
        if step.reason != "below_min":
            continue
        group = groups[step.nodes]
        expected_transport = group[0].profile.probes.expected_transport.inter_node or "not set"
        said = (
            f"{step.detail}; isolation blames no node ({verdict.detail if verdict else 'it did not run'}); "
            f"transport between nodes: {_transports(measurements, group)}, expected {expected_transport}"
        )
        row = CheckRow(
            "scaling",
            f"{step.nodes} nodes",
            Status.FAIL,
            REASON.code,
            f"{step.busbw_gbps:.3g} GB/s",
            step.expected,
            said,
        )
        found += [(node.name, row) for node in group]
    return found
