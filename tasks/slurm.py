"""Take bad nodes out of Slurm before they kill a job, and give back the ones that pass again.

``--drain`` drains every node the run rejected or could not reach, with the reasons in Slurm's reason
field (``cluster-accept: gpu_count:count_low``), so ``sinfo -R`` says why. ``--resume-passing`` resumes
nodes that are drained *by us* (their reason starts with :data:`REASON_PREFIX`) and now pass; a node an
administrator drained for another reason is never touched. Without ``apply`` the commands are only
returned, for the operator to read (a dry run). Slurm is told its own node names (the inventory's
``slurm.node_names`` rule); every action also names the inventory node. A node Slurm does not know is listed
in the plan, never silently skipped.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from cluster_accept.analysis.verdicts import NOT_ACCEPTED, Verdict, VerdictRow

REASON_PREFIX = "cluster-accept: "
REASON_MAX = 200  # Slurm keeps the reason in a short field; the run's reasons are all in its report
BAD = NOT_ACCEPTED  # the verdicts a node is drained for


@dataclass
class SlurmAction:
    node: str
    action: str  # drain | resume
    argv: list[str]
    reason: str = ""
    applied: bool = False
    exit_code: int | None = None
    output: str = ""
    slurm_node: str = ""  # the node's name in Slurm (the inventory's name unless a rule maps it)

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


@dataclass
class SlurmNode:
    name: str
    state: str
    reason: str = ""

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.state.upper()

    @property
    def drained_by_us(self) -> bool:
        return self.drained and self.reason.startswith(REASON_PREFIX)


@dataclass
class SlurmPlan:
    actions: list[SlurmAction] = field(default_factory=list)
    error: str = ""  # scontrol could not be asked: nothing was changed
    unknown: list[str] = field(default_factory=list)  # nodes to act on that Slurm does not know (inventory names)
    kept: list[tuple[str, str]] = field(default_factory=list)  # (node, why) drained by us, passing, not resumed


_FIELD = re.compile(r"(?:^|\s)(\w+)=")


def parse_show_nodes(text: str) -> dict[str, SlurmNode]:
    """``scontrol show node -o``: one line per node, ``Key=value`` fields; ``Reason`` may hold spaces and
    ends before the next field or at Slurm's ``[user@time]`` stamp."""
    nodes: dict[str, SlurmNode] = {}
    for line in text.splitlines():
        marks = [(m.group(1), m.start(1), m.end()) for m in _FIELD.finditer(line)]
        values: dict[str, str] = {}
        for i, (key, _, end) in enumerate(marks):
            stop = marks[i + 1][1] if i + 1 < len(marks) else len(line)
            values[key] = line[end:stop].strip()
        name = values.get("NodeName")
        if not name:
            continue
        reason = re.sub(r"\s*\[[^\]]*@[^\]]*\]\s*$", "", values.get("Reason", ""))
        state = values.get("State", "").split()
        node = name.split()[0]
        nodes[node] = SlurmNode(node, state[0] if state else "", reason)
    return nodes


def drain_codes(reason: str) -> list[str] | None:
    """The reason codes in a drain reason cluster-accept wrote; None when it was cut short (not all known)."""
    body = reason[len(REASON_PREFIX) :] if reason.startswith(REASON_PREFIX) else reason
    body = re.sub(r"\s*\(run [^)]*\)$", "", body.strip())
    if body.endswith("..."):
        return None
    return [code.strip() for code in body.split(",") if code.strip()]


def unchecked_codes(reason: str, judged: set[str]) -> list[str] | None:
    """The codes of ``reason`` whose check this run did not judge (``ssh`` counts as judged: the node was
    reached); None when the reason was cut short. Empty: every code was looked at again."""
    codes = drain_codes(reason)
    if codes is None:
        return None
    return [c for c in codes if c != "not accepted" and c.split(":")[0] not in judged | {"ssh"}]


def drain_reason(reasons: Sequence[str], run_id: str) -> str:
    text = f"{REASON_PREFIX}{', '.join(reasons) or 'not accepted'} (run {run_id})"
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3] + "..."


def plan(
    verdicts: Sequence[VerdictRow],
    slurm_nodes: Mapping[str, SlurmNode],
    run_id: str,
    drain: bool,
    resume_passing: bool,
    scontrol: str = "scontrol",
    names: Mapping[str, str] | None = None,
    judged: Mapping[str, set[str]] | None = None,
) -> SlurmPlan:
    """What to ask Slurm, per node; pure. ``names``: inventory name -> Slurm name (the same when absent).
    Nodes Slurm does not know are listed in ``unknown`` when there was something to do for them. ``judged``:
    node -> the checks this run judged on it; a node drained for a finding this run did not look at again
    (a preflight-only health check, a node drained for its all-reduce) stays drained, listed in ``kept``."""
    result = SlurmPlan()
    for verdict in verdicts:
        name, outcome = verdict.node, verdict.verdict
        slurm_name = (names or {}).get(name, name)
        known = slurm_nodes.get(slurm_name)
        wanted = (drain and outcome in BAD) or (resume_passing and outcome == Verdict.ACCEPTED)
        if known is None:
            if drain and outcome in BAD:
                result.unknown.append(name)
            continue
        if not wanted:
            continue
        update = [scontrol, "update", f"nodename={slurm_name}"]
        if drain and outcome in BAD and not known.drained:
            reason = drain_reason(verdict.reasons, run_id)
            action = SlurmAction(name, "drain", [*update, "state=drain", f"reason={reason}"], reason)
            result.actions.append(replace(action, slurm_node=slurm_name))
        elif resume_passing and outcome == Verdict.ACCEPTED and known.drained_by_us:
            left = unchecked_codes(known.reason, judged.get(name, set())) if judged is not None else []
            if left is None or left:
                why = (
                    f"drained for {', '.join(left)}, which this run did not check"
                    if left
                    else "its drain reason was cut short, so this run cannot tell it checked every finding"
                )
                result.kept.append((name, why))
                continue
            result.actions.append(SlurmAction(name, "resume", [*update, "state=resume"], slurm_node=slurm_name))
    return result


def slurm_step(
    verdicts: Sequence[VerdictRow],
    run_id: str,
    drain: bool,
    resume_passing: bool,
    apply: bool,
    scontrol: str = "scontrol",
    names: Mapping[str, str] | None = None,
    judged: Mapping[str, set[str]] | None = None,
) -> SlurmPlan:
    """Ask Slurm for its nodes, plan, and (with ``apply``) run each command; every outcome is data."""
    if not (drain or resume_passing):
        return SlurmPlan()
    try:
        shown = subprocess.run([scontrol, "show", "node", "-o"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return SlurmPlan(error=f"could not run {scontrol} show node: {exc}")
    if shown.returncode != 0:
        return SlurmPlan(error=f"{scontrol} show node failed (exit {shown.returncode}): {shown.stderr.strip()}")
    result = plan(verdicts, parse_show_nodes(shown.stdout), run_id, drain, resume_passing, scontrol, names, judged)
    if apply:
        for action in result.actions:
            try:
                done = subprocess.run(action.argv, capture_output=True, text=True, timeout=60)
                action.exit_code, action.output = done.returncode, (done.stdout + done.stderr).strip()
            except (OSError, subprocess.TimeoutExpired) as exc:
                action.exit_code, action.output = None, str(exc)
            action.applied = action.exit_code == 0
    return result
