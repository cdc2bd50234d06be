"""Typed reason codes: what a row's reason means to an operator, how bad it is, and what to do about it.

Every check and probe module declares the reasons it emits in one place, beside the code that emits them::

    REASONS = declare(
        Reason("version_mismatch", Status.FAIL, "the driver differs from the profile's", Action.FIX_CONFIG),
        ...
    )

Reasons any check may emit (``ok``, ``drift``, ``command_timeout``, ``unparsable_output`` …) are declared
once here, in :data:`COMMON`, and an unreachable node's causes (check ``ssh``) in :data:`SSH_REASONS`. A
check's own declaration of a common code wins for that check (``nvidia_smi_failed`` is a ``skip`` where
other checks judge the node). The report's suggested actions and wording come from these declarations
(:class:`ReasonCatalog`); nothing guesses from the spelling of a code.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from cluster_accept.vocabulary.status import Status


class Action(str, enum.Enum):
    """The closed set of actions a report suggests, for whoever fixes the node."""

    NONE = "none"
    RESTART_JOB = "restart the job"
    RESET_GPU = "reset GPU"
    REBOOT_NODE = "reboot node"
    REPLACE_GPU = "replace GPU"
    RESEAT_CABLE = "reseat cable"
    FIX_CONFIG = "fix config"
    CHECK_NODE = "check node"
    RERUN = "rerun"


class FindingKind(str, enum.Enum):
    """What a finding says of a node, for ``--drain`` (:mod:`ops.repeats`): a *hard* fact drains at once; a
    *relative* one (a figure judged against a floor, the node's peers or its own past, or a setting against the
    cluster's majority) drains once it repeats, since a co-tenant, a throttle event or a shifting reference can
    make it once on a healthy node."""

    HARD = "hard"  # a GPU missing, an ECC error, an XID, a port down, the node out of reach, a probe that crashed
    RELATIVE = "relative"  # a straggler, a figure below its floor or its own history, a slow pair or rail, drift


@dataclass(frozen=True)
class Reason:
    """One reason code: ``severity`` is the status its rows carry by default (a profile may soften a
    relative verdict to a warning); ``explanation`` is one line an operator understands; ``kind`` whether
    ``--drain`` waits for the finding to repeat (:class:`FindingKind`), declared here, beside the code, so a new
    check or probe classifies its own findings."""

    code: str
    severity: Status
    explanation: str
    action: Action = Action.NONE
    kind: FindingKind = FindingKind.HARD


def declare(*reasons: Reason) -> Mapping[str, Reason]:
    """A module's reasons by code; a code declared twice is a bug in that module."""
    found: dict[str, Reason] = {}
    for reason in reasons:
        if reason.code in found:
            raise ValueError(f"reason {reason.code!r} declared twice")
        found[reason.code] = reason
    return MappingProxyType(found)


_SESSION_FAILED = Reason(
    "session_failed",
    Status.ERROR,
    "the node's SSH session broke before its commands ran: rerun",
    Action.RERUN,
)

# Reasons any check or probe may emit: outcomes of running a command, and drift from the cluster.
COMMON = declare(
    Reason("ok", Status.PASS, "as expected"),
    Reason("recorded", Status.PASS, "recorded for comparison; nothing to judge it against"),
    Reason(
        "no_expectation",
        Status.NOT_JUDGED,
        "a figure measured with nothing to judge it against: the profile sets no minimum, none derives from the "
        "node's hardware, and no peer measured it; write the key the row names in the profile",
        Action.FIX_CONFIG,
    ),
    Reason(
        "drift",
        Status.FAIL,
        "differs from the value most nodes of the cluster have: align the configuration",
        Action.FIX_CONFIG,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "no_output",
        Status.ERROR,
        "the command did not report (the session ended before it finished): rerun",
        Action.RERUN,
    ),
    Reason(
        "command_timeout",
        Status.TIMEOUT,
        "the command hung and was killed: look for a hung driver (dmesg)",
        Action.CHECK_NODE,
    ),
    Reason(
        "parser_crashed",
        Status.ERROR,
        "the output could not be read: rerun, and keep the raw output for a bug report",
        Action.RERUN,
    ),
    Reason(
        "unparseable",
        Status.ERROR,
        "the output could not be read: rerun, and keep the raw output for a bug report",
        Action.RERUN,
    ),
    Reason(
        "nvidia_smi_failed",
        Status.ERROR,
        "nvidia-smi fails: the driver is not loaded or not installed",
        Action.FIX_CONFIG,
    ),
    Reason(
        "straggler_unconfirmed",
        Status.WARN,
        "far below its peers in the stage, but not when measured again alone: a transient load (a co-tenant, a "
        "throttle event); see the other findings on the node, and watch it in the next runs",
        Action.RERUN,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "inconclusive",
        Status.WARN,
        "below its peers or its own history by more than straggler_pct, but inside the figure's measured noise "
        "(the peers' spread, its repeats, the cluster's calibration): the difference cannot be told from the "
        "spread; measure again with nothing else running on the nodes, and watch it in the next runs",
        Action.RERUN,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "regression",
        Status.FAIL,
        "well below this node's own recent runs, beyond their spread and the figure's noise, and still so when "
        "measured again beside a control node that did not move: the settings that changed since its last accepted "
        "run are searched for the cause (the job_settings rows); where none is proved, compare clocks, power and "
        "temperature in the evidence",
        Action.CHECK_NODE,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "moved_with_cluster",
        Status.WARN,
        "below this node's own recent runs, together with most nodes of the cluster: the cluster or the machine "
        "moved (a driver, firmware or setting changed for all, a load beside the run), not this node; the detail "
        "names what changed between the runs",
        Action.RERUN,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "counter_grew",
        Status.WARN,
        "an error counter grew since the node's previous run: watch it, reseat if it keeps growing",
        Action.RESEAT_CABLE,
    ),
    Reason(
        "counter_reset",
        Status.WARN,
        "an error counter is lower than at the node's previous run: it was cleared since (a reboot, a driver "
        "reload, a counter reset), so whether it grew before the clear cannot be told; this run is the next base",
    ),
    Reason(
        "counter_saturated",
        Status.WARN,
        "an error counter sits at the most it can hold: the hardware stopped counting, so whether it still grows "
        "cannot be told until it is cleared; that many errors since the last clear is itself a link to reseat",
        Action.RESEAT_CABLE,
    ),
    Reason(
        "counter_impossible",
        Status.WARN,
        "an error counter's value cannot be a count it holds (not a number, negative, above its maximum): whether "
        "it grew cannot be told; read the evidence",
        Action.CHECK_NODE,
    ),
    Reason(
        "unparsable_output",
        Status.ERROR,
        "the command's output has an unexpected shape: rerun, and keep the raw output for a bug report",
        Action.RERUN,
    ),
    Reason("not_available", Status.SKIP, "nvidia-smi reports no value for this field on this GPU"),
    _SESSION_FAILED,
)

# Check ``ssh``: why no session could be opened to a node (``remote.result.UnreachableCause``, ``unknown``
# when no cause was recorded), or why the session broke before the batch ran.
SSH_REASONS = declare(
    Reason("dns", Status.UNREACHABLE, "the name does not resolve: fix DNS or the inventory address", Action.FIX_CONFIG),
    Reason("refused", Status.UNREACHABLE, "sshd is not answering: is the node up, is sshd running?", Action.CHECK_NODE),
    Reason(
        "timeout", Status.UNREACHABLE, "no answer on the network: check power and the BMC console", Action.CHECK_NODE
    ),
    Reason("no-route", Status.UNREACHABLE, "no route to the node: check its network port and VLAN", Action.CHECK_NODE),
    Reason(
        "auth",
        Status.UNREACHABLE,
        "authentication refused: install the key for the inventory's user",
        Action.FIX_CONFIG,
    ),
    Reason(
        "host-key",
        Status.UNREACHABLE,
        "the host key changed: confirm the node was re-installed, then update known_hosts",
        Action.CHECK_NODE,
    ),
    Reason(
        "protocol",
        Status.UNREACHABLE,
        "connected, but sshd did not talk SSH (often its MaxStartups limit): rerun with fewer parallel sessions",
        Action.RERUN,
    ),
    Reason("jump", Status.UNREACHABLE, "the jump host refused or dropped the connection", Action.CHECK_NODE),
    Reason(
        "session_lost",
        Status.UNREACHABLE,
        "the node went away mid-run: its connection closed, was reset or stopped answering before a command "
        "finished (a crash, a reboot, sshd killed, the network cut): check its console and kernel log",
        Action.CHECK_NODE,
    ),
    Reason("error", Status.UNREACHABLE, "the connection failed (see the detail): rerun", Action.RERUN),
    Reason("unknown", Status.UNREACHABLE, "no session could be opened, for no recorded cause: rerun", Action.RERUN),
    _SESSION_FAILED,
)

# Check ``tool``: cluster-accept itself failed on the controller for this node (a bug of ours, the controller
# out of file descriptors, its key file gone): no fact about the node, which stays untested and is never
# drained for it. The run exits 3.
TOOL_CHECK = "tool"
TOOL_REASONS = declare(
    Reason(
        "internal_error",
        Status.ERROR,
        "cluster-accept failed on the controller, not the node (the detail says where; the traceback is in "
        "the row's output): the node was not judged; rerun, and report the traceback if it repeats",
        Action.RERUN,
    ),
    Reason(
        "run_unattributed",
        Status.ERROR,
        "a multi-node run failed and no rank of it can be blamed: every rank hung alike, or each failed only of "
        "losing another (the detail says what each rank did): the nodes were not judged by it and none is "
        "rejected for it; rerun, and if it repeats, bisect the group",
        Action.RERUN,
    ),
    Reason(
        "shard_not_finished",
        Status.ERROR,
        "the node's shard of a sharded run (run --shard-by) did not finish on the controller that ran it, or its "
        "results are not readable here (the detail says which shard, its Prefect state and its worker): the node "
        "was not judged; see that flow run in Prefect, check the worker and that --out is shared, then rerun",
        Action.RERUN,
    ),
)


UNDECLARED = Reason("undeclared", Status.ERROR, "a reason no module declares: rerun and compare", Action.RERUN)


@dataclass(frozen=True)
class ReasonCatalog:
    """Every declared reason by ``check:code``, and the common ones by code."""

    by_check: Mapping[str, Mapping[str, Reason]] = field(default_factory=dict)
    common: Mapping[str, Reason] = field(default_factory=lambda: COMMON)

    def lookup(self, check: str, code: str) -> Reason:
        """The declaration of ``check:code``: the check's own first, then the common one."""
        own = self.by_check.get(check, {})
        return own.get(code) or self.common.get(code) or UNDECLARED

    def declared(self, check: str, code: str) -> bool:
        return self.lookup(check, code) is not UNDECLARED

    def kind(self, reason: str) -> FindingKind:
        """The kind of a verdict's reason (``check:code``), as the module that declares it says (the check's
        own declaration first, then the common one); a reason nobody declares is hard, so it drains at once, as
        every finding did before repeats were counted."""
        check, _, code = reason.partition(":")
        return self.lookup(check, code).kind


def catalog(declarations: Iterable[tuple[str, Mapping[str, Reason]]]) -> ReasonCatalog:
    """A catalogue from ``(check name, REASONS)`` pairs (several modules may speak for one check); the
    ``ssh`` and ``tool`` reasons are always in it, since every stage reports an unreachable node, and a failure
    of the tool's own, the same way."""
    by_check: dict[str, dict[str, Reason]] = {"ssh": dict(SSH_REASONS), TOOL_CHECK: dict(TOOL_REASONS)}
    for check, reasons in declarations:
        by_check.setdefault(check, {}).update(reasons)
    return ReasonCatalog({check: MappingProxyType(r) for check, r in by_check.items()})
