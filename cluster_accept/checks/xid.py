"""XID and SXID errors in the kernel log new since the node's previous run: the driver's own record of GPU
faults (NVRM ``Xid`` lines) and of NVSwitch faults (``nvidia-nvswitchN: SXid`` lines).

The command also prints the boot's id and the uptime at which the log was read: the run keeps them
(:attr:`Check.marks`), and the node's next run judges only events logged after them in the same boot
(:func:`since`); an event logged before is shown as seen before, and passes: one job's XID 13 is judged once.
A hardware event (a failing XID not of the application's making, a fatal SXID) is never marked as judged
within its boot (:func:`marks` stops before it) and never passed as seen before, whatever the mark says (a
history row or a node's marks file can be edited): whatever became of the verdict that found it (a drain the
controller never got, a check run by hand), every later check of that boot fails it again, until the node
reboots. Without a previous run (or after a reboot) every event since boot is new. A mark that cannot be (not
a number, not finite, negative, after this read's uptime) is named in a warning row (``mark_impossible``) and
not used: every event since boot is then judged as new, so a wrong mark never passes an event.

``dmesg`` is tried first; where the kernel log is restricted (``dmesg: read kernel buffer failed: Operation
not permitted``) or the ring buffer comes back empty, ``journalctl -k -b`` is asked instead. Each source's
section says which tool answered and its exit status. The log is filtered on the node (the first lines, as
evidence of what the tool printed, and the driver's ``NVRM: Xid`` and ``SXid`` lines): a kernel log since boot
can be megabytes. A driver's line is one whose message starts with ``NVRM: Xid (PCI:<bus id>):`` (or
``nvidia-nvswitchN: SXid (PCI:<bus id>):``) right after the tool's stamp, host and ``kernel:`` tag: the kernel
starts other messages with a process's own name (``NAME[pid]: segfault at …``), which any user sets to
``NVRM: Xid ():79``; that line, and the name anywhere else on a line, is not an XID. The newest 1,000
application XID lines and the newest 1,000 others are kept apart, so no flood of one job's XIDs hides a
hardware line.

An unreadable log is a ``skip`` with reason ``kernel_log_unreadable``, never a silent pass. What each XID
means, how bad it is and what to do about it is :data:`XIDS`, the one table: XIDs 43 and 45 follow a killed
or crashed job on a healthy GPU, so they warn; hardware faults fail with *replace GPU*; other listed XIDs
fail with the action NVIDIA's XID catalogue gives (restart the job, reset the GPU, reboot the node; a fault
that repeats after it: replace the GPU). The XIDs the catalogue attributes to the application (13, 31, 43, 45,
109: :data:`APPLICATION`) warn: one user's faulty job does not drain a healthy node. They fail only with
evidence against the GPU, over the profile's ``thresholds.app_xid_window_h``: the GPU logged them in more
separate bursts (events less than a minute apart are one job's; XID 45, logged for every killed job, is not
counted) than ``thresholds.app_xid_max`` (``xid_app_repeated``), or a hardware XID or a fatal SXID was
logged in that window too (``xid_app_with_hardware``). An XID the table does not list fails the node with reason
``xid_unlisted`` (its code is in the row's item), so every reason the check emits is declared. A fatal SXID
(the line says ``Fatal``) fails the node (the NVSwitch fabric needs a reset: reboot the node); a non-fatal one
warns.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from cluster_accept.checks._xid_catalogue import (
    ADVICE,
    APPLICATION,
    REPEATS_COUNTED,
    SXID_FATAL,
    SXID_NONFATAL,
    SXID_UNCLASSIFIED,
    UNLISTED,
    XIDS,
    XidKind,
    xid_kind,
    xid_reason,
)
from cluster_accept.checks.contract import (
    SEEN_BEFORE,
    Action,
    Check,
    CheckRow,
    ClusterView,
    Link,
    Profile,
    Reason,
    Status,
    dead,
    declare,
    error_row,
    fault,
    healthy,
    read_mark,
)
from cluster_accept.vocabulary.text import quote

NAME = "xid"
TIMEOUT_S = 60
_HEAD_LINES = 8  # lines shown from the start of each source: what the tool said when it did not answer
_MAX_XID_LINES = 1000  # per kind: the application's XIDs, and every other XID and SXID line
_BURST_GAP_S = 60.0  # application XIDs of one GPU less than this apart are one burst: one job's fault
_PID = re.compile(r"\bpid=([^,\s]{1,40})")
_HEX = "[0-9a-fA-F]"
# The bus id as the driver prints it (domain:bus:device; an NVSwitch's with its function), at least 10 characters:
# more than a process name (15 characters, set by the process itself) can hold after 'NVRM: Xid ('.
_BUS = f"{_HEX}{_HEX}{_HEX}{_HEX}+:{_HEX}{_HEX}:{_HEX}{_HEX}(\\.[0-7])?"
# What may come before the driver's text on a line the command prints, and nothing else: dmesg's stamp (and the
# printk caller where the kernel adds it), journalctl's stamp (short-monotonic) or date (short), its host and the
# 'kernel:' tag. An XID is the start of its message: the kernel starts other messages with a process's own name
# (a segfault: 'NAME[pid]: segfault at ...'), and a process may name itself 'NVRM: Xid ():79'. A message's
# further lines are indented by both tools, so no text inside a message starts a line of its own.
_PREFIX = (
    "^(\\[ *[0-9]+\\.[0-9]+\\] +(\\[ *[TC][0-9]+\\] +)?"
    "|[A-Z][a-z][a-z] [ 0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9] )?([A-Za-z0-9_.-]+ kernel: )?"
)
# POSIX extended expressions without intervals (mawk reads them too), the same to awk and to Python's re.
_XID_LINE = f"{_PREFIX}NVRM: Xid \\((PCI:)?{_BUS}\\):"
_SXID_LINE = f"{_PREFIX}nvidia-nvswitch[0-9]+: SXid \\((PCI:)?{_BUS}\\):"
_APP_LINE = f"{_XID_LINE}[ \\t]*(" + "|".join(str(c) for c in sorted(APPLICATION)) + ")([^0-9]|$)"
# awk: drop blank lines; print the first _HEAD_LINES other lines, then the *last* _MAX_XID_LINES Xid lines (the
# driver's XID and SXID lines, _XID_LINE and _SXID_LINE: no process's name takes a place among them) of each
# kind (the newest: a log full of one job's XIDs must not hide a later hardware XID past the cap), each once, in
# the log's order; the application's XIDs are kept apart from the others (hardware XIDs, SXIDs, lines without a
# code), so no flood of them hides a hardware line logged before it; then the source's exit status and its line
# counts. ``### rc=`` comes from the shell, after the log.
_AWK = (
    "/^### rc=-?[0-9]+$/ { rc = $0; next } /^[ \\t\\r]*$/ { next } "
    f"{{ n++; if ($0 ~ /{_XID_LINE}/ || $0 ~ /{_SXID_LINE}/) {{ x++; "
    f"if ($0 ~ /{_APP_LINE}/) {{ a++; ak[a % {_MAX_XID_LINES}] = $0; "
    f"an[a % {_MAX_XID_LINES}] = x }} else {{ h++; hk[h % {_MAX_XID_LINES}] = $0; hn[h % {_MAX_XID_LINES}] = x }} "
    f"next }} if (n <= {_HEAD_LINES}) print }} "
    f"END {{ i = (h > {_MAX_XID_LINES} ? h - {_MAX_XID_LINES} + 1 : 1); "
    f"j = (a > {_MAX_XID_LINES} ? a - {_MAX_XID_LINES} + 1 : 1); "
    f"while (i <= h || j <= a) {{ if (j > a || (i <= h && hn[i % {_MAX_XID_LINES}] < an[j % {_MAX_XID_LINES}])) "
    f"{{ print hk[i % {_MAX_XID_LINES}]; i++ }} else {{ print ak[j % {_MAX_XID_LINES}]; j++ }} }} "
    'print (rc == "" ? "### rc=?" : rc); printf "### lines=%d xid=%d\\n", n, x }'
)
COMMAND = (
    "printf '### boot=%s\\n### uptime=%s\\n' \"$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)\" "
    '"$(cut -d" " -f1 /proc/uptime 2>/dev/null)"; '
    f"ca_awk='{_AWK}'; "
    "ca_log=$(dmesg 2>&1); ca_rc=$?; "
    "echo '### source=dmesg'; "
    'printf \'%s\\n### rc=%s\\n\' "$ca_log" "$ca_rc" | awk "$ca_awk"; '
    'if [ "$ca_rc" -ne 0 ] || [ -z "$ca_log" ]; then '
    "ca_log=; echo '### source=journalctl'; "
    '{ journalctl -k -b -o short-monotonic --no-pager 2>&1; ca_rc=$?; echo; echo "### rc=$ca_rc"; } | awk "$ca_awk"; '
    "fi; echo '### done'"
)

_SOURCE = re.compile(r"^### source=(\S+)$")
_RC = re.compile(r"^### rc=(-?\d{1,18}|\?)$")
_COUNTS = re.compile(r"^### lines=(\d{1,18}) xid=(\d{1,18})$")
_KERNEL_XID = re.compile(_XID_LINE)  # a line of the driver's XID, readable or not
_KERNEL_SXID = re.compile(_SXID_LINE)
_XID = re.compile(
    f"{_PREFIX}NVRM: Xid \\((?:PCI:)?(?P<pci>{_BUS})\\):" + r"\s*(?P<code>\d{1,9})(?!\d)\s*,?\s*(?P<text>.*?)\s*$"
)
_SXID = re.compile(
    f"{_PREFIX}nvidia-nvswitch(?P<switch>[0-9]{{1,3}}): SXid \\((?:PCI:)?(?P<pci>{_BUS})\\):"
    r"\s*(?P<code>\d{1,9})(?!\d)\s*,?\s*(?:(?P<severity>Fatal|Non-fatal)\b\s*,?\s*)?(?P<text>.*?)\s*$",
    re.IGNORECASE,
)
_STAMP = re.compile(r"^\[\s*(?P<s>\d{1,10}\.\d{1,9})\]")  # seconds since boot (dmesg; journalctl short-monotonic)
_BOOT = re.compile(r"^### boot=(?P<id>[0-9a-f-]{0,64})$")
_UPTIME = re.compile(r"^### uptime=(?P<s>\d{1,10}(?:\.\d{1,9})?)?$")
# What journalctl or dmesg print around (or instead of) log lines: not evidence that the log was read.
_META = re.compile(
    r"^(-- |Hint: |\s)|No journal files|insufficient permissions|not seeing messages|"
    r"Operation not permitted|Permission denied",
    re.IGNORECASE,
)


def _xid_reason(code: int, kind: XidKind) -> Reason:
    return Reason(f"xid_{code}", kind.severity, f"XID {code}: {kind.meaning}: {ADVICE[kind.action]}", kind.action)


_REBOOT_154 = xid_kind(154, "Node Reboot Required")
REASONS = declare(
    *(_xid_reason(code, kind) for code, kind in XIDS.items()),
    Reason(
        "xid_154_reboot",
        _REBOOT_154.severity,
        f"XID 154: the driver asks for a node reboot: {ADVICE[_REBOOT_154.action]}",
        _REBOOT_154.action,
    ),  # fmt: skip
    Reason(
        "xid_unlisted",
        UNLISTED.severity,
        f"an XID this check's table does not list (the item names it): {ADVICE[UNLISTED.action]}",
        UNLISTED.action,
    ),
    Reason(
        "xid_unparsed",
        Status.FAIL,
        "kernel log lines name an XID without a readable code: read them in the evidence",
        Action.CHECK_NODE,
    ),
    Reason(
        "xid_app_repeated",
        Status.FAIL,
        "XIDs usually of the application's making (13, 31, 43, 109; not 45, logged for every killed job) on one GPU "
        "in more separate bursts than thresholds.app_xid_max within thresholds.app_xid_window_h: they follow the "
        "GPU, not one job: "
        f"{ADVICE[Action.RESET_GPU]}",
        Action.RESET_GPU,
    ),
    Reason(
        "xid_app_with_hardware",
        Status.FAIL,
        "an XID usually of the application's making logged within thresholds.app_xid_window_h of a hardware XID or "
        "a fatal SXID: part of the hardware fault; act on the hardware XID's row",
        Action.CHECK_NODE,
    ),
    Reason(
        "mark_impossible",
        Status.WARN,
        "the previous read's mark (its boot and uptime) is impossible or from the future: it was ignored and every "
        "event since boot judged as new; see whether the history or the node's marks file was edited",
    ),
    Reason("sxid_fatal", SXID_FATAL.severity, SXID_FATAL.meaning, SXID_FATAL.action),
    Reason("sxid_nonfatal", SXID_NONFATAL.severity, SXID_NONFATAL.meaning, SXID_NONFATAL.action),
    Reason("sxid_unclassified", SXID_UNCLASSIFIED.severity, SXID_UNCLASSIFIED.meaning, SXID_UNCLASSIFIED.action),
    Reason(
        SEEN_BEFORE,
        Status.PASS,
        "logged before the node's previous run, which judged it: not counted again (a node repaired since passes)",
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
    at_s: float | None = None  # seconds since boot, from the line's stamp
    switch: int | None = None  # an SXID's NVSwitch (nvidia-nvswitchN); None for an XID
    severity: str | None = None  # an SXID's 'Fatal' / 'Non-fatal' as the line says it


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
        said = "; ".join(line.strip() for line in self.shown[:3] if not _is_driver_line(line))
        return f"{self.name} rc={'?' if self.rc is None else self.rc}, {_plural(self.lines, 'line')}" + (
            f": {said}" if said else ""
        )


@dataclass(frozen=True)
class KernelLog:
    source: str | None = None  # the tool whose log was judged
    events: list[XidEvent] = field(default_factory=list)
    xid_lines: int = 0  # Xid lines in the log, also those the node left out beyond the cap
    unparsed: list[str] = field(default_factory=list)  # the driver's Xid or SXid lines without a code
    reads: list[SourceRead] = field(default_factory=list)
    unreadable: str | None = None  # why no source could be read
    error: str | None = None
    raw: str = ""
    sxids: list[XidEvent] = field(default_factory=list)
    boot_id: str | None = None  # the boot the log belongs to, and the uptime it was read at: this run's marks
    uptime_s: float | None = None
    earlier: list[XidEvent] = field(default_factory=list)  # XIDs and SXIDs logged before the previous run
    since_s: float | None = None  # the previous run's read, in seconds since this boot (None: since boot)
    ignored_mark: str | None = None  # why the previous run's mark was not used (impossible, from the future)


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
                return reads, f"unexpected line outside a source section: {quote(line)}"
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
            return reads, f"unexpected marker {quote(line)} in the {name} section"
    if name is not None or not done:
        return reads, "output truncated before the end of the kernel log sections"
    if not reads:
        return reads, "no kernel log source reported"
    return reads, None


def _header(stdout: str) -> tuple[str | None, float | None, str]:
    """The boot id and uptime the command prints first (absent from older outputs), and the rest."""
    boot: str | None = None
    uptime: float | None = None
    lines = stdout.splitlines(keepends=True)
    while lines:
        found_boot, found_uptime = _BOOT.match(lines[0].rstrip("\n")), _UPTIME.match(lines[0].rstrip("\n"))
        if found_boot:
            boot = found_boot.group("id") or None
        elif found_uptime:
            uptime = float(found_uptime.group("s")) if found_uptime.group("s") else None
        else:
            break
        lines.pop(0)
    return boot, uptime, "".join(lines)


def _is_driver_line(line: str) -> bool:
    """A line the driver logged for an XID or an SXID (its message starts the line, past the tools' prefixes, and
    names a bus id), whether or not its code can be read: a process's own name elsewhere on a line is not one."""
    return bool(_KERNEL_XID.match(line) or _KERNEL_SXID.match(line))


def _event(line: str) -> XidEvent | None:
    """An XID or SXID line as an event (its stamp in seconds since boot where the line has one)."""
    stamp = _STAMP.match(line)
    at_s = float(stamp.group("s")) if stamp else None
    sxid = _SXID.match(line)
    if sxid:
        severity = sxid.group("severity")
        return XidEvent(int(sxid.group("code")), sxid.group("pci"), sxid.group("text"), line, at_s,
                        int(sxid.group("switch")), severity.capitalize() if severity else None)  # fmt: skip
    match = _XID.match(line)
    return XidEvent(int(match.group("code")), match.group("pci"), match.group("text"), line, at_s) if match else None


def _sxid_events(lines: list[XidEvent]) -> list[XidEvent]:
    """An SXID is several lines (its severity, then its engine and data): a line without a severity that
    follows one of the same code and switch belongs to it."""
    events: list[XidEvent] = []
    for line in lines:
        if line.severity is None and any(e.code == line.code and e.switch == line.switch for e in events):
            continue
        events.append(line)
    return events


def parse(stdout: str, exit_code: int | None = 0) -> KernelLog:
    boot, uptime, body = _header(stdout)
    reads, problem = _sections(body)
    if problem:
        return KernelLog(reads=reads, error=problem, raw=stdout, boot_id=boot, uptime_s=uptime)
    chosen = next((r for r in reads if r.readable), None)
    if chosen is None:
        why = " / ".join(r.summary() for r in reads)
        return KernelLog(reads=reads, unreadable=why, raw=stdout, boot_id=boot, uptime_s=uptime)
    events: list[XidEvent] = []
    sxid_lines: list[XidEvent] = []
    unparsed: list[str] = []
    for line in chosen.shown:
        if not _is_driver_line(line):
            continue
        event = _event(line)
        if event is None:
            unparsed.append(line)
        else:
            (sxid_lines if event.switch is not None else events).append(event)
    return KernelLog(
        source=chosen.name,
        events=events,
        xid_lines=max(chosen.xid_lines, len(events) + len(sxid_lines) + len(unparsed)),
        unparsed=unparsed,
        reads=reads,
        raw=stdout,
        sxids=_sxid_events(sxid_lines),
        boot_id=boot,
        uptime_s=uptime,
    )


def marks(model: KernelLog) -> dict[str, str]:
    """Where this read of the kernel log ended (the boot, the uptime): the node's next run judges what follows.
    A hardware event this read found new (:func:`_is_hardware`) stops the mark before it, whatever this read's
    verdict led to (a drain that failed, a check run by hand): the next read of the boot judges it again and
    fails again, until a reboot. The mark is then the last event judged before it (cut down to the mark's
    precision, never rounded past it), else the previous mark, else none (every event since boot is new)."""
    if model.error or model.unreadable is not None or not model.boot_id or model.uptime_s is None:
        return {}
    stamps = [(e.at_s, _is_hardware(e)) for e in [*model.events, *model.sxids] if e.at_s is not None]
    first = min((at for at, hardware in stamps if hardware), default=None)
    if first is None:
        return {"boot_id": model.boot_id, "uptime_s": f"{model.uptime_s:.3f}"}
    kept = model.since_s if model.since_s is not None and model.since_s < first else None  # never past it
    before = max((at for at, _ in stamps if at < first), default=kept)
    if before is None:
        return {"boot_id": model.boot_id}
    return {"boot_id": model.boot_id, "uptime_s": f"{math.floor(before * 1000) / 1000:.3f}"}


def since(model: KernelLog, previous: Mapping[str, str]) -> KernelLog:
    """``model`` with the events logged at or before the previous run's read of the same boot moved to
    ``earlier``, a hardware event (:func:`_is_hardware`) never: :func:`marks` stops before the first one, so a
    mark past one was not written by a run (a history row or a marks file edited) and passes nothing of it.
    After a reboot (another boot id), or without the previous marks, every event is new; a line without a stamp
    is new (nothing says it is old). An uptime mark this read cannot vouch for (not a number, not finite,
    negative, after this read's uptime, or this read has none) is named in ``ignored_mark`` and not used: every
    event is new."""
    if "uptime_s" not in previous:
        return model
    if not model.boot_id or previous.get("boot_id") != model.boot_id:
        return model  # another boot's marks say nothing of this one
    mark = read_mark(previous, "uptime_s", model.uptime_s)
    if mark.value is None:
        return replace(model, ignored_mark=mark.problem)
    then = mark.value
    old = [e for e in [*model.events, *model.sxids] if e.at_s is not None and e.at_s <= then and not _is_hardware(e)]
    return replace(
        model,
        events=[e for e in model.events if e not in old],
        sxids=[e for e in model.sxids if e not in old],
        earlier=old,
        since_s=then,
    )


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _window(model: KernelLog) -> str:
    return f"since the previous run (read at {model.since_s:.0f} s after boot)" if model.since_s is not None else (
        "since boot")  # fmt: skip


def _window_of(model: KernelLog, events: list[XidEvent]) -> str:
    """The window a row's events were judged in, and where a hardware event was logged before the previous read's
    mark (a mark no run writes: :func:`marks` stops before one), that it was judged again."""
    if model.since_s is not None and any(e.at_s is not None and e.at_s <= model.since_s for e in events):
        return f"{_window(model)}; logged before it and judged again: a mark never passes a hardware event"
    return _window(model)


def evaluate(model: KernelLog, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    if model.unreadable is not None:
        why = f"neither dmesg nor journalctl could be read: {model.unreadable}"
        return [CheckRow(NAME, "kernel_log", Status.SKIP, "kernel_log_unreadable", None, "readable kernel log", why)]
    rows = _xid_rows(model, profile) + _sxid_rows(model) + _earlier_rows(model)
    if model.unparsed:
        lines = "\n".join(model.unparsed[:3])
        said = f"Xid lines without a readable code; from {model.source}\n{lines}"
        observed = _plural(len(model.unparsed), "line")
        rows.append(CheckRow(NAME, "xid_unparsed", Status.FAIL, "xid_unparsed", observed, "0 XID events", said))
    if not model.events and not model.sxids and not model.unparsed:
        said = f"read with {model.source}, {_window(model)}; 0 SXID events"
        rows.insert(0, CheckRow(NAME, "kernel_log", Status.PASS, "ok", "0 XID events", "0 XID events", said))
    if model.ignored_mark is not None:
        said = f"the previous read's mark was ignored ({model.ignored_mark}): every event since boot was judged as new"
        expected = "a read of this boot at or before this read's uptime"
        rows.append(CheckRow(NAME, "mark", Status.WARN, "mark_impossible", model.ignored_mark, expected, said))
    return rows


def _is_hardware(event: XidEvent) -> bool:
    """An event that fails the node on its own and is not the application's: a fatal SXID, or an XID that fails."""
    if event.switch is not None:
        return event.severity == "Fatal"
    return event.code not in APPLICATION and xid_kind(event.code, event.text).severity is Status.FAIL


def _bursts(events: list[XidEvent]) -> dict[str, int]:
    """Each GPU's separate bursts of ``events``: stamped events less than :data:`_BURST_GAP_S` apart are one
    burst (one job's fault, whatever its processes); unstamped ones count once per process they name."""
    per_gpu: dict[str, list[XidEvent]] = {}
    for event in events:
        per_gpu.setdefault(event.pci, []).append(event)
    counts: dict[str, int] = {}
    for pci, found in per_gpu.items():
        stamps = sorted(e.at_s for e in found if e.at_s is not None)
        runs = sum(1 for i, at in enumerate(stamps) if i == 0 or at - stamps[i - 1] > _BURST_GAP_S)
        unstamped = {(pid.group(1) if (pid := _PID.search(e.text)) else e.line) for e in found if e.at_s is None}
        counts[pci] = runs + len(unstamped)
    return counts


@dataclass(frozen=True)
class _AppContext:
    """What weighs against a GPU beside its application XIDs within the profile's window."""

    hardware: list[str]  # the hardware XIDs and fatal SXIDs logged in the window, named ('XID 79')
    bursts: dict[str, int]  # GPU (PCI) -> its separate bursts of application XIDs in the window
    limit: int
    window: str  # 'the last 24 h'


def _in_window(event: XidEvent, start_s: float | None) -> bool:
    return start_s is None or event.at_s is None or event.at_s >= start_s


def _app_context(model: KernelLog, profile: Profile) -> _AppContext:
    """Over ``thresholds.app_xid_window_h`` before this read (new events and those seen before alike; an
    unstamped one, or all without this read's uptime, counts as in it)."""
    hours = profile.thresholds.app_xid_window_h
    start = None if model.uptime_s is None else model.uptime_s - hours * 3600
    logged = [e for e in [*model.events, *model.sxids, *model.earlier] if _in_window(e, start)]
    hardware = sorted({f"{'SXID' if e.switch is not None else 'XID'} {e.code}" for e in logged if _is_hardware(e)})
    bursts = _bursts([e for e in logged if e.switch is None and e.code in REPEATS_COUNTED])
    return _AppContext(hardware, bursts, profile.thresholds.app_xid_max, f"the last {hours:g} h")


def _app_judgement(code: int, events: list[XidEvent], context: _AppContext) -> tuple[Status, str | None, str]:
    """An application XID's row: a warning, unless a hardware XID came with it or its GPU repeats it."""
    if context.hardware:
        said = f"with {', '.join(context.hardware)} in {context.window}: not the application's alone"
        return Status.FAIL, "xid_app_with_hardware", said
    if code not in REPEATS_COUNTED:
        return Status.WARN, None, "logged for every job killed with work on the GPU: not counted as a repeat"
    gpus = sorted({e.pci for e in events})
    over = [f"{context.bursts.get(pci, 0)} on PCI {pci}" for pci in gpus if context.bursts.get(pci, 0) > context.limit]
    if over:
        said = f"bursts in {context.window}: {', '.join(over)}, more than thresholds.app_xid_max ({context.limit})"
        return Status.FAIL, "xid_app_repeated", said
    counted = ", ".join(f"{context.bursts.get(pci, 0)} on PCI {pci}" for pci in gpus)
    said = f"the application's unless it repeats: bursts in {context.window}: {counted} (at most {context.limit})"
    return Status.WARN, None, said


def _xid_rows(model: KernelLog, profile: Profile) -> list[CheckRow]:
    rows: list[CheckRow] = []
    context = _app_context(model, profile)
    by_code: dict[int, list[XidEvent]] = {}
    for event in model.events:
        by_code.setdefault(event.code, []).append(event)
    cap = len(model.events) + len(model.sxids) + len(model.unparsed) + len(model.earlier)
    kept = f"the newest {_MAX_XID_LINES} of the application's and of the others"
    beyond = f" ({model.xid_lines} Xid lines in the log, {cap} read: {kept})" if model.xid_lines > cap else ""
    for code in sorted(by_code):
        events = by_code[code]
        kind = xid_kind(code, " ".join(e.text for e in events))
        lines = "\n".join(e.line for e in events[:3])
        observed = f"{_plural(len(events), 'event')} on PCI {', '.join(sorted({e.pci for e in events}))}"
        status, reason, weighed = kind.severity, xid_reason(code, " ".join(e.text for e in events)), ""
        if code in APPLICATION:
            status, escalated, said = _app_judgement(code, events, context)
            reason, weighed = escalated or reason, f"; {said}"
        window = _window_of(model, events)
        detail = f"XID {code}: {kind.meaning}; {window}, from {model.source}{beyond}{weighed}\n{lines}"
        rows.append(CheckRow(NAME, f"xid_{code}", status, reason, observed, "0 XID events", detail))
    return rows


def _sxid_rows(model: KernelLog) -> list[CheckRow]:
    rows: list[CheckRow] = []
    by_code: dict[tuple[int, str], list[XidEvent]] = {}
    for event in model.sxids:
        by_code.setdefault((event.code, event.severity or ""), []).append(event)
    for (code, severity), events in sorted(by_code.items()):
        reason, kind = {"Fatal": ("sxid_fatal", SXID_FATAL), "Non-fatal": ("sxid_nonfatal", SXID_NONFATAL)}.get(
            severity, ("sxid_unclassified", SXID_UNCLASSIFIED))  # fmt: skip
        switches = ", ".join(f"nvswitch{s} ({e.pci})" for s, e in sorted({e.switch: e for e in events}.items()))
        observed = f"{_plural(len(events), 'event')} ({severity or 'severity not said'}) on {switches}"
        lines = "\n".join(e.line for e in events[:3])
        detail = f"SXID {code}: {events[0].text}; {_window_of(model, events)}, from {model.source}\n{lines}"
        rows.append(CheckRow(NAME, f"sxid_{code}", kind.severity, reason, observed, "0 SXID events", detail))
    return rows


def _earlier_rows(model: KernelLog) -> list[CheckRow]:
    """XIDs and SXIDs the previous run already judged: shown, passed."""
    rows: list[CheckRow] = []
    by_item: dict[str, list[XidEvent]] = {}
    for event in model.earlier:
        by_item.setdefault(f"{'sxid' if event.switch is not None else 'xid'}_{event.code}", []).append(event)
    for item, events in sorted(by_item.items()):
        last = max(e.at_s or 0.0 for e in events)
        observed = f"{_plural(len(events), 'event')}, the last at {last:.0f} s after boot"
        detail = f"logged before the previous run read the log ({model.since_s:.0f} s after boot)\n" + "\n".join(
            e.line for e in events[:3])  # fmt: skip
        rows.append(CheckRow(NAME, item, Status.PASS, SEEN_BEFORE, observed, "none new since the previous run", detail))
    return rows


# The hardware XIDs (and fatal SXIDs) explain the application XIDs logged with them: named first.
_HARDWARE_REASONS = frozenset(
    {xid_reason(code) for code, kind in XIDS.items() if code not in APPLICATION and kind.severity is Status.FAIL}
    | {"xid_154_reboot", "xid_unlisted", "sxid_fatal"}
)
CAUSES = (
    Link(NAME, frozenset({NAME}), "preflight", _HARDWARE_REASONS, symptom_reasons=frozenset({"xid_app_with_hardware"})),
)

CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    timeout_s=TIMEOUT_S,
    marks=marks,
    since=since,
    causes=CAUSES,
    samples=(
        healthy("clean", {"ok"}, fixture="xid/clean.txt"),
        fault("xids", {"xid_48", "xid_app_with_hardware", "xid_unparsed"}, fixture="xid/xids.txt"),
        dead("unreadable", {"kernel_log_unreadable"}, fixture="xid/unreadable.txt"),
    ),
)
