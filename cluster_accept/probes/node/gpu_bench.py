"""Node-side probe: GEMM throughput per GPU, HBM copy bandwidth and pinned host<->device bandwidth.

Runs on the node with only torch and the standard library. Every GPU of the node is loaded at once, one
process per GPU started together behind a barrier, because that is how a training job loads the node (power
and thermal limits show only then). Timing uses CUDA events after warm-up, on random data (zeros make
tensor cores look faster than they are), and reports the median of repeats. Clocks, power, temperature and
active clock event reasons are sampled with nvidia-smi while the probe runs and printed with every figure; so
are other processes on the GPUs (``{"info": "foreign_process", …}``): a co-tenant, not the GPU, may be slow.

Prints one JSON object per measurement on stdout. ``--device cpu`` runs the same measurements on the CPU
(GFLOP/s, host memory copy) so a test-bed without GPUs exercises the whole stage.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import torch

# clocks_throttle_reasons.active: the older name of clocks_event_reasons.active (the same NVML bitmask), which
# drivers from before the rename know and 580 still answers; the new name fails every sample on an old driver.
SAMPLE_FIELDS = "index,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"
APP_FIELDS = "gpu_uuid,pid,process_name,used_memory"
IDLE_MIB = 256.0  # GPU memory an idle GPU may show in use (driver reservations) before anything runs on it


_EMIT = threading.Lock()


def app_cells(line: str) -> tuple[str, str, str, str] | None:
    """A line of ``--query-compute-apps`` (:data:`APP_FIELDS`) as its four cells, or None with fewer. nvidia-smi
    does not quote its CSV and a process's name is its path, which may hold commas (``/home/m/a,b/python3``): the
    name is all between the pid and the last cell, the memory (a number or ``[N/A]``, never a comma)."""
    uuid, _, rest = line.partition(",")
    pid, _, rest = rest.partition(",")
    name, comma, memory = rest.rpartition(",")
    if not comma:
        return None
    return uuid.strip(), pid.strip(), name.strip(), memory.strip()


def emit(record: dict[str, Any]) -> None:
    """One JSON line, written whole: the sampler thread and the main thread print at once."""
    line = json.dumps(record, sort_keys=True) + "\n"
    with _EMIT:
        sys.stdout.write(line)
        sys.stdout.flush()


class ConditionSampler(threading.Thread):
    """Samples nvidia-smi every ``interval_s`` while the probe runs; summarises per GPU."""

    def __init__(self, interval_s: float = 0.5):
        super().__init__(daemon=True)
        self.interval_s = interval_s
        self.samples: dict[int, list[list[str]]] = {}
        self.stop_event = threading.Event()
        self.own_pids: set[int] = {os.getpid()}  # this probe's processes (workers added as they start)
        self.uuids: dict[str, int] = {}
        self.apps: dict[tuple[int, int], dict[str, Any]] = {}  # (gpu, pid) -> name, memory, samples seen
        self.app_samples = 0
        self.own_seen = False  # our workers showed in the list: its PIDs are this namespace's
        self.baseline_mib: dict[int, float] = {}

    def _query(self, *args: str) -> str:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=10).stdout

    def _sample_apps(self) -> None:
        """Compute processes per GPU: who else runs on the GPUs while the bench measures them."""
        if not self.uuids:
            for line in self._query("--query-gpu=index,uuid", "--format=csv,noheader").splitlines():
                index, _, uuid = (c.strip() for c in line.partition(","))
                if index.isdigit():
                    self.uuids[uuid] = int(index)
        self.app_samples += 1
        for line in self._query(f"--query-compute-apps={APP_FIELDS}", "--format=csv,noheader,nounits").splitlines():
            cells = app_cells(line)
            if cells is None or not cells[1].isdigit() or cells[0] not in self.uuids:
                continue
            pid = int(cells[1])
            if pid in self.own_pids:
                self.own_seen = True
                continue
            app = self.apps.setdefault((self.uuids[cells[0]], pid), {"name": cells[2], "mib": 0.0, "seen": 0})
            app["seen"] += 1
            app["mib"] = max(app["mib"], float(cells[3]) if cells[3].replace(".", "", 1).isdigit() else 0.0)

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                out = self._query(f"--query-gpu={SAMPLE_FIELDS}", "--format=csv,noheader,nounits")
                self._sample_apps()
            except (OSError, subprocess.TimeoutExpired):
                return
            for line in out.splitlines():
                cells = [c.strip() for c in line.split(",")]
                if len(cells) == 6 and cells[0].isdigit():
                    self.samples.setdefault(int(cells[0]), []).append(cells[1:])
            self.stop_event.wait(self.interval_s)

    def take_baseline(self) -> None:
        """GPU memory in use before our workers start: memory held then is another process's, even where
        nvidia-smi cannot show whose (a container with its own PID namespace lists no processes)."""
        try:
            out = self._query("--query-gpu=index,memory.used", "--format=csv,noheader,nounits")
        except (OSError, subprocess.TimeoutExpired):
            return
        for line in out.splitlines():
            index, _, used = (c.strip() for c in line.partition(","))
            if index.isdigit() and used.replace(".", "", 1).isdigit():
                self.baseline_mib[int(index)] = float(used)

    def foreign(self) -> list[dict[str, Any]]:
        """Other processes seen on the GPUs. By PID when the list is trustworthy (our own workers showed in it);
        otherwise by the memory a GPU held before our workers started (more than :data:`IDLE_MIB`)."""
        if not self.own_seen:
            return [
                {
                    "info": "foreign_process",
                    "gpu": gpu,
                    "pid": None,
                    "name": "unknown (nvidia-smi shows no PIDs here)",
                    "used_memory_mib": used,
                    "seen_samples": 1,
                    "samples": 1,
                }
                for gpu, used in sorted(self.baseline_mib.items())
                if used > IDLE_MIB
            ]
        return [
            {
                "info": "foreign_process",
                "gpu": gpu,
                "pid": pid,
                "name": app["name"][:200],
                "used_memory_mib": app["mib"],
                "seen_samples": app["seen"],
                "samples": self.app_samples,
            }
            for (gpu, pid), app in sorted(self.apps.items())
        ]

    def summary(self, gpu: int) -> dict[str, Any]:
        rows = self.samples.get(gpu, [])

        def median(i: int) -> float | None:
            values = []
            for row in rows:
                try:
                    values.append(float(row[i]))
                except ValueError:
                    continue
            return round(statistics.median(values), 1) if values else None

        reasons = 0
        for row in rows:
            try:
                reasons |= int(row[4], 16)
            except ValueError:
                continue
        return {
            "sm_clock_mhz": median(0),
            "mem_clock_mhz": median(1),
            "power_w": median(2),
            "temp_c": max((float(r[3]) for r in rows if r[3].replace(".", "", 1).isdigit()), default=None),
            "clock_event_reasons": f"0x{reasons:016x}" if rows else None,
            "samples": len(rows),
        }


def _timed(fn: Any, device: torch.device, iters: int, repeats: int) -> tuple[float, float | None]:
    """Median seconds per call of ``fn`` over ``repeats`` runs of ``iters`` back-to-back calls, and the repeats'
    coefficient of variation (the figure's own noise: a co-tenant or a throttle makes it wide)."""
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000 / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            times.append((time.perf_counter() - t0) / iters)
    mean = statistics.fmean(times)
    spread = round(statistics.stdev(times) / mean, 4) if len(times) >= 2 and mean > 0 else None
    return statistics.median(times), spread


def warm_up(fn: Any, device: torch.device, seconds: float) -> None:
    """Call ``fn`` for at least ``seconds``: clocks ramp up and the library settles on its kernel first (on a
    GPU in batches of five between synchronisations; on a CPU, where nothing ramps, one call at a time)."""
    end = time.perf_counter() + seconds
    while True:
        for _ in range(5 if device.type == "cuda" else 1):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if time.perf_counter() >= end:
            return


CPU_REPEAT_S = 0.05  # a repeat of a CPU GEMM needs no more calls than fill this: the clock's error is far below it


def _cpu_iters(fn: Any, iters: int) -> int:
    """Calls per repeat on a CPU: at most ``iters``, fewer where one call already outlasts :data:`CPU_REPEAT_S`
    (a bf16 GEMM on a CPU without bf16 instructions is 40 times slower than fp32: three calls per repeat only
    lengthen the probe, the median of the repeats is the same)."""
    t0 = time.perf_counter()
    fn()
    one_s = time.perf_counter() - t0
    return max(1, min(iters, math.ceil(CPU_REPEAT_S / one_s) if one_s > 0 else iters))


def gemm(
    device: torch.device, dtype_name: str, n: int, iters: int, repeats: int, warmup_s: float
) -> dict[str, Any] | None:
    if dtype_name == "fp8":
        if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
            return None
        if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
            return None
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
        one = torch.tensor(1.0, device=device)

        def fn() -> Any:
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    else:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32}[
            dtype_name
        ]
        torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        c = torch.empty(n, n, device=device, dtype=dtype)

        def fn() -> Any:
            return torch.matmul(a, b, out=c)

    try:
        warm_up(fn, device, warmup_s)
        iters = iters if device.type == "cuda" else _cpu_iters(fn, iters)
        seconds, spread = _timed(fn, device, iters, repeats)
    except RuntimeError:
        return None
    flops = 2 * n * n * n / seconds
    per = 1e12 if device.type == "cuda" else 1e9
    return {
        "metric": f"gemm_{dtype_name}_{'tflops' if device.type == 'cuda' else 'gflops'}",
        "value": round(flops / per, 2),
        "unit": "TFLOP/s" if device.type == "cuda" else "GFLOP/s",
        "dtype": dtype_name,
        "size": n,
        "iterations": iters * repeats,
        "repeat_cv": spread,
    }


def copy_bandwidth(device: torch.device, nbytes: int, iters: int, repeats: int) -> dict[str, Any]:
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    seconds, spread = _timed(lambda: dst.copy_(src), device, iters, repeats)
    return {
        "metric": "hbm_copy_gbps" if device.type == "cuda" else "mem_copy_gbps",
        "value": round(2 * src.numel() * 4 / seconds / 1e9, 1),
        "unit": "GB/s",
        "dtype": "fp32",
        "size": src.numel() * 4,
        "iterations": iters * repeats,
        "repeat_cv": spread,
    }


def host_transfer(device: torch.device, nbytes: int, iters: int, repeats: int) -> list[dict[str, Any]]:
    host = torch.randn(nbytes // 4).pin_memory()
    dev = torch.empty(nbytes // 4, device=device)
    results = []
    for metric, fn in (
        ("h2d_gbps", lambda: dev.copy_(host, non_blocking=True)),
        ("d2h_gbps", lambda: host.copy_(dev, non_blocking=True)),
    ):
        for _ in range(2):
            fn()
        seconds, spread = _timed(fn, device, iters, repeats)
        results.append(
            {
                "metric": metric,
                "value": round(nbytes / seconds / 1e9, 1),
                "unit": "GB/s",
                "dtype": "fp32",
                "size": nbytes,
                "iterations": iters * repeats,
                "repeat_cv": spread,
            }
        )
    return results


def worker(gpu: int | None, turn: int, args: argparse.Namespace, barrier: Any, queue: Any) -> None:
    try:
        device = torch.device("cuda", gpu) if gpu is not None else torch.device("cpu")
        if gpu is not None:
            torch.cuda.set_device(device)
        torch.manual_seed(1234 + (gpu or 0))
        out: list[dict[str, Any]] = []
        for turn_index, dtype_name in enumerate(args.dtypes.split(",")):
            barrier.wait()
            # The first GEMM warms a cold GPU to its loaded clocks and power draw: three times the warm-up.
            warmup_s = args.warmup_s * (3 if turn_index == 0 else 1)
            result = gemm(device, dtype_name, args.gemm_size, args.iters, args.repeats, warmup_s)
            if result is not None:
                out.append(result)
        barrier.wait()
        out.append(copy_bandwidth(device, args.copy_bytes, args.iters, args.repeats))
        if gpu is not None:
            # One GPU at a time: each link is measured alone, not the host's shared memory bandwidth.
            for current in range(barrier.parties):
                barrier.wait()
                if current == turn:
                    out.extend(host_transfer(device, args.host_bytes, 5, args.repeats))
        for record in out:
            queue.put({**record, "gpu": gpu})
    except Exception as exc:  # noqa: BLE001 - reported as data, the other GPUs go on
        barrier.abort()
        queue.put({"error": f"{type(exc).__name__}: {exc}", "gpu": gpu})
    finally:
        queue.put({"done": gpu})


def _arguments() -> argparse.Namespace:
    """The command line, with each size and count defaulted for the device (a CPU run is a small one)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--dtypes", default=None)
    parser.add_argument("--gemm-size", type=int, default=None)
    parser.add_argument("--copy-bytes", type=int, default=None)
    parser.add_argument("--host-bytes", type=int, default=1 << 30)
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup-s", type=float, default=None)
    args = parser.parse_args()
    cuda = args.device == "cuda"
    args.dtypes = args.dtypes or ("bf16,fp16,tf32,fp8" if cuda else "fp32,bf16")
    args.gemm_size = args.gemm_size or (8192 if cuda else 512)
    args.copy_bytes = args.copy_bytes or ((2 << 30) if cuda else (64 << 20))
    args.iters = args.iters or (50 if cuda else 3)
    args.warmup_s = args.warmup_s if args.warmup_s is not None else (1.0 if cuda else 0.0)
    return args


def _run_here(gpu: int | None, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One device (a one-GPU node, a CPU node): measured in this process, no second start of torch."""
    threads = os.environ.get("OMP_NUM_THREADS", "1")  # what a spawned worker's torch would start with
    torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else 1)
    records: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
    worker(gpu, 0, args, threading.Barrier(1), records)
    out = []
    while not records.empty():
        item = records.get()
        if "done" not in item:
            out.append(item)
    return out


def _run_workers(gpus: list[int | None], args: argparse.Namespace, sampler: ConditionSampler) -> list[dict[str, Any]]:
    """One process per GPU, all started together (the barrier loads every GPU at once); their records."""
    if len(gpus) == 1:
        return _run_here(gpus[0], args)
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(len(gpus)), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(g, i, args, barrier, queue)) for i, g in enumerate(gpus)]
    for p in procs:
        p.start()
        sampler.own_pids.add(p.pid or 0)
    pending, records = set(gpus), []
    while pending:
        item = queue.get()
        if "done" in item:
            pending.discard(item["done"])
        else:
            records.append(item)
    for p in procs:
        p.join()
    return records


def main() -> int:
    args = _arguments()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        emit({"error": "CUDA is not available to torch on this node", "gpu": None})
        return 3
    gpus: list[int | None] = list(range(torch.cuda.device_count())) if cuda else [None]
    cuda_version = torch.version.cuda if cuda else None
    info = {"torch": torch.__version__, "gpus": len(gpus), "device": args.device, "cuda": cuda_version}
    emit({"info": "probe", "probe": "gpu_bench", **info})
    sampler = ConditionSampler()
    if cuda:
        sampler.take_baseline()
        sampler.start()
    records = _run_workers(gpus, args, sampler)
    sampler.stop_event.set()
    failed = False
    for record in records:
        if "error" in record:
            failed = True
            emit(record)
            continue
        conditions = sampler.summary(record["gpu"]) if cuda and record["gpu"] is not None else {}
        emit({**record, "probe": "gpu_bench", "conditions": conditions})
    for process in sampler.foreign() if cuda else []:
        emit(process)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
