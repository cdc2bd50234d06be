"""Causes chained to symptoms (synthetic rows shaped like the runs' own): the setting before the transport
before the figure, a co-tenant on the same GPU before the slow GPU, and the cause's action taken over."""

from __future__ import annotations

from cluster_accept.analysis.causes import cause_first, causes_of, explain, node_cause
from cluster_accept.analysis.verdicts import Verdict, node_verdict
from cluster_accept.checks.base import NodeRow, Status
from cluster_accept.checks.reasons import Action
from cluster_accept.reports.evidence import findings_by_node
from cluster_accept.tasks.stages import declared_links, reason_catalog

LINKS = declared_links()  # the cause links the stages' checks and probes declare


def row(stage: str, check: str, item: str, status: Status, reason: str, observed: str = "", expected: str = "",
        detail: str = "", gpu: int | None = None) -> NodeRow:  # fmt: skip
    return NodeRow("r", "c", stage, "n1", check, item, status, reason, observed, expected, detail, gpu)


P2P_OFF = row(
    "preflight", "nccl_harmful", "NCCL_P2P_DISABLE", Status.FAIL, "p2p_disabled", "NCCL_P2P_DISABLE=1",
    "unset or 0 on NVLink nodes", "set in /etc/nccl.conf: NCCL uses shared memory (SHM) instead of NVLink P2P",
)  # fmt: skip
SHM = row(
    "single-node", "transport", "intra_node", Status.FAIL, "unexpected", "SHM", "P2P", "SHM: 16 channel connections"
)
SLOW = row("single-node", "allreduce", "allreduce_busbw_gbps", Status.FAIL, "below_threshold", "24.9", ">= 300 GB/s")
HEALTHY = row("preflight", "driver", "version", Status.PASS, "ok", "580.159.04", "580.159.04")


def test_the_setting_comes_first_then_the_transport_then_the_figure() -> None:
    rows = [HEALTHY, SLOW, SHM, P2P_OFF]
    assert [r.code for r in cause_first(rows, explain(rows, LINKS))] == [
        "nccl_harmful:p2p_disabled",
        "transport:unexpected",
        "allreduce:below_threshold",
    ]
    verdict = node_verdict("n1", rows, LINKS)
    assert verdict.verdict == Verdict.REJECTED
    assert verdict.reasons == ["nccl_harmful:p2p_disabled", "transport:unexpected", "allreduce:below_threshold"]
    # The figure at the end of the chain is what the sentence explains, whatever order the rows came in.
    assert node_cause([HEALTHY, SHM, SLOW, P2P_OFF], explain([HEALTHY, SHM, SLOW, P2P_OFF], LINKS)) == verdict.cause
    assert verdict.cause == (
        "allreduce allreduce_busbw_gbps 24.9 (expected >= 300 GB/s): transport:unexpected SHM (SHM: 16 channel "
        "connections) because nccl_harmful:p2p_disabled NCCL_P2P_DISABLE=1 (set in /etc/nccl.conf: NCCL uses "
        "shared memory (SHM) instead of NVLink P2P)"
    )


def test_a_co_tenant_explains_only_the_gpu_it_ran_on() -> None:
    busy = row("single-node", "gpu", "compute_apps", Status.FAIL, "busy", "pid 4242 python3 (20480 MiB)", gpu=1)
    slow1 = row("single-node", "gemm", "gemm_bf16_tflops_vs_cluster", Status.FAIL, "straggler", "505", gpu=1)
    slow2 = row("single-node", "gemm", "gemm_bf16_tflops_vs_cluster", Status.FAIL, "straggler", "300", gpu=2)
    rows = [slow2, slow1, busy]
    assert node_cause(rows, explain(rows, LINKS)).startswith(
        "gemm gemm_bf16_tflops_vs_cluster gpu 1 505 (expected -): gpu:busy pid 4242"
    )
    findings = {
        (f["check"], f["gpu"]): f for f in findings_by_node(rows, "inv.yaml", None, reason_catalog(), LINKS)["n1"]
    }
    # The slow GPU with a co-tenant is not sent back: its action is the co-tenant's.
    assert findings[("gemm", 1)]["action"] == Action.CHECK_NODE.value
    assert findings[("gemm", 1)]["why"].startswith("explained by gpu:busy")
    assert findings[("gemm", 2)]["action"] == Action.REPLACE_GPU.value  # nothing explains GPU 2


def test_nothing_explains_a_lone_finding() -> None:
    assert node_cause([HEALTHY, SLOW], explain([HEALTHY, SLOW], LINKS)) == ""
    assert node_verdict("n1", [HEALTHY, SLOW], LINKS).reasons == ["allreduce:below_threshold"]
    assert node_verdict("n1", [HEALTHY], LINKS).cause == ""


def test_a_warning_that_explains_a_failure_is_named_among_the_reasons() -> None:
    loopback = row("preflight", "hostname", "resolves", Status.WARN, "resolves_to_loopback", "127.0.1.1")
    failed = row("multi-node", "allreduce", "inter_node node[01-02]", Status.ERROR, "collective_failed", "exit 1")
    verdict = node_verdict("n1", [failed, loopback], LINKS)
    assert verdict.reasons == ["hostname:resolves_to_loopback", "allreduce:collective_failed"]
    # A multi-node symptom is not explained by a single-node-only cause.
    busy = row("single-node", "gpu", "compute_apps", Status.FAIL, "busy", "pid 1", gpu=0)
    assert node_cause([failed, busy], explain([failed, busy], LINKS)) == ""


def test_a_slow_node_is_not_blamed_on_its_name_or_a_drift_warning() -> None:
    slow = row("multi-node", "isolation", "allreduce_inter", Status.FAIL, "slow_node", "node08")
    loopback = row("preflight", "hostname", "resolves", Status.WARN, "resolves_to_loopback", "127.0.0.1")
    drift = row("preflight", "nccl_env", "NCCL_DEBUG", Status.WARN, "drift", "INFO", "WARN (majority)")
    assert node_cause([slow, loopback, drift], explain([slow, loopback, drift], LINKS)) == ""
    hca = row("preflight", "nccl_harmful", "NCCL_IB_HCA", Status.FAIL, "ib_hca_missing", "NCCL_IB_HCA=mlx5_9")
    assert node_cause([slow, loopback, drift, hca], explain([slow, loopback, drift, hca], LINKS)).startswith(
        "isolation allreduce_inter node08 (expected -): nccl_harmful"
    )


def test_a_co_tenant_explains_a_slow_training_rank_on_its_gpu_but_not_bad_numerics() -> None:
    busy = NodeRow("r", "c", "single-node", "n1", "gpu", "processes", Status.FAIL, "busy", gpu=1)
    slow = NodeRow("r", "c", "single-node", "n1", "training", "slowest_rank", Status.FAIL, "slow_rank", gpu=1)
    other = NodeRow("r", "c", "single-node", "n1", "training", "slowest_rank", Status.FAIL, "slow_rank", gpu=0)
    nan = NodeRow("r", "c", "single-node", "n1", "training", "loss", Status.FAIL, "numerics")
    assert causes_of(slow, [busy, slow], LINKS) == [busy]
    assert causes_of(other, [busy, other], LINKS) == []
    assert causes_of(nan, [busy, nan], LINKS) == []
    socket = NodeRow(
        "r", "c", "multi-node", "n1", "transport", "inter_node n[1-2]", Status.FAIL, "unexpected_inter_node"
    )
    step = NodeRow("r", "c", "multi-node", "n1", "training_scaling", "2 nodes", Status.FAIL, "unattributed")
    assert causes_of(step, [socket, step], LINKS) == [socket]


def test_a_growing_port_counter_comes_before_the_slow_rail_it_explains() -> None:
    grew = row(
        "preflight", "ib_counters", "counter:mlx5_1/1.symbol_error", Status.WARN, "counter_grew", "212", "<= 3",
        "mlx5_1/1.symbol_error went from 3 to 212 since the previous run",
    )  # fmt: skip
    rail = row("multi-node", "rails", "rail1", Status.WARN, "below_other_rails", "21", ">= 45.6 GB/s")
    slow = row("multi-node", "isolation", "rail1", Status.FAIL, "slow_rail", "n1 rail1 (mlx5_1)")
    assert [r.code for r in cause_first([slow, rail, grew], explain([slow, rail, grew], LINKS))] == [
        "ib_counters:counter_grew",
        "isolation:slow_rail",
        "rails:below_other_rails",
    ]
    far = row("preflight", "topology", "GPU2 NIC", Status.FAIL, "nic_across_cpu", "mlx5_0/mlx5_1 SYS", gpu=2)
    weak_pair = row("single-node", "gpu_pairs", "GPU1->GPU2", Status.FAIL, "weak_direction", "200.0")
    assert causes_of(weak_pair, [far, weak_pair], LINKS) == []  # a NIC's place explains nothing inside the node
    assert causes_of(slow, [far, slow], LINKS) == [far]


def test_a_co_tenant_that_started_half_way_through_the_burn_is_named_before_the_drop_it_caused() -> None:
    """The rows a burn writes when another process starts a GEMM on GPU 1 half-way through: the GPU's process is
    the cause, the throughput drop its symptom, and GPU 0's drop stays its own."""
    drop = row("burn", "burn", "gpu1", Status.FAIL, "throughput_dropped", "600.5 → 290.5 TFLOP/s (-51.6 %)", gpu=1)
    busy = row("burn", "gpu", "compute_apps", Status.FAIL, "busy", "pid 4242 python (30000 MiB)", gpu=1)
    other = row("burn", "burn", "gpu0", Status.FAIL, "throughput_dropped", "600.0 → 450.0 TFLOP/s (-25.0 %)", gpu=0)
    heat = row("burn", "burn", "gpu1", Status.FAIL, "throttled", "900 MHz under load (HW thermal slowdown)", gpu=1)
    verdict = node_verdict("n1", [drop, other, busy], LINKS)
    assert verdict.reasons[:2] == ["gpu:busy", "burn:throughput_dropped"], verdict.reasons
    assert verdict.cause.startswith("burn gpu1 gpu 1 600.5 → 290.5 TFLOP/s (-51.6 %) (expected -): gpu:busy pid 4242")
    assert causes_of(other, [busy, other], LINKS) == []  # another GPU's drop is not the co-tenant's
    assert causes_of(heat, [busy, heat], LINKS) == []  # a thermal throttle is the GPU's own
    events = row("preflight", "clock_events", "gpu1", Status.WARN, "sw_power_cap", "active", gpu=1)
    assert causes_of(drop, [events, drop], LINKS) == [events]
