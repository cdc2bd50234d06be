"""RoCE v2 lossless settings, the same on every node: MTU, traffic class, PFC, ECN, and the RoCE error counters.

A RoCE fabric carries RDMA over Ethernet without loss only where every hop agrees: the RDMA traffic class the job
marks (``NCCL_IB_TC``, the port's ``tc/<port>/traffic_class`` where mlx5 sets one), priority flow control (PFC) on
the priority that class maps to, ECN marking (``ecn/roce_np`` and ``roce_rp`` under the netdev, DCQCN) and an MTU
whose RoCE payload (the netdev's MTU less the RoCE headers, rounded down to an IB MTU: 4096 from a 9000-byte
netdev, 1024 from a 1500-byte one) is the fabric's. A node that differs from the rest drops or pauses where the
others do not, and every all-reduce through it slows (seeds 000–002 tuned these by hand). The node's majority of
each value is compared with the cluster's; each RoCE port is named where it differs. PFC is read from
``mlnx_qos -i <netdev>`` (MLNX_OFED/DOCA) or ``dcb pfc show dev <netdev>`` (iproute2), where the node has one.

The RoCE counters (``hw_counters``: out of sequence, packet sequence errors, local ACK timeouts, CNPs sent and
handled) are kept with the node's run; their growth since the node's previous run is flagged by preflight.

Output: ``P|<port>|<netdev>|<netdev mtu>|<port tclass>|<pfc>|<ecn np>|<ecn rp>`` per RoCE port (``-`` where not
shown; each priority list 8 digits, priority 0 first), ``C|<port>|<counter>|<value>`` per counter, and
``NCCL_IB_TC=<value>``. Node-side: sh, cat; mlnx_qos or dcb where installed.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from cluster_accept.checks._rdma import counter_line, nccl_conf_setting
from cluster_accept.checks.contract import (
    Action,
    Check,
    CheckRow,
    ClusterView,
    FindingKind,
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

NAME = "roce_qos"
_END = "### end"
# hw_counters of mlx5 RoCE ports (Documentation/infiniband + NVIDIA's "Understanding mlx5 Linux counters").
HW_COUNTERS = (
    "out_of_sequence",
    "packet_seq_err",
    "local_ack_timeout_err",
    "implied_nak_seq_err",
    "rnr_nak_retry_err",
    "np_cnp_sent",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
)
_PRIOS = "0 1 2 3 4 5 6 7"
COMMAND = (
    's="${CLUSTER_ACCEPT_SYSFS:-/sys}"; r="$s/class/infiniband"; '
    + nccl_conf_setting("NCCL_IB_TC")
    + 'echo "NCCL_IB_TC=${NCCL_IB_TC-${c:-<unset>}}"; '
    'for d in "$r"/*/ports/*; do [ "$(cat "$d/link_layer" 2>/dev/null)" = Ethernet ] || continue; '
    'h=${d#"$r"/}; h=${h%/ports/*}; p=$h/${d##*/}; n=; '
    'for f in "$d"/gid_attrs/ndevs/*; do v=$(cat "$f" 2>/dev/null); [ -n "$v" ] && n=$v && break; done; '
    'm=$(cat "$s/class/net/$n/mtu" 2>/dev/null); '
    't=$(sed -n "s/.*tclass=//p" "$r/$h/tc/${d##*/}/traffic_class" 2>/dev/null); '
    'q=$(mlnx_qos -i "$n" 2>/dev/null | awk \'/PFC configuration/{f=1} f&&$1=="enabled"{$1="";print;exit}\' '
    "| tr -d ' \\t'); "
    '[ -z "$q" ] && q=$(dcb pfc show dev "$n" 2>/dev/null | tr " " "\\n" | sed -n "s/^[0-7]:on$/1/p;s/^[0-7]:off$/0/p" '
    "| tr -d '\\n'); "
    "e=; for k in np rp; do x=; for i in " + _PRIOS + "; do "
    'x=$x$(cat "$s/class/net/$n/ecn/roce_$k/enable/$i" 2>/dev/null); done; e="$e|${x:--}"; done; '
    'echo "P|$p|${n:--}|${m:--}|${t:--}|${q:--}$e"; '
    f"for k in {' '.join(HW_COUNTERS)}; do "
    '[ -r "$d/hw_counters/$k" ] && echo "C|$p|$k|$(cat "$d/hw_counters/$k" 2>/dev/null)"; done; done; '
    f"echo '{_END}'"
)
UNSHOWN = "-"
REASONS = declare(
    Reason("no_roce_ports", Status.SKIP, "the node has no RoCE port (no HCA port whose link layer is Ethernet)"),
    Reason("not_shown", Status.SKIP, "the node does not show this setting (no sysfs entry, no mlnx_qos or dcb)"),
    Reason("no_majority", Status.PASS, "recorded: no value is held by most nodes, so none is expected"),
    Reason(
        "differs",
        Status.FAIL,
        "this RoCE setting differs from the rest of the cluster's (MTU, traffic class, PFC or ECN): packets are "
        "dropped or paused where the other nodes' are not, and every collective through the node slows; set it "
        "as the other nodes have it",
        Action.FIX_CONFIG,
        kind=FindingKind.RELATIVE,
    ),
)


@dataclass(frozen=True)
class RocePort:
    name: str  # mlx5_0/1
    netdev: str
    mtu: int | None  # the netdev's
    tclass: str
    pfc: str  # 8 digits, priority 0 first, or '-'
    ecn_np: str
    ecn_rp: str

    @property
    def roce_mtu(self) -> int | None:
        """The RoCE payload MTU the port uses: the largest IB MTU under the netdev's, less the RoCE v2 headers
        (GRH 40, UDP 8, BTH 12, extended headers 28, ICRC 4: 92 bytes, as the kernel's ``iboe_get_mtu``)."""
        if self.mtu is None:
            return None
        return next((m for m in (4096, 2048, 1024, 512, 256) if m <= self.mtu - 92), None)

    def values(self) -> dict[str, str]:
        mtu = self.roce_mtu
        return {
            "roce_mtu": str(mtu) if mtu else UNSHOWN,
            "traffic_class": self.tclass,
            "pfc": self.pfc,
            "ecn": UNSHOWN if UNSHOWN in (self.ecn_np, self.ecn_rp) else f"np {self.ecn_np} rp {self.ecn_rp}",
        }


@dataclass(frozen=True)
class RoceQos:
    nccl_ib_tc: str = "<unset>"
    ports: list[RocePort] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)  # mlx5_0/1.packet_seq_err -> value
    error: str | None = None
    raw: str = ""


_PORT = re.compile(
    r"^P\|(?P<port>[\w.-]+/\d{1,3})\|(?P<ndev>[\w.:-]{1,64})\|(?P<mtu>\d{1,6}|-)\|(?P<tc>\d{1,3}|-)\|"
    r"(?P<pfc>[01]{1,8}|-)\|(?P<np>[01]{1,8}|-)\|(?P<rp>[01]{1,8}|-)$",
    re.ASCII,
)
_TC = re.compile(r"^NCCL_IB_TC=(?P<tc>\d{1,3}|<unset>)$")


def parse(stdout: str, exit_code: int | None = 0) -> RoceQos:
    lines = stdout.splitlines()
    if _END not in lines:
        return RoceQos(error="output truncated before the end marker", raw=stdout)
    tc, ports, counters = None, [], {}
    for line in lines[: lines.index(_END)]:
        if (match := _TC.match(line)) is not None:
            tc = match["tc"]
        elif (match := _PORT.match(line)) is not None:
            mtu = int(match["mtu"]) if match["mtu"] != UNSHOWN else None
            ports.append(
                RocePort(match["port"], match["ndev"], mtu, match["tc"], match["pfc"], match["np"], match["rp"])
            )
        elif (counted := counter_line(line, HW_COUNTERS)) is not None:
            counters[counted[0]] = counted[1]
        elif line.startswith("NCCL_IB_TC="):
            return RoceQos(error=f"NCCL_IB_TC is not a traffic class: {quote(line[11:])}", raw=stdout)
        else:
            return RoceQos(error=f"unexpected RoCE line {quote(line)}", raw=stdout)
    if tc is None:
        return RoceQos(error="no NCCL_IB_TC line in the output", raw=stdout)
    return RoceQos(tc, ports, counters, raw=stdout)


def _node_value(model: RoceQos, key: str) -> str | None:
    """The value most of the node's RoCE ports hold for ``key`` (what the cluster compares)."""
    shown = Counter(port.values()[key] for port in model.ports)
    return shown.most_common(1)[0][0] if shown else None


def cluster_values(model: RoceQos) -> dict[str, str]:
    if model.error or not model.ports:
        return {}
    values = {"NCCL_IB_TC": model.nccl_ib_tc}
    for key in ("roce_mtu", "traffic_class", "pfc", "ecn"):
        value = _node_value(model, key)
        if value is not None:
            values[key] = value
    return values


def counters(model: RoceQos) -> dict[str, int]:
    """``mlx5_0/1.packet_seq_err``: preflight flags each that grew since the node's previous run."""
    return {} if model.error else dict(model.counters)


# Read from sysfs, where an absent entry is a setting the node lacks; PFC comes from a tool the node may not have.
_SYSFS_KEYS = frozenset({"roce_mtu", "traffic_class", "ecn"})


def _compared(item: str, key: str, value: str, cluster: ClusterView, said: str = "") -> CheckRow:
    """``value`` against the cluster's majority for ``key``; ``said``: where it was read."""
    majority = cluster.majority_of(key)
    if value == UNSHOWN and (key not in _SYSFS_KEYS or majority in (None, UNSHOWN)):
        return CheckRow(NAME, item, Status.SKIP, "not_shown", None, None, f"{key} not shown on this node ({said})")
    if majority is None:
        return CheckRow(NAME, item, Status.PASS, "no_majority", value, None, said)
    if value != majority:
        detail = f"{key} {value} here, {majority} on most of the {cluster.nodes_compared} nodes compared"
        return CheckRow(NAME, item, Status.FAIL, "differs", value, majority, f"{detail}; {said}".rstrip("; "))
    return CheckRow(NAME, item, Status.PASS, "ok", value, majority, said)


def evaluate(model: RoceQos, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    if not model.ports:
        return [CheckRow(NAME, "ports", Status.SKIP, "no_roce_ports", "0 RoCE ports", None)]
    rows = [_compared("NCCL_IB_TC", "NCCL_IB_TC", model.nccl_ib_tc, cluster, "environment or nccl.conf")]
    for port in model.ports:
        values = port.values()
        netdev = f"{port.netdev}, netdev MTU {port.mtu}" if port.mtu else port.netdev
        rows.append(_compared(f"{port.name} mtu", "roce_mtu", values["roce_mtu"], cluster, netdev))
        for key in ("traffic_class", "pfc", "ecn"):
            rows.append(_compared(f"{port.name} {key}", key, values[key], cluster, port.netdev))
    return rows


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    cluster_values=cluster_values,
    counters=counters,
    environment=True,
    samples=(
        healthy("healthy", {"no_majority"}, fixture="roce_qos/two_ports.txt"),
        fault(
            "pfc_off",
            {"differs"},
            fixture="roce_qos/pfc_off.txt",
            majority={
                "NCCL_IB_TC": "106",
                "roce_mtu": "4096",
                "traffic_class": "106",
                "pfc": "00010000",
                "ecn": "np 00010000 rp 00010000",
            },
        ),
        dead("mlnx_qos_missing", {"unparsable_output"}, fixture="roce_qos/mlnx_qos_missing.txt", exit_code=127),
    ),
)
