"""A co-tenant on a GPU is seen whatever its program's path: nvidia-smi's ``--query-compute-apps`` CSV is not
quoted, so a path holding a comma (``/home/m/a,b/python3``) splits into more cells; preflight's gpu check and the
GPU bench's sampler (run by the burn too) still name the process, and a line of a GPU that cannot be read at all
is a process all the same, never dropped."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from cluster_accept.checks import gpu_processes
from cluster_accept.checks.base import Status
from cluster_accept.inventory.model import Profile
from tests.capture import NO_CLUSTER, every_field_block

REPO = Path(__file__).resolve().parents[1]
COMMA_PATH = "/home/m/a,b/python3"


def _preflight(apps: list[str]) -> list[tuple[Status, str, str | None, int | None]]:
    uuids = every_field_block("uuid")[1:]  # the captured 4 x H200's GPUs, header dropped
    gpus = "".join(f"{i}, {u}\n" for i, u in enumerate(uuids))
    text = f"### gpus\n{gpus}### apps\n" + "".join(a + "\n" for a in apps) + "### end\n"
    rows = gpu_processes.evaluate(gpu_processes.parse(text, 0), Profile(), NO_CLUSTER)
    return [(r.status, r.reason, r.observed, r.gpu) for r in rows]


def test_a_process_whose_path_holds_commas_is_a_compute_process() -> None:
    uuid = every_field_block("uuid")[2]  # GPU 1
    assert _preflight([f"{uuid}, 48211, {COMMA_PATH}, 70000"]) == [
        (Status.FAIL, "busy", f"pid 48211 {COMMA_PATH} (70000 MiB)", 1)
    ]
    assert _preflight([f"{uuid}, 48212, /x/a, b, c/python3, [N/A]"])[0][2] == "pid 48212 /x/a, b, c/python3 ([N/A] MiB)"


def test_a_gpus_line_that_cannot_be_read_is_a_process_never_dropped() -> None:
    uuid = every_field_block("uuid")[3]  # GPU 2
    ((status, reason, observed, gpu),) = _preflight([f"{uuid}, 48213"])
    assert (status, reason, gpu) == (Status.FAIL, "busy", 2)
    assert observed == f"pid 48213 unreadable line '{uuid}, 48213' (? MiB)"
    assert _preflight(["No running processes found"]) == [(Status.PASS, "ok", "no compute process on the 4 GPUs", None)]


def _gpu_bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The GPU bench's node-side script as the node imports it."""
    spec = importlib.util.spec_from_file_location("node_gpu_bench", REPO / "cluster_accept/probes/node/gpu_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "node_gpu_bench", module)
    spec.loader.exec_module(module)
    return module


def test_the_bench_sampler_names_a_co_tenant_whose_path_holds_commas(monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _gpu_bench(monkeypatch)
    sampler = bench.ConditionSampler()
    own = sampler.own_pids.copy().pop()
    answers = {
        "--query-gpu=index,uuid": "0, GPU-aaaa\n1, GPU-bbbb\n",
        f"--query-compute-apps={bench.APP_FIELDS}": (
            f"GPU-aaaa, {own}, python3, 1024\nGPU-bbbb, 4242, {COMMA_PATH}, 70000\n"
        ),
    }
    monkeypatch.setattr(sampler, "_query", lambda *args: answers[args[0]])
    sampler._sample_apps()
    assert sampler.foreign() == [
        {"info": "foreign_process", "gpu": 1, "pid": 4242, "name": COMMA_PATH, "used_memory_mib": 70000.0,
         "seen_samples": 1, "samples": 1}
    ]  # fmt: skip
