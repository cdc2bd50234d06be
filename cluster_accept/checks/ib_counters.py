"""InfiniBand / RoCE port error counters from sysfs (``/sys/class/infiniband/<hca>/ports/<n>/counters``).

A flapping cable or a dirty connector shows in these counters long before a job fails: symbol errors and link
error recoveries from a marginal link, ``link_downed`` from a port that bounced, receive errors, excessive
buffer overruns from a congested or mis-configured switch port. Counters only grow between resets (a reboot or a
driver reload clears them), so the absolute value says "this port has had errors since the last reset" and the
growth since the node's previous run (compared by preflight through :func:`counters`) says "it is still
getting them": that second finding names the port to reseat.

One line per counter, ``<hca>/ports/<n> <counter> <value>``, e.g. ``mlx5_0/ports/1 symbol_error 0``. The sysfs
root is ``$CLUSTER_ACCEPT_SYSFS`` when a node sets it (a container with the host's ``/sys`` under
``/host/sys``), else ``/sys``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cluster_accept.checks.base import Check, CheckRow, ClusterView, Status, error_row
from cluster_accept.checks.reasons import Action, Reason, declare
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
class IbCounters:
    ports: list[PortCounters] = field(default_factory=list)
    error: str | None = None
    raw: str = ""


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
    return IbCounters(ports=found, raw=stdout)


def counters(model: IbCounters) -> dict[str, int]:
    """``mlx5_0/1.symbol_error``: preflight flags each that grew since the node's previous run."""
    if model.error:
        return {}
    return {f"{port.name}.{name}": value for port in model.ports for name, value in sorted(port.values.items())}


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
    return rows


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    counters=counters,
)
