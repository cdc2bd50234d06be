"""Training steps of a GPT-style decoder on every GPU of a node: tokens/s, MFU, the slowest rank, numerics.

Clusters are accepted by training throughput, not by the parts (seed reports: per-node training TFLOPS found
half-speed nodes, all-reduce looked healthy while training scaled at 21%). Per node this probe trains the
profile's model (``training``: preset and dimensions) with data parallelism (or fully sharded) on all its GPUs
and reports tokens/s per GPU, achieved TFLOP/s and MFU (:mod:`probes.training.judge` says how they are counted),
peak memory, the loss on the fixed batch, and each rank's own forward+backward time: under data parallelism a
slow GPU holds every step of every rank, so only the solo time names it.

Judged: tokens/s per GPU against ``training_tokens_per_s_per_gpu_min``, or where the profile writes none against
an MFU floor (``training_mfu_min``, with a default: :mod:`probes.training.defaults`), and against the cluster's
median per node (the seed's per-node table); each GPU's solo throughput against the same MFU floor and the
cluster's GPUs; the node's data-parallel efficiency (together over solo) against ``training_dp_efficiency_min``
(with a default); MFU against ``training_mfu_min`` where written; the loss (finite, falling); the slowest rank
against its node's median. Across nodes the multi-node stage runs the same model at 1, 2, 4 … nodes
(:mod:`tasks.multi_node.training_sweep`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from cluster_accept.analysis.causes import SLOW_TRAINING
from cluster_accept.analysis.noise import INCONCLUSIVE
from cluster_accept.probes.contract import (
    RUN_FAILED,
    SINGLE_NODE,
    Action,
    CheckRow,
    Expectation,
    FindingKind,
    Link,
    MetricRule,
    Node,
    NodeScript,
    Probe,
    ProbeOutput,
    Profile,
    Reason,
    ReportSection,
    ReportView,
    Status,
    cluster_judgement,
    dead,
    declare,
    fault,
    gpu_state_causes,
    healthy,
    intra_node_causes,
    parse_json_lines,
    threshold_set,
)
from cluster_accept.probes.scripts import gpu_count, loopback_torchrun
from cluster_accept.probes.training.defaults import (
    DP_EFFICIENCY_METRIC,
    dp_efficiency_row,
    floor_judgement,
    other_model_detail,
    trains_profile_model,
)
from cluster_accept.probes.training.judge import (
    FLOP_FORMULA,
    derived_figures,
    dp_efficiency_figure,
    info_peak,
    loss_check,
    model_text,
    slowest_rank,
)
from cluster_accept.probes.training.report import training_section
from cluster_accept.vocabulary.lazy import pandas as pd

NAME = "training"
ORDER = 50
PER_GPU = "training_tokens_per_s_per_gpu"
SOLO = "training_solo_tokens_per_s"
METRICS = {
    PER_GPU: MetricRule(NAME, "training_tokens_per_s_per_gpu_min", False),
    SOLO: MetricRule(NAME, None, True),
}
REASONS = declare(
    Reason(
        "below_threshold",
        Status.FAIL,
        "training throughput below the profile's minimum or the MFU floor (a fraction of the GPU's dense bf16 "
        "peak): compare its GEMM, clocks and the slowest rank first",
        Action.REPLACE_GPU,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "dp_efficiency_low",
        Status.FAIL,
        "the node's GPUs train far slower together than each alone: their gradient all-reduce is slow; look at the "
        "node's all-reduce, the transport NCCL chose between its GPUs and the NCCL settings in effect",
        Action.CHECK_NODE,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "straggler",
        Status.FAIL,
        "trains far slower than its peers: look at the slowest rank, clocks and power in the evidence",
        Action.REPLACE_GPU,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "slow_rank",
        Status.FAIL,
        "one GPU's own forward+backward is far slower than the node's others, and every step waits for it: "
        "check that GPU's clocks, power and throttle reasons",
        Action.REPLACE_GPU,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "numerics",
        Status.FAIL,
        "the loss on the fixed batch went NaN/Inf or did not fall: suspect a GPU computing wrongly (run the "
        "GPU's memory and compute diagnostics) or a broken torch/CUDA install",
        Action.REPLACE_GPU,
    ),
    Reason("single_rank", Status.SKIP, "one rank: no other GPU of the node to compare its speed with"),
    Reason(
        "peak_unknown",
        Status.SKIP,
        "MFU needs the GPU's dense bf16 peak: set the profile's training.peak_tflops for this GPU",
        Action.FIX_CONFIG,
    ),
    Reason("not_measured", Status.SKIP, "the probe ran on CPU (the test-bed): no GPU peak to take MFU against"),
    Reason(
        "other_model",
        Status.SKIP,
        "the light suite trained a smaller model than the one the profile's minimum is for: judged against the "
        "cluster and the node's history here, against the minimum in the full suite",
    ),
    Reason(
        "probe_timeout",
        Status.TIMEOUT,
        "the training steps hung and were killed with their process group: look for a hung GPU or NCCL",
        Action.CHECK_NODE,
    ),
    Reason("probe_error", Status.ERROR, "the training probe reported an error (out of memory?): see the detail"),
    Reason(
        "probe_failed",
        Status.ERROR,
        "the training steps did not finish (see the output): check the probe interpreter, torch and NCCL",
        Action.RERUN,
    ),
)


def train_arguments(node: Node, quick: bool) -> str:
    """The node script's arguments for the profile's model (``--label`` and timeouts are the caller's)."""
    training, device = node.profile.training, node.profile.probes.device
    shape = training.shape(device, quick)
    args = (
        f"--device {device} --layers {shape.layers} --width {shape.width} --heads {shape.heads} "
        f"--seq-len {shape.seq_len} --micro-batch {shape.micro_batch} --vocab {shape.vocab} "
        f"--parallel {training.parallel} --warmup-steps {training.warmup_steps} --steps {training.steps}"
    )
    if training.compile:
        args += " --compile"
    if training.peak_tflops is not None:
        args += f" --peak-tflops {training.peak_tflops:g}"
    return args


# The node-side script (shipped under its own name, beside the all-reduce script it imports).
TRAIN_STEP_SCRIPT = str(Path(__file__).resolve().parent / "node" / "train_step.py")


def ranks_per_node(node: Node) -> str:
    """``n=…; ``: every GPU of the node (or the profile's partition); one process on a CPU node."""
    return gpu_count(node) if node.profile.probes.device == "cuda" else "n=1; "


def command(node: Node, quick: bool = False) -> str | None:
    """torchrun on every GPU of the node, meeting on loopback, giving up after ``rendezvous_timeout_s``."""
    if not node.profile.training.enabled:
        return None
    script = f"train_step.py {train_arguments(node, quick)} --label intra_node"
    return loopback_torchrun(node, ranks_per_node(node), script)


# Each rank's figure names its node's rank and host (the rows of its group name them otherwise).
SCRIPT = NodeScript(
    NAME, (TRAIN_STEP_SCRIPT, "allreduce.py"), NAME, command, unkept={"node_rank": (int,), "hostname": (str,)}
)


def model_info(output: ProbeOutput) -> Mapping[str, Any] | None:
    return next((i.members for i in output.info if i.kind == "training"), None)


def rank_infos(output: ProbeOutput) -> list[Mapping[str, Any]]:
    return [i.members for i in output.info if i.kind == "training_rank"]


def parse(stdout: str) -> ProbeOutput:
    """Its figures (``training_*``), TFLOP/s and MFU derived from tokens/s per GPU, each carrying the model."""
    output = parse_json_lines(stdout, SCRIPT.unkept)
    figures = [m for m in output.measurements if m.metric.startswith("training_")]
    info = model_info(output)
    if info is not None:
        per_gpu = next((m for m in figures if m.metric == PER_GPU), None)
        figures += derived_figures(info, per_gpu.value) if per_gpu is not None else []
        figures += dp_efficiency_figure(info, figures)
        described = model_text(info)
        figures = [replace(m, model=described) for m in figures]
    output.measurements = figures
    return output


def _loss_row(ranks: Sequence[Mapping[str, Any]]) -> CheckRow:
    checks = [
        (r, loss_check(r["loss_initial"], r["loss_first"], r["loss_last"], bool(r["loss_finite"]))) for r in ranks
    ]
    bad = [(r, c) for r, c in checks if not c.ok]
    rank, check = bad[0] if bad else checks[0]
    where = f"rank {rank['rank']} (gpu {rank['local_rank']})"
    detail = f"{where}: {check.detail}" + (f"; {len(bad)} of {len(ranks)} ranks" if bad else "")
    status, reason = (Status.FAIL, "numerics") if bad else (Status.PASS, "ok")
    return CheckRow(NAME, "loss", status, reason, check.observed, "finite, falling", detail)


def _slow_rank_row(ranks: Sequence[Mapping[str, Any]], profile: Profile) -> CheckRow:
    margin = profile.thresholds.straggler_pct
    solo = {f"gpu {r['local_rank']}": float(r["solo_ms_median"]) for r in ranks}
    slow = slowest_rank(solo, margin, profile.thresholds.noise_k)
    if slow is None:
        return CheckRow(NAME, "slowest_rank", Status.SKIP, "single_rank", None, None, "one rank on this node")
    said = f"{slow.label}: {slow.solo_ms:.4g} ms"
    widened = slow.margin_pct
    expected = f"<= {slow.median_ms * (1 + widened / 100):.4g} ms (median {slow.median_ms:.4g} + {widened:.3g}%)"
    detail = f"own forward+backward {slow.over_pct:.1f}% over the ranks' median ({len(solo)} ranks)"
    status, reason = (Status.FAIL, "slow_rank") if slow.slow else (Status.PASS, "ok")
    if slow.inconclusive:
        status, reason = Status.WARN, INCONCLUSIVE
        detail = f"{detail}, past {margin:g}% but inside {widened:.3g}%, noise_k times the ranks' own spread"
    gpu = int(slow.label.split()[-1])
    return CheckRow(NAME, "slowest_rank", status, reason, said, expected, detail, gpu)


def _mfu_row(output: ProbeOutput, info: Mapping[str, Any], profile: Profile) -> CheckRow | None:
    minimum = profile.thresholds.training_mfu_min
    if minimum is None:
        return None
    if profile.probes.device != "cuda":
        return CheckRow(NAME, "mfu", Status.SKIP, "not_measured", None, f">= {minimum:g}", "probes run on CPU")
    mfu = next((m for m in output.measurements if m.metric == "training_mfu"), None)
    if mfu is None:
        said = f"no dense bf16 peak known for {info.get('device_name')!r}"
        return CheckRow(NAME, "mfu", Status.SKIP, "peak_unknown", None, f">= {minimum:g}", said)
    if not trains_profile_model(model_text(info), profile):
        said = other_model_detail(model_text(info), profile)
        return CheckRow(NAME, "mfu", Status.SKIP, "other_model", None, f">= {minimum:g}", said)
    value = mfu.value
    detail = f"{FLOP_FORMULA}; peak {info_peak(info):g} TFLOP/s ({info.get('device_name')}); {model_text(info)}"
    status, reason = (Status.PASS, "ok") if value >= minimum else (Status.FAIL, "below_threshold")
    return CheckRow(NAME, "mfu", status, reason, f"{value:.3f}", f">= {minimum:g}", detail)


def inspect(output: ProbeOutput, profile: Profile) -> list[CheckRow]:
    """The model trained (recorded), the loss, the slowest rank, MFU where the profile writes a minimum and the
    node's data-parallel efficiency (:mod:`probes.training.defaults`); nothing when the run printed no rank (its
    own row says why it failed)."""
    info, ranks = model_info(output), rank_infos(output)
    if info is None or not ranks:
        return []
    model = CheckRow(NAME, "model", Status.PASS, "recorded", model_text(info), None, FLOP_FORMULA)
    rows = [model, _loss_row(ranks), _slow_rank_row(ranks, profile)]
    mfu = _mfu_row(output, info, profile)
    rows += [mfu] if mfu is not None else []
    efficiency = dp_efficiency_row(output.measurements, profile)
    return rows + ([efficiency] if efficiency is not None else [])


_judge = cluster_judgement(METRICS)
# A node whose GPUs train slowly together but fast alone: the setting or link that slows its all-reduce, or the
# all-reduce's own failure on that node.
_DP_LOW = frozenset({"dp_efficiency_low"})
DP_CAUSES: tuple[Link, ...] = (
    *(replace(link, symptom_reasons=_DP_LOW) for link in intra_node_causes(frozenset({NAME}))),
    Link("allreduce", frozenset({NAME}), SINGLE_NODE, symptom_reasons=_DP_LOW),
)


def evaluate(figures: pd.DataFrame, profiles: Mapping[str, Profile]) -> list[tuple[str, CheckRow]]:
    """Against the cluster's median and the profile's minimum, or where it writes none the MFU floor
    (:func:`~probes.training.defaults.floor_judgement`); a written minimum is only held against the model it is
    for (the light suite trains a smaller model unless the profile names a preset)."""
    models = {}
    if "model" in figures.columns:
        models = {str(n): str(m) for n, m in zip(figures["node"], figures["model"], strict=True) if isinstance(m, str)}
    out = []
    for node, row in _judge(figures, profiles):
        model = models.get(node)
        threshold_row = row.item in METRICS and row.reason in ("ok", "below_threshold")
        if threshold_row and model and node in profiles and not trains_profile_model(model, profiles[node]):
            said = other_model_detail(model, profiles[node])
            row = replace(row, status=Status.SKIP, reason="other_model", detail=said)
        out.append((node, row))
    return floor_judgement(figures.to_dict("records"), profiles, out)


def report(view: ReportView) -> ReportSection | None:
    return training_section(view)


# The profile its samples are judged under: a floor a 350M model on one H200 clears with room to spare.
SAMPLE_PROFILE = {"thresholds": {"training_tokens_per_s_per_gpu_min": 100000}}

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
    causes=gpu_state_causes(frozenset({NAME}), symptom_reasons=SLOW_TRAINING) + DP_CAUSES,
    expectations=(
        Expectation("training", SINGLE_NODE, NAME, lambda p: p.training.enabled),
        Expectation(
            "training_tokens_per_s_per_gpu_min",
            SINGLE_NODE,
            NAME,
            lambda p: p.training.enabled,
            PER_GPU,
            (NAME,),
            RUN_FAILED,
        ),
        Expectation(SOLO, SINGLE_NODE, NAME, lambda p: p.training.enabled, SOLO, (NAME,), RUN_FAILED),
        Expectation(
            "training_dp_efficiency_min",
            SINGLE_NODE,
            NAME,
            lambda p: p.training.enabled,
            DP_EFFICIENCY_METRIC,
            (NAME,),
            RUN_FAILED,
        ),
        Expectation(
            "training_mfu_min", SINGLE_NODE, NAME, threshold_set("training_mfu_min"), "mfu", (NAME,), RUN_FAILED
        ),
    ),
    samples=(
        healthy(
            "h200x1_350m_ddp",
            {"ok", "recorded"},
            fixture="training/h200x1_350m_ddp.txt",
            profile=SAMPLE_PROFILE,
        ),
        fault(
            "half_speed",
            {"below_threshold"},
            fixture="training/h200x1_350m_ddp_half_speed.txt",
            profile=SAMPLE_PROFILE,
        ),
        dead("torch_missing", {"probe_failed"}, fixture="training/torch_missing.txt", exit_code=1),
    ),
)
