"""Property-based fuzzing of the inventory loader and of hostlist expansion.

The property: for any file content, ``load_inventory`` returns a consistent Inventory or raises InventoryError
whose every problem is a non-empty line naming a key or the file; no other exception, and no hang. Inputs are
random bytes and text, YAML built from hostile fragments (anchors, aliases, merge keys, tags, tabs, huge
ints, deep nesting), and valid inventories (the shipped contract) mutated key by key and dumped back to YAML.
``derandomize=True`` keeps every run on the same examples, so CI cannot flake.
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_accept.inventory.hostlist import MAX_NODES, HostlistError, expand, fold
from cluster_accept.inventory.load import InventoryError, load_inventory
from cluster_accept.inventory.model import Inventory

pytestmark = pytest.mark.pure

FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ROOT = Path(__file__).resolve().parent.parent
CONTRACT_TEXT = (ROOT / "inventory" / "examples" / "contract.yaml").read_text()
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


@pytest.fixture(scope="module")
def inventory_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
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
        inventory = load_inventory(path)
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


def test_seeds_load() -> None:
    """The structured fuzzing starts from inventories that load."""
    assert len(load_inventory(ROOT / "inventory" / "examples" / "contract.yaml").nodes) == 9


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


# Hostlists ---------------------------------------------------------------------------------------------


@FUZZ
@given(expression=HOSTLISTS)
def test_hostlist_expands_to_valid_names_or_says_why(expression: str) -> None:
    started = time.monotonic()
    try:
        names = expand(expression)
    except HostlistError as exc:
        assert str(exc)
    else:
        assert 0 < len(names) <= MAX_NODES
        assert all(NODE_NAME.fullmatch(name) for name in names)
        assert set(expand(fold(names))) == set(names)
    assert time.monotonic() - started < 10


# What fuzzing found, pinned ----------------------------------------------------------------------------


def _problems(path: Path, content: str | bytes) -> list[str]:
    result = load_text(path, content)
    assert isinstance(result, InventoryError)
    return result.problems


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
    assert problem in "\n".join(_problems(inventory_file, content))


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
    problems = _problems(inventory_file, "\n".join(lines) + "\ncluster: *a8\nnodes: *a8\n")
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


@pytest.mark.parametrize(
    "nodes, problem",
    [
        ("[{hosts: 'a[0-99999999]'}]", "nodes[0].hosts: hostlist expression 'a[0-99999999]' names more than 100000"),
        ("[{hosts: 'a[0-999]b[0-999]'}]", "nodes[0].hosts: hostlist expression 'a[0-999]b[0-999]' names more than"),
        ("[{hosts: 'a[1-50000]'}, {hosts: 'b[1-50000]'}, {hosts: 'c1'}]", "nodes[2].hosts: the entries up to this"),
    ],
)
def test_too_many_nodes_is_a_clear_error_not_a_hang(inventory_file: Path, nodes: str, problem: str) -> None:
    started = time.monotonic()
    problems = _problems(inventory_file, f"cluster: c\ndefaults: {{profile: p}}\nnodes: {nodes}\n{PROFILES}")
    assert time.monotonic() - started < 20  # it used to take minutes and gigabytes
    assert any(p.startswith(problem) for p in problems), problems


def test_the_node_limit_is_exact() -> None:
    assert MAX_NODES == 100_000
    assert len(expand(f"n[1-{MAX_NODES}]")) == MAX_NODES
    with pytest.raises(HostlistError, match="names more than 100000 nodes"):
        expand(f"n[0-{MAX_NODES}]")
    for expression in ("n[1-3]-[1-50000]", "n[1-99999999-99999999]", "n[-60000-60000]"):
        with pytest.raises(HostlistError, match="names more than 100000 nodes"):
            expand(expression)
