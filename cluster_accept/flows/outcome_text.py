"""What a run's outcome says on the terminal: the nodes not accepted with their reasons, the counts, the report's
path, and the Slurm step's actions. Node names and reasons come from nodes and inventories: never read as rich
markup, control characters shown as escapes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from cluster_accept.analysis.verdicts import Verdict
from cluster_accept.flows.exits import say as _say
from cluster_accept.inventory.hostlist import fold
from cluster_accept.vocabulary.text import visible

if TYPE_CHECKING:
    from cluster_accept.flows.finish import RunOutcome

out = Console()


def print_outcome(outcome: RunOutcome) -> None:
    table = Table(title=Text(visible(f"run {outcome.run_id}")))
    for column in ("node", "verdict", "reasons"):
        table.add_column(column)
    for verdict in outcome.verdicts:
        if verdict.verdict != Verdict.ACCEPTED:
            table.add_row(Text(visible(verdict.node)), verdict.verdict.value, Text(visible(", ".join(verdict.reasons))))
    if table.row_count:
        out.print(table)
    out.print(
        f"accepted {outcome.count(Verdict.ACCEPTED)} / rejected {outcome.count(Verdict.REJECTED)} / "
        f"unreachable {outcome.count(Verdict.UNREACHABLE)} / skipped {outcome.count(Verdict.SKIPPED)}",
        highlight=False,
    )
    out.print(f"report: {outcome.run_dir / 'report.html'}", highlight=False, soft_wrap=True)
    if not outcome.tested:
        _say("error: no node was tested (every node is excluded in the inventory): nothing is accepted")
    failed_on = [v.node for v in outcome.verdicts if v.verdict == Verdict.TOOL_ERROR]
    if failed_on:
        said = f"error: cluster-accept failed on the controller for {fold(failed_on)} (tool:internal_error): "
        _say(said + "not judged, not drained; the traceback is in their rows")
    slurm = outcome.slurm
    if slurm.error:
        _say(f"slurm: nothing changed: {slurm.error}")
    if slurm.unknown:
        _say(f"slurm: not drained, Slurm does not know {fold(slurm.unknown)} (check slurm.node_names)")
    if slurm.breaker is not None:
        _say(f"slurm: drain refused: {slurm.breaker.why}")
        for node, reason in slurm.breaker.held:
            out.print(visible(f"slurm: not drained: {node}: {reason}"), highlight=False, markup=False, soft_wrap=True)
    for held in slurm.held:  # a relative finding drains once it repeats (ops.repeats)
        out.print(visible(f"slurm: {held.said}"), highlight=False, markup=False, soft_wrap=True)
    if slurm.held and slurm.repeats_unread:
        _say(f"slurm: earlier runs' verdicts not read, left out of the counts: {'; '.join(slurm.repeats_unread)}")
    for node, why in slurm.kept:
        out.print(visible(f"slurm: {node} stays drained: {why}"), highlight=False, markup=False, soft_wrap=True)
    for action in slurm.actions:
        if action.exit_code is None and not action.applied:
            dry = visible(f"slurm (dry run, add --apply): {action.command}")
            out.print(dry, highlight=False, markup=False, soft_wrap=True)
        else:
            said = "done" if action.applied else f"failed (exit {action.exit_code}): {action.output}"
            out.print(visible(f"slurm: {action.command}: {said}"), highlight=False, markup=False, soft_wrap=True)
