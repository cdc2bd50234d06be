"""Machine-readable outcomes of a run: ``summary.json`` for scripts and schedulers, and a Prometheus text
file for node_exporter's textfile collector (one verdict series per node, its key figures beside it).

Pure functions; the caller writes the files (atomically: node_exporter must never read half a file).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cluster_accept.analysis.verdicts import NOT_ACCEPTED, Verdict, VerdictRow

if TYPE_CHECKING:  # the history's frames: a node's own check (check --local) loads no pyarrow
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


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _name_ok(name: str) -> str:
    if not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name):
        raise ValueError(f"not a Prometheus metric name: {name!r}")
    return name


def prometheus_text(
    run: Mapping[str, Any],
    verdicts: Sequence[VerdictRow],
    figures: Mapping[tuple[str, str], float],
    fleet: FleetView | None = None,
) -> str:
    """The text exposition format: per node a 0/1 series for each verdict (so alerts can select on
    ``verdict="rejected"``), the node's key figures, and the run's time and counts.

    ``figures``: (node, metric) -> value, e.g. from :func:`analysis.history.key_figures`.
    """
    cluster = _label(run["cluster"])
    lines: list[str] = []

    def family(name: str, help_text: str) -> None:
        lines.extend([f"# HELP {_name_ok(name)} {help_text}", f"# TYPE {name} gauge"])

    family("cluster_accept_node_verdict", "1 for the node's verdict in the last run, 0 for the others.")
    for v in verdicts:
        for verdict in VERDICTS:
            labels = f'cluster="{cluster}",node="{_label(v.node)}",verdict="{verdict.value}"'
            lines.append(f"cluster_accept_node_verdict{{{labels}}} {1 if v.verdict == verdict else 0}")
    for metric, name, help_text in FIGURES:
        present = [(node, value) for (node, m), value in sorted(figures.items()) if m == metric]
        if present:
            family(name, help_text)
            lines += [f'{name}{{cluster="{cluster}",node="{_label(node)}"}} {value:.6g}' for node, value in present]
    family("cluster_accept_nodes", "Nodes per verdict in the last run.")
    for verdict in VERDICTS:
        count = _count(verdicts, verdict)
        lines.append(f'cluster_accept_nodes{{cluster="{cluster}",verdict="{verdict.value}"}} {count}')
    if fleet is not None:
        lines += _fleet_lines(cluster, fleet)
    ended = run.get("ended")
    if ended:
        family("cluster_accept_last_run_timestamp_seconds", "When the last run ended, Unix time.")
        stamp = dt.datetime.fromisoformat(str(ended)).timestamp()
        lines.append(f'cluster_accept_last_run_timestamp_seconds{{cluster="{cluster}"}} {stamp:.0f}')
    return "\n".join(lines) + "\n"


def _fleet_lines(cluster: str, fleet: FleetView) -> list[str]:
    """The fleet read from the history, each family with its samples: repeat offenders, each check's flake
    rate, figures sliding down, and each lemon's score (:mod:`analysis.lemons`)."""
    lines: list[str] = []
    off, flaky, drift = fleet.offenders, fleet.flaky, fleet.drifting
    offenders = [(f'node="{_label(n)}"', v) for n, v in zip(off["node"], off["not_accepted"], strict=True)]
    flakes = [(f'check="{_label(c)}"', v) for c, v in zip(flaky["check"], flaky["flake_rate"], strict=True)]
    drifting = [
        (f'node="{_label(n)}",metric="{_label(m)}"', v)
        for n, m, v in zip(drift["node"], drift["metric"], drift["drop_pct"], strict=True)
    ]
    lemons = [(f'node="{_label(n)}"', v) for n, v in zip(fleet.lemons["node"], fleet.lemons["score"], strict=True)]
    for name, help_text, samples in (
        (
            "cluster_accept_node_recent_not_accepted",
            f"Of the last {fleet.runs} runs, those the node failed.",
            offenders,
        ),
        ("cluster_accept_check_flake_rate", "Share of a check's run pairs that flipped, nothing changed.", flakes),
        ("cluster_accept_node_figure_drift_pct", "How far a node's figure fell over its recent runs, %.", drifting),
        (
            "cluster_accept_lemon_score",
            "A lemon's score, 0 to 1, over its recent runs: keep it out of big jobs.",
            lemons,
        ),
    ):
        if samples:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
            lines += [f'{name}{{cluster="{cluster}",{labels}}} {float(value):.6g}' for labels, value in samples]
    return lines
