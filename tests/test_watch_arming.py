"""Arming a running job per node (torch and NCCL versions), its renderers, and the parse of what the node
readers give: NCCL Inspector records and NCCL RAS status (samples under tests/data/watch/, README there)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml

from cluster_accept.watch import arming
from cluster_accept.watch.arming import (
    ArmPlan,
    ArmSettings,
    EnvVar,
    NodeVersions,
    arm,
    arm_node,
    pod_env,
    srun_export,
    taskprolog_script,
)
from cluster_accept.watch.inspector import op_name, parse_inspector_lines
from cluster_accept.watch.node import inspector_read, ras_read
from cluster_accept.watch.ras import RasRankState, parse_ras_answer, parse_ras_json, parse_ras_text
from cluster_accept.watch.words import Signal

pytestmark = pytest.mark.unit

DATA = Path(__file__).parent / "data" / "watch"
PLUGIN = "/opt/nccl/lib/libnccl-profiler-inspector.so"
SETTINGS = ArmSettings(watch_dir="/var/lib/ca-watch", shim_dir="/opt/ca/shim")
DIAGNOSTICS_OFF = "off (arm --nccl-diagnostics): the watch asks RAS's diagnostics on demand where NCCL has them"


def plan_of(torch: str | None, nccl: str | None, plugin: str | None = None, compiler: bool = False) -> ArmPlan:
    return arm_node(NodeVersions("gpu-node-07", torch, nccl, plugin, compiler), SETTINGS, job="4242")


def coverage(plan: ArmPlan) -> dict[str, tuple[bool, str]]:
    return {row.signal: (row.available, row.detail) for row in plan.coverage}


def env(plan: ArmPlan) -> dict[str, str]:
    return {var.name: var.value for var in plan.env}


# Arming per version ------------------------------------------------------------------------------------------


def test_torch_2_1_without_nccl_gets_only_the_watch_variables_and_a_reason_for_every_signal() -> None:
    plan = plan_of("2.1.0", None)
    assert plan.names() == ["CA_WATCH_DIR", "CA_WATCH_JOB"]
    assert plan.fr_handler is None
    assert coverage(plan) == {
        "flight_recorder": (False, "torch 2.1 has no Flight Recorder (it came in 2.2)"),
        "worker_server": (False, "torch 2.1 has no worker server and no Flight Recorder"),
        "nccl_timing": (False, "no NCCL on this node: only NCCL collectives are timed"),
        "inspector": (False, "no NCCL on this node"),
        "ras": (False, "no NCCL on this node"),
        "nccl_diagnostics": (False, DIAGNOSTICS_OFF),
    }
    assert {row.job for row in plan.coverage} == {"4242"} and {row.node for row in plan.coverage} == {"gpu-node-07"}


def test_torch_2_3_with_nccl_2_21_dumps_the_flight_recorder_on_timeout_only() -> None:
    plan = plan_of("2.3.1+cu121", "2.21.5")
    assert plan.names() == [
        "CA_WATCH_DIR",
        "CA_WATCH_JOB",
        "TORCH_NCCL_TRACE_BUFFER_SIZE",
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
        "TORCH_NCCL_ENABLE_TIMING",
    ]
    assert env(plan)["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/var/lib/ca-watch/{job}/fr_rank_"
    assert coverage(plan) == {
        "flight_recorder": (True, "armed: 2000 entries per rank, dumped only on a watchdog timeout"),
        "worker_server": (False, "torch 2.3 has no worker server: Flight Recorder only dumped on timeout"),
        "nccl_timing": (True, "armed: TORCH_NCCL_ENABLE_TIMING"),
        "inspector": (False, "NCCL 2.21 has no Inspector (its profiler API v5 came in 2.28)"),
        "ras": (False, "NCCL 2.21 has no RAS (it came in 2.24)"),
        "nccl_diagnostics": (False, DIAGNOSTICS_OFF),
    }


def test_torch_2_3_without_dump_on_timeout_has_nothing_to_read_the_flight_recorder() -> None:
    settings = ArmSettings("/var/lib/ca-watch", "/opt/ca/shim", dump_on_timeout=False)
    plan = arm_node(NodeVersions("n", "2.3.0", "2.21.5", None, False), settings)
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in plan.names()
    assert coverage(plan)["flight_recorder"] == (
        False,
        "torch 2.3 has no worker server and dump_on_timeout is off: nothing reads it",
    )


def test_torch_2_4_worker_server_gives_only_a_pickle() -> None:
    plan = plan_of("2.4.1", "2.20.5")
    assert "PYTHONPATH" not in plan.names() and plan.fr_handler is None
    assert coverage(plan)["worker_server"] == (
        False,
        "torch 2.4's worker server gives the Flight Recorder only as a pickle",
    )


def test_torch_2_6_with_nccl_2_24_reads_the_nccl_json_handler_and_ras_text() -> None:
    plan = plan_of("2.6.0", "2.24.3", compiler=True)
    assert plan.fr_handler == "dump_nccl_trace_json"
    assert plan.names() == [
        "CA_WATCH_DIR",
        "CA_WATCH_JOB",
        "TORCH_NCCL_TRACE_BUFFER_SIZE",
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
        "PYTHONPATH",
        "TORCH_NCCL_ENABLE_TIMING",
        "NCCL_RAS_ENABLE",
    ]
    assert env(plan)["PYTHONPATH"] == "/opt/ca/shim"
    assert coverage(plan)["ras"] == (True, "armed: port 28028, text status (JSON from 2.28.7)")
    assert coverage(plan)["inspector"] == (False, "NCCL 2.24 has no Inspector (its profiler API v5 came in 2.28)")
    assert plan.directories == ("/var/lib/ca-watch/{job}",)


def test_torch_2_13_with_nccl_2_28_and_a_named_plugin_arms_every_signal_under_both_buffer_names() -> None:
    plan = plan_of("2.13.0+cu130", "2.28.7", plugin=PLUGIN)
    assert plan.fr_handler == "fr_trace_json"
    assert list(env(plan).items()) == [
        ("CA_WATCH_DIR", "/var/lib/ca-watch"),
        ("CA_WATCH_JOB", "{job}"),
        ("TORCH_FR_BUFFER_SIZE", "2000"),
        ("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000"),
        ("TORCH_NCCL_DUMP_ON_TIMEOUT", "1"),
        ("TORCH_FR_DUMP_TEMP_FILE", "/var/lib/ca-watch/{job}/fr_rank_"),
        ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "/var/lib/ca-watch/{job}/fr_rank_"),
        ("PYTHONPATH", "/opt/ca/shim"),
        ("TORCH_NCCL_ENABLE_TIMING", "1"),
        ("NCCL_PROFILER_PLUGIN", PLUGIN),
        ("NCCL_INSPECTOR_ENABLE", "1"),
        ("NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS", "5000000"),
        ("NCCL_INSPECTOR_DUMP_DIR", "/var/lib/ca-watch/{job}/inspector"),
        ("NCCL_INSPECTOR_DUMP_VERBOSE", "1"),
        ("NCCL_RAS_ENABLE", "1"),
    ]
    assert all(available for signal, (available, _) in coverage(plan).items() if signal != "nccl_diagnostics")
    assert coverage(plan)["nccl_diagnostics"] == (False, DIAGNOSTICS_OFF)  # off unless asked for
    assert coverage(plan)["ras"][1] == (
        "armed: port 28028, JSON status (missing ranks' JSON lacks a comma before 2.29.2: repaired when read)"
    )
    assert coverage(plan)["inspector"][1] == "armed: JSON lines every 5 s"
    assert plan.directories == ("/var/lib/ca-watch/{job}", "/var/lib/ca-watch/{job}/inspector")


@pytest.mark.parametrize(
    ("nccl", "compiler", "detail"),
    [
        ("2.28.3", True, "no Inspector build named; the node can build one from NCCL 2.28's ext-profiler/inspector"),
        (
            "2.30.7",
            True,
            "no Inspector build named; the node can build one from NCCL 2.30's plugins/profiler/inspector",
        ),
        ("2.30.7", False, "no Inspector build named and no compiler on the node"),
        ("2.27.7", True, "NCCL 2.27 has no Inspector (its profiler API v5 came in 2.28)"),
    ],
)
def test_inspector_without_a_named_build(nccl: str, compiler: bool, detail: str) -> None:
    plan = plan_of("2.13.0", nccl, plugin=None, compiler=compiler)
    assert coverage(plan)["inspector"] == (False, detail)
    assert not [name for name in plan.names() if "INSPECTOR" in name or name == "NCCL_PROFILER_PLUGIN"]


@pytest.mark.parametrize(
    ("nccl", "armed", "detail"),
    [
        ("2.31.2", True, "armed: RAS's and the active checks at each communicator's creation, in the job's output"),
        ("2.30.7", False, "NCCL 2.30 has no diagnostics (they came in 2.31)"),
        (None, False, "no NCCL on this node"),
    ],
)
def test_nccls_diagnostics_are_armed_when_asked_for_and_only_where_nccl_has_them(
    nccl: str | None, armed: bool, detail: str
) -> None:
    settings = ArmSettings(watch_dir="/var/lib/ca-watch", shim_dir="/opt/ca/shim", nccl_diagnostics=True)
    plan = arm_node(NodeVersions("gpu-node-07", "2.13.0", nccl, None, False), settings, job="4242")
    assert coverage(plan)["nccl_diagnostics"] == (armed, detail)
    names = ["NCCL_RUN_RAS_DIAGNOSTICS", "NCCL_RUN_DIAGNOSTICS"]
    assert [n for n in plan.names() if n in names] == (names if armed else [])


def test_a_plugin_named_for_an_nccl_without_inspector_is_not_set() -> None:
    plan = plan_of("2.13.0", "2.21.5", plugin=PLUGIN)
    assert "NCCL_PROFILER_PLUGIN" not in plan.names()
    assert coverage(plan)["inspector"][0] is False


def test_gloo_only_jobs_record_from_torch_2_8_and_answer_over_the_socket_from_2_10() -> None:
    for version in ("2.7.1", "2.9.1", "2.10.0"):
        plan = plan_of(version, None)
        names = plan.names()
        if version == "2.7.1":
            assert coverage(plan)["flight_recorder"] == (
                False,
                "torch 2.7 records only NCCL collectives (Gloo since 2.8) and there is no NCCL",
            )
            continue
        assert names[2:4] == ["TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"]
        assert "TORCH_NCCL_DUMP_ON_TIMEOUT" not in names  # the watchdog dump is ProcessGroupNCCL's
    assert coverage(plan_of("2.9.1", None))["worker_server"] == (
        False,
        "torch 2.9 serves the Flight Recorder as JSON for NCCL only (every backend from 2.10)",
    )
    assert plan_of("2.10.0", None).fr_handler == "fr_trace_json"


def test_a_version_not_understood_is_armed_under_every_name() -> None:
    plan = plan_of("nightly", "2.28.7")
    assert {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE"} <= set(plan.names())
    assert plan.fr_handler == "fr_trace_json"
    assert arming.parse_version("(2, 28, 7)") == (2, 28, 7)
    assert arming.parse_version("2.13.0+cpu") == (2, 13, 0)
    assert arming.parse_version(None) is None
    assert arming.parse_version("nightly") == arming.NEWEST


def test_torch_absent_still_arms_nccl_signals() -> None:
    plan = plan_of(None, "2.30.7", plugin=PLUGIN)
    assert coverage(plan)["flight_recorder"] == (False, "no torch in the job's Python on this node")
    assert coverage(plan)["inspector"][0] and coverage(plan)["ras"][0]
    assert not [name for name in plan.names() if name.startswith("TORCH_") or name == "PYTHONPATH"]


def test_settings_change_the_values_and_every_node_gets_every_signal() -> None:
    settings = ArmSettings(
        "/scratch/watch/",
        "/opt/ca/shim",
        fr_buffer_entries=500,
        inspector_dump_interval_s=0.25,
        nccl_timing=False,
        inspector_verbose=False,
        ras_port=29123,
    )
    nodes = [NodeVersions("a", "2.13.0", "2.30.7", PLUGIN, False), NodeVersions("b", "2.1.0", None, None, True)]
    plans = arm(nodes, settings, job="9")
    first = env(plans[0])
    assert first["CA_WATCH_DIR"] == "/scratch/watch"
    assert first["TORCH_FR_BUFFER_SIZE"] == "500"
    assert first["NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS"] == "250000"
    assert first["NCCL_RAS_ADDR"] == "localhost:29123"
    assert "TORCH_NCCL_ENABLE_TIMING" not in first and "NCCL_INSPECTOR_DUMP_VERBOSE" not in first
    assert coverage(plans[0])["nccl_timing"] == (
        False,
        "not armed (nccl_timing off): a slow GPU is not seen, only a slow host; the timing's cost on step time is in "
        "docs/watch-signals.md",
    )
    assert coverage(plans[0])["ras"] == (True, "armed: port 29123, JSON status")
    for plan in plans:
        assert [row.signal for row in plan.coverage] == [s.value for s in Signal]


BOUNDARIES = [  # (torch, nccl, what the plan shows): each pair is the release before a thing and the first with it
    ("2.1.9", "2.21.5", "no var TORCH_NCCL_TRACE_BUFFER_SIZE"),
    ("2.2.0", "2.21.5", "var TORCH_NCCL_TRACE_BUFFER_SIZE"),
    ("2.3.1", "2.21.5", "worker_server: torch 2.3 has no worker server: Flight Recorder only dumped on timeout"),
    ("2.4.0", "2.21.5", "worker_server: torch 2.4's worker server gives the Flight Recorder only as a pickle"),
    ("2.4.1", "2.21.5", "handler None"),
    ("2.5.0", "2.21.5", "handler dump_nccl_trace_json"),
    ("2.7.1", "2.21.5", "no var TORCH_FR_BUFFER_SIZE"),
    ("2.8.0", "2.21.5", "var TORCH_FR_BUFFER_SIZE"),
    ("2.9.1", None, "handler None"),
    ("2.10.0", None, "handler fr_trace_json"),
    ("2.13.0", "2.23.4", "no var NCCL_RAS_ENABLE"),
    ("2.13.0", "2.24.3", "var NCCL_RAS_ENABLE"),
    ("2.13.0", "2.28.3", "ras: armed: port 28028, text status (JSON from 2.28.7)"),
    (
        "2.13.0",
        "2.28.9",
        "ras: armed: port 28028, JSON status (missing ranks' JSON lacks a comma before 2.29.2: repaired when read)",
    ),
    ("2.13.0", "2.29.2", "ras: armed: port 28028, JSON status"),
    ("2.13.0", "2.27.7", "no var NCCL_PROFILER_PLUGIN"),
    ("2.13.0", "2.28.3", "var NCCL_PROFILER_PLUGIN"),
]


@pytest.mark.parametrize(("torch", "nccl", "shows"), BOUNDARIES)
def test_each_version_boundary(torch: str, nccl: str | None, shows: str) -> None:
    plan = plan_of(torch, nccl, plugin=PLUGIN)
    kind, _, rest = shows.partition(" ")
    if kind == "var":
        assert rest in plan.names()
    elif kind == "no":
        assert rest.removeprefix("var ") not in plan.names()
    elif kind == "handler":
        assert str(plan.fr_handler) == rest
    else:
        signal, detail = shows.split(": ", 1)
        assert coverage(plan)[signal][1] == detail


# Refusals ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["relative/dir", "/var/watch dir", "/var/$(id)", "/var/`id`", '/var/"x"', "/var/x;rm", "/var/../etc", "/", ""],
)
def test_paths_outside_the_conservative_set_are_refused(path: str) -> None:
    with pytest.raises(ValueError, match="refused"):
        arm_node(NodeVersions("n", "2.13.0", "2.28.7", None, False), ArmSettings(path, "/opt/ca/shim"))
    with pytest.raises(ValueError, match="refused"):
        arm_node(NodeVersions("n", "2.13.0", "2.28.7", None, False), ArmSettings("/var/w", path))
    with pytest.raises(ValueError, match="inspector_plugin .* refused"):
        arm_node(NodeVersions("n", "2.13.0", "2.28.7", path or "x", False), SETTINGS)


@pytest.mark.parametrize("job", ["", "12 34", "12;id", "$SLURM_JOB_ID", "1'2", "a/b", "7+0"])
def test_job_ids_outside_the_set_are_refused(job: str) -> None:
    plan = plan_of("2.13.0", "2.28.7")
    with pytest.raises(ValueError, match="job id .* refused"):
        srun_export(plan, job)
    with pytest.raises(ValueError, match="job id .* refused"):
        pod_env(plan, job)


def test_a_hand_built_plan_cannot_carry_shell_syntax_into_a_renderer() -> None:
    bad = ArmPlan("n", (EnvVar("CA_WATCH_DIR", "/w$(reboot)", ""),), (), ())
    for render in (taskprolog_script, lambda p: srun_export(p, "1"), lambda p: pod_env(p, "1")):
        with pytest.raises(ValueError, match="refused"):
            render(bad)
    with pytest.raises(ValueError, match="refused"):
        taskprolog_script(ArmPlan("n", (EnvVar("X;Y", "1", ""),), (), ()))
    with pytest.raises(ValueError, match="pythonpath_tail"):
        pod_env(plan_of("2.13.0", "2.28.7"), "1", pythonpath_tail="/ok:/not ok")


def test_settings_out_of_range_are_refused() -> None:
    node = NodeVersions("n", "2.13.0", "2.28.7", None, False)
    for settings in (
        ArmSettings("/w", "/s", fr_buffer_entries=-1),
        ArmSettings("/w", "/s", inspector_dump_interval_s=0),
        ArmSettings("/w", "/s", ras_port=70000),
    ):
        with pytest.raises(ValueError):
            arm_node(node, settings)


# Renderers: exact text --------------------------------------------------------------------------------------

SMALL = ArmSettings("/var/lib/ca-watch", "/opt/ca/shim", inspector_verbose=False, nccl_timing=False)


def small_plan() -> ArmPlan:
    return arm_node(NodeVersions("gpu-node-07", "2.13.0", "2.28.7", PLUGIN, False), SMALL, job="4242")


def test_taskprolog_prints_export_lines_expanding_the_job_id_and_keeping_pythonpath() -> None:
    assert taskprolog_script(small_plan()) == (
        "#!/bin/sh\n"
        "# cluster-accept watch: arms the tasks of a job on gpu-node-07 through their environment.\n"
        'case "${SLURM_JOB_ID:-}" in\n'
        "  ''|*[!A-Za-z0-9_.-]*) exit 0 ;;\n"
        "esac\n"
        "umask 077\n"
        'own() { mkdir "$1" 2>/dev/null; [ -d "$1" ] && [ ! -L "$1" ] && [ -O "$1" ] && chmod go-w "$1"; }\n'
        'dir="${SLURM_JOB_ID}"\n'
        'own "/var/lib/ca-watch/${dir}" || { dir="${SLURM_JOB_ID}.$(id -u)"; own "/var/lib/ca-watch/${dir}"; } || {\n'
        '  echo "print cluster-accept watch: not armed: no directory of this user for the job in /var/lib/ca-watch '
        "(it must be root's, mode 1777)\"\n"
        "  exit 0\n"
        "}\n"
        'mkdir "/var/lib/ca-watch/${dir}/inspector" 2>/dev/null\n'
        'echo "export CA_WATCH_DIR=/var/lib/ca-watch"\n'
        'echo "export CA_WATCH_JOB=${SLURM_JOB_ID}"\n'
        'echo "export TORCH_FR_BUFFER_SIZE=2000"\n'
        'echo "export TORCH_NCCL_TRACE_BUFFER_SIZE=2000"\n'
        'echo "export TORCH_NCCL_DUMP_ON_TIMEOUT=1"\n'
        'echo "export TORCH_FR_DUMP_TEMP_FILE=/var/lib/ca-watch/${dir}/fr_rank_"\n'
        'echo "export TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/var/lib/ca-watch/${dir}/fr_rank_"\n'
        'echo "export PYTHONPATH=/opt/ca/shim${PYTHONPATH:+:${PYTHONPATH}}"\n'
        'echo "export NCCL_PROFILER_PLUGIN=/opt/nccl/lib/libnccl-profiler-inspector.so"\n'
        'echo "export NCCL_INSPECTOR_ENABLE=1"\n'
        'echo "export NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS=5000000"\n'
        'echo "export NCCL_INSPECTOR_DUMP_DIR=/var/lib/ca-watch/${dir}/inspector"\n'
        'echo "export NCCL_RAS_ENABLE=1"\n'
    )


def test_srun_export_is_one_double_quoted_argument() -> None:
    assert srun_export(small_plan(), "4242") == (
        '"--export=ALL,CA_WATCH_DIR=/var/lib/ca-watch,CA_WATCH_JOB=4242,TORCH_FR_BUFFER_SIZE=2000,'
        "TORCH_NCCL_TRACE_BUFFER_SIZE=2000,TORCH_NCCL_DUMP_ON_TIMEOUT=1,"
        "TORCH_FR_DUMP_TEMP_FILE=/var/lib/ca-watch/4242/fr_rank_,"
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/var/lib/ca-watch/4242/fr_rank_,"
        "PYTHONPATH=/opt/ca/shim${PYTHONPATH:+:${PYTHONPATH}},"
        "NCCL_PROFILER_PLUGIN=/opt/nccl/lib/libnccl-profiler-inspector.so,NCCL_INSPECTOR_ENABLE=1,"
        "NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS=5000000,"
        'NCCL_INSPECTOR_DUMP_DIR=/var/lib/ca-watch/4242/inspector,NCCL_RAS_ENABLE=1"'
    )


def test_pod_env_is_a_yaml_list_of_string_values() -> None:
    text = pod_env(small_plan(), "4242", pythonpath_tail="/app/src:/usr/lib/extra")
    assert text.splitlines()[:6] == [
        "- name: CA_WATCH_DIR",
        '  value: "/var/lib/ca-watch"',
        "- name: CA_WATCH_JOB",
        '  value: "4242"',
        "- name: TORCH_FR_BUFFER_SIZE",
        '  value: "2000"',
    ]
    loaded = yaml.safe_load(text)
    assert len(loaded) == 13
    assert all(set(item) == {"name", "value"} and isinstance(item["value"], str) for item in loaded)
    values = {item["name"]: item["value"] for item in loaded}
    assert values["PYTHONPATH"] == "/opt/ca/shim:/app/src:/usr/lib/extra"
    assert values["NCCL_INSPECTOR_DUMP_DIR"] == "/var/lib/ca-watch/4242/inspector"
    assert yaml.safe_load(pod_env(small_plan(), "4242"))[7] == {"name": "PYTHONPATH", "value": "/opt/ca/shim"}


# Inspector ---------------------------------------------------------------------------------------------------


def test_inspector_records_of_nccl_2_30_parse_to_exact_rows() -> None:
    text = (DATA / "inspector" / "gpu-node-07-pid41230.log").read_text()
    rows = parse_inspector_lines(text, job="4242", node="gpu-node-07")
    assert [row.seq for row in rows] == [1405, 1406, 1407]
    first = rows[0]
    assert first.record() == {
        "job": "4242",
        "node": "gpu-node-07",
        "rank": 0,
        "communicator": "0x7f8c496ae9f661:DP Group 0",
        "op": "all_reduce",
        "seq": 1405,
        "enqueue_ns": 1752867229000000000,
        "source": "inspector",
        "completed": True,
        "start_ns": 1752867229000040000,
        "complete_ns": 1752867229001492000,
        "exec_ms": 1.452,
        "size_bytes": 268435456,
        "busbw_gbps": 277.309355,
        "gpu": None,
        "comm_ranks": "",
        "backend": "nccl",
    }


def test_the_late_rank_arrives_later_and_p2p_and_a_half_written_line_are_left_out() -> None:
    late = parse_inspector_lines((DATA / "inspector" / "gpu-node-07-pid41231.log").read_text(), "4242", "n")
    early = parse_inspector_lines((DATA / "inspector" / "gpu-node-07-pid41230.log").read_text(), "4242", "n")
    assert [row.rank for row in late] == [1, 1, 1]
    assert [b.enqueue_ns - a.enqueue_ns for a, b in zip(early, late, strict=True)] == [180_000] * 3
    assert [row.exec_ms for row in late] == [1.27, 1.283, 1.268]
    assert [row.busbw_gbps for row in late] == [317.049751, 313.837244, 317.54983]


def test_inspector_records_of_nccl_2_28_have_no_name_and_no_times_when_not_verbose() -> None:
    rows = parse_inspector_lines((DATA / "inspector-2.28" / "gpu-node-07-pid52001.log").read_text(), "4242", "n")
    assert [(r.communicator, r.op, r.seq, r.enqueue_ns, r.start_ns, r.exec_ms, r.busbw_gbps) for r in rows] == [
        ("0x1c2d3e4f5a6b7c8d", "all_gather", 88, 0, None, 0.612, 27.413752),
        ("0x1c2d3e4f5a6b7c8d", "all_gather", 89, 0, None, 0.598, 28.055545),
    ]


def test_the_readers_global_rank_wins_and_nan_bandwidth_is_none() -> None:
    line = (DATA / "inspector-2.28" / "gpu-node-07-pid52001.log").read_text().splitlines()[0]
    record = json.loads(line)
    record["ca"] = {"file": "x", "rank": 13, "local_rank": 5}
    record["coll_perf"]["coll_busbw_gbs"] = "nan"
    (row,) = parse_inspector_lines(json.dumps(record) + '\n{"inspector": "read"}\n', "4242", "n")
    assert (row.rank, row.busbw_gbps) == (13, None)
    assert [op_name(o) for o in ("AllReduce", "ReduceScatter", "All2All", "AllGatherV")] == [
        "all_reduce",
        "reduce_scatter",
        "all_to_all",
        "all_gather_v",
    ]


def test_the_node_reader_keeps_records_dumped_after_since_at_most_limit_per_process(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert inspector_read.main([str(DATA / "inspector"), "--since-us", "1752867229500000"]) == 0
    out = capsys.readouterr().out.splitlines()
    summary = json.loads(out[-1])
    assert summary == {"inspector": "read", "dir": str(DATA / "inspector"), "files": 2, "records": 5, "skipped": 1}
    rows = parse_inspector_lines("\n".join(out), "4242", "n")
    assert [(r.rank, r.seq) for r in rows] == [(0, 1406), (0, 1407), (1, 1406), (1, 1407)]
    assert rows[0].start_ns == 1752867229100040000 and rows[0].complete_ns == 1752867229101492000
    folded = json.loads(out[0])["coll_perf"]["event_trace_ts"]["kernel_events"]
    assert folded == [{"kernel_start_ts": 1752867229100040, "kernel_stop_ts": 1752867229101492, "channels": 2}]
    lines, summary = inspector_read.read_dir(str(DATA / "inspector"), 0, 1, 1 << 20)
    assert summary["records"] == 2 and [json.loads(line)["metadata"]["pid"] for line in lines] == [41230, 41231]
    assert json.loads(lines[1])["p2p_perf"]["p2p_sn"] == 17


def test_reading_a_file_backwards_in_small_blocks_gives_every_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "h-pid1.log"
    lines = [f'{{"n":{i},"pad":"{"x" * (i % 7)}"}}' for i in range(40)]
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(inspector_read, "BLOCK_BYTES", 16)
    assert [b.decode() for b in inspector_read.lines_backwards(str(path), 1 << 20) if b] == lines[::-1]
    tail = [b.decode() for b in inspector_read.lines_backwards(str(path), 60) if b]
    assert tail == lines[::-1][: len(tail)] and 0 < len(tail) < 5


def test_the_node_reader_says_when_the_directory_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    assert inspector_read.main(["/nonexistent/inspector"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "inspector": "unavailable",
        "detail": "no directory /nonexistent/inspector",
    }


# RAS ---------------------------------------------------------------------------------------------------------

DEAD_AND_BEHIND = [
    ("0x27a079b828ff1a75", 3, "dead", "10.0.0.12", 41233, 1, "", None, None),
    ("0x27a079b828ff1a75", 1, "behind", "10.0.0.11", 41231, 1, "AllReduce", 1407, 1408),
]


def rows(status: object) -> list[tuple[object, ...]]:
    return [(r.communicator, r.rank, r.state, r.host, r.pid, r.gpu, r.op, r.count, r.peak) for r in status.ranks]  # type: ignore[attr-defined]


def test_ras_text_of_nccl_2_30_names_the_dead_process_and_the_rank_behind() -> None:
    status = parse_ras_text((DATA / "ras" / "status-2.30.7.txt").read_text())
    assert (status.available, status.form, status.nccl_version) == (True, "text", "2.30.7")
    assert (status.communicators, status.timeouts, status.collection_s) == (1, 2, 2.051)
    assert [(p.host, p.pid, p.gpus, p.state) for p in status.processes] == [("10.0.0.12", 41233, "1", "dead")]
    assert rows(status) == DEAD_AND_BEHIND
    assert [r.rank for r in status.of_state(RasRankState.BEHIND)] == [1]


@pytest.mark.parametrize("name", ["status-2.30.7.json", "status-2.28.7.json"])
def test_ras_json_gives_the_same_rows_as_the_text(name: str) -> None:
    status = parse_ras_json((DATA / "ras" / name).read_text())
    assert (status.available, status.form, status.communicators, status.timeouts) == (True, "json", 1, 2)
    assert status.nccl_version == name.removeprefix("status-").removesuffix(".json")
    assert rows(status) == DEAD_AND_BEHIND
    assert [(p.host, p.pid, p.gpus, p.state) for p in status.processes] == [("10.0.0.12", 41233, "1", "dead")]


def test_ras_json_of_2_28_7_is_not_json_as_written() -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads((DATA / "ras" / "status-2.28.7.json").read_text())


def test_ras_text_lists_the_ranks_ahead_when_they_are_fewer() -> None:
    text = (
        "NCCL version 2.26.2 compiled with CUDA 12.8\n\nWarnings\n========\n\n"
        "#0-0 (00a079b828ff1a75) MISMATCH\n"
        "  Communicator ranks have different AllReduce operation counts\n"
        "  6 ranks have launched up to operation 6649\n"
        "  2 ranks have launched up to operation 6650\n"
        "  Rank 0 -- GPU 0 managed by process 483072 on node 172.16.64.210\n"
        "  Rank 5 -- GPU 5 (NVML 3) managed by process 483077 on node 172.16.64.210\n"
        "  Communicator ranks have different status\n"
        "  7 ranks have status RUNNING\n"
        "  Rank 2 has status FINALIZE -- [process information not found]\n"
    )
    status = parse_ras_text(text)
    assert rows(status) == [
        ("0xa079b828ff1a75", 0, "ahead", "172.16.64.210", 483072, 0, "AllReduce", 6650, 6650),
        ("0xa079b828ff1a75", 5, "ahead", "172.16.64.210", 483077, 5, "AllReduce", 6650, 6650),
        ("0xa079b828ff1a75", 2, "status", "", None, None, "", None, None),
    ]
    assert status.ranks[2].detail == "FINALIZE"


def test_the_ras_answer_line_is_parsed_in_its_format_or_says_why_not() -> None:
    body = (DATA / "ras" / "status-2.30.7.json").read_text()
    answer = json.dumps({"ras": "ok", "format": "json", "protocol": 2, "body": body})
    assert rows(parse_ras_answer(answer)) == DEAD_AND_BEHIND
    gone = parse_ras_answer(json.dumps({"ras": "unavailable", "detail": "localhost:28028 timed out"}))
    assert (gone.available, gone.detail, gone.ranks) == (False, "localhost:28028 timed out", ())
    assert parse_ras_answer("Traceback (most recent call last):").available is False


def converse_with(answers: bytes, want_json: bool) -> tuple[dict[str, object], bytes]:
    """The reader's side of the protocol against answers written in advance (a socket pair: no server)."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(answers)
        theirs.shutdown(socket.SHUT_WR)
        result = ras_read.converse(ours, 7, want_json, verbose=False)
        ours.shutdown(socket.SHUT_WR)
        sent = theirs.makefile("rb").read()
    return result, sent


def test_the_ras_reader_speaks_ncclras_protocol_and_asks_for_json() -> None:
    body = (DATA / "ras" / "status-2.30.7.json").read_text()
    result, sent = converse_with(b"SERVER PROTOCOL 2\nOK\nOK\n" + body.encode(), want_json=True)
    assert sent == b"CLIENT PROTOCOL 2\nTIMEOUT 7\nSET FORMAT json\nSTATUS\n"
    assert result == {"ras": "ok", "format": "json", "protocol": 2, "body": body}


def test_the_ras_reader_falls_back_to_text_where_nccl_has_no_json() -> None:
    body = (DATA / "ras" / "status-2.30.7.txt").read_text()
    answers = b"SERVER PROTOCOL 2\nOK\nERROR: Unknown command set format json\n" + body.encode()
    result, sent = converse_with(answers, want_json=True)
    assert sent == b"CLIENT PROTOCOL 2\nTIMEOUT 7\nSET FORMAT json\nSTATUS\n"
    assert (result["format"], result["body"]) == ("text", body)


def test_the_ras_reader_refuses_a_peer_that_is_not_ras() -> None:
    with pytest.raises(ras_read.RasProtocolError, match="unexpected greeting"):
        converse_with(b"HTTP/1.1 400 Bad Request\n", want_json=True)


def test_nothing_listening_is_one_unavailable_line_with_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # bound, never listened: connecting is refused
    assert ras_read.main(["--host", "127.0.0.1", "--port", str(port)]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["ras"] == "unavailable" and answer["detail"].startswith(f"nothing listens on 127.0.0.1:{port}")
