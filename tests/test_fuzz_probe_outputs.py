"""Property-based fuzzing of the probe-output parsers (``parse_json_lines``, ``parse_nccl_tests`` and the NCCL
log readers), seeded with the real captures in testbed/captures and mutated with the mutations of
test_fuzz_parsers.py (cut mid-line, lines lost or repeated, numbers garbled, stray unicode, CRLF, NUL bytes).

Each discovered probe's own ``parse`` is fuzzed from the samples it declares. The properties: the parsers never
raise; every line that starts like a JSON object is accounted for; a row that cannot be read is an error, not an
exception. ``derandomize=True`` keeps every run on the same examples.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster_accept.analysis.nccl_log import nccl_transports, nccl_version
from cluster_accept.analysis.probe_output import ProbeOutput, parse_json_lines, parse_nccl_tests
from cluster_accept.probes.base import discover as discover_probes
from tests.capture import CAPTURES
from tests.test_fuzz_parsers import FUZZ, text_outputs

NCCL_TESTS = [(CAPTURES / "h200x4" / f"nccl-tests-allreduce-{kind}.txt").read_text() for kind in ("nvlink", "socket")]
NCCL_LOGS = [(CAPTURES / "h200x4" / f"torch-allreduce-{kind}.txt").read_text() for kind in ("nvlink", "socket")]


def _probe_lines() -> str:
    """What the probes print: an info line, then one JSON record per measurement (the all-reduce records are
    the ones parse_nccl_tests derives from the real table; the GEMM ones from the captured per-GPU TFLOP/s)."""
    lines = [json.dumps({"info": "probe", "probe": "allreduce", "world_size": 4, "nccl_version": "2.28.9"})]
    lines += [json.dumps(asdict(m), sort_keys=True) for m in parse_nccl_tests(NCCL_TESTS[0]).measurements[:8]]
    for line in (CAPTURES / "h200x4" / "gemm-nohog.txt").read_text().splitlines():
        gpu, _, value, unit = line.split()
        record = {"probe": "gpu_bench", "metric": "gemm_bf16_tflops", "value": float(value), "unit": unit}
        lines.append(json.dumps(record | {"gpu": int(gpu[3:])}, sort_keys=True))
    lines.append(json.dumps({"error": "CUDA error: out of memory", "gpu": 1}))
    lines.append("W1121 16:40:12 torch/distributed/run.py:851] noise")
    return "\n".join(lines) + "\n"


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
JSON_RECORDS = st.dictionaries(st.sampled_from(["metric", "value", "info", "error", "gpu", "unit"]), JSON_VALUES).map(
    json.dumps
)
JSON_TEXTS = st.one_of(
    text_outputs([_probe_lines()]),
    st.lists(JSON_RECORDS, max_size=5).map("\n".join),
    st.sampled_from(['{"value": ' + "9" * 5000 + "}", '{"a":' + "[" * 100_000 + "]" * 100_000 + "}", '{"v": NaN}']),
)


def _brace_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip().startswith("{"))


def test_probe_seeds_parse_cleanly() -> None:
    out = parse_json_lines(_probe_lines())
    assert len(out.measurements) == 12 and len(out.info) == 1 and len(out.errors) == 1
    assert len(parse_nccl_tests(NCCL_TESTS[0]).measurements) > 20 and not parse_nccl_tests(NCCL_TESTS[0]).errors
    assert nccl_transports(NCCL_LOGS[0]) and nccl_version(NCCL_LOGS[0]) == "2.28.9+cuda13.0"


@FUZZ
@given(text=JSON_TEXTS)
def test_parse_json_lines_never_raises_and_accounts_for_every_record(text: str) -> None:
    out = parse_json_lines(text)
    assert isinstance(out, ProbeOutput)
    # every line that starts like a JSON object is a measurement, an info record or an error: none is lost
    assert len(out.measurements) + len(out.info) + len(out.errors) == _brace_lines(text)
    for record in out.measurements:
        assert isinstance(record.metric, str) and isinstance(record.value, (int, float))
    assert all(isinstance(e, str) and e for e in out.errors)


@FUZZ
@given(text=text_outputs(NCCL_TESTS), world_size=st.one_of(st.none(), st.integers(1, 1024)))
def test_parse_nccl_tests_never_raises(text: str, world_size: int | None) -> None:
    out = parse_nccl_tests(text, world_size)
    assert isinstance(out, ProbeOutput)
    assert out.measurements or out.errors, "no rows and no error"
    assert all(isinstance(e, str) and e for e in out.errors)
    for record in out.measurements:
        assert record.metric == "allreduce_busbw_gbps"
        assert isinstance(record.value, float) and isinstance(record.size, int)
        assert world_size is None or record.world_size == world_size


@FUZZ
@given(text=text_outputs(NCCL_LOGS))
def test_nccl_log_readers_never_raise(text: str) -> None:
    transports = nccl_transports(text)
    assert all(isinstance(k, str) and k and isinstance(n, int) and n > 0 for k, n in transports.items())
    version = nccl_version(text)
    assert version is None or (version and not any(ch.isspace() for ch in version))


def test_nccl_tests_row_with_a_garbled_bandwidth_is_not_an_exception() -> None:
    table = NCCL_TESTS[0]
    row = next(line for line in table.splitlines() if re.match(r"\s+\d+\s+\d+\s+float", line))
    cells = row.split()
    garbled = row.replace(f" {cells[6]} ", " 1.2.3 ", 1)  # the out-of-place algbw column
    out = parse_nccl_tests(table.replace(row, garbled))
    assert len(out.measurements) == len(parse_nccl_tests(table).measurements) - 1
    assert parse_nccl_tests(garbled + "\n").errors == ["no all_reduce_perf result rows in the output"]
    no_ranks = "".join(line for line in table.splitlines(keepends=True) if "Rank" not in line)
    assert parse_nccl_tests(no_ranks).measurements[0].world_size == 4  # from 'nGpus 4'
    huge = parse_nccl_tests(no_ranks.replace("nGpus 4", "nGpus " + "9" * 5000))
    assert huge.measurements and huge.measurements[0].world_size is None
    size = re.match(r"\s+(\d+)\s", garbled)
    assert size is not None
    assert not parse_nccl_tests(garbled.replace(size.group(1), "9" * 5000, 1) + "\n").measurements
    assert parse_json_lines('{"value": ' + "9" * 5000 + "}").errors


PROBES = {probe.name: probe for probe in discover_probes()}


@pytest.mark.parametrize("name", sorted(PROBES))
@FUZZ
@given(data=st.data())
def test_every_probes_parse_never_raises_on_its_own_samples_mutated(name: str, data: st.DataObject) -> None:
    """Each discovered probe's ``parse``, from the samples it declares (healthy, faulty, its run dead), mutated."""
    probe = PROBES[name]
    text = data.draw(text_outputs([sample.output() for sample in probe.samples]), label="output")
    out = probe.parse(text)
    assert isinstance(out, ProbeOutput)
    assert all(isinstance(e, str) and e for e in out.errors)
    for record in out.measurements:  # a figure is a named number, whatever the text around it
        assert isinstance(record.metric, str) and isinstance(record.value, (int, float))
