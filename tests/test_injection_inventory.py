"""No shell injection through the values of the inventory: hostile hosts, addresses, jump hosts and ports
are refused by the loader; users, key and known_hosts paths reach paramiko as data; and the reproduce lines
of the report quote the inventory path and the probe's command, executed by bash in the sandbox of
injection_sandbox.py.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

import cluster_accept.remote.ssh
from cluster_accept.checks.base import NodeRow, Status
from cluster_accept.inventory.load import InventoryError, load_inventory
from cluster_accept.reports.actions import reproduce
from cluster_accept.tasks.probe_runs import probe_commands
from tests.injection_sandbox import HOSTILE, Sandbox, install_sandbox, node


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    return install_sandbox(tmp_path, monkeypatch)


def inventory_file(tmp_path: Path, ssh: dict[str, Any] | None = None, **entry: Any) -> Path:
    data = {
        "cluster": "c",
        "defaults": {"profile": "p", "ssh": {"user": "ops", **(ssh or {})}},
        "nodes": [{"hosts": "node01", **entry}],
        "profiles": {"p": {}},
    }
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("template", [*HOSTILE, "-oProxyCommand=touch {m}", "node01,node02;touch {m}"])
def test_hostile_inventory_values_are_refused(tmp_path: Path, template: str) -> None:
    hostile = template.format(m=tmp_path / "pwned")
    for entry, ssh, key in [
        ({"hosts": hostile}, {}, "nodes[0].hosts"),
        ({"address": hostile}, {}, "nodes[0].address"),
        ({}, {"jump": hostile}, "defaults.ssh.jump"),
        ({}, {"jump": f"root@{hostile}:22"}, "defaults.ssh.jump"),
        ({}, {"port": hostile}, "defaults.ssh.port"),
        ({}, {"user": hostile}, "defaults.ssh.user"),
    ]:
        with pytest.raises(InventoryError) as info:
            load_inventory(inventory_file(tmp_path, ssh, **entry))
        assert key in str(info.value), (entry, ssh)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.integration
def test_hostile_users_and_paths_are_passed_as_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox
) -> None:
    """Key and known_hosts paths reach paramiko only, never a shell: they load as written (the files' checks
    name them as data). A hostile user is refused by the loader; even one that got past it would reach
    paramiko only: the operator's ``Match exec`` (a shell runs it, with %h, %r, %n expanded) does not see it."""
    hostile = sandbox.hostile(HOSTILE[0])
    ssh = {"identity_file": f"/keys/{hostile}", "known_hosts": f"/kh/{hostile}"}
    inventory = load_inventory(inventory_file(tmp_path, ssh, address="10.0.0.1"), check_files=False)
    target = inventory.node("node01")
    assert (target.ssh.identity_file, target.ssh.known_hosts) == tuple(ssh.values())
    with pytest.raises(InventoryError) as info:
        load_inventory(inventory_file(tmp_path, ssh, address="10.0.0.1"))
    assert f"ssh.identity_file '/keys/{hostile}' (node01): does not exist" in info.value.problems
    target = replace(target, ssh=target.ssh.model_construct(**{**target.ssh.model_dump(), "user": hostile}))

    expanded = sandbox.root / "match-exec"
    (sandbox.root / "home" / ".ssh").mkdir()
    (sandbox.root / "home" / ".ssh" / "config").write_text(f'Match exec "echo %h %r %n > {expanded}"\n')
    monkeypatch.setenv("HOME", str(sandbox.root / "home"))
    monkeypatch.setattr(cluster_accept.remote.ssh, "_ssh_config", None)
    with open(os.devnull) as no_input:
        monkeypatch.setattr(sys, "stdin", no_input)  # invoke, running Match exec, reads stdin
        connection = cluster_accept.remote.ssh._connection(target.connect_host, target.ssh)
    assert (connection.host, connection.user) == ("10.0.0.1", hostile)
    assert "10.0.0.1" in expanded.read_text() and "touch" not in expanded.read_text()
    assert not sandbox.marker.exists()


def _row(stage: str, status: str, command: str) -> NodeRow:
    """A finding on node01 whose evidence came from ``command``."""
    return NodeRow("r", "c", stage, "node01", "x", "y", Status(status), "z", command=command)


@pytest.mark.integration
@pytest.mark.parametrize("template", HOSTILE)
def test_reproduce_lines_quote_the_inventory_path(sandbox: Sandbox, template: str) -> None:
    hostile = sandbox.hostile(template)
    for name in ("ssh", "cluster-accept"):
        sandbox.executable(str(sandbox.root / "bin" / name), "#!/bin/sh\nexit 0\n")
    target = node(device="cpu")
    rows = [
        _row("preflight", "fail", "nvidia-smi -L"),
        _row("single-node", "fail", probe_commands(target)[0].script),
        _row("multi-node", "fail", ""),
        _row("preflight", "unreachable", ""),
    ]
    for row in rows:
        lines = reproduce(row, f"/inventories/{hostile}.yaml", good_node="node02")
        code, _, err = sandbox.node_shell("\n".join(lines))
        assert code == 0, (lines, err)
    assert not sandbox.marker.exists()


@pytest.mark.integration
def test_reproduce_line_of_a_probe_with_a_newline_in_its_path(sandbox: Sandbox) -> None:
    target = node(python=f"python3\ntouch {sandbox.marker} #", device="cpu")
    row = _row("single-node", "fail", probe_commands(target)[0].script)
    sandbox.executable(str(sandbox.root / "bin" / "cluster-accept"), "#!/bin/sh\nexit 0\n")
    sandbox.node_shell("\n".join(reproduce(row, "inventory.yaml")))
    assert not sandbox.marker.exists()
