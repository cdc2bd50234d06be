"""What each XID and SXID means to an operator, how bad it is and what to do, after NVIDIA's XID catalogue
(the driver documentation's "XID Errors" catalogue: each XID's immediate action) and the Fabric Manager user
guide (SXIDs). One table, read by the xid check (:mod:`checks.xid`) for its rows and its declared reasons.

The immediate action is the catalogue's: *restart the job* (the application's own fault, the GPU is healthy),
*reset the GPU* (``nvidia-smi -r`` or a node drain and reset; it also applies a pending row remap), *reboot the
node* (the GPU left the bus, or the NVSwitch fabric needs a reset); a hardware fault that repeats after that
action is a *replace GPU* (RMA), which the reason's explanation says. XID 154 names its own recovery action in
its message ("GPU Reset Required", "Node Reboot Required", "Drain and Reset"): that action is taken from the line.

The XIDs the catalogue attributes to the application (immediate action *restart the job*: 13, 31, 43, 45, 109)
warn: one user's faulty job must not take a healthy node out of service. They fail only with evidence against
the GPU, which the xid check weighs (:data:`APPLICATION`): they repeat in more separate bursts than the profile
allows (:data:`REPEATS_COUNTED`), or a hardware XID came with them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from cluster_accept.checks.reasons import Action
from cluster_accept.vocabulary.status import Status


@dataclass(frozen=True)
class XidKind:
    """What one XID code means (from NVIDIA's XID catalogue), its rows' severity and the immediate action."""

    severity: Status
    meaning: str
    action: Action


def _job(meaning: str) -> XidKind:
    return XidKind(Status.WARN, meaning, Action.RESTART_JOB)


def _reset(meaning: str) -> XidKind:
    return XidKind(Status.FAIL, meaning, Action.RESET_GPU)


def _reboot(meaning: str) -> XidKind:
    return XidKind(Status.FAIL, meaning, Action.REBOOT_NODE)


# The one table of XIDs: severity, meaning and immediate action of each listed code.
XIDS: Mapping[int, XidKind] = {
    13: _job("graphics engine exception (usually the application's fault)"),
    31: _job("GPU memory page fault (usually the application's fault)"),
    43: _job("GPU stopped processing (commonly follows a killed job)"),
    45: _job("preemptive cleanup (commonly follows a killed job)"),
    48: _reset("double-bit ECC error"),
    61: _reset("internal micro-controller breakpoint"),
    62: _reset("internal micro-controller halt"),
    63: _reset("row remapping event (a row remap is pending until the GPU is reset)"),
    64: _reset("row remapping failure (the remap was not recorded)"),
    74: _reset("NVLink error"),
    79: _reboot("GPU has fallen off the bus"),
    92: XidKind(Status.WARN, "high single-bit ECC error rate", Action.NONE),
    94: _reset("contained ECC error (the job was stopped; the reset applies the remap)"),
    95: _reset("uncontained ECC error"),
    109: _job("context switch timeout"),
    119: _reset("GSP RPC timeout"),
    120: _reset("GSP error"),
    121: _reset("C2C link error"),
    136: _reset("ECC error in the GPU's internal memory"),
    140: _reset("unrecovered ECC error"),
    143: _reboot("GPU initialization failure"),
    154: _reset("GPU recovery action changed (the line names the action)"),
}
UNLISTED = XidKind(Status.FAIL, "see NVIDIA's XID catalogue", Action.CHECK_NODE)  # an XID the table does not list
# The XIDs the catalogue attributes to the application (restart the job): they warn on their own.
APPLICATION: frozenset[int] = frozenset(code for code, kind in XIDS.items() if kind.action is Action.RESTART_JOB)
# Those counted when a GPU repeats them: not XID 45, which the driver logs whenever a job with work on the GPU
# is killed (Ctrl-C, scancel, a time limit): counted, it would drain a busy node for its users' cancellations.
REPEATS_COUNTED: frozenset[int] = APPLICATION - {45}
ADVICE: Mapping[Action, str] = {
    Action.NONE: "nothing to do unless it repeats",
    Action.RESTART_JOB: "restart the job; the GPU is healthy unless it repeats with other jobs",
    Action.RESET_GPU: "reset the GPU (drain the node, nvidia-smi -r); if it repeats after the reset, replace the GPU",
    Action.REBOOT_NODE: "reboot the node; if it repeats after the reboot, replace the GPU",
    Action.CHECK_NODE: "read the kernel log around it, then rerun",
}
# XID 154's message names the recovery it needs: the first of these found in the line wins.
_RECOVERY = (
    (re.compile(r"reboot", re.IGNORECASE), Action.REBOOT_NODE),
    (re.compile(r"reset", re.IGNORECASE), Action.RESET_GPU),
)


def xid_kind(code: int, text: str = "") -> XidKind:
    """The catalogue's entry for XID ``code``; for XID 154 the action its message names."""
    kind = XIDS.get(code, UNLISTED)
    if code == 154:
        for pattern, action in _RECOVERY:
            if pattern.search(text):
                return XidKind(kind.severity, kind.meaning, action)
    return kind


def xid_reason(code: int, text: str = "") -> str:
    """The reason code of XID ``code``'s row: ``xid_79`` for a listed XID, ``xid_unlisted`` otherwise; XID 154
    asking for a reboot is ``xid_154_reboot`` (its own declared action)."""
    if code == 154 and xid_kind(code, text).action is Action.REBOOT_NODE:
        return "xid_154_reboot"
    return f"xid_{code}" if code in XIDS else "xid_unlisted"


# SXIDs (the NVSwitch driver's errors): the line says whether the error is fatal to the fabric.
SXID_FATAL = XidKind(
    Status.FAIL,
    "a fatal NVSwitch error: the fabric stopped; reboot the node (its GPUs and NVSwitches are reset together); "
    "if it repeats after the reboot, have the baseboard serviced",
    Action.REBOOT_NODE,
)
SXID_NONFATAL = XidKind(
    Status.WARN, "a non-fatal NVSwitch error: the fabric recovered; nothing to do unless it repeats", Action.NONE
)
SXID_UNCLASSIFIED = XidKind(
    Status.WARN,
    "an NVSwitch error whose line says neither Fatal nor Non-fatal: read it in the evidence",
    Action.CHECK_NODE,
)
