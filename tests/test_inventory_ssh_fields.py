"""Every SSH field of an inventory is checked when it loads: a typo is an inventory error (exit 2) naming the
key or the file and the nodes, never a node found unreachable or rejected (and drained) at run time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from cluster_accept.flows.cli import app
from cluster_accept.inventory.load import InventoryError, load_inventory
from cluster_accept.inventory.model import parse_jump
from tests.keys import operator_home, write_key

CONTRACT = Path(__file__).resolve().parent.parent / "cluster_accept" / "inventory" / "examples" / "contract.yaml"


def inventory(tmp_path: Path, ssh: dict[str, Any], entry_ssh: dict[str, Any] | None = None) -> Path:
    data = {
        "cluster": "c",
        "defaults": {"profile": "p", "ssh": ssh},
        "nodes": [{"hosts": "node[01-04]"}, {"hosts": "node05", "ssh": entry_ssh or {}}],
        "profiles": {"p": {}},
    }
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def problems(path: Path) -> str:
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    return "\n".join(info.value.problems)


@pytest.mark.parametrize(
    ("jump", "said"),
    [
        ("10.0.0.2:abc", "port 'abc' is not a number from 1 to 65535"),
        ("bastion:70000", "port '70000' is not a number from 1 to 65535"),
        ("bastion:", "port '' is not a number"),
        ("ops@:22", "no host name"),
    ],
)
def test_a_jump_host_typo_is_an_inventory_error(tmp_path: Path, jump: str, said: str) -> None:
    text = problems(inventory(tmp_path, {"jump": jump}))
    assert "defaults.ssh.jump" in text and said in text


def test_jump_hosts_that_are_right_parse() -> None:
    assert parse_jump("ops@bastion.example.net:2222") == ("ops", "bastion.example.net", 2222)
    assert parse_jump("10.0.0.2") == (None, "10.0.0.2", None)
    assert parse_jump("fd00::1") == (None, "fd00::1", None)  # IPv6 without a port


@pytest.mark.parametrize("user", ["-oProxyCommand=x", "ops admin", "ops;id", "", "a" * 70])
def test_a_user_that_is_no_login_name_is_refused(tmp_path: Path, user: str) -> None:
    text = problems(inventory(tmp_path, {}, {"user": user}))
    assert "nodes[1].ssh.user" in text and "login name" in text


def test_ports_are_numbers_in_range(tmp_path: Path) -> None:
    assert "defaults.ssh.port" in problems(inventory(tmp_path, {"port": 0}))
    assert "nodes[1].ssh.port" in problems(inventory(tmp_path, {}, {"port": "ssh"}))


def test_the_identity_file_must_be_a_usable_private_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    good = write_key(tmp_path / "id_ed25519")
    locked = write_key(tmp_path / "id_locked", b"secret")
    assert load_inventory(inventory(tmp_path, {"identity_file": str(good)})).node("node01").ssh.identity_file
    cases = {
        str(tmp_path / "missing"): "does not exist",
        str(good) + ".pub": "is a public key",
        str(tmp_path): "is not a file",
        str(locked): "is protected by a passphrase",
    }
    for path, said in cases.items():
        text = problems(inventory(tmp_path, {"identity_file": path}))
        assert f"ssh.identity_file {path!r} (node[01-05]): {said}" in text, text
    # Set on one entry only: only its nodes are named.
    text = problems(inventory(tmp_path, {"identity_file": str(good)}, {"identity_file": str(tmp_path / "nope")}))
    assert "(node05): does not exist" in text
    # With an agent running, a passphrase-protected key may be served by it.
    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "agent.sock"))
    assert load_inventory(inventory(tmp_path, {"identity_file": str(locked)}))


def test_known_hosts_must_serve_its_policy(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "known_hosts"
    text = problems(inventory(tmp_path, {"known_hosts": str(missing)}))  # strict by default
    assert "does not exist (host_key_policy strict" in text
    # accept-new creates it: a missing file in a folder that can be made is fine.
    assert load_inventory(inventory(tmp_path, {"known_hosts": str(missing), "host_key_policy": "accept-new"}))
    text = problems(inventory(tmp_path, {"known_hosts": str(tmp_path)}))
    assert "is not a file" in text


def test_excluded_and_local_nodes_need_no_key(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "cluster": "c",
                "defaults": {"profile": "p", "ssh": {"identity_file": str(tmp_path / "missing")}},
                "nodes": [{"hosts": "here", "address": "local"}, {"hosts": "gone"}],
                "exclude": ["gone"],
                "profiles": {"p": {}},
            }
        )
    )
    assert [n.name for n in load_inventory(path).tested] == ["here"]


def test_inventory_check_names_the_typo_and_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["inventory", "check", str(inventory(tmp_path, {"jump": "10.0.0.2:abc"}))])
    assert result.exit_code == 2, result.output
    assert "defaults.ssh.jump" in result.output and "Traceback" not in result.output


def test_the_example_contract_checks_where_its_files_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """contract.yaml names ~/.ssh/id_ed25519 and ~/.ssh/known_hosts: with them, it checks; without, it names them."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    text = problems(CONTRACT)
    assert "ssh.identity_file '~/.ssh/id_ed25519' (node[001-003,005-007,009-010]): does not exist" in text
    operator_home(tmp_path)
    result = CliRunner().invoke(app, ["inventory", "check", str(CONTRACT)])
    assert result.exit_code == 0, result.output
