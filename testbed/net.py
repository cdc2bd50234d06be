"""The test-bed's network: one namespace per node on a Linux bridge, veth pairs, tc limits, link faults.

Every resource is named from the prefix (namespace ``<prefix>-nodeNN``, bridge ``<prefix>br0``, host-side
veth ``<prefix>v<index>``) so that ``down`` can find and remove them without any state file and never
touches another prefix's. Commands go through ``ip -batch`` where possible: one process for all host-side
links instead of hundreds keeps ``up`` of 64 nodes within seconds on two cores.
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

IP = "ip"
TC = "tc"
PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")
T = TypeVar("T")
R = TypeVar("R")


class NetError(RuntimeError):
    """A network set-up command failed; the message holds the command and its stderr."""


def run(cmd: Sequence[str], stdin: str | None = None, check: bool = True, timeout: float = 60) -> str:
    """Run ``cmd`` (no shell), return stdout; raise :class:`NetError` with stderr on failure."""
    proc = subprocess.run(list(cmd), input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()
        raise NetError(f"{' '.join(cmd)} failed (exit {proc.returncode}): {detail}")
    return proc.stdout


def batch(lines: Iterable[str], netns: str | None = None, force: bool = False) -> None:
    """Run ``ip`` commands in one process (``ip [-n NS] [-force] -batch -``)."""
    text = "".join(line + "\n" for line in lines)
    if not text:
        return
    cmd = [IP] + (["-n", netns] if netns else []) + (["-force"] if force else []) + ["-batch", "-"]
    run(cmd, stdin=text, check=not force)


def pmap(fn: Callable[[T], R], items: Sequence[T], workers: int = 16) -> list[R]:
    """``map`` over a thread pool (the work is waiting on child processes, not Python)."""
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(pool.map(fn, items))


def check_prefix(prefix: str) -> None:
    if not PREFIX_RE.match(prefix):
        raise ValueError(f"prefix {prefix!r}: use 1-8 lowercase letters/digits starting with a letter")


def bridge_name(prefix: str) -> str:
    return f"{prefix}br0"


def veth_name(prefix: str, index: int) -> str:
    name = f"{prefix}v{index}"
    if len(name) > 15:
        raise ValueError(f"interface name {name} is longer than 15 characters; use a shorter prefix")
    return name


def netns_name(prefix: str, node: str) -> str:
    return f"{prefix}-{node}"


def list_netns(prefix: str) -> list[str]:
    pattern = re.compile(rf"^{re.escape(prefix)}-node\d+$")
    names = [line.split()[0] for line in run([IP, "netns", "list"], check=False).splitlines() if line.strip()]
    return sorted(n for n in names if pattern.match(n))


def list_links(prefix: str) -> list[str]:
    """Host-side links of the prefix: its veths and its bridge."""
    pattern = re.compile(rf"^({re.escape(prefix)}v\d+|{re.escape(bridge_name(prefix))})$")
    names = []
    for line in run([IP, "-o", "link", "show"], check=False).splitlines():
        parts = line.split(":", 2)
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if pattern.match(name):
                names.append(name)
    return names


def netns_pids(netns: str) -> list[int]:
    out = run([IP, "netns", "pids", netns], check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def addresses_overlapping(network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> list[str]:
    """Addresses already configured on this host (any interface) that fall into ``network``."""
    found = []
    for line in run([IP, "-o", "addr", "show"], check=False).splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[2] in ("inet", "inet6"):
            iface = ipaddress.ip_interface(parts[3])
            if iface.version == network.version and iface.network.overlaps(network):
                found.append(f"{parts[3]} on {parts[1]}")
    return found


def create_bridge(prefix: str, host_cidr: str) -> None:
    br = bridge_name(prefix)
    batch([f"link add {br} type bridge", f"addr add {host_cidr} dev {br}", f"link set {br} up"])


def create_nodes(prefix: str, nodes: Sequence[tuple[str, int, str]]) -> None:
    """Create namespaces and veth pairs for ``(node, index, ip/len)``; ``eth0`` inside, ``lo`` up."""
    br = bridge_name(prefix)
    host: list[str] = []
    for node, index, _ in nodes:
        ns, veth = netns_name(prefix, node), veth_name(prefix, index)
        host += [f"netns add {ns}", f"link add {veth} type veth peer name eth0 netns {ns}"]
        host += [f"link set {veth} master {br} up"]
    batch(host)

    def inside(item: tuple[str, int, str]) -> None:
        node, _, cidr = item
        batch([f"addr add {cidr} dev eth0", "link set eth0 up", "link set lo up"], netns=netns_name(prefix, node))

    pmap(inside, list(nodes))


def set_rate(prefix: str, node: str, index: int, rate_mbit: float | None) -> None:
    """A tbf limit both ways on the node's link (host-side veth egress and the node's eth0 egress)."""
    ns, veth = netns_name(prefix, node), veth_name(prefix, index)
    for cmd in ([TC], [TC, "-n", ns]):
        dev = veth if len(cmd) == 1 else "eth0"
        if rate_mbit is None:
            run(cmd + ["qdisc", "del", "dev", dev, "root"], check=False)
        else:
            burst = max(1600, int(rate_mbit * 1e6 / 8 / 250))  # ~4 ms of traffic, at least one packet
            run(cmd + ["qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit",
                       "burst", str(burst), "latency", "100ms"])  # fmt: skip


def set_link(prefix: str, node: str, ip: str, up: bool) -> None:
    """Take the node's link down (``off``: packets vanish, connections time out) or bring it back.

    A permanent neighbour entry on the host keeps the kernel from answering "no route to host" after a
    failed ARP, so a client really sees a silent, timing-out node.
    """
    ns, br = netns_name(prefix, node), bridge_name(prefix)
    if up:
        batch(["link set eth0 up"], netns=ns)
        run([IP, "neigh", "del", ip, "dev", br], check=False)
        return
    mac = run([IP, "-n", ns, "-br", "link", "show", "dev", "eth0"]).split()[2]
    run([IP, "neigh", "replace", ip, "lladdr", mac, "dev", br, "nud", "permanent"])
    batch(["link set eth0 down"], netns=ns)


def kill_pids(pids: Iterable[int], wait_s: float = 3.0) -> None:
    """SIGKILL ``pids`` and wait until they are gone (zombies count as gone)."""
    pids = [p for p in set(pids) if p > 1 and p != os.getpid()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _alive(p)]
        if pids:
            time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def teardown(prefix: str) -> None:
    """Kill every process in the prefix's namespaces, delete them, their veths and the bridge."""
    namespaces = list_netns(prefix)
    kill_pids([pid for ns in namespaces for pid in netns_pids(ns)])
    links = list_links(prefix)
    veths = [name for name in links if name != bridge_name(prefix)]
    batch([f"link del {v}" for v in veths], force=True)
    batch([f"netns del {ns}" for ns in namespaces], force=True)
    if bridge_name(prefix) in links:
        batch([f"link del {bridge_name(prefix)}"], force=True)
    left = list_netns(prefix) + list_links(prefix)
    if left:
        raise NetError(f"could not remove {', '.join(left)}")
