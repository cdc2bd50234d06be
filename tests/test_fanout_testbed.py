"""The SSH fan-out against real sshd nodes: unreachable causes, host key policies, jump host, quoting."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from cluster_accept.inventory.load import load_inventory
from cluster_accept.inventory.model import Node
from cluster_accept.remote.fanout import fan_out, run_node
from cluster_accept.remote.result import NodeStatus, RemoteCommand, UnreachableCause
from cluster_accept.testbed.faults import fault_plan_from_data

pytestmark = pytest.mark.testbed

COMMANDS = [RemoteCommand("gpus", "nvidia-smi -L"), RemoteCommand("driver", "cat /proc/driver/nvidia/version")]


def with_ssh(node: Node, **changes: object) -> Node:
    return dataclasses.replace(node, ssh=node.ssh.model_copy(update=changes))


def test_32_nodes_exactly_the_four_broken_ones_are_unreachable(testbed_factory) -> None:  # type: ignore[no-untyped-def]
    plan = fault_plan_from_data(
        {"nodes": {"node05": ["down"], "node12": ["down"], "node19": ["down"], "node27": ["host_key_changed"]}}
    )
    bed = testbed_factory(nodes=32, faults=plan, prefix="caf", subnet="10.254.0.0/22")
    inventory = load_inventory(bed.inventory_path)
    assert len(inventory.tested) == 32
    results = fan_out(inventory.tested, COMMANDS, concurrency=64)
    unreachable = {name: r.cause for name, r in results.items() if r.status is NodeStatus.UNREACHABLE}
    assert unreachable == {
        "node05": UnreachableCause.REFUSED,
        "node12": UnreachableCause.REFUSED,
        "node19": UnreachableCause.REFUSED,
        "node27": UnreachableCause.HOST_KEY,
    }
    assert "changed" in results["node27"].detail
    for name, result in results.items():
        if name in unreachable:
            continue
        assert result.status is NodeStatus.OK, (name, result.detail)
        gpus, driver = result.commands
        assert gpus.ok and gpus.stdout.count("NVIDIA H200") == 4
        assert driver.ok and "580.159.04" in driver.stdout


def test_causes_auth_dns_timeout_and_policies(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    plan = fault_plan_from_data({"nodes": {"node02": ["auth_refused"], "node03": ["off"]}})
    bed = testbed_factory(nodes=4, faults=plan, prefix="cag", subnet="10.254.8.0/24")
    inventory = load_inventory(bed.inventory_path)
    node1 = inventory.node("node01")
    auth = run_node(inventory.node("node02"), COMMANDS)
    assert (auth.status, auth.cause) == (NodeStatus.UNREACHABLE, UnreachableCause.AUTH)
    off = run_node(with_ssh(inventory.node("node03"), connect_timeout_s=2), COMMANDS)
    assert off.status is NodeStatus.UNREACHABLE
    assert off.cause in (UnreachableCause.TIMEOUT, UnreachableCause.NO_ROUTE)
    dns = run_node(dataclasses.replace(node1, name="no-such-node.invalid", address=None), COMMANDS)
    assert (dns.status, dns.cause) == (NodeStatus.UNREACHABLE, UnreachableCause.DNS)
    # The controller's key gone (the inventory refuses a missing one when it loads; this one vanished after):
    # the tool's failure, not a node that refused a key.
    missing_key = run_node(with_ssh(node1, identity_file=str(tmp_path / "nope")), COMMANDS)
    assert (missing_key.status, missing_key.cause) == (NodeStatus.TOOL_ERROR, None)
    assert "FileNotFoundError" in missing_key.detail

    # An unknown key: refused under 'strict', trusted and remembered under 'accept-new'.
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    strict = run_node(with_ssh(node1, known_hosts=str(empty)), COMMANDS)
    assert (strict.status, strict.cause) == (NodeStatus.UNREACHABLE, UnreachableCause.HOST_KEY)
    tofu = run_node(with_ssh(node1, known_hosts=str(empty), host_key_policy="accept-new"), COMMANDS)
    assert tofu.status is NodeStatus.OK
    assert bed.nodes["node01"] in empty.read_text()
    again = run_node(with_ssh(node1, known_hosts=str(empty)), COMMANDS)
    assert again.status is NodeStatus.OK

    # A changed key stays refused even under accept-new.
    changed = tmp_path / "changed_hosts"
    shutil.copy(bed.known_hosts_path, changed)
    text = changed.read_text()
    other_key_line = next(line for line in text.splitlines() if line.startswith(bed.nodes["node04"] + " "))
    forged = text.replace(
        next(line for line in text.splitlines() if line.startswith(bed.nodes["node01"] + " ")),
        bed.nodes["node01"] + " " + other_key_line.split(" ", 1)[1],
    )
    changed.write_text(forged)
    bad = run_node(with_ssh(node1, known_hosts=str(changed), host_key_policy="accept-new"), COMMANDS)
    assert (bad.status, bad.cause) == (NodeStatus.UNREACHABLE, UnreachableCause.HOST_KEY)


def test_jump_host_and_hostile_values_over_ssh(testbed_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = testbed_factory(nodes=4, faults=None, prefix="cah2", subnet="10.254.12.0/24")
    inventory = load_inventory(bed.inventory_path)
    jump = f"root@{bed.nodes['node01']}:22"
    via_jump = run_node(with_ssh(inventory.node("node02"), jump=jump), COMMANDS)
    assert via_jump.status is NodeStatus.OK, via_jump.detail
    assert via_jump.commands[0].stdout.count("NVIDIA H200") == 4
    dead_jump = run_node(
        with_ssh(inventory.node("node03"), jump="root@10.254.12.250:22", connect_timeout_s=2), COMMANDS
    )
    assert (dead_jump.status, dead_jump.cause) == (NodeStatus.UNREACHABLE, UnreachableCause.JUMP)

    pwned = tmp_path / "pwned"
    hostile = f"$(touch {pwned}); `touch {pwned}`; '\"; touch {pwned}"
    echo = RemoteCommand("echo", 'printf %s "$V"', env={"V": hostile})
    result = run_node(inventory.node("node04"), [echo])
    assert result.commands[0].stdout == hostile
    assert not pwned.exists()  # the namespaces share this filesystem


def test_user_ssh_config_is_honoured(testbed_factory, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import cluster_accept.remote.ssh

    bed = testbed_factory(nodes=4, faults=None, prefix="cah2", subnet="10.254.12.0/24")
    inventory = load_inventory(bed.inventory_path)
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(f"Host gpu-alias\n    HostName {bed.nodes['node03']}\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(cluster_accept.remote.ssh, "_ssh_config", None)
    node = dataclasses.replace(inventory.node("node03"), name="gpu-alias", address=None)
    result = run_node(node, COMMANDS)
    assert result.status is NodeStatus.OK, result.detail
    assert "580.159.04" in result.commands[1].stdout
