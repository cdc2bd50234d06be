"""Shared by the inventory fuzzing modules (test_fuzz_inventory*.py): the settings, the seed inventories,
the property every load must satisfy (``outcome``), and the hostile values and hostlists the strategies
draw from."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from cluster_accept.inventory.hostlist import MAX_NODES
from cluster_accept.inventory.load import InventoryError, load_inventory
from cluster_accept.inventory.model import Inventory

FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ROOT = Path(__file__).resolve().parent.parent
CONTRACT_TEXT = (ROOT / "cluster_accept" / "inventory" / "examples" / "contract.yaml").read_text()
CONTRACT: dict[str, Any] = yaml.safe_load(CONTRACT_TEXT)
SMALL = """\
cluster: c
defaults:
  profile: p
  ssh: {user: ops, port: 22}
nodes:
  - hosts: node[1-2]
    labels: {rack: r1}
exclude: [node2]
"""
PROFILES = """\
profiles:
  p: {gpu: {model: NVIDIA H200, count: 8}, driver_version: {min: "570.0"}}
"""
SMALL += PROFILES
NODE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}")
FILE_LEVEL = ("not valid YAML: ", "not UTF-8 text: ", "cannot read the file: ")

Key = tuple[str | int, ...]
Draw = Callable[[st.SearchStrategy[Any]], Any]


def new_inventory_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One file rewritten by every example; its folder has no profiles/ (so no profile file is found there)."""
    return tmp_path_factory.mktemp("fuzz-inventory") / "inventory.yaml"


def dotted(key: Key) -> str:
    """A key as the loader names it: ``nodes[0].ssh.port``; a part that is not a plain name quoted (``'a: b'``)."""
    text = ""
    for part in key:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            name = part if re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", part) else repr(part)
            text += f".{name}" if text else name
    return text or "(top level)"


def outcome(path: Path) -> Inventory | InventoryError:
    """Load ``path``; whatever happens, it is an Inventory that holds together or a well-formed InventoryError."""
    try:
        inventory = load_inventory(path, check_files=False)  # the file's text is fuzzed, not the controller's files
    except InventoryError as exc:
        assert exc.source == str(path)
        assert exc.problems, "an InventoryError without a problem"
        for problem in exc.problems:
            assert isinstance(problem, str) and problem.strip(), repr(problem)
            if not problem.startswith(FILE_LEVEL):  # else: one line, 'KEY: what is wrong'
                key, sep, what = problem.partition(": ")
                assert key and sep and what.strip() and "\n" not in problem, problem
            assert len(problem) < 20_000, problem[:200]
        assert str(exc).startswith(f"{path}: ")
        return exc
    assert isinstance(inventory, Inventory)
    names = [node.name for node in inventory.nodes]
    assert names and len(names) == len(set(names)) and len(names) <= MAX_NODES
    assert all(NODE_NAME.fullmatch(name) for name in names)
    assert all(inventory.profiles[node.profile_name] == node.profile for node in inventory.nodes)
    assert {node.name for node in inventory.excluded} <= set(names)
    assert re.fullmatch(r"[0-9a-f]{64}", inventory.digest)
    return inventory


def load_text(path: Path, content: str | bytes) -> Inventory | InventoryError:
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)
    return outcome(path)


def load_data(path: Path, data: Any) -> Inventory | InventoryError:
    return load_text(path, yaml.safe_dump(data, allow_unicode=True, sort_keys=False))


HOSTILE_STRINGS = [
    "$(touch /tmp/x)",
    "`touch /tmp/x`",
    "a;b",
    "a && b",
    "'",
    '"',
    "a\nb",
    "\n",
    "",
    " ",
    "\x00",
    "\t",
    "-oProxyCommand=x",
    "~",
    "null",
    "yes",
    "570.86",
    "{a: b}",
    "*x",
    "../../../etc/passwd",
    "/dev/zero",
    "é",
    "🙂",
    "\u202e",
    "%s%n",
    "[bold]x[/]",
    "x" * 300,
]
HOSTLISTS = st.one_of(
    st.sampled_from(
        [
            "node[1-",
            "node[5-1]",
            "a[0-99999999]",
            "a[0-999]b[0-999]",
            "node[001-1]",
            "node[1-3/0]",
            "node[-5--1]",
            "node[1-2]]",
            "node[[1-2]]",
            "@rack1",
            "node[1-2],@all",
            "node!node",
            "node[1-3]&node[2-4]",
            "node[1-3]^node[2]",
            "a,,b",
            ",",
            "[1-3]",
            "node[1,1,1]",
            "node[" + "9" * 5000 + "]",
            "node[1-" + "9" * 40 + "]",
            "node[1-99999999-99999999]",
            "node[-99999999-99999999]",
        ]
    ),
    st.from_regex(r"[a-z]{1,3}\[-?[0-9]{1,6}(--?[0-9]{1,6}){0,2}(/[0-9])?\]", fullmatch=True),
    st.from_regex(r"[a-z]{1,4}(\[[0-9]{1,3}(-[0-9]{1,4})?(,[0-9]{1,3})*\])?[a-z0-9.-]{0,4}", fullmatch=True),
    st.text(max_size=12),
)
HOSTILE_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(10**40), 10**40),
    st.floats(),
    st.lists(st.integers(0, 9), max_size=3),
    st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
    st.text(max_size=20),
    st.sampled_from(HOSTILE_STRINGS),
    HOSTLISTS,
)


def keys_of(data: Any, prefix: Key = ()) -> list[Key]:
    """Every key path in ``data`` (mapping keys and list positions), parents before children."""
    found: list[Key] = []
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else []
    for part, value in items:
        found.append((*prefix, part))
        found += keys_of(value, (*prefix, part))
    return found


def parent(data: Any, key: Key) -> Any:
    for part in key[:-1]:
        data = data[part]
    return data


def problems_of(path: Path, content: str | bytes) -> list[str]:
    """The problems of a content that must not load."""
    result = load_text(path, content)
    assert isinstance(result, InventoryError)
    return result.problems
