"""Machine-readable outcomes of a run: ``summary.json`` for scripts and schedulers, and a Prometheus text
file for node_exporter's textfile collector (one verdict series per node, its key figures beside it).

Pure functions; the caller writes the files (atomically: node_exporter must never read half a file). The text
file's format is ``prometheus_client``'s (:mod:`reports.gauges`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cluster_accept.analysis.verdicts import NOT_ACCEPTED, Verdict, VerdictRow

if TYPE_CHECKING:  # the history's frames: a node's own check (check --local) loads no pyarrow, nor prometheus_client
    from prometheus_client.core import Metric

    from cluster_accept.analysis.fleet import FleetView

VERDICTS = (Verdict.ACCEPTED, Verdict.REJECTED, Verdict.UNREACHABLE, Verdict.SKIPPED, Verdict.TOOL_ERROR)
# Key figures exported per node: (metric in measurements, Prometheus name, help text).
FIGURES = (
    ("gemm_bf16_tflops", "cluster_accept_gemm_bf16_tflops", "Median bf16 GEMM TFLOP/s over the node's GPUs."),
    ("hbm_copy_gbps", "cluster_accept_hbm_copy_gbps", "Median HBM copy bandwidth over the node's GPUs, GB/s."),
    ("allreduce_busbw_gbps", "cluster_accept_allreduce_busbw_gbps", "Intra-node all-reduce bus bandwidth, GB/s."),
)


def _count(verdicts: Sequence[VerdictRow], verdict: Verdict) -> int:
    return sum(1 for v in verdicts if v.verdict == verdict)


def summary(
    run: Mapping[str, Any], verdicts: Sequence[VerdictRow], warnings: Mapping[str, list[str]]
) -> dict[str, Any]:
    """``summary.json``: counts, the nodes not accepted with their reasons, nodes accepted with warnings.
    Plain values only (verdicts as their ``.value``): the record is JSON."""
    counts = {verdict: _count(verdicts, verdict) for verdict in VERDICTS}
    bad = [
        {"node": v.node, "verdict": v.verdict.value, "reasons": list(v.reasons)}
        for v in verdicts
        if v.verdict in NOT_ACCEPTED or v.verdict == Verdict.TOOL_ERROR
    ]
    flagged = [
        {"node": v.node, "warnings": warnings[v.node]}
        for v in verdicts
        if v.verdict == Verdict.ACCEPTED and warnings.get(v.node)
    ]
    return {
        "run_id": run["run_id"],
        "cluster": run["cluster"],
        "started": run.get("started"),
        "ended": run.get("ended"),
        "stages": list(run.get("stages") or []),
        "suite": run.get("suite"),
        "counts": {verdict.value: count for verdict, count in counts.items()},
        "all_accepted": counts[Verdict.ACCEPTED] > 0
        and counts[Verdict.REJECTED] == 0
        and counts[Verdict.UNREACHABLE] == 0
        and counts[Verdict.TOOL_ERROR] == 0,
        "not_accepted": bad,
        "accepted_with_warnings": flagged,
    }


def prometheus_text(
    run: Mapping[str, Any],
    verdicts: Sequence[VerdictRow],
    figures: Mapping[tuple[str, str], float],
    fleet: FleetView | None = None,
) -> str:
    """The text exposition format, written by ``prometheus_client`` (:mod:`reports.gauges`): per node a 0/1 series
    for each verdict (so alerts can select on ``verdict="rejected"``), the node's key figures, and the run's time
    and counts. Figures and the fleet's values go out to 6 significant digits, the run's end in whole seconds.

    ``figures``: (node, metric) -> value, e.g. from :func:`analysis.history.key_figures`.
    """
    from cluster_accept.reports.gauges import gauge, gauges_text  # prometheus_client: only where the file is written

    cluster = run["cluster"]
    families: list[Metric] = [
        gauge(
            "cluster_accept_node_verdict",
            "1 for the node's verdict in the last run, 0 for the others.",
            ("cluster", "node", "verdict"),
            [((cluster, v.node, each.value), int(v.verdict == each)) for v in verdicts for each in VERDICTS],
        )
    ]
    for metric, name, help_text in FIGURES:
        present = [((cluster, node), _six(value)) for (node, m), value in sorted(figures.items()) if m == metric]
        if present:
            families.append(gauge(name, help_text, ("cluster", "node"), present))
    counts = [((cluster, verdict.value), _count(verdicts, verdict)) for verdict in VERDICTS]
    families.append(gauge("cluster_accept_nodes", "Nodes per verdict in the last run.", ("cluster", "verdict"), counts))
    if fleet is not None:
        families += _fleet_families(cluster, fleet)
    ended = run.get("ended")
    if ended:
        stamp = round(dt.datetime.fromisoformat(str(ended)).timestamp())
        said = "When the last run ended, Unix time."
        families.append(gauge("cluster_accept_last_run_timestamp_seconds", said, ("cluster",), [((cluster,), stamp)]))
    return gauges_text(families)


def _six(value: float) -> float:
    """``value`` to 6 significant digits, as the file has always given the figures."""
    return float(f"{float(value):.6g}")


def _fleet_families(cluster: str, fleet: FleetView) -> list[Metric]:
    """The fleet read from the history, each family with its samples: repeat offenders, each check's flake
    rate, figures sliding down, and each lemon's score (:mod:`analysis.lemons`). A family without samples is left
    out."""
    from cluster_accept.reports.gauges import gauge

    off, flaky, drift, lemons = fleet.offenders, fleet.flaky, fleet.drifting, fleet.lemons
    by_node, by_check, by_figure = ("cluster", "node"), ("cluster", "check"), ("cluster", "node", "metric")
    offenders = [((cluster, n), _six(v)) for n, v in zip(off["node"], off["not_accepted"], strict=True)]
    flakes = [((cluster, c), _six(v)) for c, v in zip(flaky["check"], flaky["flake_rate"], strict=True)]
    drifting = [
        ((cluster, n, m), _six(v)) for n, m, v in zip(drift["node"], drift["metric"], drift["drop_pct"], strict=True)
    ]
    scores = [((cluster, n), _six(v)) for n, v in zip(lemons["node"], lemons["score"], strict=True)]
    recent = f"Of the last {fleet.runs} runs, those the node failed."
    families = (
        ("cluster_accept_node_recent_not_accepted", recent, by_node, offenders),
        (
            "cluster_accept_check_flake_rate",
            "Share of a check's run pairs that flipped, nothing changed.",
            by_check,
            flakes,
        ),
        (
            "cluster_accept_node_figure_drift_pct",
            "How far a node's figure fell over its recent runs, %.",
            by_figure,
            drifting,
        ),
        (
            "cluster_accept_lemon_score",
            "A lemon's score, 0 to 1, over its recent runs: keep it out of big jobs.",
            by_node,
            scores,
        ),
    )
    return [gauge(name, help_text, labels, samples) for name, help_text, labels, samples in families if samples]
