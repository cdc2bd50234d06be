"""Node-side probe: sustained load on every GPU at once (the burn-in), then a silent-data-corruption check.

Runs on the node with only torch and the standard library. One process per GPU, started together, runs GEMMs
with a large memory copy every few of them for ``--seconds``, and reports its GEMM throughput for every
``--sample-s`` window (``{"info": "window", …}``): a GPU that slows as it heats shows as a falling series.
Meanwhile nvidia-smi is sampled every ``--sample-s`` for clocks, power, temperature, active clock event reasons
and volatile ECC counts (``{"info": "sample", …}``), and the kernel log is read before and after for new NVRM
Xid lines (``{"info": "xid", …}``). Other processes on the GPUs are reported as the GPU bench reports them.

Then every GPU multiplies the same inputs (fixed seed, generated on the host, TF32 off) ``--sdc-repeats``
times and prints a digest of each product and of its sum (``{"info": "sdc", …}``): the same GPU model, torch
and CUDA must give bitwise the same bytes on every GPU of the cluster; the controller compares them.

``--device cpu`` runs one process per GPU that nvidia-smi lists (one when it lists none) on the CPU, so a
test-bed without GPUs exercises the whole stage, its nvidia-smi stand-in answering the samples.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import platform
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from queue import Empty
from typing import Any

import torch
from gpu_bench import ConditionSampler, emit  # shipped beside this script (probes.scripts.BURN)

SAMPLE_FIELDS = (
    "index,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active,"
    "ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total,"
    "pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max"
)
SAMPLE_KEYS = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c", "reasons", "ecc_corrected", "ecc_uncorrected",
               "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max")  # fmt: skip
SDC_SEED = 20261123
COPY_EVERY = 4  # one memory copy per this many GEMMs: HBM and SMs loaded together, as in training
SAMPLER_RETRIES = 3
GRACE_S = 120.0  # past the burn's end, how long a silent worker is waited for before it is reported hung
# The driver's XID line as dmesg prints it: its message starts the line, right after the stamp (and the printk
# caller where the kernel adds it), and names the GPU's bus id. The kernel starts other messages with a process's
# own name ('NAME[pid]: segfault at ...'), which any user sets to 'NVRM: Xid ():79' (15 characters: too short
# for a bus id), and dmesg indents a message's further lines, so neither passes for an XID.
XID_LINE = re.compile(
    r"^(\[ *[0-9]+\.[0-9]+\] +(\[ *[TC][0-9]+\] +)?)?"
    r"NVRM: Xid \((PCI:)?[0-9a-fA-F]{4,}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(\.[0-7])?\):"
)


def number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


class SeriesSampler(ConditionSampler):
    """Samples nvidia-smi every ``interval_s`` and prints each sample at once (a long burn keeps what it saw
    even when it is killed), with the seconds since the burn started."""

    def __init__(self, interval_s: float, started: float, visible: dict[int, int]):
        super().__init__(interval_s)
        self.started = started
        self.visible = visible
        self.failed: str | None = None

    def run(self) -> None:
        failures = 0
        while not self.stop_event.is_set():
            due = time.monotonic() + self.interval_s
            try:
                result = subprocess.run(
                    ["nvidia-smi", f"--query-gpu={SAMPLE_FIELDS}", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                )
                self._sample_apps()
                why = None if result.returncode == 0 else (result.stdout + result.stderr).strip()[:300]
            except (OSError, subprocess.TimeoutExpired) as exc:
                result, why = None, f"{type(exc).__name__}: {exc}"
            if why is not None or result is None:
                failures += 1
                if failures >= SAMPLER_RETRIES:  # one slow answer is not a broken nvidia-smi; three in a row are
                    self.failed = why
                    return
            else:
                failures = 0
                self._emit_samples(result.stdout)
            self.stop_event.wait(max(0.0, due - time.monotonic()))

    def _emit_samples(self, text: str) -> None:
        t_s = round(time.monotonic() - self.started, 2)
        for line in text.splitlines():
            cells = [c.strip() for c in line.split(",")]
            if len(cells) != 1 + len(SAMPLE_KEYS) or not cells[0].isdigit() or int(cells[0]) not in self.visible:
                continue
            values: dict[str, Any] = {k: number(v) for k, v in zip(SAMPLE_KEYS, cells[1:], strict=True)}
            values["reasons"] = cells[5] if cells[5].startswith("0x") else None
            emit({"info": "sample", "gpu": self.visible[int(cells[0])], "t_s": t_s, **values})


def visible_gpus(count: int) -> dict[int, int]:
    """nvidia-smi's index -> the worker's (CUDA's) index: under ``CUDA_VISIBLE_DEVICES=4,5`` nvidia-smi's GPU 4 is
    worker 0; the GPUs outside the partition are not sampled. Without a partition (or with UUIDs) they are the same."""
    listed = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if listed and all(d.isdigit() for d in listed):
        return {int(d): i for i, d in enumerate(listed[:count])}
    return {i: i for i in range(count)}


def xid_lines() -> tuple[list[str] | None, str]:
    """The kernel log's NVRM Xid lines (:data:`XID_LINE`), or None with why the log could not be read."""
    try:
        result = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if result.returncode != 0:
        return None, (result.stderr or result.stdout).strip()[:300]
    return [line for line in result.stdout.splitlines() if XID_LINE.match(line)], ""


def listed_gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def load(device: torch.device, args: argparse.Namespace, started: float, queue: Any) -> None:
    """GEMMs with a memory copy every :data:`COPY_EVERY` of them until ``args.seconds`` after ``started``; one
    throughput figure per window of ``args.sample_s``."""
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    n = args.gemm_size
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    src = torch.randn(args.copy_bytes // 4, device=device)
    dst = torch.empty_like(src)
    end = started + args.seconds
    window_start, gemms, calls = time.monotonic(), 0, 0
    while time.monotonic() < end:
        torch.matmul(a, b, out=c)
        gemms += 1
        calls += 1
        if calls % COPY_EVERY == 0:
            dst.copy_(src)
        if calls % args.sync_every == 0 or not cuda:
            if cuda:
                torch.cuda.synchronize(device)
            now = time.monotonic()
            if now - window_start >= args.sample_s:
                rate = 2 * n**3 * gemms / (now - window_start) / (1e12 if cuda else 1e9)
                queue.put({"t_s": round(now - started, 2), "value": round(rate, 3)})
                window_start, gemms = now, 0


def digests(device: torch.device, size: int, repeats: int) -> dict[str, Any]:
    """The same product on every GPU: inputs from a seeded host generator, TF32 off, deterministic algorithms."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    generator = torch.Generator().manual_seed(SDC_SEED)
    a = torch.randn(size, size, generator=generator).to(device)
    b = torch.randn(size, size, generator=generator).to(device)
    weights = (torch.arange(size * size, device=device, dtype=torch.int64) % 65521) + 1
    products, sums = [], []
    for _ in range(repeats):
        c = torch.matmul(a, b)
        products.append(fingerprint(c, weights))
        sums.append(float(c.sum(dtype=torch.float64).item()).hex())
    return {"size": size, "products": products, "sums": sums}


def fingerprint(c: torch.Tensor, weights: torch.Tensor) -> str:
    """The product's bits, summed plainly and weighted by position (integer sums: exact on every device): one
    flipped bit anywhere changes it."""
    words = c.contiguous().view(torch.int32).flatten().to(torch.int64)
    plain, weighted = int(words.sum().item()), int((words * weights).sum().item())
    return hashlib.sha256(f"{plain}:{weighted}".encode()).hexdigest()[:32]


def worker(gpu: int, cuda: bool, args: argparse.Namespace, barrier: Any, queue: Any) -> None:
    try:
        device = torch.device("cuda", gpu) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        else:
            torch.set_num_threads(1)
        torch.manual_seed(1234 + gpu)
        barrier.wait()
        started = time.monotonic()
        if args.seconds > 0:
            load(device, args, started, _Tagged(queue, gpu, "window"))
        if args.sdc_repeats:
            queue.put({"gpu": gpu, "info": "sdc", **digests(device, args.sdc_size, args.sdc_repeats)})
    except Exception as exc:  # noqa: BLE001 - reported as data, the other GPUs go on
        barrier.abort()
        queue.put({"error": f"{type(exc).__name__}: {exc}", "gpu": gpu})
    finally:
        queue.put({"done": gpu})


class _Tagged:
    """A queue that labels what a worker puts on it with its GPU and kind."""

    def __init__(self, queue: Any, gpu: int, kind: str):
        self.queue, self.gpu, self.kind = queue, gpu, kind

    def put(self, record: dict[str, Any]) -> None:
        self.queue.put({"info": self.kind, "gpu": self.gpu, **record})


def platform_of(cuda: bool) -> str:
    """What must match for two GPUs' products to be bitwise equal: the device model and the libraries."""
    if cuda:
        name = torch.cuda.get_device_name(0)
        return f"{name} | torch {torch.__version__} | CUDA {torch.version.cuda}"
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            model = next((ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")), model)
    except OSError:
        pass
    return f"cpu {model} | torch {torch.__version__}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--sample-s", type=float, default=1.0)
    parser.add_argument("--sdc-repeats", type=int, default=3)
    parser.add_argument("--gemm-size", type=int, default=None)
    parser.add_argument("--copy-bytes", type=int, default=None)
    parser.add_argument("--sdc-size", type=int, default=None)
    parser.add_argument("--sync-every", type=int, default=20)
    args = parser.parse_args()
    cuda = args.device == "cuda"
    args.gemm_size = args.gemm_size or (8192 if cuda else 256)
    args.copy_bytes = args.copy_bytes or ((1 << 30) if cuda else (8 << 20))
    args.sdc_size = args.sdc_size or (4096 if cuda else 256)
    return args


def collect(queue: Any, procs: list[Any], deadline: float) -> bool:
    """Print what the workers put on the queue until each is done, died, or ``deadline`` passed; True when one
    reported an error or was lost (a worker killed by the kernel or hung in the driver never says it is done:
    its GPU is reported, the others' results and the kernel log are still printed)."""
    pending, failed = {int(p.name.removeprefix("gpu")): p for p in procs}, False
    while pending:
        try:
            item = queue.get(timeout=1.0)
        except Empty:
            for gpu, proc in list(pending.items()):
                late = time.monotonic() > deadline
                if late or (not proc.is_alive() and proc.exitcode not in (0, None)):
                    said = "still running past the burn's end" if late else f"exited with {proc.exitcode}"
                    emit({"error": f"worker {said} without reporting (killed, or hung in the driver)", "gpu": gpu})
                    failed = True
                    if late:
                        proc.kill()
                    del pending[gpu]
            continue
        if "done" in item:
            pending.pop(item["done"], None)
            continue
        failed = failed or "error" in item
        emit(item)
    return failed


def new_xid_lines(before: list[str], after: list[str]) -> list[str]:
    """Lines in ``after`` beyond those already in ``before`` (a repeat of an earlier identical line counts)."""
    seen = Counter(before)
    fresh = []
    for line in after:
        if seen[line]:
            seen[line] -= 1
        else:
            fresh.append(line)
    return fresh


def main() -> int:
    args = parse_args()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        emit({"error": "CUDA is not available to torch on this node", "gpu": None})
        return 3
    gpus = list(range(torch.cuda.device_count() if cuda else max(1, listed_gpus())))
    platform_text = platform_of(cuda)
    emit({"info": "probe", "probe": "burn", "torch": torch.__version__, "gpus": len(gpus), "device": args.device,
          "seconds": args.seconds, "sample_s": args.sample_s, "platform": platform_text})  # fmt: skip
    before, why = xid_lines()
    # spawn for CUDA (a forked CUDA context breaks); fork on CPU, so torch is imported once, not per worker
    ctx: Any = mp.get_context("spawn" if cuda else "fork")
    barrier, queue = ctx.Barrier(len(gpus) + 1), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(g, cuda, args, barrier, queue), name=f"gpu{g}") for g in gpus]
    for p in procs:
        p.start()
    started = time.monotonic()
    sampler = SeriesSampler(args.sample_s, started, visible_gpus(len(gpus)) if cuda else {g: g for g in gpus})
    sampler.own_pids.update(p.pid or 0 for p in procs)
    sampler.take_baseline()
    try:
        barrier.wait(timeout=GRACE_S)
    except threading.BrokenBarrierError:
        pass  # a worker failed to start: its error is on the queue, or collect() names it
    sampler.started = time.monotonic()
    if args.seconds > 0:
        sampler.start()
    try:
        failed = collect(queue, procs, sampler.started + args.seconds + GRACE_S + 60 * (args.sdc_repeats > 0))
    finally:
        sampler.stop_event.set()
        if sampler.is_alive():
            sampler.join(timeout=15)
        if sampler.failed:
            emit({"info": "sampler_failed", "reason": sampler.failed})
        after, why_after = xid_lines()
        if before is None or after is None:
            emit({"info": "xid_unreadable", "reason": why or why_after})
        else:
            for line in new_xid_lines(before, after):
                emit({"info": "xid", "line": line[:500]})
    for p in procs:
        p.join(timeout=10)
    for process in sampler.foreign():
        emit(process)
    emit({"info": "sdc_platform", "platform": platform_text})
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    threading.current_thread().name = "burn"
    sys.exit(main())
