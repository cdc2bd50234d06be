"""What fuzzing the inventory loader found, pinned: each case once raised something other than an
InventoryError, hung, or answered with a problem that named no key."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cluster_accept.inventory.load import InventoryError, load_inventory
from cluster_accept.inventory.model import Inventory
from tests.fuzz_inventory_support import CONTRACT_TEXT, SMALL, load_text, new_inventory_file, problems_of


@pytest.fixture(scope="module")
def inventory_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return new_inventory_file(tmp_path_factory)


FOUND: dict[str, tuple[str | bytes, str]] = {
    "invalid UTF-8": (b"cluster: \xff\xfe\n", "not UTF-8 text: byte 9 is 0xff"),
    "deep nesting": ("cluster: " + "[" * 1000 + "]" * 1000 + "\n", "not valid YAML: nested too deeply"),
    "int over 4300 digits": ("cluster: " + "1" * 5000 + "\n", "not valid YAML: a value cannot be read (ValueError"),
    "no such date": ("cluster: 2001-02-30\n", "not valid YAML: a value cannot be read (ValueError: day is out of"),
    "!!bool x": ("cluster: !!bool x\n", "not valid YAML: a value cannot be read (KeyError: 'x')"),
    "!!int ''": ('cluster: !!int ""\n', "not valid YAML: a value cannot be read (IndexError"),
    "!!timestamp x": ("cluster: !!timestamp x\n", "not valid YAML: a value cannot be read (AttributeError"),
    "!!map on a list": ("cluster: !!map [1]\n", "expected a mapping node, but found sequence"),
    "list as a key": ("? [a, b]\n: 1\n", "found unhashable key"),
    "mapping as a key": ("{{a: 1}: 2}\n", "found unhashable key"),
    "long profile name": (SMALL.replace("profile: p", "profile: " + "x" * 300), "defaults.profile: profile 'xxxx"),
    "profile name as a path": (SMALL.replace("profile: p", "profile: ../../etc/p"), "profile '../../etc/p' is not"),
    "key with a newline": (SMALL.replace("user: ops", '"a\\nb": ops'), "defaults.ssh.'a\\nb': unknown key"),
}


@pytest.mark.parametrize("case", sorted(FOUND))
def test_found_by_fuzzing(inventory_file: Path, case: str) -> None:
    content, problem = FOUND[case]
    assert problem in "\n".join(problems_of(inventory_file, content))


def test_profile_name_is_not_a_path(tmp_path: Path) -> None:
    """A profile is looked up as profiles/NAME.yaml beside the inventory: '../' cannot reach another file."""
    (tmp_path / "evil.yaml").write_text("gpu: {model: EVIL, count: 1}\n")
    (tmp_path / "inv").mkdir()
    inventory = tmp_path / "inv" / "inventory.yaml"
    inventory.write_text(SMALL.replace("profile: p", "profile: ../../evil"))
    with pytest.raises(InventoryError, match="profile '../../evil' is not defined"):
        load_inventory(inventory)


def test_an_alias_bomb_is_refused_quickly_with_a_short_problem(inventory_file: Path) -> None:
    """Nine aliases of nine aliases...: a value of 9**9 items. Quoting it in full took minutes and gigabytes."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    started = time.monotonic()
    problems = problems_of(inventory_file, "\n".join(lines) + "\ncluster: *a8\nnodes: *a8\n")
    assert time.monotonic() - started < 10
    assert any(p.startswith("cluster: Input should be a valid string (got [[[") for p in problems)
    assert all(len(p) < 400 for p in problems)


def test_a_merge_key_in_the_contract_loads(inventory_file: Path) -> None:
    text = CONTRACT_TEXT.replace("  ssh:\n    user: ops", "  ssh: &ssh\n    user: ops").replace(
        "ssh: {port: 2222, user: root}", "ssh: {<<: *ssh, port: 2222, user: root}"
    )
    assert "<<: *ssh" in text
    merged = load_text(inventory_file, text)
    assert isinstance(merged, Inventory)
    node = merged.node("node010")
    assert (node.ssh.port, node.ssh.user, node.ssh.jump) == (2222, "root", "bastion.example.net")
