"""InfiniBand / RoCE port error counters from sysfs (``/sys/class/infiniband/<hca>/ports/<n>/counters``).

A flapping cable or a dirty connector shows in these counters long before a job fails: symbol errors and link
error recoveries from a marginal link, ``link_downed`` from a port that bounced, receive errors, excessive
buffer overruns from a congested or mis-configured switch port. Counters only grow between resets (a reboot or a
driver reload clears them), so the absolute value says "this port has had errors since the last reset" and the
growth since the node's previous run (compared by preflight through :func:`counters`) says "it is still
getting them": that second finding names the port to reseat.

A port whose ``link_downed`` grew since the node's previous run flapped in between: it fails
(``link_flapping``), and keeps failing (``flapped_recently``) until it has stayed up for the profile's
``thresholds.link_flap_clear_h`` (24 h by default), when it clears by itself; the row says when it last flapped.
The run keeps each port's ``link_downed`` and last flap, the node's boot id and the time of the reading as marks
for the next run (:attr:`Check.marks`, :func:`since`). Every time is the controller's clock (the run's own,
taken where the reading is judged), never the node's: a node whose clock is days off can neither clear a flap
nor keep one failing. A recorded flap dated after this run (the controller's clock went back, the history was
edited) is named (``flap_time_impossible``) and dated at this run instead, an upper bound.

The counters never wrap: each stops at the most its field in the PortCounters attribute holds
(:data:`COUNTER_BITS`; ``link_downed`` 255) until cleared, and a clear (a reboot, a driver reload, a counter
reset) takes it back to 0. A ``link_downed`` that went down since the previous run on the same boot but counts
again (4 -> 2) was cleared and the port went down at least that often since: a flap (``link_flapping``, the count
a lower bound, said so). One that went down to 0 or across a reboot, that sits at 255, or that reads as before
across a reboot cannot tell whether the port flapped since: a warning that says so (``flap_unknown``), never a
pass; any counter at its maximum is named (``counter_saturated``). A port with no earlier reading to compare with
(the node's first, or its marks missing or replaced) says so (``first_reading``): the check has then not looked at
a flap again, and a drain for one is not lifted on its word (:func:`~cluster_accept.checks.base.retested`).

One line per counter, ``<hca>/ports/<n> <counter> <value>``, e.g. ``mlx5_0/ports/1 symbol_error 0``. The sysfs
root is ``$CLUSTER_ACCEPT_SYSFS`` when a node sets it (a container with the host's ``/sys`` under
``/host/sys``), else ``/sys``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from cluster_accept.checks.contract import (
    FIRST_READING,
    Action,
    Check,
    CheckRow,
    ClusterView,
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
from cluster_accept.checks.sections import small_int
from cluster_accept.vocabulary.text import quote

NAME = "ib_counters"
# The error counters every mlx5/ib port exposes (Documentation/ABI/stable/sysfs-class-infiniband).
ERROR_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
)
# Each counter's width in bits, as the kernel reads it from the PortCounters attribute
# (drivers/infiniband/core/sysfs.c, PORT_PMA_ATTR): it stops at 2**bits - 1, it does not wrap.
COUNTER_BITS = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
}
_MARK = "### ib counters"
_END = "### end"
_BOOT = re.compile(r"^### boot=(?P<id>[0-9a-f-]{1,64})$")
_SHOWN_CHARS = 40  # an unreadable mark is quoted this far
SYSFS = '"${CLUSTER_ACCEPT_SYSFS:-/sys}"'
COMMAND = (
    'echo "### boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)"; '
    f"root={SYSFS}/class/infiniband; echo '{_MARK}'; "
    'for d in "$root"/*/ports/*; do [ -d "$d" ] || continue; '
    f"for c in {' '.join(ERROR_COUNTERS)}; do "
    '[ -r "$d/counters/$c" ] || continue; v=; { IFS= read -r v < "$d/counters/$c"; } 2>/dev/null; '
    'echo "${d#"$root"/} $c $v"; '
    "done; done; "
    f"echo '{_END}'"
)
REASONS = declare(
    Reason("no_ports", Status.SKIP, "the node shows no InfiniBand/RoCE port: no counters to read"),
    Reason(
        "link_flapping",
        Status.FAIL,
        "the port went down since the node's previous run (link_downed grew, or was cleared on the same boot and "
        "counts again): reseat or replace the cable or transceiver; it clears by itself once the port stays up for "
        "thresholds.link_flap_clear_h",
        Action.RESEAT_CABLE,
    ),
    Reason(
        "flapped_recently",
        Status.FAIL,
        "the port flapped less than thresholds.link_flap_clear_h ago: it passes again once it stays up that long",
        Action.RESEAT_CABLE,
    ),
    Reason(
        FIRST_READING,
        Status.PASS,
        "the port's first reading: no earlier link_downed to compare with (the node's first run, or its marks "
        "missing or replaced), so whether it flapped is told from the next run on; a drain for a flap stays",
    ),
    Reason("flap_cleared", Status.PASS, "the port flapped before, and has stayed up long enough since: cleared"),
    Reason(
        "flap_unknown",
        Status.WARN,
        "whether the port flapped since the node's previous run cannot be told: link_downed was cleared in between "
        "(a reboot, or to 0 by a driver reload or a counter reset), sits at its maximum 255, or reads what no "
        "counter holds",
        Action.CHECK_NODE,
    ),
    Reason(
        "flap_time_impossible",
        Status.FAIL,
        "the port's last flap is recorded at a time that cannot be (after this run's clock: the controller's clock "
        "went back, or the history was edited): it is dated at this run instead and clears "
        "thresholds.link_flap_clear_h after",
        Action.RESEAT_CABLE,
    ),
    Reason(
        "errors_since_reset",
        Status.WARN,
        "this port has counted errors since its counters were last cleared (reboot, driver reload): watch whether "
        "they grow; a growing count names the cable or transceiver to reseat",
        Action.RESEAT_CABLE,
    ),
)
_LINE = re.compile(
    r"^(?P<device>[A-Za-z0-9_.-]{1,64})/ports/(?P<port>\d{1,4}) (?P<counter>\w{1,64}) (?P<value>\d{1,20})$"
)


@dataclass(frozen=True)
class PortCounters:
    device: str
    port: int
    values: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"


@dataclass(frozen=True)
class Flap:
    """What the node's previous run knew of a port's flaps, and what this run adds. Times are epoch seconds on the
    controller's clock: the node's own clock is never read for them."""

    downed_before: str | None  # link_downed as the previous run recorded it (None: no previous reading)
    last_flap_s: float | None  # the last flap known: an upper bound (this run's time when found now)
    since_s: float | None  # when the previous run read the counters
    flapped_now: bool = False
    unknown: str | None = None  # why whether it flapped since the previous run cannot be told
    impossible: str | None = None  # the recorded last flap could not be (from the future): dated at this run
    bound: str | None = None  # why the flap found now is a lower bound (cleared on the same boot, counting again)


@dataclass(frozen=True)
class IbCounters:
    ports: list[PortCounters] = field(default_factory=list)
    error: str | None = None
    raw: str = ""
    boot: str | None = None  # the node's boot id when it read the counters
    at_s: float | None = None  # the controller's clock when the run judged this reading (set by :func:`since`)
    flaps: dict[str, Flap] = field(default_factory=dict)  # port -> its flaps, with a previous run


def parse(stdout: str, exit_code: int | None = 0) -> IbCounters:
    lines = stdout.splitlines()
    if _MARK not in lines:
        return IbCounters(error="no counters section in the output", raw=stdout)
    if _END not in lines:
        return IbCounters(error="output truncated before the end marker", raw=stdout)
    ports: dict[tuple[str, int], dict[str, int]] = {}
    for line in lines[lines.index(_MARK) + 1 : lines.index(_END)]:
        if not line.strip():
            continue
        match = _LINE.match(line.strip())
        if match is None or match.group("counter") not in ERROR_COUNTERS:
            return IbCounters(error=f"unexpected counter line {line[:200]!r}", raw=stdout)
        key = (match.group("device"), int(match.group("port")))
        ports.setdefault(key, {})[match.group("counter")] = int(match.group("value"))
    found = [PortCounters(device, port, values) for (device, port), values in sorted(ports.items())]
    boot = next((m.group("id") for line in lines if (m := _BOOT.match(line))), None)
    return IbCounters(ports=found, raw=stdout, boot=boot)


def counters(model: IbCounters) -> dict[str, int]:
    """``mlx5_0/1.symbol_error``: preflight flags each that grew since the node's previous run."""
    if model.error:
        return {}
    return {f"{port.name}.{name}": value for port in model.ports for name, value in sorted(port.values.items())}


def marks(model: IbCounters) -> dict[str, str]:
    """The time of this reading (the controller's clock), the node's boot id, and each port's ``link_downed`` and
    last flap: read back by the node's next run. Marks are kept where the run is judged, on the controller."""
    if model.error:
        return {}
    found = {"at_s": str(int(time.time() if model.at_s is None else model.at_s))}
    if model.boot:
        found["boot"] = model.boot
    for port in model.ports:
        if "link_downed" in port.values:
            found[f"{port.name}.link_downed"] = str(port.values["link_downed"])
        flap = model.flaps.get(port.name)
        if flap is not None and flap.last_flap_s is not None:
            found[f"{port.name}.last_flap_at_s"] = str(int(flap.last_flap_s))
    return found


def _downed(before: str | None, now: int | None, rebooted: bool, same_boot: bool) -> tuple[bool, str | None]:
    """Whether ``link_downed`` says the port went down since the previous reading (``before``), and why that
    cannot be told, or why it is a lower bound: the counter only grows between clears and stops at its maximum,
    so on the same boot one that went down but counts again went down since it was cleared."""
    if before is None:
        return False, None  # the port's first reading: nothing to compare with
    if now is None:
        return False, "link_downed could not be read this run, so whether the port flapped cannot be told"
    top, then = 2 ** COUNTER_BITS["link_downed"] - 1, small_int(before)
    why = None
    if now > top:
        why = f"link_downed reads {now}, above the most its 8-bit counter holds ({top})"
    elif then is None or then > top:
        why = f"the previous run recorded link_downed {quote(before, _SHOWN_CHARS)}, not a count it holds"
    elif now > then:
        return True, None
    elif now < then and now and same_boot:
        why = f"link_downed went down {then} -> {now} on the same boot: cleared since the previous run (a driver "
        return True, why + f"reload or a counter reset) and down at least {now} times since, a lower bound"
    elif now < then:
        cleared = "the node rebooted: its boot id changed" if rebooted else "a driver reload or a counter reset"
        why = f"link_downed went down {then} -> {now}: cleared since the previous run ({cleared}), so a flap before "
        why += "the clear is not counted"
    elif now == top:
        why = f"link_downed sits at {top}, the most its 8-bit counter holds: it stopped counting, so a flap since "
        why += "is not counted; clear the port's counters"
    elif rebooted and now:
        why = f"the node rebooted since the previous run (its boot id changed) and link_downed reads {now} as before: "
        why += "cleared and counted again, or kept, cannot be told"
    return False, why


def _last_flap(previous: Mapping[str, str], port: str, now_s: float) -> tuple[float | None, str | None]:
    """The port's last flap as the previous run recorded it, on the controller's clock, or why it cannot be: a
    flap recorded after ``now_s``. A record of an earlier version, in the node's own clock (``last_flap_s`` beside
    ``now_s``), is carried as its age then, counted from now: never older than it was."""
    kept = read_mark(previous, f"{port}.last_flap_at_s", now_s)
    if kept.value is not None or kept.problem is not None or f"{port}.last_flap_s" not in previous:
        return kept.value, kept.problem
    flapped, read = small_int(previous[f"{port}.last_flap_s"]), small_int(previous.get("now_s", ""))
    if flapped is None or read is None or flapped > read:
        return None, f"{port}.last_flap_s, kept in the node's own clock by an earlier version, cannot be dated"
    return now_s - (read - flapped), None


def since(model: IbCounters, previous: Mapping[str, str], now_s: float | None = None) -> IbCounters:
    """Each port's flaps as of this run: ``link_downed`` grown since the previous run's reading is a flap between
    that reading and this one, dated ``now_s`` (an upper bound). ``now_s`` is the controller's clock, the time the
    run judges this reading; it defaults to the clock of the process judging it, the controller."""
    if model.error:
        return model
    now = float(time.time() if now_s is None else now_s)
    then = read_mark(previous, "at_s", now).value
    rebooted = bool(previous.get("boot")) and bool(model.boot) and previous.get("boot") != model.boot
    same_boot = bool(model.boot) and previous.get("boot") == model.boot
    flaps: dict[str, Flap] = {}
    for port in model.ports:
        before = previous.get(f"{port.name}.link_downed")
        grew, why = _downed(before, port.values.get("link_downed"), rebooted, same_boot)
        unknown, bound = (None, why) if grew else (why, None)
        last, impossible = (now, None) if grew else _last_flap(previous, port.name, now)
        if before is not None and small_int(before) is None:
            before = quote(before, _SHOWN_CHARS)  # shown in a row: cut (masked where it entered)
        flaps[port.name] = Flap(before, now if impossible else last, then, grew, unknown, impossible, bound)
    return replace(model, at_s=now, flaps=flaps)


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(epoch))


def _flap_rows(port: PortCounters, flap: Flap, now_s: float, clear_h: float) -> list[CheckRow]:
    item = f"{port.name} flaps"
    went = f"link_downed {flap.downed_before} -> {port.values.get('link_downed')}"
    rows = [] if flap.downed_before is not None else [_first_reading(port)]
    if flap.unknown:
        expected = "a count that only grows, below 255"
        rows.append(CheckRow(NAME, item, Status.WARN, "flap_unknown", went, expected, flap.unknown))
    if flap.flapped_now:
        between = f"between {_when(flap.since_s)} and {_when(now_s)}" if flap.since_s else f"before {_when(now_s)}"
        detail = f"went down {between}; clears after {clear_h:g} h up" + (f"; {flap.bound}" if flap.bound else "")
        return rows + [
            CheckRow(NAME, item, Status.FAIL, "link_flapping", went, "no change since the previous run", detail)
        ]
    if flap.last_flap_s is None:
        return rows
    clears = _when(flap.last_flap_s + round(clear_h * 3600))
    if flap.impossible:
        detail = f"{flap.impossible}: dated at this run instead; clears at {clears}"
        when = f"before {_when(now_s)}"
        return rows + [CheckRow(NAME, item, Status.FAIL, "flap_time_impossible", "after this run", when, detail)]
    age_h = (now_s - flap.last_flap_s) / 3600
    seen = f"last flapped {_when(flap.last_flap_s)} ({age_h:.1f} h ago)"
    if age_h < clear_h:
        found = CheckRow(NAME, item, Status.FAIL, "flapped_recently", seen, f"up {clear_h:g} h", f"clears at {clears}")
        return rows + [found]
    return rows or [CheckRow(NAME, item, Status.PASS, "flap_cleared", seen, f"up {clear_h:g} h", "")]


def _first_reading(port: PortCounters) -> CheckRow:
    """No earlier ``link_downed`` of the port to compare with: whether it flapped is not told, and said so."""
    why = "no earlier reading of the port's link_downed to compare with: whether it flapped is told from the next run"
    said = f"link_downed {port.values.get('link_downed')}"
    return CheckRow(NAME, f"{port.name} flaps", Status.PASS, FIRST_READING, said, "an earlier reading", why)


def _ceiling_rows(port: PortCounters) -> list[CheckRow]:
    """A counter at the most its field holds stopped counting; one above it is no count this port keeps."""
    rows = []
    for name, value in sorted(port.values.items()):
        bits = COUNTER_BITS[name]
        top = 2**bits - 1
        item, said = f"{port.name}.{name}", f"{name} {value}"
        if value == top:
            why = f"{name} sits at {top}, the most its {bits}-bit counter holds: errors since are not counted"
            rows.append(CheckRow(NAME, item, Status.WARN, "counter_saturated", said, f"< {top}", why))
        elif value > top:
            why = f"{name} reads {value}, above the most its {bits}-bit counter holds ({top})"
            rows.append(CheckRow(NAME, item, Status.WARN, "counter_impossible", said, f"<= {top}", why))
    return rows


def evaluate(model: IbCounters, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    if not model.ports:
        return [
            CheckRow(NAME, "ports", Status.SKIP, "no_ports", "0 ports", None, "no counters under /sys/class/infiniband")
        ]
    rows = []
    for port in model.ports:
        seen = {name: value for name, value in port.values.items() if value}
        if seen:
            said = ", ".join(f"{name} {value}" for name, value in sorted(seen.items()))
            rows.append(CheckRow(NAME, port.name, Status.WARN, "errors_since_reset", said, "0", said))
        else:
            said = f"{len(port.values)} error counters, all 0"
            rows.append(CheckRow(NAME, port.name, Status.PASS, "ok", "0", "0", said))
        rows += _ceiling_rows(port)
        flap = model.flaps.get(port.name)
        if flap is not None and model.at_s is not None:
            rows += _flap_rows(port, flap, model.at_s, profile.thresholds.link_flap_clear_h)
        else:  # the previous run's marks were not read (none kept): nothing to compare with
            rows.append(_first_reading(port))
    return rows


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    counters=counters,
    marks=marks,
    since=since,
    samples=(
        healthy("healthy", {"first_reading", "ok"}, fixture="ib_counters/healthy.txt"),
        fault("errors_since_reset", {"errors_since_reset"}, fixture="ib_counters/two_ports.txt"),
        dead("no_hca", {"no_ports"}, fixture="ib_counters/no_hca.txt"),
    ),
)
