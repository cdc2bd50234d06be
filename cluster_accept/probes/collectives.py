"""Intra-node all-gather, reduce-scatter, all-to-all and send/recv: the collectives FSDP/ZeRO-3, mixture-of-experts
and pipeline-parallel jobs live on, measured in the same torchrun as the all-reduce sweep (one NCCL start).

Bus bandwidth as nccl-tests defines it (see the node-side script), judged at the largest size against the
profile's ``<collective>_intra_busbw_gbps_min`` and against the cluster's median. An all-reduce can be healthy
while all-to-all is slow (it stresses every GPU pair at once, where a ring all-reduce uses only neighbours),
so each collective the profile lists (``probes.collectives``) gets its own row on every node.
"""

from __future__ import annotations

from collections.abc import Callable

from cluster_accept.analysis.causes import intra_node_causes
from cluster_accept.analysis.coverage import RUN_FAILED
from cluster_accept.analysis.probe_output import ProbeOutput, parse_json_lines
from cluster_accept.analysis.probe_verdicts import MetricRule
from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.checks.declarations import Expectation, threshold_set
from cluster_accept.checks.reasons import Action, Reason, declare
from cluster_accept.inventory.model import COLLECTIVE_METRICS, ExtraCollective, Profile, busbw_threshold
from cluster_accept.probes.base import SINGLE_NODE, Probe, cluster_judgement, own_figures
from cluster_accept.probes.scripts import ALLREDUCE
from cluster_accept.reports.figures import ReportSection, ReportView, size_sweep_chart

NAME = "collectives"
ORDER = 41
SCRIPT = ALLREDUCE  # one torchrun measures all-reduce and these
EXTRA = tuple(op for op in COLLECTIVE_METRICS if op != "all_reduce")
METRICS = {COLLECTIVE_METRICS[op]: MetricRule(NAME, busbw_threshold(op, "intra"), False) for op in EXTRA}
TITLES = {
    "all_gather": "all-gather",
    "reduce_scatter": "reduce-scatter",
    "all_to_all": "all-to-all",
    "send_recv": "send/recv",
}
REASONS = declare(
    Reason("measured", Status.PASS, "the collective's bus bandwidth at the largest size (judged by the rows beside)"),
    Reason(
        "below_threshold",
        Status.FAIL,
        "this collective's bus bandwidth is below the profile's minimum: check NVLink/NVSwitch (nvidia-smi nvlink "
        "-s, topo -m) and the transport NCCL chose",
        Action.RERUN,
    ),
    Reason(
        "straggler",
        Status.FAIL,
        "this collective is far slower here than on the other nodes: check NVLink/NVSwitch and the GPU pair matrix",
        Action.RERUN,
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
    return own_figures(parse_json_lines(stdout), METRICS)


def _skipped(output: ProbeOutput) -> dict[str, str]:
    skips = [i for i in output.info if i.get("info") == "skip" and "collective" in i]
    return {str(i["collective"]): str(i.get("reason")) for i in skips}


def _largest(output: ProbeOutput, metric: str) -> dict[str, object] | None:
    figures = [m for m in output.measurements if m.get("metric") == metric]
    return max(figures, key=lambda m: m.get("size") or 0) if figures else None


def _row(op: ExtraCollective, output: ProbeOutput, profile: Profile, run_skip: str | None) -> CheckRow:
    item = f"{op}_intra"
    threshold = getattr(profile.thresholds, busbw_threshold(op, "intra"))
    expected = f">= {threshold:g} GB/s" if threshold is not None else None
    if run_skip is not None:
        return CheckRow(NAME, item, Status.SKIP, "single_gpu", None, expected, run_skip)
    unsupported = _skipped(output).get(op)
    if unsupported is not None:
        return CheckRow(NAME, item, Status.SKIP, "unsupported", None, expected, unsupported)
    largest = _largest(output, COLLECTIVE_METRICS[op])
    if largest is None:
        return CheckRow(NAME, item, Status.ERROR, "not_measured", None, expected, "no figure in the sweep's output")
    said = f"{largest['value']} GB/s at {largest.get('size')} B, {largest.get('world_size')} ranks"
    return CheckRow(NAME, item, Status.PASS, "measured", f"{float(str(largest['value'])):.4g}", expected, said)


def inspect(output: ProbeOutput, profile: Profile) -> list[CheckRow]:
    """A row for each collective the profile lists: measured (the threshold and cluster rows judge it), or why
    not. Nothing for a run that failed outright: the all-reduce probe's row says why."""
    run_skip = next(
        (str(i.get("reason")) for i in output.info if i.get("info") == "skip" and "collective" not in i), None
    )
    ran = run_skip is not None or bool(output.measurements) or any(i.get("info") == "probe" for i in output.info)
    if not ran:
        return []
    return [_row(op, output, profile, run_skip) for op in profile.probes.collectives]


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
    # every collective the profile lists gets its row inside the node (measured, or why not)
    *(
        Expectation(
            f"probes.collectives.{op}", SINGLE_NODE, NAME, _listed(op), f"{op}_intra", ("allreduce",), RUN_FAILED
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
)
