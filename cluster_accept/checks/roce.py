"""RoCE v2: the GID a job will use on every RoCE port (an HCA port whose link layer is Ethernet).

RoCE carries RDMA over Ethernet in two forms: v1 (Ethernet frames of their own, one L2 domain) and v2 (UDP/IP,
routed: what every RoCE fabric of a GPU cluster is built for, with its ECN and PFC settings). Each port keeps a
GID table (``/sys/class/infiniband/<hca>/ports/<n>/gids/<i>``, its type in ``gid_attrs/types/<i>`` and its
netdev in ``gid_attrs/ndevs/<i>``, Documentation/ABI/testing/sysfs-class-infiniband), one entry per address and
RoCE version. A job picks an entry by index: ``NCCL_IB_GID_INDEX`` where it is set (the environment, over
``~/.nccl.conf`` and ``/etc/nccl.conf``); unset, NCCL 2.21 and later select a RoCE v2 entry themselves
(``NCCL_IB_ROCE_VERSION_NUM``, default 2; earlier versions used index 0, a RoCE v1 link-local entry on most
drivers). An index that names a RoCE v1 entry, or an empty one, makes NCCL fail to connect or silently use v1
where the switches expect v2: seed 002's cluster ran with ``NCCL_IB_GID_INDEX=3`` for that reason.

Per RoCE port, one line per populated GID: ``mlx5_0/1|3|0000:…:0a00:0001|RoCE v2|eth0``. Node-side: sh, cat.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cluster_accept.checks._rdma import nccl_conf_setting
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
from cluster_accept.vocabulary.text import quote

NAME = "roce"
_MARK, _INDEX, _END = "### roce gids", "### gid index ", "### end"
_EMPTY = "0000:0000:0000:0000:0000:0000:0000:0000"
COMMAND = (
    'r="${CLUSTER_ACCEPT_SYSFS:-/sys}/class/infiniband"; '
    + nccl_conf_setting("NCCL_IB_GID_INDEX")
    + f"echo \"{_INDEX}${{NCCL_IB_GID_INDEX-$c}}\"; echo '{_MARK}'; "
    'for d in "$r"/*/ports/*; do l=; { IFS= read -r l < "$d/link_layer"; } 2>/dev/null; '
    '[ "$l" = Ethernet ] || continue; '
    'p=${d#"$r"/}; p=${p%/ports/*}/${d##*/}; '
    'for g in "$d"/gids/*; do v=; { IFS= read -r v < "$g"; } 2>/dev/null; '
    '[ -n "$v" ] && [ "$v" != ' + _EMPTY + " ] || continue; "
    'i=${g##*/}; a="$d/gid_attrs"; echo "$p|$i|$v|$(cat "$a/types/$i" 2>/dev/null)|$(cat "$a/ndevs/$i" 2>/dev/null)"; '
    'done; echo "$p|-|||"; done; '
    f"echo '{_END}'"
)
ROCE_V2 = "RoCE v2"
REASONS = declare(
    Reason("no_roce_ports", Status.SKIP, "the node has no RoCE port (no HCA port whose link layer is Ethernet)"),
    Reason(
        "gid_not_roce_v2",
        Status.FAIL,
        "the GID index a job uses names a RoCE v1 entry on this port: NCCL fails to connect, or runs RoCE v1 where "
        "the fabric routes v2; set NCCL_IB_GID_INDEX to the port's RoCE v2 entry (or unset it, NCCL 2.21+)",
        Action.FIX_CONFIG,
    ),
    Reason(
        "gid_empty",
        Status.FAIL,
        "the GID index a job uses names no address on this port (the netdev has no IP there): give the netdev its "
        "address, or point NCCL_IB_GID_INDEX at a populated RoCE v2 entry",
        Action.FIX_CONFIG,
    ),
    Reason(
        "no_roce_v2_gid",
        Status.FAIL,
        "the port has no RoCE v2 GID with an address: NCCL cannot select one; give its netdev an IP address and "
        "check the driver's RoCE mode",
        Action.FIX_CONFIG,
    ),
)


@dataclass(frozen=True)
class Gid:
    index: int
    address: str
    type: str  # 'RoCE v2', 'IB/RoCE v1'
    netdev: str


@dataclass(frozen=True)
class RoceGids:
    gid_index: int | None = None  # NCCL_IB_GID_INDEX where set (None: NCCL selects)
    ports: dict[str, list[Gid]] = field(default_factory=dict)  # RoCE port (mlx5_0/1) -> its populated GIDs
    error: str | None = None
    raw: str = ""


_LINE = re.compile(
    r"^(?P<port>[\w.-]+/\d{1,3})\|(?P<index>\d{1,5}|-)\|(?P<gid>[0-9a-f:]*)\|(?P<type>[^|]*)\|(?P<ndev>.*)$",
    re.ASCII,
)


def _index(text: str) -> int | None | str:
    """NCCL_IB_GID_INDEX's value: an index, None when unset (or -1: NCCL selects), or the text when unreadable."""
    text = text.strip()
    if not text or text == "-1":
        return None
    return int(text) if re.fullmatch("[0-9]{1,5}", text) else text  # a GID table holds at most a few hundred


def parse(stdout: str, exit_code: int | None = 0) -> RoceGids:
    lines = stdout.splitlines()
    if _MARK not in lines or _END not in lines:
        return RoceGids(error="no GID section, or output truncated before the end marker", raw=stdout)
    setting = next((line[len(_INDEX) :] for line in lines if line.startswith(_INDEX)), None)
    index = _index(setting or "")
    if isinstance(index, str):
        return RoceGids(error=f"NCCL_IB_GID_INDEX is not an index: {quote(index)}", raw=stdout)
    ports: dict[str, list[Gid]] = {}
    for line in lines[lines.index(_MARK) + 1 : lines.index(_END)]:
        match = _LINE.match(line)
        if match is None:
            return RoceGids(error=f"unexpected GID line {quote(line)}", raw=stdout)
        gids = ports.setdefault(match["port"], [])
        if match["index"] != "-":
            gids.append(Gid(int(match["index"]), match["gid"], match["type"].strip(), match["ndev"].strip()))
    return RoceGids(index, ports, raw=stdout)


def _port_row(port: str, gids: list[Gid], index: int | None) -> CheckRow:
    v2 = [g for g in gids if g.type == ROCE_V2]
    if index is None:
        if not v2:
            said = ", ".join(f"{g.index}: {g.type}" for g in gids) or "no populated GID"
            return CheckRow(NAME, port, Status.FAIL, "no_roce_v2_gid", said, ROCE_V2, "NCCL_IB_GID_INDEX unset")
        indexes = ", ".join(str(g.index) for g in v2)
        said = f"NCCL_IB_GID_INDEX unset: NCCL 2.21+ selects a RoCE v2 entry ({indexes}, on {v2[0].netdev})"
        return CheckRow(NAME, port, Status.PASS, "ok", f"{ROCE_V2} at {indexes}", ROCE_V2, said)
    entry = next((g for g in gids if g.index == index), None)
    expected = f"{index}: {ROCE_V2}"
    choices = ", ".join(str(g.index) for g in v2) or "none"
    if entry is None:
        said = f"NCCL_IB_GID_INDEX={index} names no address on {port}; its RoCE v2 entries: {choices}"
        return CheckRow(NAME, port, Status.FAIL, "gid_empty", f"{index}: empty", expected, said)
    if entry.type != ROCE_V2:
        said = f"NCCL_IB_GID_INDEX={index} is {entry.type} ({entry.address}, {entry.netdev}); RoCE v2: {choices}"
        return CheckRow(NAME, port, Status.FAIL, "gid_not_roce_v2", f"{index}: {entry.type}", expected, said)
    return CheckRow(NAME, port, Status.PASS, "ok", expected, expected, f"{entry.address} on {entry.netdev}")


def evaluate(model: RoceGids, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    if not model.ports:
        return [CheckRow(NAME, "ports", Status.SKIP, "no_roce_ports", "0 RoCE ports", None)]
    return [_port_row(port, gids, model.gid_index) for port, gids in sorted(model.ports.items())]


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    environment=True,
    samples=(
        healthy("healthy", {"ok"}, fixture="roce/gid_index_3.txt"),
        fault("gid_not_v2", {"gid_not_roce_v2"}, fixture="roce/gid_not_v2.txt"),
        dead("no_port", {"no_roce_ports"}, fixture="roce/no_port.txt"),
    ),
)
