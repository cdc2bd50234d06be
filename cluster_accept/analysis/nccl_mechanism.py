"""How NCCL ran a node's collectives next to how it ran the cluster's, from its own account
(:mod:`analysis.nccl_account`): the mechanism between a slow collective and the setting behind it.

A node whose NCCL opened 4 channels where the healthy majority opened 24 (``NCCL_P2P_LEVEL=LOC``: SHM instead of
NVLink), or ran all-reduce as TREE/LL where the others ran RING/SIMPLE, is slow for that reason; the figure alone
says only that it is slow. Each node's view is per run shape (stage, probe, ranks and nodes of the communicator),
so that an 8-GPU communicator is never held to a 16-GPU one's count, nor a single-node run to one across nodes.

With no cluster to compare, a node's NVLinks still say what to expect of a communicator inside it: the floor
taken is one collective channel per two NVLinks of a GPU, well under what NCCL opens over NVLink (4 × H200, 18
NVLinks each: 24 channels) and well over what it opens without (the same GPUs with P2P disabled or
``NCCL_P2P_LEVEL=LOC``: 4 over SHM; over sockets 2). Pure functions.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from cluster_accept.analysis.nccl_account import ALGORITHM, CHANNELS, COMMUNICATOR, PROTOCOL
from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.checks.reasons import Action, FindingKind, Reason, declare
from cluster_accept.inventory.hostlist import fold
from cluster_accept.vocabulary.rows import NcclFact

NVLINKS_PER_CHANNEL = 2
NCCL_CHOICE = "NCCL's own choice"  # the algorithm or protocol of a node whose environment forced none
_FORCED = {ALGORITHM: "NCCL_ALGO", PROTOCOL: "NCCL_PROTO"}
_T = TypeVar("_T")


@dataclass(frozen=True)
class RunShape:
    """What a channel count is compared within: the stage and probe that ran, and its communicator's ranks and
    nodes (None where NCCL's log did not say)."""

    stage: str
    probe: str
    nranks: int | None = None
    nnodes: int | None = None

    @property
    def label(self) -> str:
        """``single-node allreduce, 4 ranks on 1 node``."""
        if self.nranks is None:
            return f"{self.stage} {self.probe}"
        nodes = "" if self.nnodes is None else f" on {self.nnodes} node{'s' if self.nnodes != 1 else ''}"
        return f"{self.stage} {self.probe}, {self.nranks} ranks{nodes}"


@dataclass(frozen=True)
class NcclMechanism:
    """One way NCCL ran a node's collectives otherwise than the cluster's healthy majority, or than its NVLinks
    allow. ``what``: ``channels_below_majority``, ``channels_below_nvlinks``, ``algorithm_differs`` or
    ``protocol_differs``; ``item``: the run shape or the collective it concerns."""

    node: str
    what: str
    item: str
    observed: str
    expected: str


def _count(value: str) -> bool:
    """Whether ``value`` is a count (as NCCL prints one: a few digits; a row read back may hold anything)."""
    return value.isascii() and value.isdigit() and len(value) <= 9


def _shapes(facts: Iterable[NcclFact]) -> dict[tuple[str, str, str, str], RunShape]:
    """(stage, node, probe, communicator) -> its run shape, from the communicator lines."""
    sizes: dict[tuple[str, str, str, str], dict[str, int]] = {}
    for fact in facts:
        if fact.kind == COMMUNICATOR and fact.communicator is not None and _count(fact.value):
            key = (fact.stage, fact.node, fact.probe, fact.communicator)
            sizes.setdefault(key, {})[fact.name] = int(fact.value)
    return {key: RunShape(key[0], key[2], s.get("nranks"), s.get("nnodes")) for key, s in sizes.items()}


def channel_counts(facts: Iterable[NcclFact], name: str = "coll") -> dict[RunShape, dict[str, int]]:
    """Per run shape, each node's fewest ``name`` channels (``coll``, ``p2p`` …) over its ranks and runs: a ring
    runs at the pace of its fewest channels."""
    facts = list(facts)
    shapes = _shapes(facts)
    counts: dict[RunShape, dict[str, int]] = {}
    for fact in facts:
        if fact.kind != CHANNELS or fact.name != name or fact.communicator is None or not _count(fact.value):
            continue
        key = (fact.stage, fact.node, fact.probe, fact.communicator)
        shape = shapes.get(key, RunShape(fact.stage, fact.probe))
        nodes = counts.setdefault(shape, {})
        nodes[fact.node] = min(int(fact.value), nodes.get(fact.node, int(fact.value)))
    return counts


def choices(facts: Iterable[NcclFact], kind: str) -> dict[tuple[str, str, str], dict[str, str]]:
    """(stage, probe, name) -> node -> the ``kind`` (algorithm or protocol) NCCL used or was held to there. A node
    whose environment forced none is at :data:`NCCL_CHOICE` for ``NCCL_ALGO``/``NCCL_PROTO`` when any node was
    forced in that run."""
    facts = list(facts)
    found: dict[tuple[str, str, str], dict[str, set[str]]] = {}
    for fact in facts:
        if fact.kind == kind:
            found.setdefault((fact.stage, fact.probe, fact.name), {}).setdefault(fact.node, set()).add(fact.value)
    ran: dict[tuple[str, str], set[str]] = {}
    for fact in facts:
        ran.setdefault((fact.stage, fact.probe), set()).add(fact.node)
    chosen = {key: {node: "/".join(sorted(values)) for node, values in nodes.items()} for key, nodes in found.items()}
    for (stage, probe, name), nodes in chosen.items():
        if name == _FORCED.get(kind):
            nodes.update({node: NCCL_CHOICE for node in ran.get((stage, probe), set()) if node not in nodes})
    return chosen


def majority(values: Mapping[str, _T], among: Collection[str] | None = None) -> tuple[_T, list[str]] | None:
    """The value more than half of the nodes ``among`` (every node of ``values`` when None) hold, with those
    nodes; None when no value has that many."""
    counted = {node: value for node, value in values.items() if among is None or node in among}
    for value in dict.fromkeys(counted.values()):
        holders = sorted(node for node, held in counted.items() if held == value)
        if 2 * len(holders) > len(counted):
            return value, holders
    return None


@dataclass(frozen=True)
class ClusterAccount:
    """The cluster's account as :func:`mechanism` compares it: channel counts per run shape, algorithms and
    protocols per collective, each per node. Built once (:meth:`of`) for as many nodes as are asked about."""

    channels: Mapping[RunShape, Mapping[str, int]]
    choices: Mapping[str, Mapping[tuple[str, str, str], Mapping[str, str]]]  # kind -> (stage, probe, name) -> …

    @classmethod
    def of(cls, facts: Iterable[NcclFact]) -> ClusterAccount:
        facts = list(facts)
        return cls(channel_counts(facts), {kind: choices(facts, kind) for kind in (ALGORITHM, PROTOCOL)})


def mechanism(
    node: str,
    facts: Iterable[NcclFact] | ClusterAccount,
    healthy: Collection[str] | None = None,
    nvlinks_per_gpu: int | None = None,
) -> list[NcclMechanism]:
    """How NCCL ran ``node``'s collectives otherwise than the cluster's: fewer channels than the majority of the
    ``healthy`` nodes (every node when None) opened in the same run shape, or than its ``nvlinks_per_gpu``
    allow on one node; another algorithm or protocol than that majority's. ``facts``: the whole cluster's (or
    their :class:`ClusterAccount`, built once when many nodes are asked about)."""
    account = facts if isinstance(facts, ClusterAccount) else ClusterAccount.of(facts)
    found = _channel_findings(node, account.channels, healthy, nvlinks_per_gpu)
    for kind in (ALGORITHM, PROTOCOL):
        for (stage, probe, name), nodes in sorted(account.choices[kind].items()):
            held, common = nodes.get(node), majority(nodes, healthy)
            if held is not None and common is not None and held != common[0]:
                item = f"{stage} {probe} {name}"
                expected = f"{common[0]}, as on {fold(common[1])}"
                found.append(NcclMechanism(node, f"{kind}_differs", item, held, expected))
    return found


def _channel_findings(
    node: str, counts: Mapping[RunShape, Mapping[str, int]], healthy: Collection[str] | None, nvlinks: int | None
) -> list[NcclMechanism]:
    found = []
    for shape, nodes in sorted(counts.items(), key=lambda item: item[0].label):
        held = nodes.get(node)
        if held is None:
            continue
        common = majority(nodes, healthy)
        if common is not None and held < common[0]:
            expected = f"{common[0]} channels, as on {fold(common[1])}"
            found.append(NcclMechanism(node, "channels_below_majority", shape.label, f"{held} channels", expected))
        floor = (nvlinks or 0) // NVLINKS_PER_CHANNEL
        if shape.nnodes == 1 and (shape.nranks or 0) > 1 and held < floor:
            expected = f">= {floor} channels ({nvlinks} NVLinks per GPU)"
            found.append(NcclMechanism(node, "channels_below_nvlinks", shape.label, f"{held} channels", expected))
    return found


# Rows: a mechanism is named beside a node's failing collective, between the figure and the setting behind it.
NAME = "nccl_mechanism"
_WHY = (
    "NCCL's own log of the run; the setting behind it is named beside it where one was found (job_settings), else "
    "look at the hardware path: nvidia-smi nvlink -s / -e, topo -m"
)
REASONS = declare(
    Reason(
        "channels_below_majority",
        Status.WARN,
        f"NCCL opened fewer channels here than on the healthy majority of the cluster in the same run ({_WHY})",
        Action.CHECK_NODE,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "channels_below_nvlinks",
        Status.WARN,
        f"NCCL opened fewer channels inside the node than its GPUs' NVLinks carry ({_WHY})",
        Action.CHECK_NODE,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "algorithm_differs",
        Status.WARN,
        f"NCCL ran another algorithm here than on the healthy majority ({_WHY})",
        Action.CHECK_NODE,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "protocol_differs",
        Status.WARN,
        f"NCCL ran another protocol here than on the healthy majority ({_WHY})",
        Action.CHECK_NODE,
        kind=FindingKind.RELATIVE,
    ),
)


def mechanism_rows(found: Iterable[NcclMechanism]) -> list[CheckRow]:
    """Each finding as a row of its node (warnings: a mechanism, not a verdict of its own)."""
    return [
        CheckRow(NAME, f"{m.what} {m.item}", Status.WARN, m.what, m.observed, m.expected, f"NCCL's log: {m.item}")
        for m in found
    ]
