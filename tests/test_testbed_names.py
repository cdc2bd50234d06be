"""Test-bed names and subnets, without a test-bed: names that cannot collide (Linux's 15-character interface
names), the CLI's refusal of a bad name, and the choice of a free subnet from the networks in use."""

from __future__ import annotations

import ipaddress
import itertools
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cluster_accept.flows.cli import app
from cluster_accept.testbed import claim, net, subnets

V4 = ipaddress.IPv4Network


@pytest.mark.parametrize("name", ["a", "ca", "cazn1", "z9", "abcdefghij", "vm", "demo3fa9"])
def test_good_names(name: str) -> None:
    net.check_name(name)
    assert len(net.veth_name(name, 1000)) <= 15 and len(net.bridge_name(name)) <= 15


@pytest.mark.parametrize("name", ["", "A", "Ca", "9a", "a-b", "a_b", "a.b", "a b", "abcdefghijk", "é", "ca\n"])
def test_bad_names(name: str) -> None:
    with pytest.raises(ValueError, match="use 1-10 lowercase letters or digits, starting with a letter"):
        net.check_name(name)


@pytest.mark.parametrize(
    "args",
    [
        ["testbed", "up", "--name", "Bad_Name"],
        ["testbed", "up", "--name", "abcdefghijk", "--nodes", "2"],
        ["testbed", "down", "--name", "a-b"],
        ["demo", "--name", "a[red]b"],
    ],
)
def test_cli_refuses_a_bad_name_with_exit_2(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    name = args[args.index("--name") + 1]
    assert f"test-bed name {name!r}: use 1-10 lowercase letters or digits" in result.output
    assert "Traceback" not in result.output


def test_down_by_state_dir_needs_its_state_or_a_name(tmp_path: Path) -> None:
    with pytest.raises(claim.TestbedError, match="no test-bed state in .*: give its --name"):
        claim.name_to_take_down(None, tmp_path)
    assert claim.name_to_take_down(None, None) == "ca"
    assert claim.name_to_take_down("cazn1", tmp_path) == "cazn1"
    (tmp_path / "state.json").write_text('{"prefix": "cazn2"}')
    assert claim.name_to_take_down(None, tmp_path) == "cazn2"
    with pytest.raises(claim.TestbedError, match="holds the test-bed 'cazn2', not 'cazn1'"):
        claim.name_to_take_down("cazn1", tmp_path)
    result = CliRunner().invoke(app, ["testbed", "down", "--state-dir", str(tmp_path / "none")])
    assert result.exit_code == 2 and "give its --name" in result.output


def _resources(name: str) -> list[str]:
    return [net.bridge_name(name)] + [net.veth_name(name, i) for i in (1, 2, 9, 10, 11, 99, 100, 101, 1000)]


def test_different_names_never_share_or_match_a_resource_name() -> None:
    """Every name of up to 3 characters over the letters the interface names add (v, b, r), digits and one
    more letter: no two names share a netns or interface name, and the patterns ``down`` removes by match
    only the name's own."""
    names = [a + "".join(rest) for a in "abrv" for n in range(3) for rest in itertools.product("abrv01", repeat=n)]
    links: dict[str, str] = {}
    namespaces: dict[str, str] = {}
    for name in names:
        net.check_name(name)
        for link in _resources(name):
            assert links.setdefault(link, name) == name, f"{link} belongs to {links[link]} and {name}"
        for ns in (net.netns_name(name, f"node{i:02d}") for i in (1, 10, 100)):
            assert namespaces.setdefault(ns, name) == name, f"{ns} belongs to {namespaces[ns]} and {name}"
    for name in names:
        link_re, ns_re = net.link_pattern(name), net.netns_pattern(name)
        assert sorted(link for link in links if link_re.match(link)) == sorted(
            link for link, owner in links.items() if owner == name
        )
        assert all(owner == name for ns, owner in namespaces.items() if ns_re.match(ns))


def test_free_subnet_skips_what_is_used() -> None:
    assert subnets.free_subnet([], 8) == V4("10.251.0.0/24")
    assert subnets.free_subnet([V4("10.251.0.0/24")], 8) == V4("10.251.1.0/24")
    assert subnets.free_subnet([V4("10.251.0.128/25"), V4("10.251.1.7/32")], 8) == V4("10.251.2.0/24")
    assert subnets.free_subnet([V4("10.251.0.0/22")], 8) == V4("10.251.4.0/24")  # the former fixed default
    assert subnets.free_subnet([V4("10.251.0.0/16")], 8) == V4("10.252.0.0/24")
    assert subnets.free_subnet([V4("10.0.0.0/8")], 8) == V4("172.16.0.0/24")
    assert subnets.free_subnet([V4("10.0.0.0/8"), V4("172.16.0.0/12")], 8) == V4("192.168.0.0/24")
    assert subnets.free_subnet([ipaddress.IPv6Network("::/0")], 8) == V4("10.251.0.0/24")


def test_free_subnet_fits_the_node_count() -> None:
    assert subnets.prefix_length(1) == 24 and subnets.prefix_length(253) == 24
    assert subnets.prefix_length(254) == 23 and subnets.prefix_length(1000) == 22
    big = subnets.free_subnet([V4("10.251.1.0/24")], 300)
    assert big == V4("10.251.2.0/23") and big.num_addresses - 2 >= 301
    assert subnets.free_subnet([V4("10.251.0.0/24")], 1000) == V4("10.251.4.0/22")


def test_no_free_subnet_is_an_error() -> None:
    with pytest.raises(ValueError, match="no free /24 subnet left in 10.251.0.0/16; give one with --subnet"):
        subnets.free_subnet([V4("10.251.0.0/17"), V4("10.251.128.0/17")], 8, pools=[V4("10.251.0.0/16")])


ADDRS = [
    {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
    {"ifname": "eth0", "addr_info": [{"family": "inet", "local": "10.251.0.9", "prefixlen": 24},
                                     {"family": "inet6", "local": "fe80::1", "prefixlen": 64}]},
    {"ifname": "wg0", "addr_info": [{"family": "inet", "local": "10.9.0.1", "address": "10.9.0.2", "prefixlen": 32}]},
]  # fmt: skip
ROUTES = [
    {"dst": "default", "gateway": "10.251.0.1", "dev": "eth0"},
    {"dst": "10.251.0.0/24", "dev": "eth0", "protocol": "kernel"},
    {"dst": "10.251.16.0/20", "gateway": "10.251.0.1", "dev": "eth0"},
    {"type": "local", "dst": "10.251.0.9", "dev": "eth0", "table": "local"},
    {"type": "broadcast", "dst": "10.251.0.255", "dev": "eth0", "table": "local"},
    {"type": "blackhole", "dst": "10.251.1.0/24"},
]


def test_networks_in_use_from_addresses_and_routes() -> None:
    used = subnets.networks_in_use(ADDRS, ROUTES)
    assert [what for _, what in used] == [
        "127.0.0.1/8 on lo",
        "10.251.0.9/24 on eth0",
        "fe80::1/64 on eth0",
        "10.9.0.1/32 on wg0",
        "peer 10.9.0.2/32 on wg0",
        "route 10.251.16.0/20 via 10.251.0.1 dev eth0",
        "route 10.251.1.0/24",
    ]
    assert subnets.free_subnet([n for n, _ in used], 8) == V4("10.251.2.0/24")
    assert subnets.overlapping(V4("10.251.0.0/16"), used) == [
        "10.251.0.9/24 on eth0", "route 10.251.16.0/20 via 10.251.0.1 dev eth0", "route 10.251.1.0/24",
    ]  # fmt: skip
