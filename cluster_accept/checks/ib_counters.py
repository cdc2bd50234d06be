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
The run keeps each port's ``link_downed`` and last flap, and the node's clock, as marks for the next run
(:attr:`Check.marks`, :func:`since`).

One line per counter, ``<hca>/ports/<n> <counter> <value>``, e.g. ``mlx5_0/ports/1 symbol_error 0``. The sysfs
root is ``$CLUSTER_ACCEPT_SYSFS`` when a node sets it (a container with the host's ``/sys`` under
``/host/sys``), else ``/sys``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from cluster_accept.checks.base import Check, CheckRow, ClusterView, Status, error_row
from cluster_accept.checks.reasons import Action, Reason, declare
from cluster_accept.checks.sections import small_int
from cluster_accept.inventory.model import Profile

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
_MARK = "### ib counters"
_END = "### end"
SYSFS = '"${CLUSTER_ACCEPT_SYSFS:-/sys}"'
COMMAND = (
    'echo "### now=$(date -u +%s)"; '
    f"root={SYSFS}/class/infiniband; echo '{_MARK}'; "
    'for d in "$root"/*/ports/*; do [ -d "$d" ] || continue; '
    f"for c in {' '.join(ERROR_COUNTERS)}; do "
    '[ -r "$d/counters/$c" ] && echo "${d#"$root"/} $c $(cat "$d/counters/$c" 2>/dev/null)"; '
    "done; done; "
    f"echo '{_END}'"
)
REASONS = declare(
    Reason("no_ports", Status.SKIP, "the node shows no InfiniBand/RoCE port: no counters to read"),
    Reason(
        "link_flapping",
        Status.FAIL,
        "the port went down since the node's previous run (link_downed grew): reseat or replace the cable or "
        "transceiver; it clears by itself once the port stays up for thresholds.link_flap_clear_h",
        Action.RESEAT_CABLE,
    ),
    Reason(
        "flapped_recently",
        Status.FAIL,
        "the port flapped less than thresholds.link_flap_clear_h ago: it passes again once it stays up that long",
        Action.RESEAT_CABLE,
    ),
    Reason("flap_cleared", Status.PASS, "the port flapped before, and has stayed up long enough since: cleared"),
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
    """What the node's previous run knew of a port's flaps, and what this run adds."""

    downed_before: int | None  # link_downed at the previous run (None: no previous run)
    last_flap_s: int | None  # the last flap known, in the node's clock (epoch seconds): an upper bound
    since_s: int | None  # when the previous run read the counters
    flapped_now: bool = False


@dataclass(frozen=True)
class IbCounters:
    ports: list[PortCounters] = field(default_factory=list)
    error: str | None = None
    raw: str = ""
    now_s: int | None = None  # the node's clock when it read the counters
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
    clock = next((small_int(line[8:]) for line in lines if line.startswith("### now=")), None)
    return IbCounters(ports=found, raw=stdout, now_s=clock)


def counters(model: IbCounters) -> dict[str, int]:
    """``mlx5_0/1.symbol_error``: preflight flags each that grew since the node's previous run."""
    if model.error:
        return {}
    return {f"{port.name}.{name}": value for port in model.ports for name, value in sorted(port.values.items())}


def marks(model: IbCounters) -> dict[str, str]:
    """The node's clock and each port's ``link_downed`` and last flap: read back by the node's next run."""
    if model.error or model.now_s is None:
        return {}
    found = {"now_s": str(model.now_s)}
    for port in model.ports:
        if "link_downed" in port.values:
            found[f"{port.name}.link_downed"] = str(port.values["link_downed"])
        flap = model.flaps.get(port.name)
        if flap is not None and flap.last_flap_s is not None:
            found[f"{port.name}.last_flap_s"] = str(flap.last_flap_s)
    return found


def since(model: IbCounters, previous: Mapping[str, str]) -> IbCounters:
    """Each port's flaps as of this run: ``link_downed`` grown since the previous run's read is a flap between that
    read and this one (dated this run's clock, an upper bound); a counter that went down was cleared (a reboot)."""
    if model.error or model.now_s is None:
        return model
    then = small_int(previous.get("now_s", ""))
    flaps: dict[str, Flap] = {}
    for port in model.ports:
        before, last = small_int(previous.get(f"{port.name}.link_downed", "")), small_int(
            previous.get(f"{port.name}.last_flap_s", ""))  # fmt: skip
        now = port.values.get("link_downed")
        grew = before is not None and now is not None and now > before
        flaps[port.name] = Flap(before, model.now_s if grew else last, then, grew)
    return replace(model, flaps=flaps)


def _when(epoch: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(epoch))


def _flap_row(port: PortCounters, flap: Flap, now_s: int, clear_h: float) -> CheckRow | None:
    item = f"{port.name} flaps"
    if flap.flapped_now:
        went = f"link_downed {flap.downed_before} -> {port.values.get('link_downed')}"
        between = f"between {_when(flap.since_s)} and {_when(now_s)}" if flap.since_s else f"before {_when(now_s)}"
        return CheckRow(NAME, item, Status.FAIL, "link_flapping", went, "no change since the previous run",
                        f"went down {between}; clears after {clear_h:g} h up")  # fmt: skip
    if flap.last_flap_s is None:
        return None
    age_h = (now_s - flap.last_flap_s) / 3600
    seen = f"last flapped {_when(flap.last_flap_s)} ({age_h:.1f} h ago)"
    if age_h < clear_h:
        clears = _when(flap.last_flap_s + round(clear_h * 3600))
        return CheckRow(NAME, item, Status.FAIL, "flapped_recently", seen, f"up {clear_h:g} h", f"clears at {clears}")
    return CheckRow(NAME, item, Status.PASS, "flap_cleared", seen, f"up {clear_h:g} h", "")


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
        flap = model.flaps.get(port.name)
        row = _flap_row(port, flap, model.now_s, profile.thresholds.link_flap_clear_h) if flap and model.now_s else None
        rows += [row] if row is not None else []
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
)
