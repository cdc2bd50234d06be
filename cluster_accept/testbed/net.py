"""The test-bed's network: one namespace per node on a Linux bridge, veth pairs, tc limits, link faults.

Every resource is named from the prefix, the test-bed's name (namespace ``<prefix>-nodeNN``, bridge
``<prefix>br0``, host-side veth ``<prefix>v<index>``), so that ``down`` can find and remove them without any
state file and never touches another prefix's: a prefix is lowercase letters and digits (no ``-``, so the
namespace names of two prefixes never meet; a veth name ends in ``v`` + digits and a bridge name in ``br0``,
so neither kind can be another prefix's). The bridge and veths carry the alias ``cluster-accept-testbed:<prefix>``
(the bridge's also names the state dir): an interface of that name without it (``vmbr0``, ``virbr0``) is
never removed. Commands go through ``ip -batch`` where possible: one process for all host-side
links instead of hundreds keeps ``up`` of 64 nodes within seconds on two cores.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

IP = "ip"
TC = "tc"
MAX_NAME = 10  # "<name>v1000" fills Linux's 15-character interface names
NAME_RE = re.compile(rf"[a-z][a-z0-9]{{0,{MAX_NAME - 1}}}")
MARK = "cluster-accept-testbed"
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


def check_name(prefix: str) -> None:
    """A test-bed name (the prefix of its resources): 1-10 lowercase letters or digits, a letter first."""
    if not isinstance(prefix, str) or not NAME_RE.fullmatch(prefix):
        raise ValueError(
            f"test-bed name {prefix!r}: use 1-{MAX_NAME} lowercase letters or digits, starting with a letter "
            "(it begins the names of the test-bed's network namespaces and interfaces, which Linux limits "
            "to 15 characters)"
        )


def bridge_name(prefix: str) -> str:
    return f"{prefix}br0"


def veth_name(prefix: str, index: int) -> str:
    name = f"{prefix}v{index}"
    if len(name) > 15:
        raise ValueError(f"interface name {name} is longer than 15 characters; use a shorter prefix")
    return name


def netns_name(prefix: str, node: str) -> str:
    return f"{prefix}-{node}"


def rails_netns(prefix: str) -> str:
    """The namespace holding the prefix's rail switches (one bridge per rail)."""
    return f"{prefix}-rails"


def netns_pattern(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(prefix)}-(?:node\d+|rails)$")


def link_pattern(prefix: str) -> re.Pattern[str]:
    """The host-side link names of the prefix: its veths and its bridge."""
    return re.compile(rf"^(?:{re.escape(prefix)}v\d+|{re.escape(bridge_name(prefix))})$")


def link_alias(prefix: str) -> str:
    return f"{MARK}:{prefix}"


def list_netns(prefix: str) -> list[str]:
    pattern = netns_pattern(prefix)
    names = [line.split()[0] for line in run([IP, "netns", "list"], check=False).splitlines() if line.strip()]
    return sorted(n for n in names if pattern.match(n))


def ip_json(*args: str) -> list[dict[str, Any]]:
    """``ip -j ARGS`` parsed; an empty list when ip fails or prints nothing."""
    try:
        data = json.loads(run([IP, "-j", *args], check=False) or "[]")
    except ValueError:
        return []
    return [item for item in data if isinstance(item, dict)] if isinstance(data, list) else []


def _named_links(prefix: str) -> list[tuple[str, bool]]:
    """Host links named as the prefix's, each with whether a test-bed of that prefix made it (its alias)."""
    pattern, mark = link_pattern(prefix), link_alias(prefix)
    found = []
    for link in ip_json("link", "show"):
        name, alias = str(link.get("ifname", "")), str(link.get("ifalias", ""))
        if pattern.match(name):
            found.append((name, alias == mark or alias.startswith(mark + ":")))
    return found


def list_links(prefix: str) -> list[str]:
    """Host-side links a test-bed of the prefix made: its veths and its bridge."""
    return [name for name, own in _named_links(prefix) if own]


def foreign_links(prefix: str) -> list[str]:
    """Links with a name the prefix would use that no test-bed made (``vmbr0`` for the prefix ``vm``)."""
    return [name for name, own in _named_links(prefix) if not own]


def bridge_state_dir(prefix: str) -> str | None:
    """The state dir recorded on the prefix's bridge (its alias), if the bridge is there and says."""
    head = link_alias(prefix) + ":"
    for link in ip_json("link", "show", "dev", bridge_name(prefix)):
        alias = str(link.get("ifalias", ""))
        if alias.startswith(head) and len(alias) > len(head):
            return alias[len(head) :]
    return None


def netns_pids(netns: str) -> list[int]:
    out = run([IP, "netns", "pids", netns], check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def create_bridge(prefix: str, host_cidr: str, state_dir: str = "") -> None:
    """The prefix's bridge with the host's address; its alias marks it as the prefix's and names the state dir."""
    br, mark = bridge_name(prefix), link_alias(prefix)
    batch([f"link add {br} type bridge", f"link set {br} alias {mark}"])
    alias = f"{mark}:{state_dir}"
    if state_dir and len(alias.encode()) < 256 and "\n" not in alias:
        run([IP, "link", "set", "dev", br, "alias", alias])
    batch([f"addr add {host_cidr} dev {br}", f"link set {br} up"])


def create_nodes(prefix: str, nodes: Sequence[tuple[str, int, str]]) -> None:
    """Create namespaces and veth pairs for ``(node, index, ip/len)``; ``eth0`` inside, ``lo`` up."""
    br = bridge_name(prefix)
    host: list[str] = []
    for node, index, _ in nodes:
        ns, veth = netns_name(prefix, node), veth_name(prefix, index)
        host += [f"netns add {ns}", f"link add {veth} type veth peer name eth0 netns {ns}"]
        host += [f"link set {veth} master {br} alias {link_alias(prefix)} up"]
    batch(host)

    def inside(item: tuple[str, int, str]) -> None:
        node, _, cidr = item
        batch([f"addr add {cidr} dev eth0", "link set eth0 up", "link set lo up"], netns=netns_name(prefix, node))

    pmap(inside, list(nodes))


RAIL_NET = "192.168.{rail}.{host}/24"  # inside the namespaces only: never routed from the host


def rail_ifname(rail: int) -> str:
    return f"rail{rail}"


def create_rails(prefix: str, rails: int, nodes: Sequence[tuple[str, int]]) -> None:
    """``rails`` more networks, each a bridge in the prefix's rails namespace with one veth to every node:
    ``rail<k>`` inside the node at 192.168.<100+k>.<index>. A rail is a node's NIC and cable of one GPU index;
    shaping one node's ``rail<k>`` (:func:`set_rail_rate`) is a slow NIC or cable on that rail."""
    if rails < 1:
        return
    switch = rails_netns(prefix)
    batch([f"netns add {switch}"])
    batch([f"link add {rail_ifname(k)} type bridge" for k in range(rails)], netns=switch)
    batch([f"link set {rail_ifname(k)} up" for k in range(rails)] + ["link set lo up"], netns=switch)
    lines = []
    for node, index in nodes:
        for k in range(rails):
            lines.append(f"link add r{k}n{index} type veth peer name {rail_ifname(k)} netns {netns_name(prefix, node)}")
            lines.append(f"link set r{k}n{index} master {rail_ifname(k)} up")
    batch(lines, netns=switch)

    def inside(item: tuple[str, int]) -> None:
        node, index = item
        cmds = []
        for k in range(rails):
            cmds += [f"addr add {RAIL_NET.format(rail=100 + k, host=index)} dev {rail_ifname(k)}"]
            cmds += [f"link set {rail_ifname(k)} up"]
        batch(cmds, netns=netns_name(prefix, node))

    pmap(inside, list(nodes))


def set_rail_rate(prefix: str, index: int, node: str, rail: int, rate_mbit: float | None) -> None:
    """A tbf limit both ways on one node's ``rail<k>`` (its end and the switch's end of the veth)."""
    for netns, dev in ((netns_name(prefix, node), rail_ifname(rail)), (rails_netns(prefix), f"r{rail}n{index}")):
        _shape([TC, "-n", netns], dev, rate_mbit)


def _shape(cmd: list[str], dev: str, rate_mbit: float | None) -> None:
    if rate_mbit is None:
        run(cmd + ["qdisc", "del", "dev", dev, "root"], check=False)
        return
    burst = max(1600, int(rate_mbit * 1e6 / 8 / 250))  # ~4 ms of traffic, at least one packet
    run(cmd + ["qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit",
               "burst", str(burst), "latency", "100ms"])  # fmt: skip


def set_rate(prefix: str, node: str, index: int, rate_mbit: float | None) -> None:
    """A tbf limit both ways on the node's link (host-side veth egress and the node's eth0 egress)."""
    ns, veth = netns_name(prefix, node), veth_name(prefix, index)
    for cmd in ([TC], [TC, "-n", ns]):
        _shape(cmd, veth if len(cmd) == 1 else "eth0", rate_mbit)


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
    """Kill every process in the prefix's namespaces, delete them, their veths and the bridge (only links a
    test-bed made: see :func:`list_links`)."""
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
