"""The GPU-pair matrix: copy bandwidth for every ordered pair of GPUs in a node, so one weak NVLink, NVSwitch
port or GPU is named instead of hiding in the node's all-reduce average.

Runs on CUDA profiles with ``probes.gpu_pairs`` (the default); judged by :mod:`analysis.gpu_pairs` against
``gpu_pair_copy_gbps_min`` (where the profile sets none, a fraction of the GPU's NVLink, or of its PCIe where no
NVLink joins every GPU), the node's own median and the same pair on the other nodes. A node whose pairs have
neither a minimum nor anything to compare with (two GPUs alone) is not judged.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from cluster_accept.analysis.gpu_pairs import INCONCLUSIVE, METRIC, judge_pairs, summary
from cluster_accept.analysis.probe_verdicts import NO_EXPECTATION, Floor, minimum_of, relative_status, to_write
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
    Node,
    NodeScript,
    Probe,
    ProbeOutput,
    Profile,
    Reason,
    Status,
    Thresholds,
    dead,
    declare,
    fault,
    healthy,
    intra_node_causes,
    json_figures,
    nvlink_rating,
)
from cluster_accept.probes.scripts import job_env
from cluster_accept.vocabulary.lazy import pandas as pd

NAME = "gpu_pairs"
ORDER = 45
# One pair copies over its own links: all of a GPU's NVLinks through NVSwitch, a third of them (6 of 18) on
# 4-GPU boards without. Measured 381.5-386.5 GB/s for every ordered pair of 4 x H100 with NVSwitch (0.80-0.81 of
# 18 x 26.562 = 478, bench/results/h100x4-floors/); 0.20 (96 GB/s) stays under a 4-GPU board's pair at that
# efficiency and well over a copy staged through host memory (PCIe: some 20-25 GB/s on Gen5). Without NVLink
# joining every GPU, the fraction of PCIe the collectives use.
DEFAULT = Default(
    "NVLink bandwidth per GPU and direction (a pair's share on 4-GPU boards: a third)",
    0.20,
    nvlink_rating,
    "12 ordered pairs of 4 x H100 with NVSwitch, 256 MiB: 381.5-386.5 GB/s (0.80-0.81 of 478)",
    otherwise=PCIE_COLLECTIVE,
)
METRICS = {METRIC: MetricRule(NAME, "gpu_pair_copy_gbps_min", True, default=DEFAULT, devices=frozenset({"cuda"}))}
REASONS = declare(
    Reason(
        "ok",
        Status.PASS,
        "every ordered GPU pair copied at or above the minimum, or within the margins of the node's and the "
        "cluster's medians (the rows beside name any that did not)",
    ),
    Reason(
        "below_threshold",
        Status.FAIL,
        "a GPU pair copies below its minimum (the profile's, or the row's fraction of the GPU's NVLink or PCIe): "
        "check that pair's NVLinks (nvidia-smi nvlink -s, topo -m)",
        Action.RESEAT_CABLE,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "weak_gpu",
        Status.FAIL,
        "every copy to and from this GPU is far below the node's other pairs: its NVLinks or NVSwitch ports; reseat "
        "or replace the GPU",
        Action.REPLACE_GPU,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "weak_link",
        Status.FAIL,
        "this GPU pair is slow both ways while the node's other pairs are not: the link between them",
        Action.RESEAT_CABLE,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "weak_direction",
        Status.FAIL,
        "this GPU pair is slow one way only: rerun; if it repeats, check the link (nvidia-smi nvlink -e)",
        Action.RERUN,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "straggler",
        Status.FAIL,
        "this pair is far slower than the same pair on the cluster's other nodes: check the node's NVLinks",
        Action.RESEAT_CABLE,
        kind=FindingKind.RELATIVE,
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


# Each pair's copy names the GPU copied to and whether it has peer access (its label names the pair).
SCRIPT = NodeScript("gpu_pairs", ("gpu_pairs.py",), NAME, command, unkept={"peer": (int,), "p2p": (bool,)})
parse = json_figures(METRICS, SCRIPT)


def inspect(output: ProbeOutput, profile: Profile) -> list[CheckRow]:
    skipped = output.skip_reason()
    return [CheckRow(NAME, "pairs", Status.SKIP, "single_gpu", None, None, skipped)] if skipped else []


def evaluate(figures: pd.DataFrame, profiles: Mapping[str, Profile]) -> list[tuple[str, CheckRow]]:
    """A row per node that measured pairs — its slowest pair against the minimum, or against the node's and the
    cluster's medians where it has none, or not judged with neither — then one row per problem, cause first."""
    if figures.empty or not (figures["metric"] == METRIC).any():
        return []
    mine = figures[figures["metric"] == METRIC]
    thresholds: dict[str, Thresholds] = {}
    out: list[tuple[str, CheckRow]] = []
    for node, group in mine.groupby("node", sort=True):
        name = str(node)
        floor, why = minimum_of(METRICS[METRIC], profiles.get(name))
        limits = profiles[name].thresholds if name in profiles else Thresholds()
        # the pairs' own judgement (analysis.gpu_pairs) reads the minimum from the thresholds it is given
        thresholds[name] = limits.model_copy(update={"gpu_pair_copy_gbps_min": floor.value if floor else None})
        out.append((name, _node_row(group, floor, why, _compared(mine, group))))
    for finding in judge_pairs(mine, thresholds):
        limits = thresholds.get(finding.node, Thresholds())
        status = relative_status(METRICS[METRIC], limits) if finding.relative else Status.FAIL
        if finding.reason == INCONCLUSIVE:
            status = Status.WARN  # a difference inside the pairs' spread: never a rejection
        row = CheckRow(
            NAME, finding.item, status, finding.reason, f"{finding.measured:.1f}", finding.expected, finding.detail
        )
        out.append((finding.node, row))
    return out


def _compared(mine: pd.DataFrame, group: pd.DataFrame) -> bool:
    """Whether a node's pairs have peers: three pairs or more inside it (its own median), or the same pair on
    another node of its profile."""
    if len(group) >= 3:
        return True
    profile = group["profile"].iloc[0] if "profile" in group.columns else None
    others = mine[mine["node"] != group["node"].iloc[0]]
    if profile is not None and "profile" in others.columns:
        others = others[others["profile"] == profile]
    return bool(others["label"].isin(set(group["label"])).any())


def _node_row(group: pd.DataFrame, floor: Floor | None, why: str, compared: bool) -> CheckRow:
    low = float(group["value"].min())
    said = summary(group)
    if floor is not None:
        ok = low >= floor.value
        status, reason = (Status.PASS, "ok") if ok else (Status.FAIL, "below_threshold")
        return CheckRow(NAME, "pairs", status, reason, f"{low:.1f}", floor.expected("GB/s"), said)
    if compared:
        expected = (
            "within the margin (straggler_pct, widened by the noise) of the node's median pair and of the same "
            "pair on other nodes"
        )
        return CheckRow(NAME, "pairs", Status.PASS, "ok", f"{low:.1f}", expected, said)
    said = f"{said}: {why}; no other pair inside the node or on another node to compare with"
    expected = to_write(METRICS[METRIC])
    return CheckRow(NAME, "pairs", Status.NOT_JUDGED, NO_EXPECTATION, f"{low:.1f}", expected, said)


# The profile its samples are judged under: the minimums they are held to.
SAMPLE_PROFILE = {"thresholds": {"gpu_pair_copy_gbps_min": 300}}

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
    samples=(
        healthy("two_gpus", {"ok"}, fixture="gpu_pairs/two_gpus.txt", profile=SAMPLE_PROFILE),
        fault(
            "slow_link",
            {"below_threshold"},
            fixture="gpu_pairs/two_gpus_slow_link.txt",
            profile=SAMPLE_PROFILE,
        ),
        dead(
            "torch_missing",
            {"probe_failed"},
            fixture="gpu_bench/torch_missing.txt",
            exit_code=1,
            profile=SAMPLE_PROFILE,
        ),
    ),
)
