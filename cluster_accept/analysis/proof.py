"""What the arms of a search proved, as rows: each setting of the smallest set named with the arms that prove it,
every other difference cleared by an arm that restored the figure with it still in effect. Pure.

One arm's outcome comes from its figures (each failing figure measured again and judged as the stage judged it,
:class:`analysis.suspects.Retest`) and from the settings it said it ran with: an arm whose settings are not the
ones asked (a reverted key still set, a kept one gone) proves nothing and is ``void``, named as such.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from cluster_accept.analysis.minimal_cause import Arm, Finding, Outcome
from cluster_accept.analysis.reference import Change
from cluster_accept.analysis.suspects import (
    ENV_SOURCE,
    NAME,
    NCCL_LOG,
    JobSetting,
    Retest,
    figure_value,
    masked,
    retest_said,
)
from cluster_accept.checks.base import CheckRow, Status

FAILING_RUN = "the failing run itself"


def arm_settings_wrong(changes: Sequence[Change], reverted: frozenset[str], ran: Sequence[JobSetting]) -> str:
    """Why an arm did not run as asked ("" when it did): each reverted change must read as the reference (its
    value, or unset/neutral), each kept one as in the failing run; a masked value is not compared. Another
    library's key only an NCCL config file still sets counts as unset: that library read its environment at its
    own start, before NCCL reads its files."""
    said = {s.key: s.value for s in ran if s.source == ENV_SOURCE or s.key.startswith("NCCL_")}
    wrong = []
    for change in changes:
        if change.now is not None and change.now.source == NCCL_LOG:
            continue  # only NCCL's log said it, and an arm's own log is not read: not held to it
        if change.key in reverted:
            wanted = change.revert()
        else:
            wanted = change.now.value if change.now is not None else None
        got = said.get(change.key)
        if wanted is not None and masked(wanted) or got is not None and masked(got):
            continue
        if got != wanted and not (wanted == "" and got is None):
            shown = "unset" if got is None else repr(got)
            asked = "unset" if wanted is None else repr(wanted)
            wrong.append(f"{change.key} ran {shown}, asked {asked}")
    return "; ".join(wrong)


# Where an arm's figure sits between the failing figure (0) and the reference level (1: for a straggler first its
# peers' median, then the first arm's figure, everything reverted), on a log scale: at or past RESTORED it is back,
# at or under LOW it is not; in between it is measured again (a throughput figure is only ever pulled down by what
# runs beside it, so the highest of its measurements is the figure), and whatever is not back by then is not
# restored: one culprit of two reverted leaves the figure about half-way.
RESTORED, LOW, REPEATS = 0.75, 0.25, 2


def position(before: float, level: float, again: float) -> float | None:
    """Where ``again`` sits from ``before`` (0) to ``level`` (1), on a log scale; None where the level is not
    above the failing figure (nothing to place it between)."""
    if before <= 0 or level <= before or again <= 0:
        return None
    return math.log(again / before) / math.log(level / before)


def row_call(retest: Retest, level: float | None) -> Outcome | None:
    """One failing row's figure in an arm: ``restored``, ``low``, or None (not told apart yet). Without a reference
    level (the first arm) the stage's own judgement decides (:class:`Retest`'s ``recovered``)."""
    before, again = figure_value(retest.row.observed), figure_value(retest.again)
    where = position(before, level, again) if before is not None and level is not None and again is not None else None
    if where is None:
        return "restored" if retest.recovered else None
    return "restored" if where >= RESTORED else "low" if where <= LOW else None


def arm_outcome(
    retests: Sequence[Retest], wrong: str, levels: Mapping[int, float] | None = None, last: bool = True
) -> tuple[Outcome | None, str]:
    """One arm's outcome over its node's failing figures, and what it measured in words: ``void`` when it ran
    otherwise than asked or a figure did not come back; ``low`` when a figure is still low; ``restored`` when every
    figure is back (``levels``: each row's reference level by the row's ``id``, once the first arm gave them);
    None when not told apart yet and the arm may be measured again (``last``: it may not, and what is not back
    is low)."""
    said = retest_said(retests)
    if wrong:
        return "void", f"{said}; void: {wrong}" if said else f"void: {wrong}"
    if not retests or any(r.again is None for r in retests):
        return "void", f"{said}; void: no figure came back" if said else "void: no figure came back"
    calls = [row_call(r, (levels or {}).get(id(r.row))) for r in retests]
    if "low" in calls or (last and None in calls):
        return "low", said
    return ("restored", said) if all(c == "restored" for c in calls) else (None, said)


def _arm(finding: Finding, reverted: frozenset[str]) -> str:
    """The arm that reverted exactly ``reverted``, in words; the failing run where nothing was reverted."""
    if not reverted:
        return FAILING_RUN
    for number, arm in enumerate(finding.arms, 1):
        if arm.reverted == reverted:
            return f"arm {number}: {arm.said}"
    return ""


def _restored_with(finding: Finding, key: str) -> str:
    """An arm that restored the figure with ``key`` still in effect: proof it is not needed to explain it."""
    for number, arm in enumerate(finding.arms, 1):
        if arm.outcome == "restored" and key not in arm.reverted:
            return f"arm {number}: {arm.said}"
    return ""


def _names(changes: Mapping[str, Change], keys: Sequence[str]) -> str:
    return ", ".join(changes[k].short for k in keys)


def counted(finding: Finding) -> str:
    return f"{len(finding.arms)} re-measurement{'s' if len(finding.arms) != 1 else ''} (at most {finding.bound})"


def _restoring(finding: Finding, key: str) -> tuple[str, str]:
    """The smallest arm that reverted ``key`` and restored the figure, in words, and what else it reverted."""
    arms = [(n, a) for n, a in enumerate(finding.arms, 1) if a.outcome == "restored" and key in a.reverted]
    if not arms:
        return "no arm", ""
    number, arm = min(arms, key=lambda na: (len(na[1].reverted), na[0]))
    others = sorted(arm.reverted - {key})
    return f"arm {number}: {arm.said}", ", ".join(others)


def _alone_row(change: Change, finding: Finding, changes: Mapping[str, Change], reference: str) -> CheckRow:
    kept = _arm(finding, frozenset(changes) - {change.key})
    restored, others = _restoring(finding, change.key)
    with_others = f" with {others}" if others else ""
    detail = (
        f"{change.where}; against {reference}: kept alone in effect (every other difference reverted) the figure "
        f"stayed low ({kept}); reverting it{with_others} restored it ({restored}); proved in {counted(finding)}"
    )
    return CheckRow(NAME, change.key, Status.FAIL, "confirmed", change.said, change.fix(), detail)


def _together_row(change: Change, finding: Finding, changes: Mapping[str, Change], reference: str) -> CheckRow:
    partners = [k for k in finding.together if k != change.key]
    everything = frozenset(changes)
    detail = (
        f"{change.where}; against {reference}: slows the figure only together with {_names(changes, partners)}: "
        f"kept alone in effect it is harmless ({_arm(finding, everything - {change.key})}), kept with them the "
        f"figure stays low ({_arm(finding, everything - frozenset(finding.together))}); proved in {counted(finding)}"
    )
    return CheckRow(NAME, change.key, Status.FAIL, "confirmed_together", change.said, change.fix(), detail)


def _cleared_row(change: Change, finding: Finding, reference: str, everything: frozenset[str]) -> CheckRow:
    if finding.kind == "cleared":
        why = (
            f"reverting every difference left the figure low ({_arm(finding, everything)}): not the cause; the "
            "figure's own row says what to inspect"
        )
    else:
        why = f"with it still in effect the figure was restored ({_restored_with(finding, change.key)})"
    detail = f"{change.where}; against {reference}: {why}"
    return CheckRow(NAME, change.key, Status.PASS, "cleared", change.said, change.fix(), detail)


def _unresolved_row(change: Change, finding: Finding, reference: str) -> CheckRow:
    detail = (
        f"{change.where}; against {reference}: {finding.note} after {counted(finding)}; still in question: "
        f"{', '.join(finding.left)}: revert them one at a time and measure again"
    )
    return CheckRow(NAME, change.key, Status.WARN, "unresolved", change.said, change.fix(), detail)


def finding_rows(changes: Sequence[Change], finding: Finding, reference: str) -> list[CheckRow]:
    """A row per change: ``confirmed`` (it slows the figure by itself), ``confirmed_together`` (only with the
    others named), ``unresolved`` (the search stopped with it still in question), ``suspect`` (the first arm was
    void), ``cleared`` (an arm restored the figure with it in effect, or reverting everything did not)."""
    by_key = {c.key: c for c in changes}
    rows = []
    for change in changes:
        if change.key in finding.alone:
            rows.append(_alone_row(change, finding, by_key, reference))
        elif change.key in finding.together:
            rows.append(_together_row(change, finding, by_key, reference))
        elif finding.kind == "void":
            detail = f"{change.where}; against {reference}: {finding.note} ({_arm_said(finding.arms[:1])})"
            rows.append(CheckRow(NAME, change.key, Status.WARN, "suspect", change.said, change.fix(), detail))
        elif change.key in finding.left:
            rows.append(_unresolved_row(change, finding, reference))
        else:
            rows.append(_cleared_row(change, finding, reference, frozenset(by_key)))
    return rows


def _arm_said(arms: Sequence[Arm]) -> str:
    return "; ".join(f"arm {i}: {a.said}" for i, a in enumerate(arms, 1))


def figure_note(finding: Finding, changes: Sequence[Change], reference: str) -> str:
    """What a failing figure's row adds: what the search against ``reference`` found, in one sentence."""
    by_key = {c.key: c for c in changes}
    found = []
    if finding.alone:
        found.append(f"{_names(by_key, finding.alone)} (each slows it by itself)")
    if finding.together:
        found.append(f"{_names(by_key, finding.together)} (only together)")
    if finding.kind == "cleared":
        said = f"none of the {len(changes)} differences: reverting them all left it low"
    elif finding.kind == "void":
        said = f"nothing proved: {finding.note}"
    else:
        said = " and ".join(found) if found else "no setting proved"
        if finding.kind == "unfinished":
            said += f"; {finding.note}, still in question: {', '.join(finding.left)}"
    return f"measured again against {reference}, {len(changes)} differences: the cause is {said}; {counted(finding)}"


def unproved_change_rows(changes: Sequence[Change], why: str, reference: str) -> list[CheckRow]:
    """The differences named as suspects without an arm (``why``: proving is off)."""
    return [
        CheckRow(NAME, c.key, Status.WARN, "suspect", c.said, c.fix(), f"{c.where}; against {reference}; {why}")
        for c in changes
    ]
