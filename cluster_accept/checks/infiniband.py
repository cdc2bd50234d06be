"""InfiniBand / RoCE ports under ``/sys/class/infiniband`` and whether ``nvidia_peermem`` is loaded.

Where the profile expects NCCL's inter-node transport to be ``NET/IB``, every port must be ``4: ACTIVE``, its
rate must match the cluster's majority for that port (a cable trained at half speed is a slow node), and
``nvidia_peermem`` must be loaded: without it GPUDirect RDMA is off and NCCL stages every inter-node
transfer through host memory — unless the node reaches GPU memory through dma-buf instead: NVIDIA's open kernel
module (``/proc/driver/nvidia/version`` says "Open Kernel Module") on Linux 5.12 or later, which NCCL 2.13+ uses
unless ``NCCL_DMABUF_ENABLE=0``. Nodes not expected to use InfiniBand only record the ports they have.

One line per port, as ``<port dir> <state> <rate> <link_layer>``, e.g.
``/sys/class/infiniband/mlx5_0/ports/1 4: ACTIVE 400 Gb/sec (4X NDR) InfiniBand``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cluster_accept.checks.contract import (
    Action,
    Check,
    CheckRow,
    ClusterView,
    Expectation,
    NodeModels,
    Profile,
    Reason,
    Status,
    SuggestedValues,
    dead,
    declare,
    error_row,
    fault,
    healthy,
    is_set,
)
from cluster_accept.inventory.fabric import NodeFabric, RdmaPort, inter_node_floor, node_fabric, rdma_kind
from cluster_accept.inventory.model import InfinibandSpec
from cluster_accept.vocabulary.text import quote

NAME = "infiniband"
_PORTS_MARK = "### ports"
_NET_MARK = "### net"
_PEERMEM_MARK = "### peermem "
_DMABUF_MARK = "### dmabuf "
_END = "### end"
# Each port with its driver (EFA is told by it), then the physical network links (those with a device behind
# them, not lo, bridges or veths) with their speed in Mb/s: what a node without RDMA ports talks over.
COMMAND = (
    's="${CLUSTER_ACCEPT_SYSFS:-/sys}"; '
    f"echo '{_PORTS_MARK}'; "
    'for d in "$s"/class/infiniband/*/ports/*; do '
    '[ -d "$d" ] || continue; v=$(readlink "${d%/ports/*}/device/driver" 2>/dev/null); '
    'echo "$d $(cat "$d/state" 2>/dev/null) $(cat "$d/rate" 2>/dev/null) $(cat "$d/link_layer" 2>/dev/null)'
    ' driver=${v##*/}"; '
    "done; "
    f"echo '{_NET_MARK}'; "
    'for n in "$s"/class/net/*; do [ -e "$n/device" ] || continue; '
    'echo "${n##*/} $(cat "$n/speed" 2>/dev/null || echo -1) $(cat "$n/operstate" 2>/dev/null)"; done; '
    "if [ -d \"$s/module/nvidia_peermem\" ] || grep -q '^nvidia_peermem ' /proc/modules 2>/dev/null; "
    f"then echo '{_PEERMEM_MARK}loaded'; else echo '{_PEERMEM_MARK}absent'; fi; "
    "m=closed; grep -q 'Open Kernel Module' /proc/driver/nvidia/version 2>/dev/null && m=open; "
    f'echo "{_DMABUF_MARK}$(uname -r) $m"; '
    f"echo '{_END}'"
)
ACTIVE = "4: ACTIVE"
# ``drift`` (common): a port count or an active port's rate that differs from the cluster majority.
REASONS = declare(
    Reason("no_ib_expected", Status.SKIP, "the profile expects no InfiniBand between nodes and the node has none"),
    Reason(
        "no_ib_ports",
        Status.FAIL,
        "the profile expects NET/IB between nodes but the node shows no InfiniBand port: check the HCAs and driver",
        Action.CHECK_NODE,
    ),
    Reason(
        "dmabuf",
        Status.PASS,
        "nvidia_peermem is not loaded, but GPUDirect RDMA goes through dma-buf (NVIDIA's open kernel module on "
        "Linux 5.12+; NCCL 2.13+ uses it unless NCCL_DMABUF_ENABLE=0)",
    ),
    Reason("port_down", Status.FAIL, "an HCA port is down: check the cable and switch port", Action.RESEAT_CABLE),
    Reason(
        "rate_low",
        Status.FAIL,
        "an active port trained below the profile's rate (a cable, transceiver or switch port that fell back): "
        "reseat or swap it",
        Action.RESEAT_CABLE,
    ),
    Reason(
        "width_low",
        Status.FAIL,
        "an active port runs on fewer lanes than the profile's width (4X NDR at 1X): reseat or swap the cable",
        Action.RESEAT_CABLE,
    ),
    Reason(
        "ports_missing",
        Status.FAIL,
        "fewer active HCA ports than the profile's infiniband.ports: check the HCAs, cables and driver",
        Action.CHECK_NODE,
    ),
    Reason(
        "peermem_missing",
        Status.FAIL,
        "GPUDirect RDMA is off: nvidia_peermem is not loaded and the driver gives no dma-buf (open kernel module on "
        "Linux 5.12+): load it (modprobe nvidia_peermem)",
        Action.FIX_CONFIG,
    ),
)
_PORT_LINE = re.compile(
    r"^(?P<path>/\S*/(?P<device>[^/\s]+)/ports/(?P<port>\d{1,9}))"
    r"(?:\s+(?P<state>\d+:\s*[A-Za-z_]+))?"
    r"(?:\s+(?P<rate>\d+(?:\.\d+)?\s+Gb/sec(?:\s+\([^)]*\))?))?"
    r"(?:\s+(?P<link_layer>[A-Za-z]\w*))?"
    r"(?:\s+driver=(?P<driver>[\w.-]*))?\s*$"
)
_NET_LINE = re.compile(r"^(?P<name>[\w.:@-]{1,64}) (?P<speed>-?\d{1,9})(?: (?P<state>\w*))?\s*$")


@dataclass(frozen=True)
class IbPort:
    device: str
    port: int
    state: str  # '4: ACTIVE', '1: DOWN', ... ('' when unreadable)
    rate: str  # '400 Gb/sec (4X NDR)' ('' when unreadable)
    link_layer: str  # 'InfiniBand', 'Ethernet' ('' when unreadable)
    driver: str = ""  # 'mlx5_core', 'efa' ('' when unreadable)

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def active(self) -> bool:
        return self.state == ACTIVE


@dataclass(frozen=True)
class NetLink:
    """A physical network link: its name, speed (Mb/s; -1 when the driver does not say) and state."""

    name: str
    speed_mbps: int
    up: bool


@dataclass(frozen=True)
class IbPorts:
    ports: list[IbPort] = field(default_factory=list)
    net: list[NetLink] = field(default_factory=list)
    peermem: bool = False
    dmabuf: bool = False  # GPUDirect RDMA through dma-buf: the open kernel module on Linux 5.12+
    error: str | None = None
    raw: str = ""


def _port(line: str) -> IbPort | None:
    match = _PORT_LINE.match(line)
    if match is None:
        return None
    return IbPort(
        match.group("device"),
        int(match.group("port")),
        re.sub(r":\s*", ": ", match.group("state") or ""),
        re.sub(r"\s+", " ", match.group("rate") or ""),
        match.group("link_layer") or "",
        match.group("driver") or "",
    )


def _net_link(line: str) -> NetLink | None:
    match = _NET_LINE.match(line)
    if match is None:
        return None
    return NetLink(match.group("name"), int(match.group("speed")), match.group("state") == "up")


def _dmabuf(line: str) -> bool | None:
    """``### dmabuf 6.8.0-45-generic open``: True on the open kernel module and Linux 5.12+; None if unreadable."""
    match = re.fullmatch(r"(?P<major>\d{1,3})\.(?P<minor>\d{1,3})\S{0,200} (?P<module>open|closed)", line.strip())
    if match is None:
        return None
    return match["module"] == "open" and (int(match["major"]), int(match["minor"])) >= (5, 12)


def parse(stdout: str, exit_code: int | None = 0) -> IbPorts:
    lines = stdout.splitlines()
    if _PORTS_MARK not in lines:
        return IbPorts(error="no ports section in the output", raw=stdout)
    if _END not in lines:
        return IbPorts(error="output truncated before the end marker", raw=stdout)
    body = lines[lines.index(_PORTS_MARK) + 1 : lines.index(_END)]
    ports: list[IbPort] = []
    net: list[NetLink] = []
    peermem: bool | None = None
    dmabuf = False  # absent from the output of older versions of this command
    in_net = False  # the net section is absent from the output of older versions of this command
    for line in body:
        if line.startswith(_DMABUF_MARK):
            read = _dmabuf(line[len(_DMABUF_MARK) :])
            if read is None:
                return IbPorts(error=f"unexpected dma-buf line {quote(line)}", raw=stdout)
            dmabuf = read
            continue
        if line.startswith(_PEERMEM_MARK):
            state = line[len(_PEERMEM_MARK) :].strip()
            if state not in ("loaded", "absent"):
                return IbPorts(error=f"unexpected peermem state {quote(state)}", raw=stdout)
            peermem = state == "loaded"
            continue
        if line == _NET_MARK or not line.strip():
            in_net = in_net or line == _NET_MARK
            continue
        link, port = (_net_link(line), None) if in_net else (None, _port(line))
        if link is None and port is None:
            what = "network link" if in_net else "port"
            return IbPorts(error=f"unexpected {what} line {quote(line)}", raw=stdout)
        net += [link] if link else []
        ports += [port] if port else []
    if peermem is None:
        return IbPorts(error="no nvidia_peermem line in the output", raw=stdout)
    ports.sort(key=lambda p: (p.device, p.port))
    return IbPorts(ports=ports, net=net, peermem=peermem, dmabuf=dmabuf, raw=stdout)


def fabric_of(model: object) -> NodeFabric | None:
    """The node's fabric (:mod:`inventory.fabric`): its RDMA ports, or without any its physical links that are
    up; None when the check did not run there (``model`` is not its parsed output) or its output was unreadable."""
    if not isinstance(model, IbPorts) or model.error:
        return None
    rdma = []
    for port in model.ports:
        kind = rdma_kind(port.link_layer, port.driver, port.device)
        if kind is not None:
            rdma.append(RdmaPort(port.name, kind, port.active, *_rate_width(port)))
    speeds = [link.speed_mbps / 1000 for link in model.net if link.up and link.speed_mbps > 0]
    return node_fabric(rdma, speeds, model.peermem or model.dmabuf)  # GPUDirect RDMA, either way


def _rate_key(port: IbPort) -> str:
    return f"rate:{port.name}"


def cluster_values(model: IbPorts) -> dict[str, str]:
    """The rate of every active port (a down port fails on its own) and the port count."""
    if model.error:
        return {}
    values = {_rate_key(p): p.rate for p in model.ports if p.active and p.rate}
    values["ports"] = str(len(model.ports))
    return values


def _ib_expected(profile: Profile) -> bool:
    """NET/IB between nodes, or an ``infiniband`` block: the ports are judged, not only recorded."""
    return profile.infiniband is not None or (profile.probes.expected_transport.inter_node or "").startswith("NET/IB")


def _describe(port: IbPort) -> str:
    return f"state {port.state or 'unreadable'}, rate {port.rate or 'unreadable'}, link layer {port.link_layer or '?'}"


_RATE = re.compile(r"^(\d+(?:\.\d+)?) Gb/sec(?: \((\d+X)\b)?")


def _rate_width(port: IbPort) -> tuple[float | None, str | None]:
    """A port's rate (Gb/s) and width (``4X``) from sysfs's ``400 Gb/sec (4X NDR)``; None for what it lacks."""
    match = _RATE.match(port.rate)
    return (float(match[1]), match[2]) if match else (None, None)


def _spec_rows(model: IbPorts, spec: InfinibandSpec) -> list[CheckRow]:
    """The profile's ``infiniband`` block: active port count, each active port's rate and width."""
    active = [p for p in model.ports if p.active]
    rows = []
    if spec.ports is not None:
        ok = len(active) >= spec.ports
        said = ", ".join(p.name for p in active) or "no active port"
        status, reason = (Status.PASS, "ok") if ok else (Status.FAIL, "ports_missing")
        rows.append(CheckRow(NAME, "active_ports", status, reason, str(len(active)), f">= {spec.ports}", said))
    for port in active:
        rate, width = _rate_width(port)
        if spec.rate_gbps is not None and (rate is None or rate < spec.rate_gbps):
            want = f">= {spec.rate_gbps:g} Gb/sec"
            rows.append(
                CheckRow(NAME, f"{port.name} rate", Status.FAIL, "rate_low", port.rate or None, want, _describe(port))
            )
        if spec.width is not None and width != spec.width:
            rows.append(
                CheckRow(NAME, f"{port.name} width", Status.FAIL, "width_low", width, spec.width, _describe(port))
            )
    if active and not [r for r in rows if r.status != Status.PASS] and (spec.rate_gbps or spec.width):
        want = " ".join(x for x in (f"{spec.rate_gbps:g} Gb/sec" if spec.rate_gbps else "", spec.width or "") if x)
        rows.append(CheckRow(NAME, "rate_width", Status.PASS, "ok", f"{len(active)} ports", want))
    return rows


def evaluate(model: IbPorts, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    spec = profile.infiniband
    if spec is not None and not model.ports:
        said = "the profile's infiniband block expects HCA ports"
        return [
            CheckRow(NAME, "ports", Status.FAIL, "no_ib_ports", "0 ports", "ports under /sys/class/infiniband", said)
        ]
    own = _spec_rows(model, spec) if spec is not None else []
    return own + _ports_rows(model, profile, cluster)


def _ports_rows(model: IbPorts, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if not _ib_expected(profile):
        return _recorded_rows(model, profile)
    rows: list[CheckRow] = []
    if not model.ports:
        said = "the profile expects NET/IB between nodes"
        rows.append(
            CheckRow(NAME, "ports", Status.FAIL, "no_ib_ports", "0 ports", "ports under /sys/class/infiniband", said)
        )
    majority_count = cluster.majority_of("ports")
    if model.ports and majority_count is not None and majority_count != str(len(model.ports)):
        names = ", ".join(p.name for p in model.ports)
        count = str(len(model.ports))
        rows.append(CheckRow(NAME, "ports", Status.FAIL, "drift", count, f"{majority_count} (majority)", names))
    for port in model.ports:
        rows += _port_rows(port, cluster)
    rows.append(_gpudirect_row(model, profile))
    return rows


def _recorded_rows(model: IbPorts, profile: Profile) -> list[CheckRow]:
    """A node not expected to use InfiniBand between nodes: its ports and GPUDirect as they are, judged by none."""
    if not model.ports:
        transport = profile.probes.expected_transport.inter_node or "not set"
        said = f"expected inter-node transport: {transport}"
        return [CheckRow(NAME, "ports", Status.SKIP, "no_ib_expected", "0 ports", None, said)]
    recorded = [CheckRow(NAME, p.name, Status.PASS, "recorded", p.state, None, _describe(p)) for p in model.ports]
    peermem = "loaded" if model.peermem else "not loaded"
    recorded.append(CheckRow(NAME, "nvidia_peermem", Status.PASS, "recorded", peermem, None))
    return recorded


def _port_rows(port: IbPort, cluster: ClusterView) -> list[CheckRow]:
    """One port: down, or active (and at another rate than the cluster's majority for that port)."""
    if not port.active:
        return [CheckRow(NAME, port.name, Status.FAIL, "port_down", port.state or None, ACTIVE, _describe(port))]
    rows = [CheckRow(NAME, port.name, Status.PASS, "ok", port.state, ACTIVE, _describe(port))]
    majority = cluster.majority_of(_rate_key(port))
    if majority is not None and majority != port.rate:
        expected = f"{majority} (majority)"
        rows.append(CheckRow(NAME, port.name, Status.FAIL, "drift", port.rate or None, expected, _describe(port)))
    return rows


def _gpudirect_row(model: IbPorts, profile: Profile) -> CheckRow:
    """GPUDirect RDMA: nvidia_peermem loaded, or dma-buf, or recorded where the profile does without it."""
    peermem = "loaded" if model.peermem else "not loaded"
    if model.peermem:
        return CheckRow(NAME, "nvidia_peermem", Status.PASS, "ok", peermem, "loaded")
    if model.dmabuf:
        said = "the open kernel module on Linux 5.12+: NCCL reaches GPU memory through dma-buf"
        return CheckRow(NAME, "nvidia_peermem", Status.PASS, "dmabuf", peermem, "loaded, or dma-buf", said)
    if profile.infiniband is not None and profile.infiniband.peermem is False:
        said = "infiniband.peermem is false: GPUDirect RDMA is not required (neither nvidia_peermem nor dma-buf here)"
        return CheckRow(NAME, "nvidia_peermem", Status.PASS, "recorded", peermem, None, said)
    said = "GPUDirect RDMA is off: NCCL stages inter-node transfers through host memory"
    return CheckRow(NAME, "nvidia_peermem", Status.FAIL, "peermem_missing", peermem, "loaded", said)


# The profile keys a node's fabric implies beside its ports (``profile suggest``; ``fabric: auto`` derives the same).
FLOOR_KEY = "thresholds.allreduce_inter_busbw_gbps_min"
TRANSPORT_KEY = "probes.expected_transport.inter_node"


def suggest_values(model: IbPorts, others: NodeModels) -> SuggestedValues:
    """One node's fabric under the profile keys it implies (and ``fabric``, described)."""
    fabric = fabric_of(model)
    if fabric is None:
        return {}
    values: SuggestedValues = {"fabric": fabric.describe(), TRANSPORT_KEY: fabric.transport}
    if fabric.rdma:
        values["infiniband.ports"] = str(fabric.ports)
        values["infiniband.rate_gbps"] = f"{fabric.rate_gbps:g}" if fabric.rate_gbps else ""
        values["infiniband.width"] = fabric.width or "" if fabric.kind != "efa" else ""
        values["infiniband.peermem"] = "true" if fabric.peermem else "false"
    floor = inter_node_floor(fabric)
    if floor:
        values[FLOOR_KEY] = f"{floor:g}"
    return values


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    cluster_values=cluster_values,
    suggest=suggest_values,
    expectations=(Expectation("infiniband", "preflight", NAME, is_set(lambda p: p.infiniband)),),
    samples=(
        healthy(
            "healthy",
            {"ok"},
            fixture="infiniband/healthy.txt",
            profile={"infiniband": {"ports": 2, "rate_gbps": 400, "width": "4X"}},
        ),
        fault(
            "port_down",
            {"port_down", "rate_low", "width_low"},
            fixture="infiniband/port_down.txt",
            profile={"infiniband": {"ports": 2, "rate_gbps": 400, "width": "4X"}},
        ),
        dead(
            "no_hca",
            {"no_ib_ports"},
            fixture="infiniband/no_hca.txt",
            profile={"infiniband": {"ports": 2, "rate_gbps": 400, "width": "4X"}},
        ),
    ),
)
