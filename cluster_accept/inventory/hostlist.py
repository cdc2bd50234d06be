"""Hostlist expressions (Slurm/ClusterShell syntax), expanded and folded by ClusterShell's NodeSet.

Range expansion is never written by hand here: ``node[001-007,009]`` means exactly what it means to Slurm
and to clush. Group syntax (``@rack1``) is switched off so that an inventory cannot make us read files or run
group resolvers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

from cluster_accept.inventory.quoting import cut, quoted

# A node name is a host name: letters, digits, dots, dashes and underscores. Anything else in an inventory
# (a ';', a '$(', a space, a leading '-' that ssh would read as an option) is a typo or an attack.
_NODE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,252}$")
# More nodes than this in one inventory is a typo (node[1-10000000]), not a cluster. ClusterShell builds every
# index of a range when it parses it, so a[0-99999999] takes minutes and gigabytes before it can be counted.
MAX_NODES = 100_000
_BRACKETS = re.compile(r"\[([^\[\]]*)\]")
# One operand of an expression as written (``node[001-003]``, ``gpu7``): what lies between ClusterShell's
# operators (``,`` union, ``!`` difference, ``&`` intersection, ``^`` symmetric difference) outside brackets,
# which do not nest. One character a step: linear, however long the expression.
_OPERAND = re.compile(r"(?:[^,!&^\[]|\[[^\]]*\]?)+")


class HostlistError(ValueError):
    """A hostlist expression that does not parse."""


def _span(text: str) -> int:
    """An upper bound on how many indices the bracket ranges of ``text`` hold (``1-5/2,9`` counts 5 + 1), read
    before ClusterShell expands them. A part that is not a number is left to ClusterShell to report."""
    total = 0
    for ranges in _BRACKETS.findall(text):
        for part in ranges.split(","):
            bounds = part.split("/", 1)[0]
            try:
                ends = [abs(int(n)) for n in bounds.split("-") if n][-2:]
            except ValueError:
                continue
            if len(ends) < 2:
                total += 1
            elif bounds.count("-") == 1 and not bounds.startswith("-"):  # 'a-b'
                total += abs(ends[1] - ends[0]) + 1
            else:  # '-a-b', '-a--b', 'x-a-b' (ClusterShell reads the last as -a-b): at most a + b + 1
                total += ends[0] + ends[1] + 1
    return total


def expand(expression: str) -> list[str]:
    """Expand ``node[001-003]`` into ``["node001", "node002", "node003"]`` (sorted as NodeSet sorts)."""
    text = expression.strip()
    if not text:
        raise HostlistError("empty hostlist expression")
    if any(ch.isspace() for ch in text):
        raise HostlistError(f"whitespace inside hostlist expression {quoted(expression)}")
    _refuse_operands(text, expression)
    too_many = f"hostlist expression {quoted(expression)} names more than {MAX_NODES} nodes"
    if _span(text) > MAX_NODES:
        raise HostlistError(too_many)
    try:
        nodes = NodeSet(text, resolver=RESOLVER_NOGROUP)
    except (NodeSetException, ValueError, TypeError) as exc:
        raise HostlistError(f"bad hostlist expression {quoted(expression)}: {cut(str(exc))}") from exc
    if len(nodes) > MAX_NODES:  # node[1-1000]-[1-1000]: small ranges, a large product
        raise HostlistError(too_many)
    names = list(nodes)
    if not names:
        raise HostlistError(f"hostlist expression {quoted(expression)} names no node")
    for name in names:
        if not _NODE_NAME.match(name):
            raise _not_a_name(name, expression)
    return names


def _not_a_name(name: str, expression: str) -> HostlistError:
    return HostlistError(
        f"{quoted(name)} (from {quoted(expression)}) is not a valid node name: use letters, digits, '.', '-', '_'"
    )


def _refuse_operands(text: str, expression: str) -> None:
    """Refuse, in one pass over ``text``, what needs no expansion to be refused: more operands than
    :data:`MAX_NODES` (ClusterShell's parse of a list of names grows with the square of its length, minutes for a
    million), and a plain name that is not one (the first as written, not the first once sorted)."""
    operands = _OPERAND.findall(text)
    if len(operands) > MAX_NODES:
        raise HostlistError(
            f"hostlist expression {quoted(expression)} lists {len(operands):,} names, more than {MAX_NODES} nodes"
        )
    for operand in operands:
        if "[" not in operand and not _NODE_NAME.match(operand):
            raise _not_a_name(operand, expression)


def fold(names: Iterable[str]) -> str:
    """Fold node names back into one expression: ``node[001-007,009]``."""
    names = list(names)
    if not names:
        return ""
    return str(NodeSet.fromlist(names, resolver=RESOLVER_NOGROUP))


def fold_values(values: Mapping[str, str]) -> list[tuple[str, str, int]]:
    """Group nodes by an observed value: ``[(value, "node[001-007]", 7), ...]``, largest group first.

    This is how every cross-cluster difference is shown ("driver 580.159.04 on node[001-007];
    570.86.15 on node010").
    """
    groups: dict[str, list[str]] = {}
    for node, value in values.items():
        groups.setdefault(value, []).append(node)
    folded = [(value, fold(nodes), len(nodes)) for value, nodes in groups.items()]
    folded.sort(key=lambda item: (-item[2], item[0]))
    return folded


def describe_folded(values: Mapping[str, str]) -> str:
    """One line: ``580.159.04 on node[001-007]; 570.86.15 on node010``."""
    return "; ".join(f"{value} on {nodes}" for value, nodes, _ in fold_values(values))
