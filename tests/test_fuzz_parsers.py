"""Property-based fuzzing of every check's ``parse``/``evaluate``/``cluster_values`` (the probe-output parsers:
test_fuzz_probe_outputs.py, with the mutations here), seeded with the samples each discovered check declares
(the real captures in testbed/captures, and the faults and dead tools derived from them) and mutated the way
broken nodes break them (cut mid-line, lines lost or repeated, numbers garbled, stray unicode, CRLF, NUL bytes),
plus plain random text.

The properties: ``parse`` never raises and returns its model; garbage never yields a ``pass`` row, and the
error shows in the rows; ``evaluate`` and ``cluster_values`` never raise on any model ``parse`` returns; every
reason a row carries is declared, with the status declared for it (tests/test_check_reasons.py).
``derandomize=True`` keeps every run on the same examples, so CI cannot flake.
"""

from __future__ import annotations

import functools
import re
import typing
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_accept.checks.base import Check, CheckRow, ClusterView, Status, discover, majority_values
from cluster_accept.checks.samples import SampleKind
from cluster_accept.inventory.load import load_inventory
from cluster_accept.inventory.model import (
    ExpectedTransport,
    MinVersion,
    NvlinkSpec,
    PcieSpec,
    ProbeSettings,
    Profile,
)
from cluster_accept.testbed.profile import base_profile
from cluster_accept.vocabulary.secrets import MASK
from tests.capture import NO_CLUSTER
from tests.test_check_reasons import assert_declared

FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MACHINES = ("h200x4", "h100x1")
CHECKS = {check.name: check for check in discover()}
EXIT_CODES = st.one_of(st.none(), st.integers(-300, 300))

# Real profiles: the contract's, the test-bed's (derived from the captures), none at all, and one that pins
# the other way (minimum driver, no NVLink, persistence off, InfiniBand expected).
PROFILES = [
    Profile(),
    load_inventory(
        Path(__file__).resolve().parent.parent / "cluster_accept" / "inventory" / "examples" / "contract.yaml",
        check_files=False,
    ).profiles["h200-sxm"],
    *(Profile.model_validate(base_profile(machine)) for machine in MACHINES),
    Profile(
        driver_version=MinVersion(min="570.0"),
        persistence_mode="disabled",
        nvlink=NvlinkSpec(links_per_gpu=0, link_speed_gbps=1.0),
        pcie=PcieSpec(gen=4, width=8),
        nccl_env={"NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "mlx5", "NCCL_API_TOKEN": "x"},
        probes=ProbeSettings(expected_transport=ExpectedTransport(intra_node="P2P", inter_node="NET/IB/0")),
    ),
]


# Seeds: each check's own samples (its checks/ module declares them) ---------------------------------------


def sample_output(name: str, sample: str) -> str:
    """What check ``name``'s sample ``sample`` printed (its module declares it beside the check)."""
    return next(s.output() for s in CHECKS[name].samples if s.name == sample)


@functools.cache
def _seeds(name: str) -> list[tuple[str, int | None]]:
    """What the check's command prints, from the samples it declares: healthy nodes (the captured machines
    first), its faults and its tool dead (nvidia-smi's dead-driver output, a tool not found)."""
    return [(sample.output(), sample.exit_code) for sample in CHECKS[name].samples]


def test_every_check_has_seeds_that_parse_cleanly() -> None:
    """The seeds are real: each healthy or faulty output that exits 0 parses without error (so mutations start
    from the real shape)."""
    assert len(CHECKS) >= 12
    for name, check in CHECKS.items():
        read = [s for s in check.samples if s.exit_code == 0 and s.kind is not SampleKind.DEAD]
        assert read, name
        for sample in read:
            model = check.parse(sample.output(), sample.exit_code)
            assert model.error is None, (name, sample.name, model.error)


# Mutations ---------------------------------------------------------------------------------------------

Draw = Callable[[st.SearchStrategy[typing.Any]], typing.Any]
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
# Numbers as a broken tool or a corrupted stream may print them. Python's int() refuses '²' (though
# '²'.isdigit()) and anything over 4300 digits: those come twice as often.
_INT_REFUSES = ["9" * 5000, "1" * 4301, "²", "³"]
_ODD_NUMBERS = ["٣", "𝟗", "1.2.3", ".", "", "-1", "nan", "1e999", "0x1F", "2" * 30]
HOSTILE_NUMBERS = st.sampled_from(_INT_REFUSES * 2 + _ODD_NUMBERS)
ODD_BREAKS = st.sampled_from(["\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1e", "\x85", "\u2028", "\n\n", ""])


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _truncate(draw: Draw, text: str) -> str:
    return text[: draw(st.integers(0, len(text)))]


def _delete_line(draw: Draw, text: str) -> str:
    lines = _lines(text)
    if lines:
        del lines[draw(st.integers(0, len(lines) - 1))]
    return "".join(lines)


def _duplicate_line(draw: Draw, text: str) -> str:
    lines = _lines(text)
    if lines:
        i = draw(st.integers(0, len(lines) - 1))
        lines.insert(draw(st.integers(0, len(lines))), lines[i])
    return "".join(lines)


def _swap_lines(draw: Draw, text: str) -> str:
    lines = _lines(text)
    if len(lines) > 1:
        i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
        lines[i], lines[j] = lines[j], lines[i]
    return "".join(lines)


def _replace_line(draw: Draw, text: str) -> str:
    lines = _lines(text)
    if lines:
        lines[draw(st.integers(0, len(lines) - 1))] = draw(st.text(max_size=40)) + "\n"
    return "".join(lines)


def _replace_number(draw: Draw, text: str) -> str:
    numbers = list(_NUMBER.finditer(text))
    if not numbers:
        return text
    found = numbers[draw(st.integers(0, len(numbers) - 1))]
    new = draw(st.one_of(HOSTILE_NUMBERS, HOSTILE_NUMBERS, st.integers().map(str), st.text(max_size=6)))
    return text[: found.start()] + new + text[found.end() :]


def _replace_every_number(draw: Draw, text: str) -> str:
    return _NUMBER.sub(draw(HOSTILE_NUMBERS), text)


def _replace_column(draw: Draw, text: str) -> str:
    """One column of a table garbled on every line: the k-th number of each line becomes the same hostile text."""
    column, new = draw(st.integers(0, 12)), draw(HOSTILE_NUMBERS)

    def garble(line: str) -> str:
        numbers = list(_NUMBER.finditer(line))
        if column >= len(numbers):
            return line
        found = numbers[column]
        return line[: found.start()] + new + line[found.end() :]

    return "".join(garble(line) for line in _lines(text))


def _insert_text(draw: Draw, text: str) -> str:
    at = draw(st.integers(0, len(text)))
    return text[:at] + draw(st.text(min_size=1, max_size=20)) + text[at:]


def _insert_nul(draw: Draw, text: str) -> str:
    at = draw(st.integers(0, len(text)))
    return text[:at] + "\x00" * draw(st.integers(1, 3)) + text[at:]


def _crlf(draw: Draw, text: str) -> str:
    return text.replace("\n", "\r\n")


def _odd_line_break(draw: Draw, text: str) -> str:
    breaks = [m.start() for m in re.finditer("\n", text)]
    if not breaks:
        return text
    at = breaks[draw(st.integers(0, len(breaks) - 1))]
    return text[:at] + draw(ODD_BREAKS) + text[at + 1 :]


MUTATIONS: list[Callable[[Draw, str], str]] = [
    _truncate,
    _delete_line,
    _duplicate_line,
    _swap_lines,
    _replace_line,
    _replace_number,
    _replace_number,
    _replace_number,
    _replace_every_number,
    _replace_column,
    _insert_text,
    _insert_nul,
    _crlf,
    _odd_line_break,
]


@st.composite
def mutated(draw: Draw, seeds: list[tuple[str, int | None]]) -> tuple[str, int | None]:
    """A seed output with one to three mutations, and its exit code or another one."""
    text, code = draw(st.sampled_from(seeds))
    for _ in range(draw(st.integers(1, 3))):
        text = draw(st.sampled_from(MUTATIONS))(draw, text)
    return text, draw(st.one_of(st.just(code), EXIT_CODES))


def outputs(seeds: list[tuple[str, int | None]]) -> st.SearchStrategy[tuple[str, int | None]]:
    """Mostly mutated seeds; also random text, and the seeds as they are."""
    changed = mutated(seeds)
    return st.one_of(changed, changed, changed, st.tuples(st.text(), EXIT_CODES), st.sampled_from(seeds))


def text_outputs(seeds: list[str]) -> st.SearchStrategy[str]:
    texts = mutated([(s, 0) for s in seeds]).map(lambda pair: pair[0])
    return st.one_of(texts, texts, texts, st.text(), st.sampled_from(seeds))


# Checks ------------------------------------------------------------------------------------------------


@functools.cache
def _views(check: Check) -> st.SearchStrategy[ClusterView]:
    """No cluster, the majority of the healthy seeds, and majorities with random values for the same keys."""
    values = [check.cluster_values(check.parse(s, c)) for s, c in _seeds(check.name)] if check.cluster_values else []
    healthy = majority_values({f"node{i}": v for i, v in enumerate(values)})
    keys = sorted({k for v in values for k in v} | {"nccl_keys", "gpu_count", "driver_version"})
    random = st.dictionaries(st.sampled_from(keys), st.text(max_size=12)).map(
        lambda majority: ClusterView(majority=majority, nodes_compared=3)
    )
    return st.one_of(st.just(NO_CLUSTER), st.just(healthy), random)


def _assert_rows(check: Check, model: typing.Any, rows: list[CheckRow]) -> None:
    assert isinstance(rows, list)
    for row in rows:
        assert isinstance(row, CheckRow)
        assert row.check == check.name
        assert isinstance(row.status, Status)
        assert re.fullmatch(r"[a-z0-9_]+", row.reason), row.reason  # a stable code, not free text
        assert isinstance(row.item, str) and row.item
        assert isinstance(row.detail, str)
        assert row.observed is None or isinstance(row.observed, str)
        assert row.expected is None or isinstance(row.expected, str)
        assert row.gpu is None or isinstance(row.gpu, int)
        assert_declared(row)
    if model.error or getattr(model, "failure", None):
        assert all(row.status != Status.PASS for row in rows), "unreadable output passed"
    if model.error:
        said = [r for r in rows if r.status in (Status.ERROR, Status.SKIP) and model.error[:60] in r.detail]
        assert said, f"the error {model.error!r} shows in no row"


@pytest.mark.parametrize("name", sorted(CHECKS))
@settings(FUZZ, max_examples=300)
@given(data=st.data())
def test_check_parse_evaluate_and_cluster_values_never_raise(name: str, data: st.DataObject) -> None:
    check = CHECKS[name]
    stdout, exit_code = data.draw(outputs(_seeds(name)), label="output")
    model = check.parse(stdout, exit_code)
    assert isinstance(model, typing.get_type_hints(check.parse)["return"])
    assert model.error is None or (isinstance(model.error, str) and model.error.strip())
    assert isinstance(model.raw, str)
    if model.raw != stdout:  # kept with its secrets masked: it differs only on the lines where one was masked
        kept, printed = model.raw.split("\n"), stdout.split("\n")
        assert len(kept) == len(printed) and all(k == p or MASK in k for k, p in zip(kept, printed, strict=True))
    values = check.cluster_values(model) if check.cluster_values else {}
    assert isinstance(values, dict)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in values.items())
    if model.error:
        assert values == {}, "an unreadable output must not vote in the cluster majority"
    counters = getattr(check.module, "counters", None)  # error counters compared with the node's last run
    if counters is not None:
        found = counters(model)
        assert all(isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in found.items())
        assert not (model.error and found)
    view = data.draw(_views(check), label="cluster")
    for profile in PROFILES:
        _assert_rows(check, model, check.evaluate(model, profile, view))


def _drifted(view: ClusterView) -> ClusterView:
    """The majority with every value changed: each compared value of a healthy node drifts."""
    return ClusterView({key: f"other-{value}" for key, value in view.majority.items()}, view.nodes_compared)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_reasons_on_the_real_captures_are_declared(name: str) -> None:
    """Every row of every seed (the real captures, the dead driver) under every profile, alone, in a healthy
    cluster and in one whose majority differs in every value, carries a declared reason and its severity."""
    check = CHECKS[name]
    values = [check.cluster_values(check.parse(s, c)) for s, c in _seeds(name)] if check.cluster_values else []
    healthy = majority_values({f"node{i}": v for i, v in enumerate(values)})
    reasons = set()
    for stdout, code in _seeds(name):
        model = check.parse(stdout, code)
        for profile in PROFILES:
            for view in (NO_CLUSTER, healthy, _drifted(healthy)):
                rows = check.evaluate(model, profile, view)
                _assert_rows(check, model, rows)
                reasons |= {row.reason for row in rows}
    assert reasons, name
