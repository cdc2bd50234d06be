"""A hostlist that is refused is refused in one pass over its text: a list of more names than any inventory
may hold, or a name that is no host name, never reaches ClusterShell's parse (which grows with the square of a
list's length: minutes for a million names). Time itself is measured by ``bench/hostlist_refusal.py``."""

from __future__ import annotations

from typing import Any

import pytest

from cluster_accept.inventory import hostlist
from cluster_accept.inventory.hostlist import MAX_NODES, HostlistError, expand


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every expression handed to ClusterShell's parser."""
    seen: list[str] = []
    real = hostlist.NodeSet

    def counting(text: str, **kwargs: Any) -> Any:
        seen.append(text)
        return real(text, **kwargs)

    monkeypatch.setattr(hostlist, "NodeSet", counting)
    return seen


def test_a_list_of_more_names_than_the_limit_is_refused_before_it_is_parsed(parses: list[str]) -> None:
    expression = ",".join(f"n{i}" for i in range(MAX_NODES + 1))
    with pytest.raises(HostlistError) as refused:
        expand(expression)
    assert parses == []
    assert str(refused.value) == f"hostlist expression {expression[:200]!r}… ({len(expression):,} characters) " + (
        "lists 100,001 names, more than 100000 nodes"
    )


def test_the_first_bad_name_as_written_is_named_without_a_parse(parses: list[str]) -> None:
    expression = "n1,n[2-3],zz;reboot,a$(id),n4"
    with pytest.raises(HostlistError) as refused:
        expand(expression)
    assert parses == []
    assert str(refused.value).startswith(f"'zz;reboot' (from {expression!r}) is not a valid node name")


def test_operands_split_only_outside_brackets() -> None:
    assert expand("n[1-3,7]!n2") == ["n1", "n3", "n7"]
    assert expand("m[01-02],x&m[02-05]") == ["m02"]  # left to right, as ClusterShell reads it
    assert len(expand(",".join(f"n{i}" for i in range(MAX_NODES)))) == MAX_NODES  # the limit itself loads
    with pytest.raises(HostlistError, match=r"^bad hostlist expression 'n\[1-2': missing bracket"):
        expand("n[1-2")
