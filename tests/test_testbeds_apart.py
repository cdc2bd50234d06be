"""Test-beds that do not collide: two names side by side on subnets of their own, each taken down by name
alone; an ``up`` onto a running test-bed's name or state dir refused (a stale one replaced); the CLI's
``testbed up/down --name`` and ``demo --name``."""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cluster_accept.flows.cli import app
from cluster_accept.testbed import bed, net, subnets

# Not untimed: its SSH to a test-bed node beside another xdist worker was closed by that node's sshd once in CI
# (as for the test-bed's own sshd answers): it runs in the second, one-worker command.
pytestmark = [pytest.mark.testbed]

ONE, TWO, CLI = "cazn1", "cazn2", "cazn3"


@pytest.fixture
def names() -> Iterator[None]:
    """This file's test-beds are down before and after each test, whatever happens in it."""

    def down_all() -> None:
        for name in (ONE, TWO, CLI):
            bed.down(None, name)

    down_all()
    try:
        yield
    finally:
        down_all()


def answers(tb: bed.Testbed, node: str) -> str:
    proc = subprocess.run(
        tb.ssh_argv(node, "echo $CLUSTER_ACCEPT_TESTBED_NODE"), capture_output=True, text=True, timeout=30, check=False
    )
    return proc.stdout.strip() or proc.stderr.strip()


def alone_in(tb: bed.Testbed) -> list[str]:
    """What on this machine overlaps the test-bed's subnet: only its own bridge address."""
    return subnets.overlapping(ipaddress.ip_network(tb.subnet), subnets.in_use())


def test_two_names_side_by_side_each_down_by_name(names: None, tmp_path: Path) -> None:
    with ThreadPoolExecutor(2) as pool:  # brought up at once: each takes a subnet of its own
        first = pool.submit(bed.up, 2, state_dir=tmp_path / ONE, prefix=ONE)
        second = pool.submit(bed.up, 3, state_dir=tmp_path / TWO, prefix=TWO, base="h100x1")
        one, two = first.result(), second.result()
    assert not ipaddress.ip_network(one.subnet).overlaps(ipaddress.ip_network(two.subnet))
    assert alone_in(one) == [f"{one.host_ip}/24 on {ONE}br0"] and alone_in(two) == [f"{two.host_ip}/24 on {TWO}br0"]
    assert [answers(one, n) for n in one.nodes] == ["node01", "node02"]
    assert [answers(two, n) for n in two.nodes] == ["node01", "node02", "node03"]

    bed.down(None, ONE)  # by name alone: the state dir is found from the running test-bed
    assert net.list_netns(ONE) == [] and net.list_links(ONE) == [] and not one.state_dir.exists()
    assert len(net.list_netns(TWO)) == 3 and two.state_dir.exists()
    assert [answers(two, n) for n in two.nodes] == ["node01", "node02", "node03"]
    bed.down(None, TWO)
    assert net.list_netns(TWO) == [] and net.list_links(TWO) == [] and not two.state_dir.exists()


def test_up_onto_a_running_testbed_is_refused_and_a_stale_one_replaced(names: None, tmp_path: Path) -> None:
    running = bed.up(2, state_dir=tmp_path / ONE, prefix=ONE)
    pids = {n: (running.node_dir(n) / "sshd.pid").read_text() for n in running.nodes}
    refusal = rf"test-bed '{ONE}' is already running \(state dir {tmp_path / ONE}\): 2 network namespace"
    down_hint = f"Take it down first with `cluster-accept testbed down --name {ONE}`"
    with pytest.raises(bed.TestbedError, match=refusal) as same:
        bed.up(2, state_dir=tmp_path / ONE, prefix=ONE)
    assert down_hint in str(same.value)
    with pytest.raises(bed.TestbedError, match=refusal):
        bed.up(2, state_dir=tmp_path / "elsewhere", prefix=ONE)  # the same name, another state dir
    with pytest.raises(bed.TestbedError, match=rf"{tmp_path / ONE} holds the test-bed '{ONE}'"):
        bed.up(2, state_dir=tmp_path / ONE, prefix=TWO)  # another name, the same state dir
    assert net.list_netns(TWO) == [] and not (tmp_path / "elsewhere").exists()
    assert [answers(running, n) for n in running.nodes] == ["node01", "node02"]
    assert {n: (running.node_dir(n) / "sshd.pid").read_text() for n in running.nodes} == pids
    assert bed.load(tmp_path / ONE, ONE).nodes == running.nodes

    net.teardown(ONE)  # a crash: nothing alive, state.json left behind
    assert (tmp_path / ONE / "state.json").exists()
    again = bed.up(2, state_dir=tmp_path / ONE, prefix=ONE)
    assert [answers(again, n) for n in again.nodes] == ["node01", "node02"]


def test_cli_up_and_down_by_name(names: None, tmp_path: Path) -> None:
    runner = CliRunner()
    up = ["testbed", "up", "--name", CLI, "--nodes", "2", "--state-dir", str(tmp_path / CLI)]
    first = runner.invoke(app, up)
    assert first.exit_code == 0, first.output
    tb = bed.load(tmp_path / CLI, CLI)
    assert f"test-bed {CLI}: 2 nodes up on {tb.subnet}; state dir: {tmp_path / CLI}" in first.output
    assert f"take it down with: cluster-accept testbed down --name {CLI}" in first.output
    assert [answers(tb, n) for n in tb.nodes] == ["node01", "node02"]

    again = runner.invoke(app, up[:-2])  # its default state dir: refused all the same
    assert again.exit_code == 2, again.output
    assert f"test-bed '{CLI}' is already running" in again.output
    assert f"cluster-accept testbed down --name {CLI}" in again.output
    demo = runner.invoke(app, ["demo", "--name", CLI, "--out", str(tmp_path / "runs")])
    assert demo.exit_code == 2 and f"test-bed '{CLI}' is already running" in demo.output, demo.output
    assert [answers(tb, n) for n in tb.nodes] == ["node01", "node02"]  # neither replaced nor taken down

    down = runner.invoke(app, ["testbed", "down", "--name", CLI])
    assert down.exit_code == 0 and f"test-bed {CLI} down" in down.output, down.output
    assert net.list_netns(CLI) == [] and net.list_links(CLI) == [] and not (tmp_path / CLI).exists()
