"""The node-side runs the built-in probes ship: the GPU bench (GEMM, HBM, host links in one run, every GPU
loaded at once), the torch all-reduce sweep, and nccl-tests' ``all_reduce_perf`` where a profile names it.

Each command line runs in the node's private probe directory (``$CA_PROBE_DIR``) under the node-side
timeout; ``command_prefix`` is the operator's own (``docker exec trainer``).
"""

from __future__ import annotations

import shlex

from cluster_accept.inventory.model import Node
from cluster_accept.probes.base import NodeScript

# A light suite's probes: fewer timed repeats, a short warm-up, all-reduce up to 256 MiB. Minutes per node
# instead of tens of minutes, for checks every few hours; the full suite measures as acceptance does.
QUICK_BENCH = " --repeats 3 --warmup-s 1"
QUICK_ALLREDUCE_MAX_BYTES = 256 << 20


def _prefix(node: Node) -> str:
    probes = node.profile.probes
    return f"{probes.command_prefix} " if probes.command_prefix else ""


def _gpus_or_skip(node: Node) -> str:
    """``n``: the GPUs to run on; a CUDA node with fewer than two says so and skips the all-reduce."""
    if node.profile.probes.device != "cuda":
        return "n=2; "
    return (
        "n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); "
        'if [ "$n" -lt 2 ]; then echo \'{"info": "skip", "reason": "fewer than 2 GPUs"}\'; exit 0; fi; '
    )


def _top_bytes(node: Node, quick: bool) -> int | None:
    top = node.profile.probes.allreduce_max_bytes
    if quick:
        top = min(top or QUICK_ALLREDUCE_MAX_BYTES, QUICK_ALLREDUCE_MAX_BYTES)
    return top


def gpu_bench_command(node: Node, quick: bool = False) -> str:
    probes = node.profile.probes
    python = shlex.quote(probes.python)
    quick_args = QUICK_BENCH if quick else ""
    return f'cd "$CA_PROBE_DIR" && exec {_prefix(node)}{python} gpu_bench.py --device {probes.device}{quick_args}'


def allreduce_command(node: Node, quick: bool = False) -> str | None:
    probes = node.profile.probes
    if probes.nccl_tests_all_reduce:
        return None
    top = _top_bytes(node, quick)
    max_bytes = f" --max-bytes {top}" if top else ""
    return (
        f'cd "$CA_PROBE_DIR" && {_gpus_or_skip(node)}NCCL_DEBUG=INFO exec {_prefix(node)}'
        f"{shlex.quote(probes.python)} -m torch.distributed.run --standalone --nproc_per_node=$n allreduce.py "
        f"--device {probes.device}{max_bytes} 2>&1"
    )


def nccl_tests_command(node: Node, quick: bool = False) -> str | None:
    binary = node.profile.probes.nccl_tests_all_reduce
    if not binary:
        return None
    top = _top_bytes(node, quick) or (1 << 30)
    return (
        f"{_gpus_or_skip(node)}NCCL_DEBUG=INFO exec {_prefix(node)}{shlex.quote(binary)} -b 1M -e {top} -f 4 -g $n 2>&1"
    )


GPU_BENCH = NodeScript("gpu_bench", ("gpu_bench.py",), "gemm", gpu_bench_command)
# The torch sweep and the nccl-tests variant never run on the same node (a profile picks one): one name, so a
# run's results and checkpoints read the same whichever ran.
ALLREDUCE = NodeScript("allreduce", ("allreduce.py",), "allreduce", allreduce_command)
NCCL_TESTS = NodeScript("allreduce", (), "allreduce", nccl_tests_command)
