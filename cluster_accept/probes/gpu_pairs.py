"""The GPU-pair matrix: copy bandwidth for every ordered pair of GPUs in a node, so one weak NVLink, NVSwitch
port or GPU is named instead of hiding in the node's all-reduce average.

Runs on CUDA profiles with ``probes.gpu_pairs`` (the default); judged by :mod:`analysis.gpu_pairs` against
``gpu_pair_copy_gbps_min``, the node's own median and the same pair on the other nodes.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from cluster_accept.analysis.causes import intra_node_causes
from cluster_accept.analysis.coverage import RUN_FAILED
from cluster_accept.analysis.gpu_pairs import METRIC, judge_pairs, summary
from cluster_accept.analysis.probe_output import ProbeOutput
from cluster_accept.analysis.probe_verdicts import MetricRule, relative_status
from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.checks.declarations import Expectation
from cluster_accept.checks.reasons import Action, Reason, declare
from cluster_accept.inventory.model import Node, Profile, Thresholds
from cluster_accept.probes.base import SINGLE_NODE, NodeScript, Probe, json_figures
from cluster_accept.probes.scripts import job_env
from cluster_accept.vocabulary.lazy import pandas as pd

NAME = "gpu_pairs"
ORDER = 45
METRICS = {METRIC: MetricRule(NAME, "gpu_pair_copy_gbps_min", True)}
REASONS = declare(
    Reason("measured", Status.PASS, "every ordered GPU pair copied within the margins (the rows beside name any)"),
    Reason(
        "below_threshold",
        Status.FAIL,
        "a GPU pair copies below the profile's minimum: check that pair's NVLinks (nvidia-smi nvlink -s, topo -m)",
        Action.RESEAT_CABLE,
    ),
    Reason(
        "weak_gpu",
        Status.FAIL,
        "every copy to and from this GPU is far below the node's other pairs: its NVLinks or NVSwitch ports; reseat "
        "or replace the GPU",
        Action.REPLACE_GPU,
    ),
    Reason(
        "weak_link",
        Status.FAIL,
        "this GPU pair is slow both ways while the node's other pairs are not: the link between them",
        Action.RESEAT_CABLE,
    ),
    Reason(
        "weak_direction",
        Status.FAIL,
        "this GPU pair is slow one way only: rerun; if it repeats, check the link (nvidia-smi nvlink -e)",
        Action.RERUN,
    ),
    Reason(
        "straggler",
        Status.FAIL,
        "this pair is far slower than the same pair on the cluster's other nodes: check the node's NVLinks",
        Action.RESEAT_CABLE,
    ),
    Reason("single_gpu", Status.SKIP, "fewer than two GPUs: no pairs"),
    Reason(
        "probe_timeout",
        Status.TIMEOUT,
        "the pair copies hung and were killed: look for a hung driver",
        Action.CHECK_NODE,
    ),
    Reason(
        "probe_error",
        Status.ERROR,
        "a pair's copy failed (see the detail): rerun; if it repeats, check the GPUs",
        Action.RERUN,
    ),
    Reason("probe_failed", Status.ERROR, "the pair probe did not finish (see its output): rerun", Action.RERUN),
)


def command(node: Node, quick: bool = False) -> str | None:
    probes = node.profile.probes
    if probes.device != "cuda" or not probes.gpu_pairs:
        return None
    prefix = f"{probes.command_prefix} " if probes.command_prefix else ""
    repeats = " --repeats 3" if quick else ""
    return f'cd "$CA_PROBE_DIR" && exec {prefix}{job_env(node)}{shlex.quote(probes.python)} gpu_pairs.py{repeats} 2>&1'


SCRIPT = NodeScript("gpu_pairs", ("gpu_pairs.py",), NAME, command)
parse = json_figures(METRICS)


def inspect(output: ProbeOutput, profile: Profile) -> list[CheckRow]:
    skipped = output.skip_reason()
    return [CheckRow(NAME, "pairs", Status.SKIP, "single_gpu", None, None, skipped)] if skipped else []


def evaluate(figures: pd.DataFrame, profiles: Mapping[str, Profile]) -> list[tuple[str, CheckRow]]:
    """A summary row per node that measured pairs, then one row per problem, cause first."""
    if figures.empty or not (figures["metric"] == METRIC).any():
        return []
    mine = figures[figures["metric"] == METRIC]
    thresholds = {node: profile.thresholds for node, profile in profiles.items()}
    out: list[tuple[str, CheckRow]] = []
    for node, group in mine.groupby("node", sort=True):
        minimum = thresholds.get(str(node), Thresholds()).gpu_pair_copy_gbps_min
        expected = f">= {minimum:g} GB/s" if minimum is not None else None
        low = f"{float(group['value'].min()):.1f}"
        out.append((str(node), CheckRow(NAME, "pairs", Status.PASS, "measured", low, expected, summary(group))))
    for finding in judge_pairs(mine, thresholds):
        limits = thresholds.get(finding.node, Thresholds())
        status = relative_status(METRICS[METRIC], limits) if finding.relative else Status.FAIL
        row = CheckRow(
            NAME, finding.item, status, finding.reason, f"{finding.measured:.1f}", finding.expected, finding.detail
        )
        out.append((finding.node, row))
    return out


PROBE = Probe(
    name=NAME,
    script=SCRIPT,
    metrics=METRICS,
    reasons=REASONS,
    parse=parse,
    evaluate=evaluate,
    order=ORDER,
    inspect=inspect,
    causes=intra_node_causes(frozenset({NAME})),
    expectations=(
        Expectation("probes.gpu_pairs", SINGLE_NODE, NAME, lambda p: p.probes.gpu_pairs and p.probes.device == "cuda"),
        Expectation(
            "gpu_pair_copy_gbps_min",
            SINGLE_NODE,
            NAME,
            lambda p: p.thresholds.gpu_pair_copy_gbps_min is not None and p.probes.device == "cuda",
            None,
            (NAME,),
            RUN_FAILED,
        ),
    ),
)
