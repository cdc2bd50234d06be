"""Intra-node all-gather, reduce-scatter, all-to-all and send/recv: the collectives FSDP/ZeRO-3, mixture-of-experts
and pipeline-parallel jobs live on, measured in the same torchrun as the all-reduce sweep (one NCCL start).

Bus bandwidth as nccl-tests defines it (see the node-side script), judged at the largest size against the
profile's ``<collective>_intra_busbw_gbps_min`` — where the profile sets none, a fraction of the GPU's NVLink
(of its PCIe where no NVLink joins every GPU) — and against the cluster's median. An all-reduce can be healthy
while all-to-all is slow (it stresses every GPU pair at once, where a ring all-reduce uses only neighbours),
so each collective the profile lists (``probes.collectives``) gets its own rows on every node: judged, not
judged (no minimum and no peer), or why it has no figure.
"""

from __future__ import annotations

from collections.abc import Callable

from cluster_accept.inventory.model import COLLECTIVE_METRICS, ExtraCollective, busbw_threshold
from cluster_accept.probes.allreduce import PCIE_COLLECTIVE
from cluster_accept.probes.contract import (
    RUN_FAILED,
    SINGLE_NODE,
    Action,
    CheckRow,
    Default,
    Expectation,
    FindingKind,
    MetricRule,
    Probe,
    ProbeOutput,
    Profile,
    Reason,
    ReportSection,
    ReportView,
    Status,
    cluster_judgement,
    declare,
    fault,
    healthy,
    intra_node_causes,
    nvlink_rating,
    own_figures,
    parse_json_lines,
    size_sweep_chart,
    threshold_set,
)
from cluster_accept.probes.scripts import ALLREDUCE, ALLREDUCE_TORCH_MISSING

NAME = "collectives"
ORDER = 41
SCRIPT = ALLREDUCE  # one torchrun measures all-reduce and these
EXTRA = tuple(op for op in COLLECTIVE_METRICS if op != "all_reduce")
# Where no NVLink joins every GPU (the default minimums' NVLink figure is 18 x 26.562 = 478 GB/s on H100/H200),
# all-gather, reduce-scatter and all-to-all move about as much per GPU as the all-reduce: at 1 GiB, on 4 GPUs
# 319-329 / 322-326 / 320-337 GB/s (4 x H200 and 4 x H100, bench/results/h100x4-floors/), on 2 GPUs 264-267 /
# 272 / 308-327 (0.55-0.70 of 478 in all); with P2P disabled (SHM) 19.7-26.4 (0.04-0.06). 0.40 (191 GB/s on
# H100/H200) is 28 % under the lowest healthy figure and 7 times the highest crippled one.
RING = Default(
    "NVLink bandwidth per GPU and direction",
    0.40,
    nvlink_rating,
    "2 and 4 x H100/H200 at 1 GiB: 264-337 GB/s (0.55-0.70 of 478); P2P disabled (SHM): 19.7-26.4 (0.04-0.06)",
    otherwise=PCIE_COLLECTIVE,
)
# Send/recv moves between neighbours only: each pair's own links, a third of a GPU's NVLinks on 4-GPU boards
# without NVSwitch (6 of 18). Measured 352.8-355.2 GB/s on 2 and 4 x H100 with NVSwitch (0.74 of 478), 22.4-23.6
# with P2P disabled; 0.20 (96 GB/s) stays under a 4-GPU board's pair and 4 times over the crippled figure.
PAIR = Default(
    "NVLink bandwidth per GPU and direction (a pair's share on 4-GPU boards: a third)",
    0.20,
    nvlink_rating,
    "2 and 4 x H100 at 1 GiB: 352.8-355.2 GB/s (0.74 of 478); P2P disabled (SHM): 22.4-23.6 (0.05)",
    otherwise=PCIE_COLLECTIVE,
)
METRICS = {
    COLLECTIVE_METRICS[op]: MetricRule(
        NAME, busbw_threshold(op, "intra"), False, default=PAIR if op == "send_recv" else RING
    )
    for op in EXTRA
}
TITLES = {
    "all_gather": "all-gather",
    "reduce_scatter": "reduce-scatter",
    "all_to_all": "all-to-all",
    "send_recv": "send/recv",
}
REASONS = declare(
    Reason(
        "below_threshold",
        Status.FAIL,
        "this collective's bus bandwidth is below its minimum (the profile's, or the row's fraction of the GPU's "
        "NVLink or PCIe): first the job_settings rows (a setting measured again without it) and NCCL's channels "
        "and transport (nccl_mechanism); with no setting to blame, NVLink/NVSwitch (nvidia-smi nvlink -s, topo -m)",
        Action.CHECK_NODE,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "straggler",
        Status.FAIL,
        "this collective is far slower here than on the other nodes: the job_settings rows, then NVLink/NVSwitch "
        "and the GPU pair matrix",
        Action.CHECK_NODE,
        kind=FindingKind.RELATIVE,
    ),
    Reason("single_gpu", Status.SKIP, "fewer than two GPUs: no collective inside the node"),
    Reason("unsupported", Status.SKIP, "the backend has no such collective (gloo on CPU, an old torch)"),
    Reason(
        "not_measured",
        Status.ERROR,
        "the sweep ran but printed no figure for this collective (it stopped early): see its output and rerun",
        Action.RERUN,
    ),
)


def parse(stdout: str) -> ProbeOutput:
    """The extra collectives' figures, and the run's info lines (skips name their collective)."""
    return own_figures(parse_json_lines(stdout, SCRIPT.unkept), METRICS)


def _skipped(output: ProbeOutput) -> dict[str, str]:
    skips = [i for i in output.info if i.kind == "skip" and "collective" in i.members]
    return {str(i.members["collective"]): str(i.get("reason")) for i in skips}


def _row(op: ExtraCollective, output: ProbeOutput, run_skip: str | None) -> CheckRow | None:
    """Why ``op`` has no figure on this node; None when it has one (the figure's own rows judge it)."""
    item = COLLECTIVE_METRICS[op]
    if run_skip is not None:
        return CheckRow(NAME, item, Status.SKIP, "single_gpu", None, None, run_skip)
    unsupported = _skipped(output).get(op)
    if unsupported is not None:
        return CheckRow(NAME, item, Status.SKIP, "unsupported", None, None, unsupported)
    if not any(m.metric == item for m in output.measurements):
        return CheckRow(NAME, item, Status.ERROR, "not_measured", None, None, "no figure in the sweep's output")
    return None


def inspect(output: ProbeOutput, profile: Profile) -> list[CheckRow]:
    """Why a collective the profile lists has no figure on this node (one GPU, the backend lacks it, the sweep
    stopped early); one that has a figure is judged by its rows in ``evaluate``. Nothing for a run that failed
    outright: the all-reduce probe's row says why."""
    run_skip = output.skip_reason()
    ran = run_skip is not None or bool(output.measurements) or any(i.kind == "probe" for i in output.info)
    if not ran:
        return []
    return [row for op in profile.probes.collectives if (row := _row(op, output, run_skip)) is not None]


evaluate = cluster_judgement(METRICS)


def report(view: ReportView) -> ReportSection | None:
    charts = []
    for op in EXTRA:
        metric = COLLECTIVE_METRICS[op]
        chart = size_sweep_chart(
            op.replace("_", ""),
            f"Intra-node {TITLES[op]} bus bandwidth vs message size",
            metric,
            METRICS[metric].threshold,
            NAME,
            view,
        )
        if chart is not None:
            charts.append(chart)
    return ReportSection("collectives", tuple(charts)) if charts else None


def _listed(op: str) -> Callable[[Profile], bool]:
    """The profile lists ``op`` and the torch sweep runs (nccl-tests' variant measures all-reduce only)."""
    return lambda profile: op in profile.probes.collectives and not profile.probes.nccl_tests_all_reduce


EXPECTATIONS = (
    # every collective the profile lists gets its rows inside the node (judged, not judged, or why not measured)
    *(
        Expectation(
            f"probes.collectives.{op}",
            SINGLE_NODE,
            NAME,
            _listed(op),
            COLLECTIVE_METRICS[op],
            ("allreduce",),
            RUN_FAILED,
        )
        for op in EXTRA
    ),
    *(
        Expectation(
            busbw_threshold(op, "intra"),
            SINGLE_NODE,
            NAME,
            threshold_set(busbw_threshold(op, "intra")),
            COLLECTIVE_METRICS[op],
            ("allreduce", NAME),
            RUN_FAILED | {"single_gpu", "unsupported", "not_measured"},
        )
        for op in EXTRA
    ),
)

# The profile its samples are judged under: the minimums they are held to.
SAMPLE_MINIMUMS = {f"{op}_intra_busbw_gbps_min": 0.01 for op in ("allgather", "reducescatter", "alltoall")}
SAMPLE_PROFILE = {"probes": {"device": "cpu"}, "training": {"enabled": False}, "thresholds": SAMPLE_MINIMUMS}

PROBE = Probe(
    name=NAME,
    script=SCRIPT,
    metrics=METRICS,
    reasons=REASONS,
    parse=parse,
    evaluate=evaluate,
    order=ORDER,
    inspect=inspect,
    report=report,
    causes=intra_node_causes(frozenset({NAME})),
    expectations=EXPECTATIONS,
    samples=(
        healthy("gloo_2ranks", {"ok"}, fixture="collectives/gloo_2ranks.txt", profile=SAMPLE_PROFILE),
        fault(
            "slow_allgather",
            {"below_threshold"},
            fixture="collectives/gloo_2ranks_slow_allgather.txt",
            profile=SAMPLE_PROFILE,
        ),
        ALLREDUCE_TORCH_MISSING.judged({"probe_failed"}, SAMPLE_PROFILE),
    ),
)
