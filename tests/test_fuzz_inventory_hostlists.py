"""Property-based fuzzing of hostlist expansion, on its own and through the inventory loader: any expression
expands to valid node names or fails saying why, quickly, and never to more than ``MAX_NODES`` nodes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given

from cluster_accept.inventory.hostlist import MAX_NODES, HostlistError, expand, fold
from tests.fuzz_inventory_support import FUZZ, HOSTLISTS, NODE_NAME, PROFILES, new_inventory_file, problems_of


@pytest.fixture(scope="module")
def inventory_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return new_inventory_file(tmp_path_factory)


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
    problems = problems_of(inventory_file, f"cluster: c\ndefaults: {{profile: p}}\nnodes: {nodes}\n{PROFILES}")
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
