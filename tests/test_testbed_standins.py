"""The node-side stand-ins and the fault transformations, without any network: real captures in, exact out.

Each test builds a node data dir in tmp_path with the same code ``up`` uses, installs the wrappers and
runs them as subprocesses, comparing against the captured outputs byte for byte where the stand-in
should reproduce them and against the exact edited text where a fault should change them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from cluster_accept.testbed.captures import build_table, load_base, raw_capture, strip_capture
from cluster_accept.testbed.faults import (
    FaultPlan,
    FaultPlanError,
    Replace,
    Slower,
    Xid,
    fault_plan_from_data,
    load_fault_plan,
    parse_fault,
)
from cluster_accept.testbed.nodedata import FaultApplyError, build_node, write_node_data
from cluster_accept.testbed.sdcflip import write_every_slower
from cluster_accept.testbed.standins import write_standins

Run = Callable[..., subprocess.CompletedProcess[str]]
QUERY_31 = (
    "index,name,uuid,serial,pci.bus_id,driver_version,vbios_version,persistence_mode,compute_mode,"
    "mig.mode.current,ecc.mode.current,memory.total,memory.used,power.limit,power.max_limit,clocks.max.sm,"
    "clocks.max.mem,clocks.sm,clocks.mem,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,"
    "pcie.link.width.max,temperature.gpu,utilization.gpu,clocks_event_reasons.active,retired_pages.pending,"
    "remapped_rows.pending,remapped_rows.failure,ecc.errors.uncorrected.volatile.total,"
    "ecc.errors.corrected.volatile.total"
)
FAILED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


@pytest.fixture
def node(tmp_path: Path) -> Callable[..., Run]:
    """``node(faults, base)`` -> ``run(tool_args..., tool="nvidia-smi")`` for a fresh node data dir."""
    count = [0]

    def make(faults: Sequence[object] = (), base: str = "h200x4") -> Run:
        count[0] += 1
        folder = tmp_path / f"node{count[0]}"
        parsed = [parse_fault(f, "test") for f in faults]
        write_node_data(build_node(base, parsed, {"NCCL_SOCKET_IFNAME": "eth0"}), folder / "data", seed="n")
        tools = write_standins(folder / "bin", folder / "data")

        def run(*args: str, tool: str = "nvidia-smi", timeout: float = 20) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [str(tools[tool]), *args], capture_output=True, text=True, timeout=timeout, check=False
            )

        run.data = folder / "data"  # type: ignore[attr-defined]
        return run

    return make


def out(name: str, base: str = "h200x4") -> str:
    return raw_capture(base, name)[0]


def test_strip_capture_framing() -> None:
    assert strip_capture("$ nvidia-smi -L\nGPU 0: X\n[exit 0]\n") == ("GPU 0: X\n", 0)
    assert strip_capture("No devices were found\nrc=6\n") == ("No devices were found\n", 6)
    assert strip_capture("a, b\n1, 2\n") == ("a, b\n1, 2\n", None)


@pytest.mark.integration
def test_file_backed_commands_reproduce_the_captures(node: Callable[..., Run]) -> None:
    run = node()
    for args, name in [
        ((), "nvidia-smi.txt"), (("-L",), "nvidia-smi-L.txt"), (("-q",), "nvidia-smi-q.txt"),
        (("-q", "-x"), "nvidia-smi-q-x.txt"), (("-q", "-d", "ECC"), "q-ecc.txt"),
        (("-q", "-d", "ROW_REMAPPER"), "q-row-remapper.txt"), (("nvlink", "-s"), "nvlink-s.txt"),
        (("nvlink", "--status"), "nvlink-status.txt"), (("nvlink", "-c"), "nvlink-c.txt"),
        (("nvlink", "-e"), "nvlink-e.txt"), (("nvlink", "-gt", "d"), "nvlink-gt.txt"),
        (("topo", "-m"), "topo-m.txt"), (("--help-query-gpu",), "help-query-gpu.txt"),
    ]:  # fmt: skip
        proc = run(*args)
        assert (proc.returncode, proc.stdout) == (0, out(name)), args


@pytest.mark.integration
def test_query_gpu_matches_captured_field_lists(node: Callable[..., Run]) -> None:
    run = node()
    proc = run(f"--query-gpu={QUERY_31}", "--format=csv")
    assert (proc.returncode, proc.stdout) == (0, out("query-gpu.txt"))
    fields = "index,name,driver_version,persistence_mode,pcie.link.width.current,pcie.link.width.max"
    assert run(f"--query-gpu={fields}", "--format=csv,noheader,nounits").stdout == out("query-gpu-noheader.txt")
    one = run("--query-gpu=index,persistence_mode,pcie.link.width.current", "--format=csv,noheader,nounits", "-i", "1")
    assert one.stdout == out("query-gpu-one-index-noheader-nounits.txt")


@pytest.mark.integration
def test_query_gpu_any_field_from_the_every_field_capture(node: Callable[..., Run]) -> None:
    run = node()
    proc = run("--query-gpu=power.draw,memory.total,clocks.sm,pci.device_id,gpu_name", "--format=csv")
    assert proc.stdout == (
        "power.draw [W], memory.total [MiB], clocks.current.sm [MHz], pci.device_id, name\n"
        "77.45 W, 143771 MiB, 345 MHz, 0x233510DE, NVIDIA H200\n"
        "80.62 W, 143771 MiB, 345 MHz, 0x233510DE, NVIDIA H200\n"
        "79.08 W, 143771 MiB, 345 MHz, 0x233510DE, NVIDIA H200\n"
        "78.07 W, 143771 MiB, 345 MHz, 0x233510DE, NVIDIA H200\n"
    )
    nounits = run("--query-gpu=power.draw,utilization.gpu,count", "--format=csv,nounits", "--id=3")
    assert nounits.stdout == "power.draw, utilization.gpu, count\n78.07, 0, 4\n"
    table = build_table(load_base("h200x4").files)
    assert len(table.order) == 214
    assert table.canonical("clocks_throttle_reasons.active") == "clocks_event_reasons.active"


@pytest.mark.integration
def test_invalid_field_index_and_usage(node: Callable[..., Run]) -> None:
    run = node()
    bad = run("--query-gpu=index,foo.bar", "--format=csv")
    assert (bad.returncode, bad.stdout) == (2, raw_capture("h200x4", "query-gpu-invalid-field.txt")[0])
    assert raw_capture("h200x4", "query-gpu-invalid-field.txt")[1] == 2
    missing = run("-L", "-i", "4")
    assert (missing.returncode, missing.stdout) == (6, "No devices were found\n")
    by_uuid = run("--query-gpu=index", "-i", "GPU-af99445d-f281-a0fa-cf5e-7dd94389b31a", "--format=csv,noheader")
    assert by_uuid.stdout == "1\n"
    for args in [("--bogus",), ("nvlink",), ("topo",), ("-q", "-d", "NOPE"), ("--query-gpu=index",), ("-L", "extra")]:
        assert run(*args).returncode == 2, args


@pytest.mark.integration
def test_other_query_forms(node: Callable[..., Run]) -> None:
    run = node()
    rows = run("--query-remapped-rows=gpu_bus_id,remapped_rows.correctable,remapped_rows.uncorrectable,"
               "remapped_rows.pending,remapped_rows.failure", "--format=csv")  # fmt: skip
    assert rows.stdout == out("query-remapped-rows.txt")
    pages = run("--query-retired-pages=gpu_uuid,retired_pages.cause", "--format=csv,noheader", "-i", "3")
    assert pages.stdout == (
        "GPU-1de6bf3a-4fa7-1d8b-d529-b341e374e91b, Single Bit ECC\n"
        "GPU-1de6bf3a-4fa7-1d8b-d529-b341e374e91b, Double Bit ECC\n"
    )
    apps = run("--query-compute-apps=pid,process_name,used_gpu_memory", "--format=csv")
    assert apps.stdout == "pid, process_name, used_gpu_memory [MiB]\n"


@pytest.mark.integration
def test_h100_base_knows_only_its_31_fields(node: Callable[..., Run]) -> None:
    run = node(base="h100x1")
    assert run(f"--query-gpu={QUERY_31}", "--format=csv").stdout == out("query-gpu.txt", "h100x1")
    assert run("-L").stdout == out("nvidia-smi-L.txt", "h100x1")
    assert run("--query-gpu=power.draw", "--format=csv").returncode == 2
    assert run("nvlink", "-s").stdout == ""


@pytest.mark.integration
def test_driver_version_everywhere_and_table_width_kept(node: Callable[..., Run]) -> None:
    run = node([{"driver_version": {"version": "570.86.15"}}])
    plain, real = run().stdout.splitlines(), out("nvidia-smi.txt").splitlines()
    assert plain[2] == "| NVIDIA-SMI 570.86.15              Driver Version: 570.86.15      CUDA Version: 13.0     |"
    assert [len(x) for x in plain] == [len(x) for x in real]
    assert run("--query-gpu=driver_version", "--format=csv,noheader").stdout == "570.86.15\n" * 4
    assert "Driver Version                                         : 570.86.15\n" in run("-q").stdout
    assert "<driver_version>570.86.15</driver_version>" in run("-q", "-x").stdout
    proc = (run.data / "proc-driver-version.txt").read_text()  # type: ignore[attr-defined]
    assert proc.startswith("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build")
    assert "580.159.04" not in run("-q").stdout


@pytest.mark.integration
def test_gpu_missing_removes_the_last_gpu_everywhere(node: Callable[..., Run]) -> None:
    run = node(["gpu_missing"])
    assert run("-L").stdout == "".join(out("nvidia-smi-L.txt").splitlines(True)[:3])
    assert run("--query-gpu=index,count", "--format=csv,noheader").stdout == "0, 3\n1, 3\n2, 3\n"
    plain = run().stdout
    assert "00000000:00:09.0" not in plain and len(plain.splitlines()) == len(out("nvidia-smi.txt").splitlines()) - 4
    for args in [("-q",), ("-q", "-d", "POWER"), ("-q", "-x"), ("nvlink", "-s"), ("nvlink", "-e"), ("topo", "-m")]:
        text = run(*args).stdout
        assert "00000000:00:09.0" not in text and "GPU 3:" not in text and "GPU3" not in text, args
    assert "Attached GPUs                                          : 3\n" in run("-q").stdout
    assert "<attached_gpus>3</attached_gpus>" in run("-q", "-x").stdout
    assert run("topo", "-m").stdout.splitlines()[1] == "GPU0\t X \tNV18\tNV18\t0-63\t0\t\tN/A"
    assert run("-i", "3", "-L").returncode == 6


@pytest.mark.integration
def test_persistence_and_pcie_width_on_one_gpu(node: Callable[..., Run]) -> None:
    run = node([{"persistence_disabled": {"gpu": 1}}, {"pcie_width": {"gpu": 2, "width": 8}}])
    query = run("--query-gpu=index,persistence_mode,pcie.link.width.current", "--format=csv,noheader")
    assert query.stdout == "0, Enabled, 16\n1, Disabled, 16\n2, Enabled, 8\n3, Enabled, 16\n"
    q = run("-q").stdout
    assert q.count("Persistence Mode                                   : Disabled") == 1
    assert "Persistence Mode                                   : Disabled" in run("-q", "-i", "1").stdout
    assert "                Current                                : 8x" in run("-q", "-i", "2").stdout
    assert "<current_link_width>8x</current_link_width>" in run("-q", "-x", "-i", "2").stdout
    assert "|   1  NVIDIA H200                    Off |   00000000:00:07.0 Off |" in run().stdout
    assert run().stdout.count(" On  |") == 3
    everything_off = node(["persistence_disabled"])
    assert everything_off("--query-gpu=persistence_mode", "--format=csv,noheader").stdout == "Disabled\n" * 4


@pytest.mark.integration
def test_nvlink_inactive_and_errors(node: Callable[..., Run]) -> None:
    run = node([{"nvlink_inactive": {"gpu": 1, "link": 7}}, {"nvlink_errors": {"gpu": 0, "link": 3, "crc": 12}}])
    status = run("nvlink", "-s").stdout
    assert status.count("<inactive>") == 1
    assert run("nvlink", "-s", "-i", "1", "-l", "7").stdout == (
        "GPU 1: NVIDIA H200 (UUID: GPU-af99445d-f281-a0fa-cf5e-7dd94389b31a)\n\t Link 7: <inactive>\n"
    )
    assert run("nvlink", "--status", "-i", "1").stdout.count("<inactive>") == 1
    assert run("nvlink", "-e", "-i", "0", "-l", "3").stdout == (
        "GPU 0: NVIDIA H200 (UUID: GPU-33f7137f-2577-6408-7f45-fd57dff161bc)\n"
        "\t Link 3: Replay Errors: 0\n\t Link 3: Recovery Errors: 0\n\t Link 3: CRC Errors: 12\n\n"
    )
    assert run("nvlink", "-e").stdout.count("CRC Errors: 0") == 4 * 18 - 1
    topo = run("topo", "-m").stdout.splitlines()
    assert topo[1:5] == [
        "GPU0\t X \tNV17\tNV18\tNV18\t0-63\t0\t\tN/A",
        "GPU1\tNV17\t X \tNV17\tNV17\t0-63\t0\t\tN/A",
        "GPU2\tNV18\tNV17\t X \tNV18\t0-63\t0\t\tN/A",
        "GPU3\tNV18\tNV17\tNV18\t X \t0-63\t0\t\tN/A",
    ]
    with pytest.raises(FaultApplyError, match="GPU 0 has no NVLinks in nvlink-s.txt"):
        node([{"nvlink_inactive": {"gpu": 0, "link": 3}}], base="h100x1")
    with pytest.raises(FaultApplyError, match="nvlink_errors: GPU 2 link 18: not found"):
        node([{"nvlink_errors": {"gpu": 2, "link": 18}}])


@pytest.mark.integration
def test_xid_nccl_env_and_replace(node: Callable[..., Run]) -> None:
    run = node(
        [Xid(code=79, gpu=1, at_s=1234.56789), {"nccl_env": {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": None}},
         Replace(file="nvidia-smi-q.txt", old="Pass-Through", new="None")]
    )  # fmt: skip
    log = run(tool="dmesg").stdout
    assert log.endswith(
        "[ 1234.567890] NVRM: Xid (PCI:0000:00:07): 79, pid=0, name=swapper/0, GPU has fallen off the bus.\n"
    )
    assert "Xid" not in node()(tool="dmesg").stdout
    data: Path = run.data  # type: ignore[attr-defined]
    assert (data / "nccl.conf").read_text() == "NCCL_DEBUG=INFO\n"
    assert "Pass-Through" not in run("-q").stdout and "Pass-Through" in run("-q", "-x").stdout
    with pytest.raises(FaultApplyError, match="not found in nvidia-smi-q.txt"):
        node([Replace(file="nvidia-smi-q.txt", old="no such text", new="x")])
    with pytest.raises(FaultApplyError, match="GPU 4 does not exist"):
        node([{"pcie_width": {"gpu": 4, "width": 8}}])


@pytest.mark.integration
def test_behaviour_faults(node: Callable[..., Run]) -> None:
    fail = node(["nvidia_smi_fail"])("-L")
    assert (fail.returncode, fail.stdout) == (9, FAILED)
    cut = node(["truncated"])("-L").stdout
    full = out("nvidia-smi-L.txt")
    assert cut == full[: len(full) // 2 - 1] and not cut.endswith("\n") and len(cut.splitlines()) == 2
    junk = node(["garbage"])
    first, again = junk("-L"), junk("-L")
    assert first.returncode == 0 and first.stdout == again.stdout and "NVIDIA H200" not in first.stdout
    assert len(first.stdout.splitlines()) == 24
    with pytest.raises(subprocess.TimeoutExpired):
        node(["nvidia_smi_hang"])("-L", timeout=1.5)


def test_fault_plan_yaml_and_errors(tmp_path: Path) -> None:
    good = tmp_path / "plan.yaml"
    good.write_text(
        'nodes:\n  node03: [down]\n  node05: [{driver_version: {version: "570.86.15"}}]\n'
        "  node06: [{nvlink_inactive: {gpu: 1, link: 7}}, persistence_disabled]\n"
        "  node07: [off, {nccl_env: {NCCL_IB_DISABLE: no}}]\n"
    )
    plan = load_fault_plan(good)
    assert plan.as_yaml() == {
        "nodes": {
            "node03": ["down"],
            "node05": [{"driver_version": {"version": "570.86.15"}}],
            "node06": [{"nvlink_inactive": {"gpu": 1, "link": 7}}, "persistence_disabled"],
            "node07": ["off", {"nccl_env": {"NCCL_IB_DISABLE": "no"}}],  # YAML 1.1 would read off/no as false
        }
    }
    assert FaultPlan(nodes={"node03": ["down"]}) == fault_plan_from_data({"nodes": {"node03": ["down"]}})
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes:\n  node02: [dwon]\n  node04: [{slow: {rate: 5}}, {driver_version: {version: 570.86}}]\n")
    with pytest.raises(FaultPlanError) as err:
        load_fault_plan(bad)
    assert err.value.problems[0].startswith(f"{bad}: nodes.node02[0]: unknown fault kind 'dwon' (known: ")
    assert err.value.problems[1:] == [
        f"{bad}: nodes.node04[0].slow.rate_mbit: required parameter is missing",
        f"{bad}: nodes.node04[0].slow.rate: unknown parameter (known: rate_mbit)",
        f"{bad}: nodes.node04[1].driver_version.version: Input should be a valid string (quote it) (got 570.86)",
    ]
    with pytest.raises(ValueError, match="nodes.node01\\[0\\]: unknown fault kind 'nope'"):
        FaultPlan(nodes={"node01": ["nope"]})
    with pytest.raises(FaultPlanError, match="extra: unknown key"):
        fault_plan_from_data({"nodes": {}, "extra": 1})


def test_slower_fault_takes_a_factor_above_one_and_at_most_100() -> None:
    assert parse_fault("slower", "n").as_yaml() == "slower"  # the default, 1.15, written back as a bare kind
    assert parse_fault("slower", "n") == Slower(factor=1.15)
    assert parse_fault({"slower": {"factor": 2}}, "n").as_yaml() == {"slower": {"factor": 2.0}}
    assert parse_fault({"slower": {"factor": 100}}, "n") == Slower(factor=100)
    for factor, said in (
        (1, "Input should be greater than 1"),
        (0.9, "Input should be greater than 1"),
        (100.5, "Input should be less than or equal to 100"),
        ("1.2", "Input should be a valid number"),  # a number, not text that reads as one
        (True, "Input should be a valid number"),
    ):
        with pytest.raises(FaultPlanError) as err:
            parse_fault({"slower": {"factor": factor}}, "nodes.node02[0]")
        assert err.value.problems == [f"nodes.node02[0].slower.factor: {said} (got {factor!r})"], factor
    with pytest.raises(FaultPlanError, match=r"slower.gpu: unknown parameter \(known: factor\)"):
        parse_fault({"slower": {"gpu": 1}}, "n")


SLOWER_PROBE = """
import json, multiprocessing as mp, statistics, time
import torch


def timed(op, a, b, c):
    started = time.perf_counter()
    op(a, b, out=c)
    op(a, b)
    return time.perf_counter() - started


def ratio(queue):
    # Each round times the wrapped and the plain product in turn, which first alternating so that neither order's
    # bias stands, and the median of many rounds stands for the process: a 2-core machine running other tests
    # beside this one slows single calls.
    torch.set_num_threads(1)
    a, b, c = torch.randn(384, 384), torch.randn(384, 384), torch.empty(384, 384)
    ratios = []
    for n in range(31):
        if n % 2:
            plain, wrapped = timed(torch.mm, a, b, c), timed(torch.matmul, a, b, c)
        else:
            wrapped, plain = timed(torch.matmul, a, b, c), timed(torch.mm, a, b, c)
        ratios.append(wrapped / plain)
    queue.put((getattr(torch, "_testbed_fault", False), statistics.median(ratios)))


if __name__ == "__main__":
    queue = mp.get_context("spawn").SimpleQueue()
    ratio(queue)
    child = mp.get_context("spawn").Process(target=ratio, args=(queue,))
    child.start()
    child.join()
    assert child.exitcode == 0, child.exitcode
    print(json.dumps([queue.get(), queue.get()]))
"""


@pytest.mark.integration
def test_slower_fault_slows_every_matmul_of_every_process(tmp_path: Path) -> None:
    """The ``slower`` sitecustomize: ``torch.matmul`` (into ``out=`` or not) takes the factor times as long in the
    process and in the one it spawns, as the GPU bench's worker is; ``torch.mm`` is left alone."""
    site = write_every_slower(tmp_path / "slower", 3.0)
    script = tmp_path / "probe.py"  # a file: a spawned child imports its parent's main module
    script.write_text(SLOWER_PROBE)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(site.parent), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (parent_wrapped, parent), (child_wrapped, child) = json.loads(proc.stdout)
    assert parent_wrapped and child_wrapped, proc.stdout
    assert 2.6 < parent < 4.5 and 2.6 < child < 4.5, proc.stdout  # 3x, within a shared machine's noise
