"""Silent data corruption: the burn's closing product, compared bit for bit across every GPU of the cluster.

The burn's node-side run ends with every GPU multiplying the same seeded inputs (TF32 off) a few times and
printing digests of the product and of its sum. They are judged across nodes (:func:`compare`), GPUs grouped by
platform (model, torch, CUDA): a GPU whose digest differs from the majority is named ``sdc:mismatch``.
"""

from __future__ import annotations

from collections.abc import Mapping

from cluster_accept.analysis import sdc
from cluster_accept.probes.contract import (
    RUN_FAILED,
    Action,
    CheckRow,
    Expectation,
    MetricRule,
    Probe,
    ProbeOutput,
    Profile,
    Reason,
    Status,
    declare,
    fault,
    parse_json_lines,
)
from cluster_accept.probes.scripts import BURN, BURN_HEALTHY, BURN_PROFILE, BURN_TORCH_MISSING
from cluster_accept.vocabulary.lazy import pandas as pd

NAME = "sdc"
STAGE = "burn"
ORDER = 61
SCRIPT = BURN
METRICS: dict[str, MetricRule] = {}
REASONS = declare(
    Reason("same", Status.PASS, "computed the same bits as its peers", Action.NONE),
    Reason(
        "mismatch",
        Status.FAIL,
        "computed different bits from its peers for the same product: silent data corruption; take the GPU out "
        "of service and replace it",
        Action.REPLACE_GPU,
    ),
    Reason(
        "unstable",
        Status.FAIL,
        "gave different bits for the same product on repeats: silent data corruption; replace the GPU",
        Action.REPLACE_GPU,
    ),
    Reason(
        "no_majority",
        Status.ERROR,
        "the GPUs of this platform split evenly between answers, so the wrong ones cannot be named: rerun on more "
        "GPUs of the same model",
        Action.RERUN,
    ),
    Reason(
        "not_reported",
        Status.ERROR,
        "the burn run gave no digest for this GPU (see the burn's errors)",
        Action.RERUN,
    ),
)


KEPT = ("probe", "sdc", "sdc_platform")  # the burn's output is mostly its series: only these are compared


def parse(stdout: str) -> ProbeOutput:
    output = parse_json_lines(stdout)
    return ProbeOutput(info=[i for i in output.info if i.kind in KEPT], errors=output.errors)


def evaluate(figures: pd.DataFrame, profiles: Mapping[str, Profile]) -> list[tuple[str, CheckRow]]:
    return []  # no figure: the digests are judged across nodes by :func:`compare`


def digests(node: str, output: ProbeOutput) -> list[dict[str, object]]:
    said = [str(i.get("platform")) for i in output.info if i.kind in ("sdc_platform", "probe") and i.get("platform")]
    platform = said[0] if said else "unknown"  # the probe line says it too, should the run stop before its end
    rows = []
    for info in output.info:
        products, sums = info.get("products"), info.get("sums")
        if info.kind != "sdc" or not isinstance(products, list) or not isinstance(sums, list) or not products:
            continue
        stable = len(set(products)) == 1 and len(set(sums)) == 1
        rows.append({"node": node, "gpu": info.get("gpu"), "platform": platform, "size": info.get("size"),
                     "product": products[0], "sum": sums[0], "stable": stable})  # fmt: skip
    return rows


def compare(outputs: Mapping[str, ProbeOutput], profiles: Mapping[str, Profile]) -> list[tuple[str, CheckRow]]:
    """Every GPU's digest against its platform's majority across the cluster; a GPU the run reported without a
    digest is named too."""
    found = [d for node, output in outputs.items() if profiles[node].burn.sdc for d in digests(node, output)]
    rows = []
    for f in sdc.judge(pd.DataFrame(found, columns=list(sdc.COLUMNS))) if found else []:
        status = REASONS[f.reason].severity
        rows.append((f.node, CheckRow(NAME, f"gpu{f.gpu}", status, f.reason, f.observed, f.expected, f.detail, f.gpu)))
    reported = {(str(d["node"]), d["gpu"]) for d in found}
    for node, output in outputs.items():
        info = next((i.members for i in output.info if i.kind == "probe"), {})
        count = info.get("gpus") if profiles[node].burn.sdc else 0
        for gpu in range(count if isinstance(count, int) else 0):
            if (node, gpu) not in reported:
                rows.append(
                    (node, CheckRow(NAME, f"gpu{gpu}", Status.ERROR, "not_reported", None, "a digest", "", gpu))
                )
    return rows


PROBE = Probe(
    name=NAME,
    script=SCRIPT,
    metrics=METRICS,
    reasons=REASONS,
    parse=parse,
    evaluate=evaluate,
    stage=STAGE,
    order=ORDER,
    compare=compare,
    expectations=(Expectation("burn.sdc", STAGE, NAME, lambda p: p.burn.sdc, None, ("burn",), RUN_FAILED),),
    samples=(
        BURN_HEALTHY.judged({"same"}),
        fault("unstable", {"unstable"}, fixture="burn/h100_20s_sdc_unstable.txt", profile=BURN_PROFILE),
        BURN_TORCH_MISSING,
    ),
)
