"""The node's own name, and what it resolves to on the node.

Multi-node jobs find each other by name: torchrun's rendezvous publishes the agent's hostname, gloo picks
its interface by resolving the node's own name, and job scripts set ``MASTER_ADDR=$(hostname)``. A name that
does not resolve makes such a job wait for minutes and fail with ``DistNetworkError … connect to (node01, …)``;
one that resolves only to loopback (Debian's ``127.0.1.1 node01`` line in ``/etc/hosts``) sends gloo and
anything that binds to it onto ``lo``, unreachable from the other nodes. Both are named here, before a probe
waits on them. ``getent ahosts`` answers as the C library does (``/etc/hosts``, DNS, per nsswitch.conf).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from cluster_accept.checks.contract import (
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
)

NAME = "hostname"
_MARK = "### addresses"
COMMAND = (
    f"h=$(hostname); printf 'name=%s\\n' \"$h\"; echo '{_MARK}'; "
    "timeout 10 getent ahosts \"$h\" | awk '{print $1}' | sort -u"
)
REASONS = declare(
    Reason(
        "unresolvable",
        Status.FAIL,
        "the node's own hostname does not resolve on the node: multi-node jobs that publish or dial it "
        "(torchrun's rendezvous, MASTER_ADDR=$(hostname), gloo) hang, then fail; add it to DNS or /etc/hosts",
        Action.FIX_CONFIG,
    ),
    Reason(
        "resolves_to_loopback",
        Status.WARN,
        "the node's own hostname resolves only to loopback (an /etc/hosts line such as 127.0.1.1): gloo and jobs "
        "binding to it use lo, which other nodes cannot reach; map it to the node's cluster address",
        Action.FIX_CONFIG,
    ),
)


@dataclass(frozen=True)
class Hostname:
    name: str = ""
    addresses: list[str] = field(default_factory=list)
    error: str | None = None
    raw: str = ""


def parse(stdout: str, exit_code: int | None = 0) -> Hostname:
    lines = stdout.splitlines()
    if not lines or not lines[0].startswith("name=") or _MARK not in lines:
        return Hostname(error="no hostname in the output", raw=stdout)
    name = lines[0][len("name=") :].strip()
    addresses = [line.strip() for line in lines[lines.index(_MARK) + 1 :] if line.strip()]
    return Hostname(name, addresses, raw=stdout)


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def evaluate(model: Hostname, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    if not model.name:
        return [CheckRow(NAME, "resolves", Status.FAIL, "unresolvable", "<empty>", "a resolvable name", "no hostname")]
    shown = ", ".join(model.addresses[:8])
    if not model.addresses:
        said = f"getent ahosts {model.name} found nothing"
        return [CheckRow(NAME, "resolves", Status.FAIL, "unresolvable", model.name, "an address", said)]
    if all(_loopback(a) for a in model.addresses):
        said = f"{model.name} -> {shown}"
        return [CheckRow(NAME, "resolves", Status.WARN, "resolves_to_loopback", shown, "a non-loopback address", said)]
    return [CheckRow(NAME, "resolves", Status.PASS, "ok", shown, "a non-loopback address", model.name)]


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    environment=True,
    samples=(
        healthy("resolves", {"ok"}, fixture="hostname/resolves.txt"),
        fault("loopback", {"resolves_to_loopback"}, fixture="hostname/loopback.txt"),
        fault("unresolvable", {"unresolvable"}, fixture="hostname/unresolvable.txt", exit_code=2),
        dead("no_output", {"unparsable_output"}, text="", exit_code=127),
    ),
)
