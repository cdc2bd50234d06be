"""No silent pass: every expectation a profile states yields a row for every node a stage tested.

A check that finds nothing to look at (no transport in a log, no figure for a threshold) must say so — pass,
fail, or skip/error with the reason — never leave the expectation unjudged while the node is accepted.
:data:`EXPECTATIONS` maps each expectation of the profile model to the check (and item) whose row judges it
and the stage that writes that row; :func:`missing` lists what a stage left without a row, and the stage
adds an ``error`` row ``coverage:no_row`` for each, so a gap rejects the node instead of passing it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import get_args

from cluster_accept.checks.base import CheckRow, NodeRow, Status
from cluster_accept.checks.reasons import TOOL_CHECK, Action, Reason, declare
from cluster_accept.inventory.model import COLLECTIVE_METRICS, ExtraCollective, Profile, busbw_threshold

NAME = "coverage"
REASONS = declare(
    Reason(
        "no_row",
        Status.ERROR,
        "the profile states this expectation but the stage judged nothing for it on this node: a gap in the "
        "tool, not the node; rerun and report it",
        Action.RERUN,
    ),
)


@dataclass(frozen=True)
class Expectation:
    """``name`` (the profile's key) is judged by a row of ``check`` (whose item starts with ``item``, when
    given) written in ``stage``; ``stated`` says whether a profile states it. A row of a ``settled_by`` check
    that is not a pass settles it too: a probe that failed or was skipped could not judge what it carries."""

    name: str
    stage: str
    check: str
    stated: Callable[[Profile], bool]
    item: str | None = None
    settled_by: tuple[str, ...] = ()
    settling_reasons: frozenset[str] = frozenset()  # when given, only these reasons of settled_by settle it


def _set(get: Callable[[Profile], object]) -> Callable[[Profile], bool]:
    return lambda profile: get(profile) is not None


def _threshold_set(key: str) -> Callable[[Profile], bool]:
    return lambda profile: getattr(profile.thresholds, key) is not None


def _collective_across_nodes(op: str) -> Callable[[Profile], bool]:
    return lambda profile: op in profile.probes.collectives


# A multi-node run that failed, a node isolation pulled, a sweep that stopped: their rows settle what the node
# would have been measured for across nodes.
_ACROSS_NODES = ("allreduce", "isolation", "scaling")


def _collective_listed(op: str) -> Callable[[Profile], bool]:
    """The profile lists ``op`` and the torch sweep runs (nccl-tests' variant measures all-reduce only)."""
    return lambda profile: op in profile.probes.collectives and not profile.probes.nccl_tests_all_reduce


# The training run itself failed: nothing it would have measured can be judged (its own row says why).
_TRAINING_RUN_FAILED = frozenset({"probe_failed", "probe_error", "probe_timeout"})
# The same for a probe that measures several figures: its own failure row judges every one of them.
_PROBE_RUN_FAILED = _TRAINING_RUN_FAILED

EXPECTATIONS: tuple[Expectation, ...] = (
    Expectation("gpu", "preflight", "gpu_count", _set(lambda p: p.gpu)),
    Expectation("driver_version", "preflight", "driver", _set(lambda p: p.driver_version)),
    Expectation("cuda_version", "preflight", "cuda", _set(lambda p: p.cuda_version)),
    Expectation("persistence_mode", "preflight", "persistence", _set(lambda p: p.persistence_mode)),
    Expectation("nvlink", "preflight", "nvlink", _set(lambda p: p.nvlink)),
    Expectation("pcie", "preflight", "pcie", _set(lambda p: p.pcie)),
    Expectation("infiniband", "preflight", "infiniband", _set(lambda p: p.infiniband)),
    Expectation("harmful NCCL settings", "preflight", "nccl_harmful", lambda p: True),
    Expectation("probes.python", "preflight", "probe", lambda p: True),
    *(
        # each GEMM minimum needs its own figure's row (a bf16 row says nothing of fp8), unless the bench failed
        Expectation(
            f"gemm_{dtype}_tflops_min",
            "single-node",
            "gemm",
            _threshold_set(f"gemm_{dtype}_tflops_min"),
            f"gemm_{dtype}_tflops",
            ("gemm",),
            _PROBE_RUN_FAILED,
        )
        for dtype in ("bf16", "fp16", "tf32", "fp8")
    ),
    Expectation("hbm_copy_gbps_min", "single-node", "hbm", _set(lambda p: p.thresholds.hbm_copy_gbps_min)),
    Expectation(
        "allreduce_intra_busbw_gbps_min",
        "single-node",
        "allreduce",
        _set(lambda p: p.thresholds.allreduce_intra_busbw_gbps_min),
    ),
    Expectation(
        "expected_transport.intra_node",
        "single-node",
        "transport",
        _set(lambda p: p.probes.expected_transport.intra_node),
        "intra_node",
        ("allreduce",),
    ),
    *(
        # every collective the profile lists gets its row inside the node (measured, or why not)
        Expectation(
            f"probes.collectives.{op}",
            "single-node",
            "collectives",
            _collective_listed(op),
            f"{op}_intra",
            ("allreduce",),
            _PROBE_RUN_FAILED,
        )
        for op in get_args(ExtraCollective)
    ),
    *(
        Expectation(
            busbw_threshold(op, "intra"),
            "single-node",
            "collectives",
            _threshold_set(busbw_threshold(op, "intra")),
            COLLECTIVE_METRICS[op],
            ("allreduce", "collectives"),
            _PROBE_RUN_FAILED | {"single_gpu", "unsupported", "not_measured"},
        )
        for op in get_args(ExtraCollective)
    ),
    Expectation(
        "probes.gpu_pairs",
        "single-node",
        "gpu_pairs",
        lambda p: p.probes.gpu_pairs and p.probes.device == "cuda",
    ),
    Expectation(
        "gpu_pair_copy_gbps_min",
        "single-node",
        "gpu_pairs",
        lambda p: p.thresholds.gpu_pair_copy_gbps_min is not None and p.probes.device == "cuda",
        None,
        ("gpu_pairs",),
        _PROBE_RUN_FAILED,
    ),
    Expectation("multi-node all-reduce", "multi-node", "scaling", lambda p: True, None, ("allreduce", "isolation")),
    Expectation(
        "allreduce_inter_busbw_gbps_min",
        "multi-node",
        "scaling",
        _set(lambda p: p.thresholds.allreduce_inter_busbw_gbps_min),
        None,
        ("allreduce", "isolation"),
    ),
    Expectation(
        "scaling_efficiency_min",
        "multi-node",
        "scaling",
        _set(lambda p: p.thresholds.scaling_efficiency_min),
        None,
        ("allreduce", "isolation"),
    ),
    *(
        Expectation(
            f"probes.collectives.{op} across nodes",
            "multi-node",
            "collectives",
            _collective_across_nodes(op),
            f"{op}_inter",
            _ACROSS_NODES,
        )
        for op in get_args(ExtraCollective)
    ),
    *(
        Expectation(
            busbw_threshold(op, "inter"),
            "multi-node",
            "collectives",
            _threshold_set(busbw_threshold(op, "inter")),
            f"{op}_inter",
            _ACROSS_NODES,
        )
        for op in get_args(ExtraCollective)
    ),
    Expectation("probes.rails", "multi-node", "rails", lambda p: bool(p.probes.rails), None, _ACROSS_NODES),
    Expectation(
        "rail_busbw_gbps_min",
        "multi-node",
        "rails",
        _set(lambda p: p.thresholds.rail_busbw_gbps_min),
        None,
        _ACROSS_NODES,
    ),
    Expectation("training", "single-node", "training", lambda p: p.training.enabled),
    Expectation(
        "training_tokens_per_s_per_gpu_min",
        "single-node",
        "training",
        _set(lambda p: p.thresholds.training_tokens_per_s_per_gpu_min),
        "training_tokens_per_s_per_gpu",
        ("training",),
        _TRAINING_RUN_FAILED,
    ),
    Expectation(
        "training_mfu_min",
        "single-node",
        "training",
        _set(lambda p: p.thresholds.training_mfu_min),
        "mfu",
        ("training",),
        _TRAINING_RUN_FAILED,
    ),
    Expectation(
        "multi-node training",
        "multi-node",
        "training_scaling",
        lambda p: p.training.enabled,
        None,
        ("allreduce", "isolation"),
    ),
    Expectation(
        "training_scaling_efficiency_min",
        "multi-node",
        "training_scaling",
        _set(lambda p: p.thresholds.training_scaling_efficiency_min),
        None,
        ("allreduce", "isolation"),
    ),
    # the burn: a row per node (each GPU's, or the suite's skip); the digests and DCGM's tests, unless the burn
    # run itself failed (its row says why)
    Expectation("burn.minutes", "burn", "burn", lambda p: p.burn.minutes > 0 or p.burn.light_minutes > 0),
    Expectation("burn.sdc", "burn", "sdc", lambda p: p.burn.sdc, None, ("burn",), _PROBE_RUN_FAILED),
    Expectation("burn.dcgm_level", "burn", "dcgm", lambda p: p.burn.dcgm_level is not None),
    Expectation(
        "expected_transport.inter_node",
        "multi-node",
        "transport",
        lambda p: p.probes.expected_transport.inter_node is not None and p.probes.device == "cuda",
        "inter_node",
        ("allreduce", "isolation", "scaling"),
    ),
)


def stated(profile: Profile, stage: str) -> list[Expectation]:
    """What ``profile`` states that ``stage`` judges, each ``nccl_env`` key its own expectation."""
    found = [e for e in EXPECTATIONS if e.stage == stage and e.stated(profile)]
    if stage == "preflight":
        found += [Expectation(f"nccl_env.{key}", stage, "nccl_env", lambda p: True, key) for key in profile.nccl_env]
    return found


def _judged(rows: Iterable[NodeRow], expectation: Expectation) -> bool:
    return any(
        (r.check == expectation.check and (expectation.item is None or r.item.startswith(expectation.item)))
        or (
            r.check in expectation.settled_by
            and r.status != Status.PASS
            and (not expectation.settling_reasons or r.reason in expectation.settling_reasons)
        )
        for r in rows
    )


def missing(stage: str, tested: Mapping[str, Profile], rows: Iterable[NodeRow]) -> list[tuple[str, Expectation]]:
    """(node, expectation) pairs that ``stage`` left without a row. A node the stage could not reach (or the tool
    failed on), or whose
    stage ended with a stage-wide skip (one GPU, fewer than two nodes), was judged by that row."""
    by_node: dict[str, list[NodeRow]] = {}
    for row in rows:
        if row.stage == stage:
            by_node.setdefault(row.node, []).append(row)
    gaps = []
    for node, profile in tested.items():
        own = by_node.get(node, [])
        if any(r.status == Status.UNREACHABLE or r.check == TOOL_CHECK for r in own):
            continue
        gaps += [(node, e) for e in stated(profile, stage) if not _judged(own, e)]
    return gaps


def gap_row(expectation: Expectation) -> CheckRow:
    what = f"{expectation.check} row" + (f" for {expectation.item}" if expectation.item else "")
    return CheckRow(NAME, expectation.name, Status.ERROR, "no_row", None, what, "the stage judged nothing for it")
