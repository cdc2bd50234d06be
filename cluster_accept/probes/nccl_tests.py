"""Intra-node all-reduce with nccl-tests' ``all_reduce_perf``, where a profile names the binary
(``probes.nccl_tests_all_reduce``): the tool many sites already trust, read into the same figures, rows and
transport check as the torch sweep (it speaks for the ``allreduce`` check; the torch probe's report draws
both).
"""

from __future__ import annotations

from collections.abc import Mapping

from cluster_accept.analysis.probe_output import parse_nccl_tests
from cluster_accept.probes import allreduce
from cluster_accept.probes.contract import CheckRow, Probe, ProbeOutput, Profile, dead, fault, healthy, parse_json_lines
from cluster_accept.probes.scripts import NCCL_TESTS
from cluster_accept.vocabulary.lazy import pandas as pd

NAME = "nccl_tests"
ORDER = 41
SCRIPT = NCCL_TESTS
METRICS = allreduce.METRICS
REASONS = allreduce.REASONS
OTHER_REASONS = allreduce.OTHER_REASONS


def parse(stdout: str) -> ProbeOutput:
    """The nccl-tests table, or the skip line the command prints on a node with one GPU."""
    skip = parse_json_lines(stdout)
    output = skip if skip.info else parse_nccl_tests(stdout)
    return allreduce.with_nccl_log(output, stdout)


def inspect(output: ProbeOutput, profile: Profile) -> list[CheckRow]:
    return allreduce.inspect(output, profile)


def evaluate(figures: pd.DataFrame, profiles: Mapping[str, Profile]) -> list[tuple[str, CheckRow]]:
    return allreduce.evaluate(figures, profiles)


# The profile its samples are judged under: the minimums they are held to.
SAMPLE_PROFILE = {
    "probes": {"nccl_tests_all_reduce": "/opt/nccl-tests/build/all_reduce_perf"},
    "training": {"enabled": False},
    "thresholds": {"allreduce_intra_busbw_gbps_min": 100.0},
}

PROBE = Probe(
    name=NAME,
    script=SCRIPT,
    metrics=METRICS,
    reasons=REASONS,
    parse=parse,
    evaluate=evaluate,
    check=allreduce.NAME,
    order=ORDER,
    inspect=inspect,
    other_reasons=OTHER_REASONS,
    samples=(
        healthy(
            "nvlink",
            {"ok", "recorded"},
            fixture="captures/h200x4/nccl-tests-allreduce-nvlink.txt",
            profile=SAMPLE_PROFILE,
        ),
        fault(
            "socket",
            {"below_threshold", "unreadable"},
            fixture="captures/h200x4/nccl-tests-allreduce-socket.txt",
            profile=SAMPLE_PROFILE,
        ),
        dead(
            "not_found",
            {"probe_error"},
            text="sh: 1: /opt/nccl-tests/build/all_reduce_perf: not found\n",
            exit_code=127,
            profile=SAMPLE_PROFILE,
        ),
    ),
)
