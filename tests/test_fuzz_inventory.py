"""Property-based fuzzing of the inventory loader.

The property: for any file content, ``load_inventory`` returns a consistent Inventory or raises InventoryError
whose every problem is a non-empty line naming a key or the file; no other exception, and no hang. Inputs are
random bytes and text, YAML built from hostile fragments (anchors, aliases, merge keys, tags, tabs, huge
ints, deep nesting), and valid inventories (the shipped contract) mutated key by key and dumped back to YAML.
``derandomize=True`` keeps every run on the same examples, so CI cannot flake. Hostlist expansion is fuzzed in
test_fuzz_inventory_hostlists.py; what fuzzing found is pinned in test_fuzz_inventory_found.py.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_accept.inventory.load import InventoryError, load_inventory
from cluster_accept.inventory.model import Inventory
from tests.fuzz_inventory_support import (
    CONTRACT,
    FUZZ,
    HOSTILE_STRINGS,
    HOSTILE_VALUES,
    HOSTLISTS,
    ROOT,
    SMALL,
    Draw,
    Key,
    dotted,
    keys_of,
    load_data,
    load_text,
    new_inventory_file,
    parent,
)


@pytest.fixture(scope="module")
def inventory_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return new_inventory_file(tmp_path_factory)


def test_seeds_load() -> None:
    """The structured fuzzing starts from inventories that load."""
    assert (
        len(
            load_inventory(
                ROOT / "cluster_accept" / "inventory" / "examples" / "contract.yaml", check_files=False
            ).nodes
        )
        == 9
    )


def test_seeds_load_from_a_dump(inventory_file: Path) -> None:
    assert isinstance(load_data(inventory_file, CONTRACT), Inventory)
    assert isinstance(load_text(inventory_file, SMALL), Inventory)


# (a) Random bytes, random text, YAML from hostile fragments ----------------------------------------------

FRAGMENTS = [
    "cluster: c",
    "nodes:",
    "  - hosts: node[1-2]",
    "- hosts: a",
    "defaults: {profile: p}",
    "profiles: {p: {}}",
    "base: &b {hosts: x}",
    "nodes: [*b]",
    "nodes: [{<<: *b}]",
    "<<: *b",
    "*undefined",
    "&a [*a]",
    "? [a, b]\n: 1",
    "{[a]: 1}",
    "{{a: 1}: 2}",
    "cluster: c\ncluster: d",
    "\t",
    "\tcluster: c",
    "[" * 300,
    "]" * 300,
    "{a: " * 200,
    "- " * 200,
    "!!python/object/apply:os.system ['touch /tmp/x']",
    "!!python/name:os.system",
    "!!binary zz==",
    "!!int abc",
    "!!int ''",
    "!!float x",
    "!!bool x",
    "!!map [1]",
    "!!seq {a: 1}",
    "!!timestamp x",
    "!!timestamp 2001-02-30",
    "cluster: 2001-02-30",
    "cluster: 2001-13-01 25:61:61",
    "cluster: " + "1" * 5000,
    "cluster: " + "9" * 4300 + ".5e99999",
    "count: 0x_",
    "count: 0o777",
    "count: 1_000",
    "count: 190:20:30",
    "count: .nan",
    "count: -.inf",
    "%YAML 1.1\n---",
    "%TAG ! tag:x,2000:",
    "---",
    "...",
    "--- !!set {a, b}",
    "'",
    '"',
    '"\\x00\\uD800"',
    "\x00",
    "\ufeff",
    "\x85",
    "\u2028",
    "$(touch /tmp/x)",
    "a;b",
    "-oProxyCommand=x",
    "~",
    ": ",
    "? ",
    "|",
    ">-",
    "#",
]


@st.composite
def yaml_like(draw: Draw) -> str:
    """Lines of the small inventory with hostile fragments inserted, lines dropped, indents changed."""
    lines = SMALL.splitlines()
    for _ in range(draw(st.integers(1, 5))):
        action = draw(st.sampled_from(["insert", "insert", "drop", "indent", "append", "text"]))
        at = draw(st.integers(0, len(lines)))
        if action == "insert":
            lines.insert(at, draw(st.sampled_from(FRAGMENTS)))
        elif action == "append" and at < len(lines):
            lines[at] += " " + draw(st.sampled_from(FRAGMENTS))
        elif action == "drop" and at < len(lines):
            del lines[at]
        elif action == "indent" and at < len(lines):
            lines[at] = draw(st.sampled_from(["\t", " ", "   ", ""])) + lines[at].lstrip()
        elif action == "text":
            lines.insert(at, draw(st.text(max_size=20)))
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\r\n"]))


FILE_CONTENTS = st.one_of(
    st.binary(max_size=400),
    st.text(max_size=400),
    st.lists(st.sampled_from(FRAGMENTS), max_size=8).map("\n".join),
    yaml_like(),
    yaml_like().map(lambda text: text.encode("utf-8") + b"\xff\xfe"),
)


@FUZZ
@given(content=FILE_CONTENTS)
def test_any_file_content_loads_or_fails_naming_a_key(inventory_file: Path, content: str | bytes) -> None:
    outcome_ = load_text(inventory_file, content)
    assert isinstance(outcome_, (Inventory, InventoryError))


# (b) Valid inventories mutated key by key ---------------------------------------------------------------


MutationFn = Callable[[Draw, Any], None]


def _drop(draw: Draw, data: Any) -> None:
    key = draw(st.sampled_from(keys_of(data)))
    del parent(data, key)[key[-1]]


def _replace(draw: Draw, data: Any) -> None:
    key = draw(st.sampled_from(keys_of(data)))
    parent(data, key)[key[-1]] = draw(HOSTILE_VALUES)


def _add_key(draw: Draw, data: Any) -> None:
    mappings = [()] + [k for k in keys_of(data) if isinstance(parent(data, k)[k[-1]], dict)]
    key = draw(st.sampled_from(mappings))
    target = parent(data, key)[key[-1]] if key else data
    target[draw(st.one_of(st.text(max_size=8), st.sampled_from(HOSTILE_STRINGS)))] = draw(HOSTILE_VALUES)


def _hosts(draw: Draw, data: Any) -> None:
    nodes = data.get("nodes")
    entries = [entry for entry in nodes if isinstance(entry, dict)] if isinstance(nodes, list) else []
    if entries:
        draw(st.sampled_from(entries))["hosts"] = draw(HOSTLISTS)
    else:
        data["exclude"] = [draw(HOSTLISTS)]


def _alias(draw: Draw, data: Any) -> None:
    """Make one key hold the very object another holds: yaml.safe_dump writes it as an anchor and an alias."""
    keys = keys_of(data)
    source, target = draw(st.sampled_from(keys)), draw(st.sampled_from(keys))
    held = parent(data, target)[target[-1]]
    parent(data, target)[target[-1]] = parent(data, source)[source[-1]]
    if _cyclic(data):
        parent(data, target)[target[-1]] = held


def _cyclic(data: Any, inside: frozenset[int] = frozenset()) -> bool:
    if not isinstance(data, (dict, list)):
        return False
    if id(data) in inside:
        return True
    values = data.values() if isinstance(data, dict) else data
    return any(_cyclic(value, inside | {id(data)}) for value in values)


MUTATIONS: list[MutationFn] = [_drop, _replace, _replace, _add_key, _hosts, _alias]


@st.composite
def mutated_inventory(draw: Draw) -> Any:
    data = copy.deepcopy(draw(st.sampled_from([CONTRACT, yaml.safe_load(SMALL)])))
    for _ in range(draw(st.integers(1, 4))):
        if keys_of(data):
            draw(st.sampled_from(MUTATIONS))(draw, data)
    return data


@FUZZ
@given(data=mutated_inventory())
def test_mutated_inventories_load_or_fail_naming_a_key(inventory_file: Path, data: Any) -> None:
    assert isinstance(load_data(inventory_file, data), (Inventory, InventoryError))


# The model mappings of the contract: every key in them is checked, an unknown one is named.
MODEL_KEYS: list[Key] = [
    (),
    ("defaults",),
    ("defaults", "ssh"),
    ("nodes", 0),
    ("nodes", 1),
    ("nodes", 1, "ssh"),
    ("profiles", "h200-sxm"),
    ("profiles", "h200-sxm", "gpu"),
    ("profiles", "h200-sxm", "nvlink"),
    ("profiles", "h200-sxm", "pcie"),
    ("profiles", "h200-sxm", "probes"),
    ("profiles", "h200-sxm", "probes", "expected_transport"),
    ("profiles", "h200-sxm", "thresholds"),
]


@FUZZ
@given(
    where=st.sampled_from(MODEL_KEYS),
    name=st.one_of(st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True), st.text(max_size=8)),
    value=HOSTILE_VALUES,
)
def test_an_unknown_key_anywhere_is_named(inventory_file: Path, where: Key, name: str, value: Any) -> None:
    """Named as written, or quoted when it is not a plain name ('', 'a: b', a newline), so the line still says
    which key it is about."""
    data = copy.deepcopy(CONTRACT)
    target = parent(data, where)[where[-1]] if where else data
    # the key as YAML reads it back: PyYAML writes '\x85' as it is and reads it back as a line break (a space)
    (read,) = yaml.safe_load(yaml.safe_dump({name: 0}, allow_unicode=True))
    if read in target:
        return  # a real key
    target[name] = value
    result = load_data(inventory_file, data)
    assert isinstance(result, InventoryError)
    assert f"{dotted((*where, read))}: unknown key (typo?" in "\n".join(result.problems)


# Where a problem caused by a bad value in each section may be named: in the section, or where it is used
# (node entries inherit defaults and name profiles; exclude names nodes).
NAMED_IN = {
    "cluster": ("cluster",),
    "defaults": ("defaults", "nodes["),
    "nodes": ("nodes", "exclude["),
    "exclude": ("exclude",),
    "profiles": ("profiles", "defaults.profile", "nodes["),
}


@FUZZ
@given(st.data())
def test_a_bad_value_is_named_by_its_key(inventory_file: Path, data: st.DataObject) -> None:
    """One value of the contract replaced: it loads, or a problem names the key's section or where it is used."""
    doc = copy.deepcopy(CONTRACT)
    key = data.draw(st.sampled_from(keys_of(doc)), label="key")
    parent(doc, key)[key[-1]] = data.draw(HOSTILE_VALUES, label="value")
    result = load_data(inventory_file, doc)
    if isinstance(result, InventoryError):
        section = str(key[0])
        assert any(p.startswith(NAMED_IN[section]) for p in result.problems), (dotted(key), result.problems)
        if len(key) > 1 and section in ("cluster", "exclude"):
            assert any(p.startswith(dotted(key)) for p in result.problems), (dotted(key), result.problems)


POLICIES = ["strict", "accept-new"]


@settings(FUZZ, max_examples=100)
@given(
    base=st.fixed_dictionaries(
        {"user": st.from_regex(r"[a-z]{1,8}", fullmatch=True), "port": st.integers(1, 65535)},
        optional={"connect_timeout_s": st.integers(1, 600), "host_key_policy": st.sampled_from(POLICIES)},
    ),
    override=st.fixed_dictionaries({}, optional={"port": st.integers(1, 65535), "user": st.just("root")}),
)
def test_anchors_aliases_and_merge_keys_mean_what_they_mean_in_yaml(
    inventory_file: Path, base: dict[str, Any], override: dict[str, Any]
) -> None:
    """``<<: *ssh`` merges the anchored mapping, the keys beside it override: the same inventory as when the
    merged mapping is written out in full."""

    def flow(mapping: dict[str, Any]) -> str:
        return "{" + ", ".join(f"{k}: {v}" for k, v in mapping.items()) + "}"

    merged = "{<<: *ssh" + "".join(f", {k}: {v}" for k, v in override.items()) + "}"
    head = f"cluster: c\ndefaults:\n  profile: p\n  ssh: &ssh {flow(base)}\n"
    tail = "profiles:\n  p: &p {gpu: {model: X, count: 1}}\n  q: *p\n"
    with_merge = load_text(inventory_file, f"{head}nodes:\n  - {{hosts: n1, profile: q, ssh: {merged}}}\n{tail}")
    written_out = load_text(
        inventory_file, f"{head}nodes:\n  - {{hosts: n1, profile: q, ssh: {flow(base | override)}}}\n{tail}"
    )
    assert isinstance(with_merge, Inventory) and isinstance(written_out, Inventory)
    assert with_merge.nodes[0].ssh == written_out.nodes[0].ssh
    assert with_merge.nodes[0].profile == with_merge.profiles["p"]
