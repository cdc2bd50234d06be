"""Intra-node all-reduce: a bus-bandwidth sweep over message sizes under torchrun, every GPU of the node,
and the transport NCCL actually used between them (read from its ``NCCL_DEBUG=INFO`` channel lines).

NCCL falls back silently (to ``SHM`` when P2P is unavailable, to sockets between nodes), so the transport is
checked against the profile's ``expected_transport.intra_node`` beside the bandwidth. Judged at the largest
size against ``allreduce_intra_busbw_gbps_min`` (where the profile sets none, a fraction of the GPU's NVLink, or
of its PCIe where no NVLink joins every GPU) and the cluster's median per node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from cluster_accept.analysis.nccl_log import nccl_transports, nccl_version, transport_matches
from cluster_accept.inventory.gpus import ALLREDUCE_NVLINK_FRACTION, pcie_rating
from cluster_accept.probes.contract import (
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
    is_set,
    nvlink_rating,
    own_figures,
    parse_json_lines,
    size_sweep_chart,
    threshold_set,
)
from cluster_accept.probes.scripts import ALLREDUCE, ALLREDUCE_TORCH_MISSING

NAME = "allreduce"
ORDER = 40
SCRIPT = ALLREDUCE
METRIC = "allreduce_busbw_gbps"
# Where no NVLink joins every GPU of the node (PCIe cards; NVL cards, whose bridges join pairs or groups of four),
# a collective's ring crosses PCIe. Not yet measured on such a host; the floor stays under what NCCL's SHM
# transport (through host memory, the slowest path inside a node short of the network) moved on Gen5 hosts with
# P2P disabled: 19.7-27.1 GB/s for every collective on 2 and 4 x H100 and 4 x H200 (0.31-0.43 of 63 GB/s), so
# it catches a fall to sockets or a link trained down, not a PCIe node's P2P turned off (the transport row does).
PCIE_COLLECTIVE = Default(
    "PCIe bandwidth per GPU and direction",
    0.25,
    pcie_rating,
    "not measured on a PCIe-only host; SHM through host memory on Gen5 hosts: 19.7-27.1 GB/s (0.31-0.43 of 63)",
)
# Over NVLink joining every GPU (the built-in profiles write the same minimum, inventory.gpus.profile_data):
# 1 GiB-4 GiB, 4 x H200 355.6-362.4 GB/s, 2 x H200 342.8-343.8, 4 x H100 351.7, 2 x H100 324.8 (0.68-0.76 of
# 478); with NCCL_P2P_DISABLE=1 (SHM) 23.7-27.1 (4 x H200 with the line in /etc/nccl.conf: 25.0).
NVLINK = Default(
    "NVLink bandwidth per GPU and direction",
    ALLREDUCE_NVLINK_FRACTION,
    nvlink_rating,
    "2 and 4 x H100/H200 at 1-4 GiB: 324.8-362.4 GB/s (0.68-0.76 of 478); P2P disabled (SHM): 23.7-27.1",
    otherwise=PCIE_COLLECTIVE,
)
METRICS = {METRIC: MetricRule(NAME, "allreduce_intra_busbw_gbps_min", False, default=NVLINK)}
REASONS = declare(
    Reason(
        "below_threshold",
        Status.FAIL,
        "all-reduce bus bandwidth below the minimum: first the job_settings rows (a setting measured again without "
        "it) and NCCL's transport and channels (nccl_mechanism, nccl.parquet); with no setting to blame, the "
        "hardware path: nvidia-smi nvlink -s / -e, nvidia-smi topo -m, the NVSwitch and Fabric Manager rows",
        Action.CHECK_NODE,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "straggler",
        Status.FAIL,
        "all-reduce bus bandwidth far below the other nodes' (measured again alone, see the detail): the "
        "job_settings rows, then NVLink/NVSwitch (nvidia-smi nvlink -s / -e, topo -m)",
        Action.CHECK_NODE,
        kind=FindingKind.RELATIVE,
    ),
    Reason("single_gpu", Status.SKIP, "fewer than two GPUs: nothing to all-reduce between"),
    Reason(
        "probe_timeout",
        Status.TIMEOUT,
        "the all-reduce hung and was killed with its process group: look for a hung driver or NVLink fault",
        Action.CHECK_NODE,
    ),
    Reason("probe_error", Status.ERROR, "the all-reduce probe reported an error: rerun", Action.RERUN),
    Reason(
        "probe_failed",
        Status.ERROR,
        "the all-reduce did not finish (see its output): check the probe interpreter, torch and NCCL, then rerun",
        Action.RERUN,
    ),
)
# Rows this probe writes under the ``transport`` check: what NCCL chose inside the node.
TRANSPORT = "transport"
UNREADABLE = Reason(
    "unreadable",
    Status.WARN,
    "NCCL ran but its log names no transport (NCCL_DEBUG or NCCL_DEBUG_SUBSYS overridden, or an unknown line "
    "shape): the transport was not checked; keep NCCL_DEBUG=INFO for the probes and send the log for a bug report",
    Action.RERUN,
)
OTHER_REASONS = {
    TRANSPORT: declare(
        UNREADABLE,
        Reason("not_measured", Status.SKIP, "no NCCL run inside the node to read a transport from (see the detail)"),
        Reason(
            "unexpected",
            Status.FAIL,
            "NCCL did not use the expected intra-node transport (a silent fallback): check NCCL_P2P_LEVEL, "
            "NCCL_P2P_DISABLE and the GPU topology",
            Action.FIX_CONFIG,
        ),
    )
}


def parse(stdout: str) -> ProbeOutput:
    """Its figures from the JSON lines, with the transport NCCL used (each figure carries it) and NCCL's
    version."""
    output = own_figures(parse_json_lines(stdout, SCRIPT.unkept), METRICS)
    return with_nccl_log(output, stdout)


def with_nccl_log(output: ProbeOutput, stdout: str) -> ProbeOutput:
    output.transports = nccl_transports(stdout)
    output.nccl_version = nccl_version(stdout)
    used = ",".join(sorted(output.transports)) or None
    output.measurements = [replace(m, transport=used) for m in output.measurements]
    return output


def inspect(output: ProbeOutput, profile: Profile) -> list[CheckRow]:
    """A skip when the node has one GPU; on a GPU node, the transport against the profile's and NCCL's
    version (recorded)."""
    rows = []
    skipped = output.skip_reason()
    if skipped is not None:
        rows.append(CheckRow(NAME, "intra_node", Status.SKIP, "single_gpu", None, None, skipped))
    expected = profile.probes.expected_transport.intra_node
    if profile.probes.device != "cuda" or skipped is not None:
        # The expectation is answered, with why it could not be judged; a probe that failed says so itself.
        if expected is not None and (skipped is not None or output.measurements):
            why = "probes run on CPU (gloo): NCCL chooses no transport" if skipped is None else skipped
            rows.append(CheckRow(TRANSPORT, "intra_node", Status.SKIP, "not_measured", None, expected, why))
        return rows
    ran = skipped is None and (bool(output.measurements) or output.nccl_version is not None)
    rows += transport_rows(output.transports, profile.probes.expected_transport.intra_node, ran)
    if output.nccl_version:
        rows.append(CheckRow(NAME, "nccl_version", Status.PASS, "recorded", output.nccl_version, None))
    return rows


def transport_rows(used: Mapping[str, int], expected: str | None, ran: bool) -> list[CheckRow]:
    """What NCCL used against what the profile expects; a probe that ran (it measured, or NCCL started) with no
    transport in its log is a warning, never silence: the expectation was not checked."""
    if not used:
        if not ran:
            return []  # the probe did not run: its own row says why
        said = "no connection line in NCCL's log"
        return [CheckRow(TRANSPORT, "intra_node", Status.WARN, "unreadable", None, expected, said)]
    observed = ",".join(sorted(used))
    if expected is None:
        return [CheckRow(TRANSPORT, "intra_node", Status.PASS, "recorded", observed, None)]
    bad = [t for t in used if not transport_matches(t, expected)]
    status, reason = (Status.FAIL, "unexpected") if bad else (Status.PASS, "ok")
    detail = ", ".join(f"{t}: {n} channel connections" for t, n in sorted(used.items()))
    return [CheckRow(TRANSPORT, "intra_node", status, reason, observed, expected, detail)]


evaluate = cluster_judgement(METRICS)


def report(view: ReportView) -> ReportSection | None:
    chart = size_sweep_chart(
        "allreduce",
        "Intra-node all-reduce bus bandwidth vs message size",
        METRIC,
        METRICS[METRIC].threshold,
        NAME,
        view,
    )
    return ReportSection("allreduce", (chart,)) if chart is not None else None


# The profile its samples are judged under: the minimums they are held to.
SAMPLE_PROFILE = {
    "probes": {"device": "cpu"},
    "training": {"enabled": False},
    "thresholds": {"allreduce_intra_busbw_gbps_min": 1.0},
}

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
    other_reasons=OTHER_REASONS,
    causes=intra_node_causes(frozenset({NAME, "transport"})),
    expectations=(
        Expectation(
            "allreduce_intra_busbw_gbps_min",
            SINGLE_NODE,
            NAME,
            threshold_set("allreduce_intra_busbw_gbps_min"),
        ),
        Expectation(
            "expected_transport.intra_node",
            SINGLE_NODE,
            "transport",
            is_set(lambda p: p.probes.expected_transport.intra_node),
            "intra_node",
            (NAME,),
        ),
    ),
    samples=(
        healthy("testbed_cpu_2ranks", {"ok"}, fixture="allreduce/testbed_cpu_2ranks.txt", profile=SAMPLE_PROFILE),
        fault(
            "quarter_bandwidth",
            {"below_threshold"},
            fixture="allreduce/testbed_cpu_2ranks_slow.txt",
            profile=SAMPLE_PROFILE,
        ),
        ALLREDUCE_TORCH_MISSING.judged({"probe_failed"}, SAMPLE_PROFILE),
    ),
)
