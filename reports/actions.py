"""What to do about a finding, and the command that reproduces it. Pure.

The report is handed to whoever fixes the node (the vendor, the data-centre hands, the platform team), so
every failing row carries a suggested action from a closed set and the exact command that shows the same
failure again. Actions are looked up by ``check:reason`` first, then by check, then fall back to *rerun*:
an unknown reason is a fresh one, and the safe first step is to see whether it repeats.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class Action:
    REPLACE_GPU = "replace GPU"
    RESEAT_CABLE = "reseat cable"
    FIX_CONFIG = "fix config"
    CHECK_NODE = "check node"
    RERUN = "rerun"


@dataclass(frozen=True)
class Suggestion:
    action: str
    why: str


# XIDs that mean the GPU itself is failing (NVIDIA's XID catalog): replace rather than retry.
_HARDWARE_XIDS = {48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140}

_BY_REASON: dict[str, Suggestion] = {
    "ssh:refused": Suggestion(Action.CHECK_NODE, "sshd is not answering: is the node up, is sshd running?"),
    "ssh:timeout": Suggestion(Action.CHECK_NODE, "no answer on the network: check power and the BMC console"),
    "ssh:no-route": Suggestion(Action.CHECK_NODE, "no route to the node: check its network port and VLAN"),
    "ssh:dns": Suggestion(Action.FIX_CONFIG, "the name does not resolve: fix DNS or the inventory address"),
    "ssh:auth": Suggestion(Action.FIX_CONFIG, "authentication refused: install the key for the inventory's user"),
    "ssh:host-key": Suggestion(
        Action.CHECK_NODE, "the host key changed: confirm the node was re-installed, then update known_hosts"
    ),
    "ssh:jump": Suggestion(Action.CHECK_NODE, "the jump host refused or dropped the connection"),
    "gpu_count:count_low": Suggestion(Action.REPLACE_GPU, "a GPU is missing from the bus: reseat it or replace it"),
    "pcie:width_degraded": Suggestion(Action.RESEAT_CABLE, "the PCIe link trained narrower: reseat the GPU/riser"),
    "pcie:width_below_profile": Suggestion(Action.RESEAT_CABLE, "the PCIe link is narrower than the profile's"),
    "pcie:gen_below_profile": Suggestion(Action.RESEAT_CABLE, "the PCIe link trained at a lower generation"),
    "pcie:gen_downshifted": Suggestion(Action.RESEAT_CABLE, "the PCIe link downshifted under load"),
    "nvlink:link_inactive": Suggestion(Action.RESEAT_CABLE, "an NVLink is down: reseat the GPU/baseboard"),
    "nvlink:links_missing": Suggestion(Action.RESEAT_CABLE, "fewer NVLinks than the profile: reseat the GPU"),
    "nvlink:link_slow": Suggestion(Action.RESEAT_CABLE, "an NVLink runs below its rated speed"),
    "nvlink:link_errors": Suggestion(Action.RESEAT_CABLE, "NVLink error counters are growing"),
    "infiniband:port_down": Suggestion(Action.RESEAT_CABLE, "an HCA port is down: check the cable and switch port"),
    "memory:remap_failed": Suggestion(Action.REPLACE_GPU, "row remapping failed: the GPU has no spare rows left"),
    "memory:uncorrected_ecc": Suggestion(Action.REPLACE_GPU, "uncorrected ECC errors"),
    "memory:remap_pending": Suggestion(Action.CHECK_NODE, "a row remap waits for a GPU reset: reset, then rerun"),
    "memory:retired_pages_pending": Suggestion(Action.CHECK_NODE, "pages wait for retirement: reboot, then rerun"),
    "memory:ecc_disabled": Suggestion(Action.FIX_CONFIG, "ECC is off: nvidia-smi -e 1 and reboot"),
    "persistence:persistence_disabled": Suggestion(
        Action.FIX_CONFIG, "persistence mode is off: enable nvidia-persistenced (or nvidia-smi -pm 1)"
    ),
    "transport:unexpected": Suggestion(Action.FIX_CONFIG, "NCCL did not use the expected intra-node transport"),
    "transport:unexpected_inter_node": Suggestion(
        Action.FIX_CONFIG, "NCCL fell back between nodes: check NCCL_SOCKET_IFNAME, NCCL_IB_HCA and the HCAs"
    ),
    "gemm:straggler": Suggestion(Action.REPLACE_GPU, "far below its peers: look at clocks/power in the evidence"),
    "hbm:straggler": Suggestion(Action.REPLACE_GPU, "memory bandwidth far below its peers"),
    "hbm:below_threshold": Suggestion(Action.REPLACE_GPU, "memory bandwidth below the profile's minimum"),
    "isolation:slow_node": Suggestion(Action.RESEAT_CABLE, "slows every group it joins: check its HCAs and cables"),
    "isolation:slow_pair": Suggestion(Action.RESEAT_CABLE, "slow only with one partner: check the link between them"),
    "isolation:unresolved": Suggestion(Action.RERUN, "isolation could not tell which node: bisect with good nodes"),
}

_BY_CHECK: dict[str, Suggestion] = {
    "driver": Suggestion(Action.FIX_CONFIG, "install the cluster's driver version"),
    "cuda": Suggestion(Action.FIX_CONFIG, "install the cluster's CUDA version"),
    "nccl_env": Suggestion(Action.FIX_CONFIG, "set the NCCL environment the profile expects"),
    "topology": Suggestion(Action.RESEAT_CABLE, "the GPU topology differs from the profile's"),
    "clock_events": Suggestion(Action.CHECK_NODE, "clocks are being held back: check cooling and power capping"),
    "gemm": Suggestion(Action.RERUN, "rerun; if it repeats, compare clocks and temperature, then replace the GPU"),
    "allreduce": Suggestion(Action.RERUN, "rerun; if it repeats, check NVLink/NVSwitch (nvidia-smi nvlink -s)"),
    "host_bw": Suggestion(Action.CHECK_NODE, "check the GPU's PCIe slot and NUMA placement"),
}

_NVIDIA_SMI = Suggestion(Action.FIX_CONFIG, "nvidia-smi fails: the driver is not loaded or not installed")
_TIMEOUT = Suggestion(Action.CHECK_NODE, "the command hung and was killed: look for a hung driver (dmesg)")
_ERROR = Suggestion(Action.RERUN, "the output could not be read: rerun, and keep the raw output for a bug report")
_DEFAULT = Suggestion(Action.RERUN, "rerun and compare; see the evidence")


def suggest(row: Mapping[str, Any]) -> Suggestion:
    """The suggested action for one non-passing row (``check``, ``reason``, ``status`` keys)."""
    check, reason, status = str(row["check"]), str(row["reason"]), str(row["status"])
    found = _BY_REASON.get(f"{check}:{reason}")
    if found:
        return found
    xid = re.fullmatch(r"xid_(\d+)", reason)
    if check == "xid" and xid:
        if int(xid.group(1)) in _HARDWARE_XIDS:
            return Suggestion(Action.REPLACE_GPU, f"XID {xid.group(1)} is a GPU hardware fault")
        return Suggestion(Action.CHECK_NODE, f"XID {xid.group(1)}: read the kernel log around it, then rerun")
    if reason == "nvidia_smi_failed":
        return _NVIDIA_SMI
    if status == "timeout":
        return _TIMEOUT
    if status == "error":
        return _ERROR
    if reason.endswith("mismatch") or reason.endswith("drift") or reason == "different":
        return Suggestion(Action.FIX_CONFIG, "differs from the profile or the cluster: align the configuration")
    return _BY_CHECK.get(check, _DEFAULT)


def reproduce(row: Mapping[str, Any], inventory: str, good_node: str | None = None) -> list[str]:
    """Commands that show the same finding again: the node-side command (when the row has one) and the
    ``cluster-accept`` line that reruns the stage on this node alone."""
    node, stage = str(row["node"]), str(row.get("stage") or "")
    inv = shlex.quote(inventory)
    lines: list[str] = []
    if row.get("status") == "unreachable":
        return [f"ssh -v {shlex.quote(node)} true"]
    command = str(row.get("command") or "")
    if command and stage == "preflight":
        lines.append(f"ssh {shlex.quote(node)} {shlex.quote(command)}")
    elif command and stage == "single-node":
        # Two lines, the command quoted whole: nothing in it (a profile's python path) can end the comment.
        lines.append(f"# on {node}, in a copy of probes/:")
        lines.append(f'CA_PROBE_DIR="$PWD" sh -c {shlex.quote(command)}')
    if stage == "multi-node" or stage == "bisect":
        good = f" --good {shlex.quote(good_node)}" if good_node else ""
        lines.append(f"cluster-accept bisect --inventory {inv} --nodes {shlex.quote(node)}{good}")
    elif stage:
        lines.append(f"cluster-accept run --inventory {inv} --nodes {shlex.quote(node)} --stages {stage}")
    return lines
