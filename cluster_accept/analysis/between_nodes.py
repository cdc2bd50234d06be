"""What the multi-node stage's rows answer of a profile, and the findings that can explain them.

The stage writes rows of its own (``scaling``, ``isolation``, ``rails``, ``training_scaling``) and of the
probes it runs between nodes (``allreduce``, ``collectives``, ``transport``); these are its declarations, as a
probe's are its own (:class:`~cluster_accept.checks.declarations.Expectation`,
:class:`~cluster_accept.checks.declarations.Link`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, get_args

from cluster_accept.analysis.causes import PINNED
from cluster_accept.checks.declarations import Expectation, Link, always, threshold_set
from cluster_accept.inventory.model import ExtraCollective, busbw_threshold

STAGE = "multi-node"
SYMPTOMS = frozenset({"allreduce", "transport", "scaling", "isolation", "training_scaling", "collectives", "rails"})
# Settings in the job's environment that change how NCCL reaches other nodes.
INTER_SETTINGS = frozenset({"socket_ifname_missing", "ib_hca_missing", "ib_disabled", "net_forced", "site_rule"})
DID_NOT_RUN = frozenset({"collective_failed", "collective_timeout", "launch_failed"})
# A multi-node run that failed, a node isolation pulled, a sweep that stopped: their rows settle what the node
# would have been measured for across nodes.
ACROSS_NODES = ("allreduce", "isolation", "scaling")
RUN_WITH_OTHERS = ("allreduce", "isolation")

# In priority order: the mechanism a log shows first, then the setting or state behind it.
CAUSES: tuple[Link, ...] = (
    Link("transport", SYMPTOMS - {"transport"}, STAGE, frozenset({"unexpected_inter_node"})),
    Link("nccl_harmful", SYMPTOMS, STAGE, INTER_SETTINGS),
    # A name that does not resolve breaks a rendezvous; it does not slow a ring that started.
    Link("hostname", SYMPTOMS, STAGE, symptom_reasons=DID_NOT_RUN),
    Link("infiniband", SYMPTOMS, STAGE),
    Link("roce", SYMPTOMS, STAGE),  # a RoCE v1 or empty GID: no connection, or v1 where the fabric routes v2
    Link("roce_qos", SYMPTOMS, STAGE),  # MTU, traffic class, PFC or ECN off the fabric's: drops and pauses
    Link("efa", SYMPTOMS, STAGE),  # no plugin or provider: NCCL on sockets instead of the adapters
    Link("profile", SYMPTOMS, STAGE, frozenset({"no_rdma_fabric"})),
    # A port counting errors (or still counting: grown since the last run) is the cable a slow rail crosses.
    Link("ib_counters", SYMPTOMS, STAGE),
    Link("topology", SYMPTOMS, STAGE, frozenset({"nic_across_cpu", "rail_nic_not_nearest"})),
    Link("nccl_env", SYMPTOMS, STAGE, PINNED),
)


def _collective_across_nodes(op: str) -> Callable[[Any], bool]:
    return lambda profile: op in profile.probes.collectives


EXPECTATIONS: tuple[Expectation, ...] = (
    Expectation("multi-node all-reduce", STAGE, "scaling", always, None, RUN_WITH_OTHERS),
    Expectation(
        "allreduce_inter_busbw_gbps_min",
        STAGE,
        "scaling",
        threshold_set("allreduce_inter_busbw_gbps_min"),
        None,
        RUN_WITH_OTHERS,
    ),
    Expectation(
        "scaling_efficiency_min", STAGE, "scaling", threshold_set("scaling_efficiency_min"), None, RUN_WITH_OTHERS
    ),
    *(
        Expectation(
            f"probes.collectives.{op} across nodes",
            STAGE,
            "collectives",
            _collective_across_nodes(op),
            f"{op}_inter",
            ACROSS_NODES,
        )
        for op in get_args(ExtraCollective)
    ),
    *(
        Expectation(
            busbw_threshold(op, "inter"),
            STAGE,
            "collectives",
            threshold_set(busbw_threshold(op, "inter")),
            f"{op}_inter",
            ACROSS_NODES,
        )
        for op in get_args(ExtraCollective)
    ),
    Expectation("probes.rails", STAGE, "rails", lambda p: bool(p.probes.rails), None, ACROSS_NODES),
    Expectation("rail_busbw_gbps_min", STAGE, "rails", threshold_set("rail_busbw_gbps_min"), None, ACROSS_NODES),
    Expectation("multi-node training", STAGE, "training_scaling", lambda p: p.training.enabled, None, RUN_WITH_OTHERS),
    Expectation(
        "training_scaling_efficiency_min",
        STAGE,
        "training_scaling",
        threshold_set("training_scaling_efficiency_min"),
        None,
        RUN_WITH_OTHERS,
    ),
    Expectation(
        "expected_transport.inter_node",
        STAGE,
        "transport",
        lambda p: p.probes.expected_transport.inter_node is not None and p.probes.device == "cuda",
        "inter_node",
        ACROSS_NODES,
    ),
)
