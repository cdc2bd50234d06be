"""Other processes on the GPUs: before the probes (preflight, from --query-compute-apps mapped through the
captured UUIDs) and while the GPU bench runs (its foreign_process lines), plus GPUs clocked well below their
neighbours under the same load."""

from __future__ import annotations

import json

from cluster_accept.checks import gpu_processes
from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.inventory.model import Profile
from cluster_accept.probes import gemm
from cluster_accept.tasks.preflight.evaluate import own_gpus
from tests.capture import CAPTURES, DRIVER_FAILURE, NO_CLUSTER, every_field_block
from tests.injection_sandbox import node


def preflight_output(apps: list[str]) -> str:
    uuids = every_field_block("uuid")[1:]  # the captured 4 x H200's GPUs, header dropped
    gpus = "".join(f"{i}, {u}\n" for i, u in enumerate(uuids))
    return f"### gpus\n{gpus}### apps\n" + "".join(a + "\n" for a in apps) + "### end\n"


def judged(text: str, code: int = 0) -> list[tuple[Status, str, str | None, int | None]]:
    rows = gpu_processes.evaluate(gpu_processes.parse(text, code), Profile(), NO_CLUSTER)
    return [(r.status, r.reason, r.observed, r.gpu) for r in rows]


def test_an_idle_node_passes_and_says_so() -> None:
    header = (CAPTURES / "h200x4" / "query-compute-apps.txt").read_text()  # the machine's answer: no process
    assert judged(preflight_output(header.splitlines())) == [
        (Status.PASS, "ok", "no compute process on the 4 GPUs", None)
    ]


def test_a_process_is_named_on_its_gpu() -> None:
    uuid = every_field_block("uuid")[2]
    text = preflight_output([f"{uuid}, 48211, python3, 20480"])
    assert judged(text) == [(Status.FAIL, "busy", "pid 48211 python3 (20480 MiB)", 1)]


def test_without_nvidia_smi_the_check_skips_with_why() -> None:
    assert judged(DRIVER_FAILURE, 9)[0][:2] == (Status.SKIP, "nvidia_smi_failed")
    missing = "### gpus\nsh: 1: nvidia-smi: not found\n### apps\nsh: 1: nvidia-smi: not found\n### end\n"
    assert judged(missing)[0][:3] == (Status.SKIP, "nvidia_smi_failed", None)
    assert judged(preflight_output([]).replace("### end\n", ""))[0][:2] == (Status.ERROR, "unparsable_output")


def bench_output(clocks: list[float], foreign: list[dict[str, object]]) -> str:
    lines = [
        json.dumps(
            {"metric": "gemm_bf16_tflops", "value": 680.0, "gpu": gpu, "unit": "TFLOP/s",
             "conditions": {"sm_clock_mhz": mhz, "power_w": 690.0, "clock_event_reasons": "0x0000000000000000"}}
        )
        for gpu, mhz in enumerate(clocks)
    ]  # fmt: skip
    lines += [json.dumps({"info": "foreign_process", **f}) for f in foreign]
    return "\n".join(lines) + "\n"


def test_the_bench_names_a_co_tenant_and_a_gpu_clocked_below_its_neighbours() -> None:
    co_tenant = {"gpu": 1, "pid": 4242, "name": "python3", "used_memory_mib": 2048.0, "seen_samples": 9, "samples": 40}
    output = gemm.parse(bench_output([1980, 1410, 1980, 1965], [co_tenant]))
    rows = gemm.inspect(output, Profile())
    assert [(r.check, r.status, r.reason, r.gpu) for r in rows] == [
        ("gpu", Status.FAIL, "busy", 1),
        ("gpu", Status.WARN, "clocks_low", 1),
    ]
    assert rows[0].observed == "pid 4242 python3 (2048.0 MiB)"
    assert rows[0].detail == "seen in 9 of 40 samples while the GPU bench ran"
    assert rows[1].observed == "1410 MHz" and rows[1].expected.startswith(">= 1775 MHz")
    assert gemm.inspect(gemm.parse(bench_output([1980, 1950, 1980, 1965], [])), Profile()) == []


def test_a_node_partitioned_by_its_profile_answers_for_its_own_gpus_only() -> None:
    """A host split into two "nodes" (cuda_visible_devices per part): a process on GPU 3 fails the part that
    tests GPUs 2,3 and not the part that tests 0,1, which says where it saw it. GPUs named by UUID: all count."""
    uuid = every_field_block("uuid")[4]  # GPU 3
    text = preflight_output([f"{uuid}, 1622, python3, 1004"])

    def for_part(visible: str) -> list[tuple[Status, str, str | None, int | None]]:
        profile = Profile.model_validate({"probes": {"cuda_visible_devices": visible}})
        rows = gpu_processes.evaluate(gpu_processes.parse(text), profile, NO_CLUSTER)
        return [(r.status, r.reason, r.observed, r.gpu) for r in rows]

    assert for_part("0,1") == [
        (Status.PASS, "ok", "no compute process on GPUs 0,1 (the profile tests those; a process on GPU 3)", None)
    ]
    assert for_part("2,3") == [(Status.FAIL, "busy", "pid 1622 python3 (1004 MiB)", 3)]
    assert for_part("GPU-0a37d5a8")[0][:2] == (Status.FAIL, "busy")
    co_tenant = {"gpu": 3, "pid": 1622, "name": "python3", "used_memory_mib": 1004.0, "seen_samples": 9, "samples": 9}
    bench = gemm.parse(bench_output([1980, 1980], [co_tenant]))  # the sampler lists the host's every GPU
    part = {"probes": {"cuda_visible_devices": "0,1"}}
    assert gemm.inspect(bench, Profile.model_validate(part)) == []
    assert [r.reason for r in gemm.inspect(bench, Profile())] == ["busy"]


def test_preflight_keeps_the_rows_of_the_gpus_a_partitioned_node_tests() -> None:
    """Every per-GPU check reads the host's every GPU: a part testing GPUs 0,1 keeps its own GPUs' rows and the
    node-wide ones (no GPU), not GPU 3's; GPUs named by UUID or unset keep every row."""
    rows = [
        CheckRow("clock_events", "event_reasons", Status.WARN, "throttle_sw_power_cap", gpu=3),
        CheckRow("clock_events", "event_reasons", Status.PASS, "ok", gpu=1),
        CheckRow("driver", "version", Status.PASS, "ok"),
    ]
    assert [r.gpu for r in own_gpus(rows, node(cuda_visible_devices="0,1"))] == [1, None]
    assert own_gpus(rows, node(cuda_visible_devices="GPU-0a37d5a8")) == rows
    assert own_gpus(rows, node()) == rows
