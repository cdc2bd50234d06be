"""XID errors in the kernel log since boot: the driver's own record of GPU faults (NVRM ``Xid`` lines).

``dmesg`` is tried first; where the kernel log is restricted (``dmesg: read kernel buffer failed: Operation
not permitted``) or the ring buffer comes back empty, ``journalctl -k -b`` is asked instead. Each source's
section says which tool answered and its exit status. The log is filtered on the node (the first lines, as
evidence of what the tool printed, and the ``NVRM: Xid`` lines): a kernel log since boot can be megabytes.

An unreadable log is a ``skip`` with reason ``kernel_log_unreadable``, never a silent pass. What each XID
means, how bad it is and what to do about it is :data:`XIDS`, the one table: XIDs 43 and 45 follow a killed
or crashed job on a healthy GPU, so they warn; hardware faults fail with *replace GPU*; other listed XIDs
fail with *check node*. An XID the table does not list fails the node with reason ``xid_unlisted`` (its
code is in the row's item), so every reason the check emits is declared.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from cluster_accept.checks.base import Check, CheckRow, ClusterView, Status, error_row
from cluster_accept.checks.reasons import Action, Reason, declare
from cluster_accept.inventory.model import Profile
from cluster_accept.vocabulary.secrets import masked_quote

NAME = "xid"
TIMEOUT_S = 60
_HEAD_LINES = 8  # lines shown from the start of each source: what the tool said when it did not answer
_MAX_XID_LINES = 1000
# awk: drop blank lines; print the first _HEAD_LINES lines and up to _MAX_XID_LINES Xid lines, each once;
# then the source's exit status and its line counts. ``### rc=`` comes from the shell, after the log.
_AWK = (
    "/^### rc=-?[0-9]+$/ { rc = $0; next } /^[ \\t\\r]*$/ { next } "
    f"{{ n++; if ($0 ~ /NVRM: Xid/) {{ if (++x <= {_MAX_XID_LINES}) {{ print; next }} }} "
    f"if (n <= {_HEAD_LINES}) print }} "
    'END { print (rc == "" ? "### rc=?" : rc); printf "### lines=%d xid=%d\\n", n, x }'
)
COMMAND = (
    f"ca_awk='{_AWK}'; "
    "ca_log=$(dmesg 2>&1); ca_rc=$?; "
    "echo '### source=dmesg'; "
    'printf \'%s\\n### rc=%s\\n\' "$ca_log" "$ca_rc" | awk "$ca_awk"; '
    'if [ "$ca_rc" -ne 0 ] || [ -z "$ca_log" ]; then '
    "ca_log=; echo '### source=journalctl'; "
    '{ journalctl -k -b --no-pager 2>&1; ca_rc=$?; echo; echo "### rc=$ca_rc"; } | awk "$ca_awk"; '
    "fi; echo '### done'"
)

_SOURCE = re.compile(r"^### source=(\S+)$")
_RC = re.compile(r"^### rc=(-?\d{1,18}|\?)$")
_COUNTS = re.compile(r"^### lines=(\d{1,18}) xid=(\d{1,18})$")
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[^)]*)\):\s*(?P<code>\d{1,9})(?!\d)\s*,?\s*(?P<text>.*?)\s*$")
# What journalctl or dmesg print around (or instead of) log lines: not evidence that the log was read.
_META = re.compile(
    r"^(-- |Hint: |\s)|No journal files|insufficient permissions|not seeing messages|"
    r"Operation not permitted|Permission denied",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class XidKind:
    """What one XID code means to an operator (from NVIDIA's XID catalog) and what its rows carry."""

    severity: Status
    meaning: str
    action: Action


def _job(meaning: str) -> XidKind:
    return XidKind(Status.WARN, meaning, Action.NONE)


def _hardware(meaning: str) -> XidKind:
    return XidKind(Status.FAIL, meaning, Action.REPLACE_GPU)


def _node(meaning: str) -> XidKind:
    return XidKind(Status.FAIL, meaning, Action.CHECK_NODE)


# The one table of XIDs: severity, meaning and action of each listed code.
XIDS: Mapping[int, XidKind] = {
    13: _node("graphics engine exception"),
    31: _node("GPU memory page fault"),
    43: _job("GPU stopped processing (commonly follows a killed job)"),
    45: _job("preemptive cleanup (commonly follows a killed job)"),
    48: _hardware("double-bit ECC error"),
    63: _hardware("row remapping event (ECC page retirement recorded)"),
    64: _hardware("row remapping failure (ECC page retirement not recorded)"),
    74: _hardware("NVLink error"),
    79: _hardware("GPU has fallen off the bus"),
    92: _hardware("high single-bit ECC error rate"),
    94: _hardware("contained ECC error"),
    95: _hardware("uncontained ECC error"),
    119: _hardware("GSP RPC timeout"),
    120: _hardware("GSP error"),
    140: _hardware("unrecovered ECC error"),
}
UNLISTED = _node("see NVIDIA's XID catalog")  # an XID the table does not list
_ADVICE = {
    Action.NONE: "follows a killed or crashed job on a healthy GPU; nothing to do unless it repeats",
    Action.REPLACE_GPU: "a GPU hardware fault",
    Action.CHECK_NODE: "read the kernel log around it, then rerun",
}


def xid_reason(code: int) -> str:
    """The reason code of XID ``code``'s row: ``xid_79`` for a listed XID, ``xid_unlisted`` otherwise."""
    return f"xid_{code}" if code in XIDS else "xid_unlisted"


REASONS = declare(
    *(
        Reason(f"xid_{code}", kind.severity, f"XID {code}: {kind.meaning}: {_ADVICE[kind.action]}", kind.action)
        for code, kind in XIDS.items()
    ),
    Reason(
        "xid_unlisted",
        UNLISTED.severity,
        f"an XID this check's table does not list (the item names it): {_ADVICE[UNLISTED.action]}",
        UNLISTED.action,
    ),
    Reason(
        "xid_unparsed",
        Status.FAIL,
        "kernel log lines name an XID without a readable code: read them in the evidence",
        Action.CHECK_NODE,
    ),
    Reason(
        "kernel_log_unreadable",
        Status.SKIP,
        "neither dmesg nor journalctl could be read by the inventory's user: XIDs were not judged",
    ),
)


@dataclass(frozen=True)
class XidEvent:
    code: int
    pci: str  # the bus id as the driver prints it, e.g. '0000:00:07'
    text: str  # everything after the code: 'pid=..., name=..., <message>'
    line: str


@dataclass(frozen=True)
class SourceRead:
    """What one tool printed: its exit status, counts, and the lines the node kept."""

    name: str
    rc: int | None
    lines: int
    xid_lines: int
    shown: list[str] = field(default_factory=list)

    @property
    def readable(self) -> bool:
        if self.rc != 0:
            return False
        if self.lines > len(self.shown):  # lines were left out: more than the head, so a real log
            return True
        return any(not _META.search(line) for line in self.shown)

    def summary(self) -> str:
        said = "; ".join(line.strip() for line in self.shown[:3] if not _XID.search(line))
        return f"{self.name} rc={'?' if self.rc is None else self.rc}, {_plural(self.lines, 'line')}" + (
            f": {said}" if said else ""
        )


@dataclass(frozen=True)
class KernelLog:
    source: str | None = None  # the tool whose log was judged
    events: list[XidEvent] = field(default_factory=list)
    xid_lines: int = 0  # Xid lines in the log, also those the node left out beyond the cap
    unparsed: list[str] = field(default_factory=list)  # 'NVRM: Xid' lines without a code
    reads: list[SourceRead] = field(default_factory=list)
    unreadable: str | None = None  # why no source could be read
    error: str | None = None
    raw: str = ""


def _sections(stdout: str) -> tuple[list[SourceRead], str | None]:
    reads: list[SourceRead] = []
    name: str | None = None
    shown: list[str] = []
    rc: int | None = None
    done = False
    for line in stdout.splitlines():
        if name is None:
            source = _SOURCE.match(line)
            if source:
                name, shown, rc = source.group(1), [], None
            elif line == "### done":
                done = True
            elif line.strip():
                return reads, f"unexpected line outside a source section: {masked_quote(line)}"
            continue
        rc_match, counts = _RC.match(line), _COUNTS.match(line)
        if rc_match:
            rc = None if rc_match.group(1) == "?" else int(rc_match.group(1))
        elif counts:
            reads.append(SourceRead(name, rc, int(counts.group(1)), int(counts.group(2)), shown))
            name = None
        elif not line.startswith("### "):
            shown.append(line)
        else:
            return reads, f"unexpected marker {masked_quote(line)} in the {name} section"
    if name is not None or not done:
        return reads, "output truncated before the end of the kernel log sections"
    if not reads:
        return reads, "no kernel log source reported"
    return reads, None


def parse(stdout: str, exit_code: int | None = 0) -> KernelLog:
    reads, problem = _sections(stdout)
    if problem:
        return KernelLog(reads=reads, error=problem, raw=stdout)
    chosen = next((r for r in reads if r.readable), None)
    if chosen is None:
        why = " / ".join(r.summary() for r in reads)
        return KernelLog(reads=reads, unreadable=why, raw=stdout)
    events: list[XidEvent] = []
    unparsed: list[str] = []
    for line in chosen.shown:
        if "NVRM: Xid" not in line:
            continue
        match = _XID.search(line)
        if match:
            events.append(XidEvent(int(match.group("code")), match.group("pci"), match.group("text"), line))
        else:
            unparsed.append(line)
    return KernelLog(
        source=chosen.name,
        events=events,
        xid_lines=max(chosen.xid_lines, len(events) + len(unparsed)),
        unparsed=unparsed,
        reads=reads,
        raw=stdout,
    )


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def evaluate(model: KernelLog, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    if model.unreadable is not None:
        return [
            CheckRow(
                NAME,
                "kernel_log",
                Status.SKIP,
                "kernel_log_unreadable",
                None,
                "readable kernel log",
                f"neither dmesg nor journalctl could be read: {model.unreadable}",
            )
        ]
    if not model.events and not model.unparsed:
        return [
            CheckRow(NAME, "kernel_log", Status.PASS, "ok", "0 XID events", "0 XID events", f"read with {model.source}")
        ]
    rows: list[CheckRow] = []
    by_code: dict[int, list[XidEvent]] = {}
    for event in model.events:
        by_code.setdefault(event.code, []).append(event)
    cap = len(model.events) + len(model.unparsed)
    beyond = f" ({model.xid_lines} Xid lines in the log, the first {cap} read)" if model.xid_lines > cap else ""
    for code in sorted(by_code):
        events = by_code[code]
        pcis = sorted({e.pci for e in events})
        kind = XIDS.get(code, UNLISTED)
        lines = "\n".join(e.line for e in events[:3])
        rows.append(
            CheckRow(
                NAME,
                f"xid_{code}",
                kind.severity,
                xid_reason(code),
                f"{_plural(len(events), 'event')} on PCI {', '.join(pcis)}",
                "0 XID events",
                f"XID {code}: {kind.meaning}; from {model.source}{beyond}\n{lines}",
            )
        )
    if model.unparsed:
        rows.append(
            CheckRow(
                NAME,
                "xid_unparsed",
                Status.FAIL,
                "xid_unparsed",
                _plural(len(model.unparsed), "line"),
                "0 XID events",
                f"Xid lines without a readable code; from {model.source}\n" + "\n".join(model.unparsed[:3]),
            )
        )
    return rows


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    timeout_s=TIMEOUT_S,
)
