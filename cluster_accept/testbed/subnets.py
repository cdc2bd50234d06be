"""Subnets for test-beds: the networks this machine already uses, and a free one that fits a test-bed.

A test-bed's subnet holds the host's address on the bridge and one address per node. When none is given,
:func:`free_subnet` takes the first block of the smallest fitting size (at least a /24) in the private
ranges, starting at ``10.251.0.0``, that overlaps no address on any interface and no route of this machine
(:func:`networks_in_use`). The default route covers everything and is not counted.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from typing import Any

from cluster_accept.testbed import net
from cluster_accept.testbed.claim import TestbedError

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
POOLS: tuple[ipaddress.IPv4Network, ...] = tuple(
    ipaddress.IPv4Network(n)
    for n in ("10.251.0.0/16", "10.252.0.0/14", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
)
# Route types that do not claim a network for traffic (the local table's own entries).
_NOT_CLAIMING = {"local", "broadcast", "multicast", "anycast"}


def prefix_length(nodes: int) -> int:
    """The longest prefix with room for the host's address and ``nodes`` nodes, at most /24."""
    return min(24, 32 - (nodes + 2).bit_length())


def free_subnet(
    used: Iterable[IPNetwork], nodes: int, pools: Sequence[ipaddress.IPv4Network] = POOLS
) -> ipaddress.IPv4Network:
    """The first block for ``nodes`` nodes in ``pools`` (in order) that overlaps none of ``used``."""
    length = prefix_length(nodes)
    size = 1 << (32 - length)
    taken = [(int(n.network_address), int(n.broadcast_address)) for n in used if n.version == 4]
    for pool in pools:
        start, last = int(pool.network_address), int(pool.broadcast_address)
        while start + size - 1 <= last:
            end = start + size - 1
            clash = max((hi for lo, hi in taken if lo <= end and hi >= start), default=None)
            if clash is None:
                return ipaddress.IPv4Network((start, length))
            start = (clash // size + 1) * size
    raise ValueError(f"no free /{length} subnet left in {', '.join(map(str, pools))}; give one with --subnet")


def networks_in_use(addrs: list[dict[str, Any]], routes: list[dict[str, Any]]) -> list[tuple[IPNetwork, str]]:
    """Networks taken on this machine, each with what takes it, from ``ip -j addr show`` and
    ``ip -j route show table all``: every interface address's network, then every route not already
    counted (a VPN's or a container network's), without the default route."""
    found: list[tuple[IPNetwork, str]] = []
    for link in addrs:
        for info in link.get("addr_info", []):
            if info.get("family") not in ("inet", "inet6") or "local" not in info:
                continue
            iface = ipaddress.ip_interface(f"{info['local']}/{info.get('prefixlen', 32)}")
            found.append((iface.network, f"{iface} on {link.get('ifname', '?')}"))
            if "address" in info and info["address"] != info["local"]:  # the peer of a point-to-point link
                peer = ipaddress.ip_interface(f"{info['address']}/{info.get('prefixlen', 32)}")
                found.append((peer.network, f"peer {peer} on {link.get('ifname', '?')}"))
    seen = {network for network, _ in found}
    for route in routes:
        dst = str(route.get("dst", ""))
        if not dst or dst == "default" or route.get("type") in _NOT_CLAIMING:
            continue
        try:
            network = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        if network in seen:
            continue
        seen.add(network)
        via = f" via {route['gateway']}" if route.get("gateway") else ""
        dev = f" dev {route['dev']}" if route.get("dev") else ""
        found.append((network, f"route {dst}{via}{dev}"))
    return found


def in_use() -> list[tuple[IPNetwork, str]]:
    """:func:`networks_in_use` of this machine, now."""
    return networks_in_use(net.ip_json("addr", "show"), net.ip_json("route", "show", "table", "all"))


def overlapping(network: IPNetwork, used: Iterable[tuple[IPNetwork, str]]) -> list[str]:
    """What in ``used`` overlaps ``network``."""
    return [what for taken, what in used if taken.version == network.version and taken.overlaps(network)]


def hosts(network: IPNetwork, nodes: int) -> list[str]:
    """The host's address and one per node: the first ``nodes + 1`` of ``network``."""
    hosts = [str(h) for _, h in zip(range(nodes + 1), network.hosts(), strict=False)]
    if len(hosts) < nodes + 1:
        raise TestbedError(f"subnet {network} has room for {max(len(hosts) - 1, 0)} nodes, not {nodes}")
    return hosts


def claim(network: IPNetwork | None, nodes: int) -> IPNetwork:
    """``network`` when nothing here uses it, else an error; a free subnet when none is given."""
    used = in_use()
    if network is None:
        return free_subnet([n for n, _ in used], nodes)
    clash = overlapping(network, used)
    if clash:
        raise TestbedError(f"subnet {network} is already in use here ({', '.join(clash)}); pick another subnet")
    return network
