"""Causes chained to symptoms: a failed figure is explained by what the same run saw on the same node.

An all-reduce at 24.9 GB/s is a symptom; NCCL having used SHM instead of P2P is its mechanism, and
``NCCL_P2P_DISABLE=1`` in ``/etc/nccl.conf`` is its cause. A GEMM straggler on GPU 1 is a symptom; another
process on GPU 1 during the bench is its cause, and the action is to stop that process, not to send the GPU
back. Each plug-in declares which findings can explain its own (:class:`~cluster_accept.checks.declarations.Link`,
on the same GPU where both name one); the stages gather them, and the verdict and the report put the cause first
and keep the symptoms listed after it. Pure functions over rows; the groups of links several probes share are
built here.
"""

from __future__ import annotations

from collections.abc import Sequence

from cluster_accept.checks.base import BAD_STATUSES, NodeRow, Status
from cluster_accept.checks.declarations import Link
from cluster_accept.checks.nvswitch import FABRIC_DOWN
from cluster_accept.checks.nvswitch import NAME as NVSWITCH

_NOT_FINDINGS = frozenset({Status.PASS, Status.SKIP, Status.NOT_JUDGED})
SINGLE_NODE = "single-node"
# A slow training step: what a co-tenant or clock events explain; not numerics (no co-tenant makes NaN).
SLOW_TRAINING = frozenset({"slow_rank", "straggler", "below_threshold"})
# Settings in the job's environment that change how NCCL connects the GPUs of one node.
INTRA_SETTINGS = frozenset(
    {"p2p_disabled", "p2p_level_low", "shm_disabled", "gpus_hidden", "algo_forced", "proto_forced", "site_rule"}
)
PINNED = frozenset({"value_mismatch", "missing"})  # a pinned variable set otherwise (not a drift warning)


def gpu_state_causes(
    symptoms: frozenset[str], stage: str = SINGLE_NODE, symptom_reasons: frozenset[str] = frozenset()
) -> tuple[Link, ...]:
    """What slows one GPU's own figures: another process on it, clocks held low, clock events; each on that GPU.
    ``symptom_reasons``: only these findings (a slow step, not a numerics error)."""
    return (
        Link("gpu", symptoms, stage, frozenset({"busy"}), True, symptom_reasons),
        Link("gpu", symptoms, stage, frozenset({"clocks_low"}), True, symptom_reasons),
        Link("clock_events", symptoms, stage, frozenset(), True, symptom_reasons),
    )


def intra_node_causes(symptoms: frozenset[str]) -> tuple[Link, ...]:
    """What slows traffic between the GPUs of one node, the mechanism a log shows first (the transport NCCL
    chose), then the setting or state behind it."""
    # the transport NCCL chose is read from the all-reduce's log: it explains that figure
    read_from_log = symptoms & {"allreduce"}
    transport = (Link("transport", read_from_log, SINGLE_NODE, frozenset({"unexpected", "unreadable"})),)
    return (
        Link("gpu", symptoms, SINGLE_NODE, frozenset({"busy"}), same_gpu=True),
        # a fabric down (Fabric Manager stopped): the root of NCCL's fallback to SHM and of the slow figure
        Link(NVSWITCH, symptoms | ({"transport"} if read_from_log else frozenset()), SINGLE_NODE, FABRIC_DOWN),
        *(transport if read_from_log else ()),
        Link("nccl_harmful", symptoms, SINGLE_NODE, INTRA_SETTINGS),
        Link("nccl_env", symptoms, SINGLE_NODE, PINNED),
        Link("nvlink", symptoms, SINGLE_NODE),
        Link("topology", symptoms, SINGLE_NODE, frozenset({"nvlink_pairs"})),
    )


def _findings(rows: Sequence[NodeRow]) -> list[NodeRow]:
    return [r for r in rows if r.status not in _NOT_FINDINGS]


def causes_of(symptom: NodeRow, findings: Sequence[NodeRow], links: Sequence[Link]) -> list[NodeRow]:
    """The ``findings`` (one node's) that explain ``symptom``, likeliest first (in ``links`` order)."""
    found: list[NodeRow] = []
    for link in links:
        found += [c for c in findings if link.explains(c, symptom) and c not in found]
    return found


Explained = dict[int, list[NodeRow]]  # index of a finding among one node's rows -> the findings that explain it


def explain(rows: Sequence[NodeRow], links: Sequence[Link]) -> Explained:
    """For one node's rows: the index of each finding that has causes (by the declared ``links``), and its
    causes. The other functions here take its result, so that a caller working on one node computes it once."""
    findings = _findings(rows)
    return {
        i: causes
        for i, row in enumerate(rows)
        if row.status not in _NOT_FINDINGS and (causes := causes_of(row, findings, links))
    }


def cause_first(rows: Sequence[NodeRow], explained: Explained) -> list[NodeRow]:
    """One node's findings, those that explain others first (in link priority), then the rest as they came."""
    causes: list[NodeRow] = []
    for i in sorted(explained, key=lambda i: rows[i].status != Status.FAIL):
        causes += [c for c in explained[i] if c not in causes]
    # Root causes (explained by nothing else) before the mechanisms they explain: the setting, then SHM.
    has_cause = {id(rows[i]) for i in explained}
    causes.sort(key=lambda c: id(c) in has_cause)
    return causes + [r for r in _findings(rows) if r not in causes]


def causes_of_failures(rows: Sequence[NodeRow], explained: Explained) -> list[NodeRow]:
    """Findings that explain a failing one (fail, error, timeout, unreachable): named among a verdict's reasons
    even when only a warning themselves."""
    found: list[NodeRow] = []
    for i, causes in explained.items():
        if rows[i].status in BAD_STATUSES:
            found += [c for c in causes if c not in found]
    return found


def _said(row: NodeRow) -> str:
    gpu = "" if row.gpu is None else f" gpu {row.gpu}"
    return f"{row.check} {row.item}{gpu}"


def sentence(symptom: NodeRow, causes: Sequence[NodeRow]) -> str:
    """``symptom (observed, expected …): mechanism because cause — detail``: cause first, in words."""
    head = f"{_said(symptom)} {symptom.observed or '-'} (expected {symptom.expected or '-'})"
    parts = []
    for cause in causes[:2]:
        what = f"{cause.check}:{cause.reason} {cause.observed or ''}".rstrip()
        parts.append(f"{what} ({cause.detail})" if cause.detail else what)
    return f"{head}: " + " because ".join(parts)


def node_cause(rows: Sequence[NodeRow], explained: Explained) -> str:
    """The likeliest cause of a node's worst finding, as one sentence; empty when nothing explains anything."""
    if not explained:
        return ""
    # The failing finding at the end of the longest chain: the figure, not the transport that explains it.
    first = min(explained, key=lambda i: (rows[i].status != Status.FAIL, -len(explained[i]), i))
    return sentence(rows[first], mechanism_then_cause(rows, explained, explained[first]))


def mechanism_then_cause(rows: Sequence[NodeRow], explained: Explained, causes: Sequence[NodeRow]) -> list[NodeRow]:
    """What one finding's sentence says of its ``causes``: the first that is itself explained (the mechanism:
    the transport NCCL chose, the channels it opened), then the first that is not (the setting or state behind
    it), in link order; "because" joins only a mechanism to its cause, never two causes."""
    has_cause = {id(rows[i]) for i in explained}
    mechanism = next((c for c in causes if id(c) in has_cause), None)
    root = next((c for c in causes if id(c) not in has_cause), None)
    return [c for c in (mechanism, root) if c is not None]
