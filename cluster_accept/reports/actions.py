"""What to do about a finding, and the command that reproduces it. Pure.

The report is handed to whoever fixes the node (the vendor, the data-centre hands, the platform team), so
every failing row carries a suggested action from a closed set and the exact command that shows the same
failure again. The action and its explanation are the declaration of the row's ``check:reason``
(:class:`~cluster_accept.checks.reasons.ReasonCatalog`): the module that emits a reason says what it means.
A reason nobody declared gets *rerun* (an unknown reason is a fresh one, and the safe first step is to see
whether it repeats); nothing is guessed from how a code is spelled.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from cluster_accept.checks.base import NodeRow, Status
from cluster_accept.checks.reasons import Action, ReasonCatalog

__all__ = ["Action", "Suggestion", "reproduce", "suggest"]


@dataclass(frozen=True)
class Suggestion:
    action: Action
    why: str


def suggest(row: NodeRow, reasons: ReasonCatalog) -> Suggestion:
    """The suggested action for one non-passing row: its reason's declaration."""
    declared = reasons.lookup(row.check, row.reason)
    return Suggestion(declared.action, declared.explanation)


def reproduce(row: NodeRow, inventory: str, good_node: str | None = None) -> list[str]:
    """Commands that show the same finding again: the node-side command (when the row has one) and the
    ``cluster-accept`` line that reruns the stage on this node alone."""
    node, stage = row.node, row.stage
    inv = shlex.quote(inventory)
    lines: list[str] = []
    if row.status == Status.UNREACHABLE:
        return [f"ssh -v {shlex.quote(node)} true"]
    command = row.command
    if command and stage == "preflight":
        lines.append(f"ssh {shlex.quote(node)} {shlex.quote(command)}")
    elif command and stage == "single-node":
        # Two lines, the command quoted whole: nothing in it (a profile's python path) can end the comment.
        lines.append(f"# on {node}, in a copy of probes/:")
        lines.append(f'CA_PROBE_DIR="$PWD" sh -c {shlex.quote(command)}')
    if stage == "multi-node" or stage == "bisect":
        good = f" --good {shlex.quote(good_node)}" if good_node else ""
        lines.append(f"cluster-accept bisect --inventory {inv} --nodes {shlex.quote(node)}{good}")
    elif stage:
        lines.append(f"cluster-accept run --inventory {inv} --nodes {shlex.quote(node)} --stages {stage}")
    return lines
