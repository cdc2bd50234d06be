"""Causes chained to symptoms: a failed figure is explained by what the same run saw on the same node.

An all-reduce at 24.9 GB/s is a symptom; NCCL having used SHM instead of P2P is its mechanism, and
``NCCL_P2P_DISABLE=1`` in ``/etc/nccl.conf`` is its cause. A GEMM straggler on GPU 1 is a symptom; another
process on GPU 1 during the bench is its cause, and the action is to stop that process, not to send the GPU
back. :data:`LINKS` says which findings can explain which (on the same GPU where both name one); the verdict
and the report put the cause first and keep the symptoms listed after it. Pure functions over rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cluster_accept.checks.base import BAD_STATUSES, NodeRow, Status

_NOT_FINDINGS = frozenset({Status.PASS, Status.SKIP})
_INTRA = frozenset({"allreduce", "transport", "collectives", "gpu_pairs"})
_INTER = frozenset({"allreduce", "transport", "scaling", "isolation", "training_scaling", "collectives", "rails"})
_GPU_FIGURES = frozenset({"gemm", "hbm", "host_bw"})
_TRAINING = frozenset({"training"})
_SLOW_TRAINING = frozenset({"slow_rank", "straggler", "below_threshold"})  # not numerics: no co-tenant makes NaN
_BURN = frozenset({"burn"})
# A GPU slower late in the burn than early, or than its peers, or clocked down without a thermal or power reason:
# what a co-tenant or clock events explain; not an XID, ECC errors, or a thermal or power throttle.
_SLOW_BURN = frozenset({"throughput_dropped", "straggler", "clocks_fell"})


@dataclass(frozen=True)
class Link:
    """Findings of ``cause_check`` (any reason, or one of ``reasons``) explain findings of ``symptoms`` written
    in ``stage``; with ``same_gpu``, only on the GPU the cause names (a cause naming no GPU covers them all)."""

    cause_check: str
    symptoms: frozenset[str]
    stage: str
    reasons: frozenset[str] = frozenset()
    same_gpu: bool = False
    symptom_reasons: frozenset[str] = frozenset()  # only these symptoms (empty: any finding of those checks)

    def explains(self, cause: NodeRow, symptom: NodeRow) -> bool:
        if cause is symptom or cause.check != self.cause_check or symptom.check not in self.symptoms:
            return False
        if self.symptom_reasons and symptom.reason not in self.symptom_reasons:
            return False
        if symptom.stage != self.stage or (self.reasons and cause.reason not in self.reasons):
            return False
        return not (self.same_gpu and cause.gpu is not None and symptom.gpu is not None and cause.gpu != symptom.gpu)


_INTRA_SETTINGS = frozenset(
    {"p2p_disabled", "p2p_level_low", "shm_disabled", "gpus_hidden", "algo_forced", "proto_forced", "site_rule"}
)
_INTER_SETTINGS = frozenset({"socket_ifname_missing", "ib_hca_missing", "ib_disabled", "net_forced", "site_rule"})
_PINNED = frozenset({"value_mismatch", "missing"})  # a pinned variable set otherwise (not a drift warning)
_DID_NOT_RUN = frozenset({"collective_failed", "collective_timeout", "launch_failed"})

# In priority order: the mechanism a log shows first, then the setting or state behind it.
LINKS: tuple[Link, ...] = (
    Link("gpu", _GPU_FIGURES | _INTRA, "single-node", frozenset({"busy"}), same_gpu=True),
    Link("gpu", _TRAINING, "single-node", frozenset({"busy"}), same_gpu=True, symptom_reasons=_SLOW_TRAINING),
    Link("transport", frozenset({"allreduce"}), "single-node", frozenset({"unexpected", "unreadable"})),
    Link("nccl_harmful", _INTRA, "single-node", _INTRA_SETTINGS),
    Link("nccl_env", _INTRA, "single-node", _PINNED),
    Link("nvlink", _INTRA, "single-node"),
    Link("topology", _INTRA, "single-node", frozenset({"nvlink_pairs"})),
    Link("gpu", _GPU_FIGURES, "single-node", frozenset({"clocks_low"}), same_gpu=True),
    Link("clock_events", _GPU_FIGURES, "single-node", same_gpu=True),
    Link("gpu", _TRAINING, "single-node", frozenset({"clocks_low"}), same_gpu=True, symptom_reasons=_SLOW_TRAINING),
    Link("clock_events", _TRAINING, "single-node", same_gpu=True, symptom_reasons=_SLOW_TRAINING),
    Link("gpu", _BURN, "burn", frozenset({"busy"}), same_gpu=True, symptom_reasons=_SLOW_BURN),
    Link("gpu", _BURN, "burn", frozenset({"clocks_low"}), same_gpu=True, symptom_reasons=_SLOW_BURN),
    Link("clock_events", _BURN, "burn", same_gpu=True, symptom_reasons=_SLOW_BURN),
    Link("pcie", frozenset({"host_bw"}), "single-node", same_gpu=True),
    Link("transport", _INTER - {"transport"}, "multi-node", frozenset({"unexpected_inter_node"})),
    Link("nccl_harmful", _INTER, "multi-node", _INTER_SETTINGS),
    # A name that does not resolve breaks a rendezvous; it does not slow a ring that started.
    Link("hostname", _INTER, "multi-node", symptom_reasons=_DID_NOT_RUN),
    Link("infiniband", _INTER, "multi-node"),
    Link("roce", _INTER, "multi-node"),  # a RoCE v1 or empty GID: no connection, or v1 where the fabric routes v2
    Link("roce_qos", _INTER, "multi-node"),  # MTU, traffic class, PFC or ECN off the fabric's: drops and pauses
    Link("efa", _INTER, "multi-node"),  # no plugin or provider: NCCL on sockets instead of the adapters
    Link("profile", _INTER, "multi-node", frozenset({"no_rdma_fabric"})),
    # A port counting errors (or still counting: grown since the last run) is the cable a slow rail crosses.
    Link("ib_counters", _INTER, "multi-node"),
    Link("topology", _INTER, "multi-node", frozenset({"nic_across_cpu", "rail_nic_not_nearest"})),
    Link("nccl_env", _INTER, "multi-node", _PINNED),
)


def _findings(rows: Sequence[NodeRow]) -> list[NodeRow]:
    return [r for r in rows if r.status not in _NOT_FINDINGS]


def causes_of(symptom: NodeRow, findings: Sequence[NodeRow]) -> list[NodeRow]:
    """The ``findings`` (one node's) that explain ``symptom``, likeliest first."""
    found: list[NodeRow] = []
    for link in LINKS:
        found += [c for c in findings if link.explains(c, symptom) and c not in found]
    return found


Explained = dict[int, list[NodeRow]]  # index of a finding among one node's rows -> the findings that explain it


def explain(rows: Sequence[NodeRow]) -> Explained:
    """For one node's rows: the index of each finding that has causes, and its causes. The other functions
    here take its result, so that a caller working on one node computes it once."""
    findings = _findings(rows)
    return {
        i: causes
        for i, row in enumerate(rows)
        if row.status not in _NOT_FINDINGS and (causes := causes_of(row, findings))
    }


def cause_first(rows: Sequence[NodeRow], explained: Explained | None = None) -> list[NodeRow]:
    """One node's findings, those that explain others first (in link priority), then the rest as they came."""
    explained = explain(rows) if explained is None else explained
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


def node_cause(rows: Sequence[NodeRow], explained: Explained | None = None) -> str:
    """The likeliest cause of a node's worst finding, as one sentence; empty when nothing explains anything."""
    explained = explain(rows) if explained is None else explained
    if not explained:
        return ""
    # The failing finding at the end of the longest chain: the figure, not the transport that explains it.
    first = min(explained, key=lambda i: (rows[i].status != Status.FAIL, -len(explained[i]), i))
    return sentence(rows[first], explained[first])
