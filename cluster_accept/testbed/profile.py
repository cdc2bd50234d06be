"""The inventory a test-bed writes: contract format, with a profile derived from the base's captures.

The profile is read off the same captures the nodes serve (GPU model and count from the field table,
CUDA version from the ``nvidia-smi`` header, NVLink links and speed from ``nvlink -s``), so a healthy
node meets it by construction and every planted fault is a deviation the tool must report.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

from cluster_accept.testbed import textops
from cluster_accept.testbed.captures import build_table, load_base

# What the test-bed's NCCL looks like: sockets over the node's eth0, no InfiniBand, no NVLS multicast.
TESTBED_NCCL_ENV = {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1", "NCCL_NVLS_ENABLE": "0"}


def testbed_nccl_env(rails: int) -> dict[str, str]:
    """The nodes' NCCL environment: with simulated HCAs (rails) InfiniBand is not switched off, as on a cluster
    that has it."""
    return {k: v for k, v in TESTBED_NCCL_ENV.items() if not (rails and k == "NCCL_IB_DISABLE")}


NODES_PER_RACK = 8


def profile_name(base: str) -> str:
    return f"testbed-{base}"


def base_profile(base: str, python: str = sys.executable, training: bool = False, rails: int = 0) -> dict[str, Any]:
    """The profile every healthy node of ``base`` meets (inventory ``profiles:`` entry)."""
    files = load_base(base).files
    table = build_table(files)
    cuda = re.search(r"CUDA Version:\s*(\S+)", files.get("nvidia-smi.txt", ""))
    profile: dict[str, Any] = {
        "gpu": {"model": table.get("name", 0), "count": table.gpu_count},
        "driver_version": table.get("driver_version", 0),
    }
    if cuda:
        profile["cuda_version"] = cuda.group(1)
    profile["persistence_mode"] = table.get("persistence_mode", 0).lower()
    blocks = textops.nvlink_blocks(files.get("nvlink-s.txt", "")).blocks
    if blocks:
        speeds = re.findall(r"Link \d+: ([\d.]+) GB/s", blocks[0][1])
        if speeds:
            profile["nvlink"] = {"links_per_gpu": len(speeds), "link_speed_gbps": float(speeds[0])}
    profile["pcie"] = {
        "gen": int(table.get("pcie.link.gen.max", 0)),
        "width": int(table.get("pcie.link.width.max", 0)),
    }
    profile["nccl_env"] = testbed_nccl_env(rails)
    profile["probes"] = {
        "python": python,
        "device": "cpu",
        "expected_transport": {"intra_node": "SHM", "inter_node": "NET/Socket"},
        # Every simulated node runs on this machine's cores: probing them one at a time keeps their CPU
        # figures comparable, and CPU timings on a shared machine still vary more than GPUs do.
        "max_parallel_nodes": 1,
        # gloo's collectives beside all-reduce cost seconds per node here: tests that want them list them.
        "collectives": [],
        # One rank per node on each rail, held to the rail's interface (its simulated HCA named beside it).
        "rails": [{"gpu": k, "nic": f"mlx5_{k}", "ifname": f"rail{k}"} for k in range(rails)],
    }
    # gloo over this machine's veths moves ~0.1-0.4 GB/s per rank; a node limited to tens of Mbit/s, ~0.006.
    # Groups measured at once share two cores (a slow group's ranks spin too), so relative figures swing
    # widely: the test-bed judges by that absolute floor, with a margin that only a 10x drop crosses. Every
    # simulated node shares this machine's cores, so a node far below the others (or below its own history)
    # is reported as a warning: its CPU figures say more about the machine than about the node.
    profile["thresholds"] = {"straggler_pct": 90, "allreduce_inter_busbw_gbps_min": 0.03, "relative_verdict": "warn"}
    # The training probe's tiny CPU model takes seconds per node and per sweep step on these shared cores; a
    # test-bed trains only where asked (training=True), so that tests of other stages stay fast.
    profile["training"] = {"enabled": training}
    # The burn loads every simulated node's cores for minutes: a test-bed burns only where a test asks for it.
    profile["burn"] = {"minutes": 0, "light_minutes": 0, "sdc": False}
    return profile


def rack(index: int) -> str:
    """Rack label of the 1-based node ``index``: eight nodes per rack (r01 = node01..node08)."""
    return f"r{(index - 1) // NODES_PER_RACK + 1:02d}"


def inventory(
    base: str,
    nodes: dict[str, str],
    identity_file: Path,
    known_hosts: Path,
    cluster: str = "testbed",
    rails: int = 0,
) -> dict[str, Any]:
    name = profile_name(base)
    return {
        "cluster": cluster,
        "defaults": {
            "profile": name,
            "ssh": {
                "user": "root",
                "port": 22,
                "identity_file": str(identity_file),
                "known_hosts": str(known_hosts),
                "host_key_policy": "strict",
                "connect_timeout_s": 5,
                "command_timeout_s": 30,
            },
        },
        "nodes": [
            {"hosts": node, "address": ip, "labels": {"rack": rack(i)}}
            for i, (node, ip) in enumerate(nodes.items(), start=1)
        ],
        "profiles": {name: base_profile(base, rails=rails)},
    }


def write_inventory(path: Path, data: dict[str, Any]) -> None:
    header = "# Written by `cluster-accept testbed up` (testbed.bed.up); rewritten at every up.\n"
    path.write_text(header + yaml.safe_dump(data, sort_keys=False, width=120), encoding="utf-8")
