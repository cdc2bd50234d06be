"""The node-side runs the built-in probes ship: the GPU bench (GEMM, HBM, host links in one run, every GPU
loaded at once), the torch all-reduce sweep, and nccl-tests' ``all_reduce_perf`` where a profile names it.

Each command line runs in the node's private probe directory (``$CA_PROBE_DIR``) under the node-side
timeout; ``command_prefix`` is the operator's own (``docker exec trainer``).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from types import MappingProxyType

from cluster_accept.checks.samples import dead, fault, healthy
from cluster_accept.inventory.model import Node
from cluster_accept.probes.base import NodeScript

# A light suite's probes: fewer timed repeats and a short warm-up, for checks every few hours; the full suite
# measures as acceptance does. The all-reduce sweep keeps its top size in both: its threshold is a bus
# bandwidth at that size (smaller messages never reach it), and the largest sizes take milliseconds on GPUs.
QUICK_BENCH = " --repeats 3 --warmup-s 1"


def _prefix(node: Node) -> str:
    probes = node.profile.probes
    return f"{probes.command_prefix} " if probes.command_prefix else ""


# Settings a run is measured again without (key -> None: unset; -> "": set empty, which NCCL takes as its
# default and which keeps NCCL from reading the key from its config files, where ``setenv(k, v, 0)`` never
# overwrites). Set only around building one node's commands (:func:`tasks.prove_causes`); empty otherwise.
REMOVED_SETTINGS: ContextVar[Mapping[str, str | None]] = ContextVar("removed_settings", default=MappingProxyType({}))
# Keys the tool sets for its own runs: whatever the node has for them is not what the probe ran with.
TOOL_KEYS = frozenset({"NCCL_DEBUG", "GLOO_SOCKET_IFNAME"})


def tool_keys(node: Node) -> frozenset[str]:
    """What :func:`job_env` sets on ``node`` whatever its job environment has: never a setting of the job's own."""
    partition = frozenset({"CUDA_VISIBLE_DEVICES"}) if node.profile.probes.cuda_visible_devices else frozenset()
    return TOOL_KEYS | partition


def job_env(node: Node, **extra: str) -> str:
    """``env K=V … `` placed after the command prefix, so the variables reach the probe inside a container too
    (``docker exec`` does not pass the caller's environment): the profile's GPU partition and ``extra``; while
    a run is measured again without some settings (:data:`REMOVED_SETTINGS`), ``-u K`` or ``K=`` for each."""
    values = {}
    if node.profile.probes.cuda_visible_devices:
        values["CUDA_VISIBLE_DEVICES"] = node.profile.probes.cuda_visible_devices
    values.update(extra)  # a run's own choice (one rail's GPU) over the profile's partition
    return _env_words(values)


def _env_words(values: Mapping[str, str]) -> str:
    """``env -u K … K=V … `` for the settings a run is measured again without (:data:`REMOVED_SETTINGS`), then
    ``values`` over them; "" when there is nothing to change."""
    removed = REMOVED_SETTINGS.get()
    values = {**{k: v for k, v in removed.items() if v is not None}, **values}
    unset = [f"-u {shlex.quote(k)}" for k, v in removed.items() if v is None and k not in values]
    words = unset + [f"{k}={shlex.quote(v)}" for k, v in values.items()]
    return "env " + " ".join(words) + " " if words else ""


def settings_prelude(node: Node, on_stdout: bool = False) -> str:
    """Before a run, in its environment (inside the operator's container too): the settings it runs with
    (``job_settings.py``), one JSON line each, on stderr, out of the way of every probe's own output; on stdout
    (``on_stdout``) for a rank across nodes, whose stderr a launcher may not keep (srun keeps each task's
    stdout only) and whose stdout is read line by line. A run measured again without some settings says the
    settings it runs with then, each removed one unset or set as the run has it (:data:`REMOVED_SETTINGS`)."""
    python = shlex.quote(node.profile.probes.python)
    to = "" if on_stdout else ">&2 "
    return f'( cd "$CA_PROBE_DIR" && {_prefix(node)}{_env_words({})}{python} job_settings.py ) {to}2>/dev/null; '


def gpu_count(node: Node) -> str:
    """``n=…; ``: the GPUs a probe runs on, the profile's partition when it names one, else every GPU."""
    devices = node.profile.probes.cuda_visible_devices
    if devices:
        return f"n={len([d for d in devices.split(',') if d.strip()])}; "
    return "n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); "


def _gpus_or_skip(node: Node) -> str:
    """``n``: the GPUs to run on (the profile's partition when it names one); a CUDA node with fewer than two
    says so and skips the all-reduce."""
    if node.profile.probes.device != "cuda":
        return "n=2; "
    skip = '{"info": "skip", "reason": "fewer than 2 GPUs"}'
    return f"{gpu_count(node)}if [ \"$n\" -lt 2 ]; then echo '{skip}'; exit 0; fi; "


def gpu_bench_command(node: Node, quick: bool = False) -> str:
    probes = node.profile.probes
    python = shlex.quote(probes.python)
    quick_args = QUICK_BENCH if quick else ""
    return (
        f'cd "$CA_PROBE_DIR" && exec {_prefix(node)}{job_env(node)}{python} gpu_bench.py '
        f"--device {probes.device}{quick_args}"
    )


# A free port on loopback for the node's own rendezvous, picked by the probe's interpreter.
LOOPBACK_PORT = 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'


def allreduce_command(node: Node, quick: bool = False) -> str | None:
    """torchrun on every GPU of the node, meeting on loopback: a node whose own hostname does not resolve
    still runs it (``--standalone`` publishes the hostname to its workers), and the rendezvous and the process
    group give up after ``probes.rendezvous_timeout_s`` instead of torch's 300-600 s."""
    probes = node.profile.probes
    if probes.nccl_tests_all_reduce:
        return None
    top = node.profile.probes.allreduce_max_bytes  # light suite or not (see QUICK_BENCH)
    max_bytes = f" --max-bytes {top}" if top else ""
    ops = ",".join(["all_reduce", *probes.collectives])
    script = f"allreduce.py --device {probes.device} --ops {ops}{max_bytes}"
    return loopback_torchrun(node, _gpus_or_skip(node), script)


def loopback_torchrun(node: Node, count: str, script: str) -> str:
    """``torchrun`` of ``script`` (file and arguments) on ``count`` (``n=…; ``) processes of the node, meeting on
    loopback at a port the probe's interpreter finds free: NCCL's log on (it names the transport), gloo on
    loopback on CPU, the rendezvous given up after ``probes.rendezvous_timeout_s``."""
    probes = node.profile.probes
    python = shlex.quote(probes.python)
    wait = int(probes.rendezvous_timeout_s)
    extra = {"NCCL_DEBUG": "INFO"} if probes.device == "cuda" else {"GLOO_SOCKET_IFNAME": "lo"}
    return (
        f'cd "$CA_PROBE_DIR" && {count}'
        f"port=$({_prefix(node)}{python} -c {shlex.quote(LOOPBACK_PORT)}) && "
        f"exec {_prefix(node)}{job_env(node, **extra)}{python} -m torch.distributed.run --nnodes=1 "
        f"--nproc_per_node=$n --master_addr=127.0.0.1 --master_port=$port --rdzv-conf=timeout={wait} {script} "
        f"--init-timeout-s {wait} 2>&1"
    )


def nccl_tests_command(node: Node, quick: bool = False) -> str | None:
    binary = node.profile.probes.nccl_tests_all_reduce
    if not binary:
        return None
    top = node.profile.probes.allreduce_max_bytes or (1 << 30)
    run = f"{_prefix(node)}{job_env(node, NCCL_DEBUG='INFO')}{shlex.quote(binary)}"
    return f"{_gpus_or_skip(node)}exec {run} -b 1M -e {top} -f 4 -g $n 2>&1"


def burn_command(node: Node, quick: bool = False) -> str | None:
    """The burn on every GPU of the node at once for the suite's minutes, then the silent-data-corruption
    check; None where the profile asks for neither."""
    burn = node.profile.burn
    seconds = burn.seconds(quick)
    if seconds <= 0 and not burn.sdc:
        return None
    python = shlex.quote(node.profile.probes.python)
    return (
        f'cd "$CA_PROBE_DIR" && exec {_prefix(node)}{job_env(node)}{python} burn.py '
        f"--device {node.profile.probes.device} --seconds {seconds:g} --sample-s {burn.sample_interval_s:g} "
        f"--sdc-repeats {burn.sdc_repeats if burn.sdc else 0}"
    )


def burn_timeout_s(node: Node, quick: bool) -> float:
    return node.profile.burn.seconds(quick) + node.profile.probes.timeout_s


# What ``dcgmi diag`` prints when the node has no DCGM: a skip, with the reason, never a silent pass.
DCGM_MISSING = '{"info": "skip", "reason": "dcgmi is not installed on this node (no DCGM diagnostics)"}'
DCGM_EXIT = "### dcgmi exit "  # dcgmi exits 226 (205: isolate the GPU) when a test fails: read, not a crash


def dcgm_command(node: Node, quick: bool = False) -> str | None:
    """``dcgmi diag -r LEVEL -j`` where the node has dcgmi (inside the operator's container when it runs one);
    a skip line where it has not. Its exit status is printed after its JSON: dcgmi exits non-zero when a test
    fails, which is DCGM's verdict, not the run failing. The profile's GPU partition becomes ``-i``."""
    level = node.profile.burn.dcgm(quick)
    if level is None:
        return None
    prefix = _prefix(node)
    devices = node.profile.probes.cuda_visible_devices
    gpus = f" -i {shlex.quote(devices)}" if devices else ""
    return (
        f"if ! {prefix}sh -c 'command -v dcgmi' >/dev/null 2>&1; then echo {shlex.quote(DCGM_MISSING)}; exit 0; fi; "
        f'{prefix}dcgmi diag -r {level}{gpus} -j 2>&1; echo "{DCGM_EXIT}$?"'
    )


def dcgm_timeout_s(node: Node, quick: bool) -> float:
    return node.profile.burn.dcgm_timeout_s


SETTINGS_FILE = "job_settings.py"
GPU_BENCH = NodeScript("gpu_bench", ("gpu_bench.py",), "gemm", gpu_bench_command)
# What the GPU bench prints, declared once for the probes that read its run (gemm, hbm, host_bw), and the minimums
# its samples are held to.
GPU_BENCH_PROFILE = {
    "thresholds": {"gemm_bf16_tflops_min": 600, "hbm_copy_gbps_min": 4000, "h2d_gbps_min": 40, "d2h_gbps_min": 40}
}
GPU_BENCH_SAMPLES = (
    healthy("h200x4", {"ok"}, fixture="gpu_bench/h200x4.txt", profile=GPU_BENCH_PROFILE),
    healthy(
        "testbed_cpu",
        {"ok"},
        fixture="gpu_bench/testbed_cpu.txt",
        profile={
            "probes": {"device": "cpu"},
            "training": {"enabled": False},
            "thresholds": {"gemm_fp32_gflops_min": 50, "gemm_bf16_gflops_min": 100, "mem_copy_gbps_min": 20},
        },
    ),
    fault(
        "slow_gpus",
        {"below_threshold", "straggler"},
        fixture="gpu_bench/h200x4_slow_gpus.txt",
        profile=GPU_BENCH_PROFILE,
    ),
    dead("torch_missing", {"probe_failed"}, fixture="gpu_bench/torch_missing.txt", exit_code=1),
)
# The burn's node-side script lives in its sub-package (probes/burn/node/); it samples with the GPU bench's sampler.
BURN_SCRIPT = str(Path(__file__).resolve().parent / "burn" / "node" / "burn.py")
BURN = NodeScript("burn", (BURN_SCRIPT, "gpu_bench.py"), "burn", burn_command, burn_timeout_s)
# What the burn prints, declared once for the probes that read its run (burn, sdc): each judges its healthy output
# with its own reasons. ``BURN_PROFILE``: the minimums its samples are held to.
BURN_PROFILE = {"burn": {"minutes": 1}, "thresholds": {"burn_tflops_min": 500}}
BURN_HEALTHY = healthy("h100_20s", fixture="burn/h100_20s.txt", profile=BURN_PROFILE)
BURN_TORCH_MISSING = dead(
    "torch_missing", {"probe_failed"}, fixture="burn/torch_missing.txt", exit_code=1, profile=BURN_PROFILE
)
DCGM = NodeScript("dcgm", (), "dcgm", dcgm_command, dcgm_timeout_s, says_settings=False)
# The torch sweep and the nccl-tests variant never run on the same node (a profile picks one): one name, so a
# run's results and checkpoints read the same whichever ran.
# The sweep names the collective beside each figure (its metric names it too).
ALLREDUCE = NodeScript("allreduce", ("allreduce.py",), "allreduce", allreduce_command, unkept={"collective": (str,)})
# The all-reduce run where torch is missing, declared once for the probes that read the run (allreduce,
# collectives): each judges it under its own profile.
ALLREDUCE_TORCH_MISSING = dead("torch_missing", {"probe_failed"}, fixture="allreduce/torch_missing.txt", exit_code=1)
NCCL_TESTS = NodeScript("allreduce", (), "allreduce", nccl_tests_command)
