"""--query-gpu checks on older drivers: a field the driver does not know falls back instead of failing the node.

Outputs come from the real captures: the 580 answers (query-gpu.txt), and nvidia-smi's refusal of an unknown
field (h200x4/query-gpu-invalid-field.txt, exit 2) with the refused name put in. The node-side snippet itself
runs under sh against the test-bed's nvidia-smi stand-in, told to refuse the fields an older driver lacks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import cluster_accept.checks.clock_events as clock_events
import cluster_accept.checks.memory_health as memory
from cluster_accept.checks.reasons import Action
from cluster_accept.checks.sections import FALLBACK_MARK, FIELD_NOT_IN_DRIVER, GpuQuery
from cluster_accept.inventory.model import Profile
from cluster_accept.testbed.captures import raw_capture
from cluster_accept.testbed.nodedata import build_node, write_node_data
from cluster_accept.testbed.standins import write_standins
from tests.capture import NO_CLUSTER, noheader, table
from tests.test_check_reasons import assert_declared

NO_PROFILE = Profile()
EXPECTED = "none of hw_slowdown, sw_thermal, hw_thermal, hw_power_brake"
THROTTLE = "clocks_throttle_reasons.active"
SHELLS = [s for s in ("sh", "dash", "bash") if shutil.which(s)]


def refusal(name: str) -> tuple[str, int]:
    """What nvidia-smi prints when ``name`` is not a field of its driver: the captured refusal, renamed."""
    text, code = raw_capture("h200x4", "query-gpu-invalid-field.txt")
    assert (text, code) == ('Field "foo.bar" is not a valid field to query.\n\n', 2)
    return text.replace("foo.bar", name), code


def fallback(refused: str, fields: str, body: str) -> str:
    return f"{FALLBACK_MARK} refused={refused} fields={fields}\n{body}"


def clock_rows(stdout: str, code: int | None = 0) -> list[tuple[object, ...]]:
    rows = clock_events.evaluate(clock_events.parse(stdout, code), NO_PROFILE, NO_CLUSTER)
    for row in rows:
        assert_declared(row)
    return [(*t, r.detail) for t, r in zip(table(rows), rows, strict=True)]


# The parser on both shapes -------------------------------------------------------------------------------


def test_580_shape_reads_todays_name() -> None:
    detail = "clocks_event_reasons.active=0x0000000000000001"
    assert clock_rows(noheader("h200x4", clock_events.FIELDS)) == [
        ("event_reasons", i, "pass", "ok", "gpu_idle", EXPECTED, detail) for i in range(4)
    ]


def test_old_driver_answers_to_the_throttle_name() -> None:
    # an older driver refuses today's name; the snippet asks again with the name it knows (the same NVML bits)
    said, code = refusal("clocks_event_reasons.active")
    assert said == 'Field "clocks_event_reasons.active" is not a valid field to query.\n\n' and code == 2
    body = noheader("h200x4", clock_events.FIELDS).replace("2, 0x0000000000000001", "2, 0x0000000000000008")
    stdout = fallback("clocks_event_reasons.active", f"index,{THROTTLE}", body)
    model = clock_events.parse(stdout, 0)
    assert (model.error, model.source, model.note) == (None, THROTTLE, "driver before clocks_event_reasons")
    assert model.raw == stdout
    idle = f"{THROTTLE}=0x0000000000000001 (driver before clocks_event_reasons)"
    slow = f"{THROTTLE}=0x0000000000000008 (driver before clocks_event_reasons)"
    assert clock_rows(stdout) == [
        ("event_reasons", 0, "pass", "ok", "gpu_idle", EXPECTED, idle),
        ("event_reasons", 1, "pass", "ok", "gpu_idle", EXPECTED, idle),
        ("event_reasons", 2, "fail", "throttle_hw_slowdown", "hw_slowdown", EXPECTED, slow),
        ("event_reasons", 3, "pass", "ok", "gpu_idle", EXPECTED, idle),
    ]


def test_a_field_with_no_older_name_is_a_skip_row_the_rest_judged() -> None:
    # remapped_rows.* are recent in --query-gpu: without them the query still reads ECC and page retirement
    fields = ["index", "ecc.mode.current", "ecc.errors.uncorrected.volatile.total", "retired_pages.pending"]
    body = noheader("h200x4", fields).replace("1, Enabled, 0, [N/A]", "1, Enabled, 3, [N/A]")
    assert body.splitlines()[0] == "0, Enabled, 0, [N/A]"
    stdout = fallback("remapped_rows.pending,remapped_rows.failure", ",".join(fields), body)
    model = memory.parse(stdout, 0)
    assert model.error is None
    assert memory.counters(model) == {f"gpu{i}.uncorrected_ecc": 3 if i == 1 else 0 for i in range(4)}
    rows = memory.evaluate(model, NO_PROFILE, NO_CLUSTER)
    for row in rows:
        assert_declared(row)
    why = "the node's driver predates remapped_rows.{}: its nvidia-smi refused the field"
    assert [(*t, r.detail) for t, r in zip(table(rows), rows, strict=True) if r.gpu == 1] == [
        ("ecc_mode", 1, "pass", "ok", "Enabled", "Enabled", ""),
        ("uncorrected_ecc", 1, "fail", "uncorrected_ecc", "3", "0", _ECC),
        ("remapped_rows_pending", 1, "skip", "field_not_in_driver", None, "No", why.format("pending")),
        ("remapped_rows_failure", 1, "skip", "field_not_in_driver", None, "No", why.format("failure")),
        ("retired_pages_pending", 1, "skip", "not_available", "[N/A]", "No", "retired_pages.pending not reported"),
    ]
    assert [(r.gpu, r.item) for r in rows if r.reason == "field_not_in_driver"] == [
        (g, item) for g in range(4) for item in ("remapped_rows_pending", "remapped_rows_failure")
    ]


_ECC = "uncorrected ECC errors since the driver was loaded"


def test_the_skip_reason_is_declared_with_explanation_and_action() -> None:
    assert memory.REASONS["field_not_in_driver"] is FIELD_NOT_IN_DRIVER
    assert FIELD_NOT_IN_DRIVER.severity.value == "skip"
    assert "too old" in FIELD_NOT_IN_DRIVER.explanation and FIELD_NOT_IN_DRIVER.action is Action.FIX_CONFIG


def test_the_older_name_refused_too_is_an_error_row_with_both_refusals() -> None:
    said, code = refusal(THROTTLE)
    stdout = fallback("clocks_event_reasons.active", f"index,{THROTTLE}", said)
    rows = clock_events.evaluate(clock_events.parse(stdout, code), NO_PROFILE, NO_CLUSTER)
    assert table(rows) == [("output", None, "error", "unparsable_output", None, None)]
    assert rows[0].detail.startswith("nvidia-smi exited 2 (after the driver refused clocks_event_reasons.active)")
    assert f'Field "{THROTTLE}" is not a valid field to query.' in rows[0].detail


@pytest.mark.parametrize(
    "mark",
    [
        f"{FALLBACK_MARK} refused=clocks_event_reasons.active fields=index,clocks_event_reasons.nope",
        f"{FALLBACK_MARK} refused=clocks_event_reasons.active fields=index",  # the mask has an older name
        f"{FALLBACK_MARK} refused=clocks_event_reasons.active fields=index,{THROTTLE},index",
        f"{FALLBACK_MARK} garbled",
    ],
)
def test_a_fallback_line_that_does_not_match_the_fields_is_an_error(mark: str) -> None:
    stdout = f"{mark}\n0, 0x0000000000000001\n"
    rows = clock_events.evaluate(clock_events.parse(stdout, 0), NO_PROFILE, NO_CLUSTER)
    assert [(r.item, r.status.value, r.reason) for r in rows] == [("output", "error", "unparsable_output")]
    assert mark[:40] in rows[0].detail


def test_the_refusal_without_the_snippet_stays_an_error() -> None:
    # output of the plain query (no fallback mark): nothing was retried, nothing may pass
    said, code = refusal("clocks_event_reasons.active")
    rows = clock_events.evaluate(clock_events.parse(said, code), NO_PROFILE, NO_CLUSTER)
    assert [(r.item, r.status.value, r.reason) for r in rows] == [("output", "error", "unparsable_output")]


def test_fields_without_an_older_form_keep_the_plain_query() -> None:
    query = GpuQuery(["index", "persistence_mode"])
    assert query.command == "nvidia-smi --query-gpu=index,persistence_mode --format=csv,noheader,nounits"
    answer = query.read("0, Enabled\n", 0)
    assert (answer.rows, answer.missing, answer.note("persistence_mode")) == (
        [{"index": "0", "persistence_mode": "Enabled"}],
        (),
        "",
    )
    with pytest.raises(ValueError, match="not --query-gpu field names"):
        GpuQuery(["index", "x;reboot"])


# The node-side snippet under sh, against the stand-in ----------------------------------------------------


@pytest.fixture
def node(tmp_path: Path) -> dict[str, object]:
    data = tmp_path / "data"
    write_node_data(build_node("h200x4", [], {}), data, seed="n")
    write_standins(tmp_path / "bin", data)
    return {"data": data, "env": {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}}


def run(
    node: dict[str, object], command: str, shell: str, refused: list[str], modes: tuple[str, ...] = ()
) -> tuple[str, int]:
    data = node["data"]
    assert isinstance(data, Path)
    behavior = json.loads((data / "behavior.json").read_text())
    (data / "behavior.json").write_text(json.dumps({**behavior, "refused_fields": refused, "modes": list(modes)}))
    env = node["env"]
    assert isinstance(env, dict)
    done = subprocess.run([shell, "-c", command], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.stderr == ""
    return done.stdout, done.returncode


@pytest.mark.integration
@pytest.mark.parametrize("shell", SHELLS)
def test_snippet_on_580_prints_the_plain_answer(node: dict[str, object], shell: str) -> None:
    assert run(node, clock_events.COMMAND, shell, []) == (noheader("h200x4", clock_events.FIELDS), 0)
    assert run(node, memory.COMMAND, shell, []) == (noheader("h200x4", memory.FIELDS), 0)


@pytest.mark.integration
@pytest.mark.parametrize("shell", SHELLS)
def test_snippet_on_an_old_driver_falls_back(node: dict[str, object], shell: str) -> None:
    refused = ["clocks_event_reasons.active", "remapped_rows.pending", "remapped_rows.failure"]
    stdout, code = run(node, clock_events.COMMAND, shell, refused)
    assert (stdout, code) == (
        fallback("clocks_event_reasons.active", f"index,{THROTTLE}", noheader("h200x4", clock_events.FIELDS)),
        0,
    )
    assert [r[2:4] for r in clock_rows(stdout, code)] == [("pass", "ok")] * 4
    stdout, code = run(node, memory.COMMAND, shell, refused)
    kept = ["index", "ecc.mode.current", "ecc.errors.uncorrected.volatile.total", "retired_pages.pending"]
    refused_both = "remapped_rows.pending,remapped_rows.failure"
    assert (stdout, code) == (fallback(refused_both, ",".join(kept), noheader("h200x4", kept)), 0)
    rows = memory.evaluate(memory.parse(stdout, code), NO_PROFILE, NO_CLUSTER)
    assert sorted({(r.status.value, r.reason) for r in rows}) == [
        ("pass", "ok"),
        ("skip", "field_not_in_driver"),
        ("skip", "not_available"),
    ]


@pytest.mark.integration
@pytest.mark.parametrize("shell", SHELLS)
def test_snippet_gives_up_when_the_older_name_is_refused_too(node: dict[str, object], shell: str) -> None:
    stdout, code = run(node, clock_events.COMMAND, shell, ["clocks_event_reasons.active", THROTTLE])
    said, _ = refusal(THROTTLE)
    assert (stdout, code) == (fallback("clocks_event_reasons.active", f"index,{THROTTLE}", said), 2)
    # a field with no older form refused: the plain refusal, no retry
    stdout, code = run(node, memory.COMMAND, shell, ["ecc.mode.current"])
    assert (stdout, code) == refusal("ecc.mode.current")


@pytest.mark.integration
@pytest.mark.parametrize("shell", SHELLS)
def test_snippet_keeps_a_cut_output_cut(node: dict[str, object], shell: str) -> None:
    # the answer passes through a shell variable: a line cut mid-write must not gain a line end
    stdout, code = run(node, clock_events.COMMAND, shell, [], ("truncated",))
    assert (stdout, code) == ("0, 0x0000000000000001\n1, 0x0000000000000001", 0)
    assert clock_events.parse(stdout, code).error == "output ends mid-line (truncated)"
