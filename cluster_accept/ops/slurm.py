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

import json
import os
import re
import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from cluster_accept.analysis.verdicts import NOT_ACCEPTED, Verdict, VerdictRow

if TYPE_CHECKING:  # a node's own check names its reasons with this module: the breaker's is loaded when it drains
    from cluster_accept.ops.breaker import BreakerTrip, DrainLimits
    from cluster_accept.ops.repeats import HeldDrain

REASON_PREFIX = "cluster-accept: "
SSH_CHECK = "ssh"  # the check an unreachable node's reasons are under (``ssh:refused``, ``ssh:host-key``)
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
        """Slurm's own reason field begins with our prefix: a reason that only quotes one (an administrator's
        ``vendor hold, was cluster-accept: ...``) is the administrator's."""
        return self.drained and self.reason.startswith(REASON_PREFIX)


@dataclass
class SlurmPlan:
    actions: list[SlurmAction] = field(default_factory=list)
    error: str = ""  # scontrol could not be asked: nothing was changed
    unknown: list[str] = field(default_factory=list)  # nodes to act on that Slurm does not know (inventory names)
    kept: list[tuple[str, str]] = field(default_factory=list)  # (node, why) drained by us, passing, not resumed
    breaker: BreakerTrip | None = None  # the drains held back as a whole (ops.breaker), and why
    held: list[HeldDrain] = field(default_factory=list)  # drains for relative findings not repeated yet (ops.repeats)
    repeats_unread: tuple[str, ...] = ()  # earlier runs' verdicts the held drains' counts could not read


# ``scontrol show node -o``: the fields Slurm prints after the reason (``Comment=``, ``Extra=`` ...), and the
# ``[user@time]`` stamp it appends to the reason's first line (its time made standard by SLURM_TIME_FORMAT).
_AFTER_REASON = re.compile(r" (?:Comment|Extra|InstanceId|InstanceType|ReservationName)=")
_STAMP = re.compile(r" \[[^\s\[\]@]+@\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\]")
_SHOW_ENV = {"SLURM_TIME_FORMAT": "standard"}


def _reason_in_line(line: str) -> str:
    """The reason of one ``scontrol show node -o`` line, as Slurm wrote it.

    Slurm prints the reason after every field that has a value of its own choosing (CPU, memory, state, boot
    times, TRES, power) and before the administrators' other free text (``Comment=``, ``Extra=``): its
    *first* `` Reason=`` is the field, and whatever looks like a field inside the reason text (an administrator
    quoting an old ``Reason=cluster-accept: ...``) is part of the value. The value ends at Slurm's
    ``[user@time]`` stamp; without one, at the next field Slurm prints after it, or the line's end."""
    start = line.find(" Reason=")
    if start < 0:
        return ""
    rest = line[start + len(" Reason=") :]
    end = _STAMP.search(rest) or _AFTER_REASON.search(rest)
    return (rest[: end.start()] if end else rest).rstrip()


def parse_show_nodes(text: str) -> dict[str, SlurmNode]:
    """``scontrol show node -o``: one line per node, ``NodeName=`` first; ``State`` and the reason read where
    Slurm prints them (:func:`_reason_in_line`), never by splitting the line at every ``key=``. Slurm prints
    a reason's line breaks as spaces, but a node's ``Comment=`` or ``Extra=`` as written: a node named on two
    lines is one line forged by such text, and which is Slurm's cannot be told, so nothing is read (ValueError)."""
    nodes: dict[str, SlurmNode] = {}
    for line in text.splitlines():
        if not line.startswith("NodeName="):
            continue
        name = line[len("NodeName=") :].split(" ", 1)[0]
        state = re.search(r" State=(\S+)", line)
        if name in nodes:
            raise ValueError(
                f"scontrol show node -o names node {name} on two lines: a line break in a node's free text "
                "(Comment=, Extra=) forged one, and which is Slurm's cannot be told"
            )
        if name:
            nodes[name] = SlurmNode(name, state.group(1) if state else "", _reason_in_line(line))
    return nodes


def parse_json_nodes(text: str) -> dict[str, SlurmNode] | None:
    """Slurm's JSON node list: ``scontrol --json show node`` (23.02 and later: ``state`` a list of flags,
    ``["IDLE", "DRAIN"]``) or ``sinfo --json`` of 21.08 to 22.05 (``state`` a word, the flags in
    ``state_flags``). The reason is a field of its own: nothing to parse. None when the text is not such a list
    (a later ``sinfo --json`` lists partitions' summaries instead)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    listed = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(listed, list) or not all(isinstance(n, dict) and isinstance(n.get("name"), str) for n in listed):
        return None
    nodes: dict[str, SlurmNode] = {}
    for node in listed:
        state = node.get("state")
        flags = [state] if isinstance(state, str) else list(state or [])
        flags += [f for f in node.get("state_flags") or [] if f not in flags]
        name = node["name"]
        nodes[name] = SlurmNode(name, "+".join(str(f).upper() for f in flags), str(node.get("reason") or ""))
    return nodes


def _show(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``argv``'s answer, with Slurm's times in one format and without the caller's ``SQUEUE_*`` settings
    (``SQUEUE_FORMAT``, ``SQUEUE_STATES``, ``SQUEUE_USERS`` would change or filter what squeue prints)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQUEUE_")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**env, **_SHOW_ENV})


def _beside(scontrol: str, program: str) -> str:
    """The Slurm client ``program`` beside ``scontrol`` (the same installation), or on the PATH."""
    return str(Path(scontrol).with_name(program)) if "/" in scontrol else program


def _json_nodes(argv: list[str]) -> dict[str, SlurmNode] | None:
    """The nodes as ``argv`` gives them in JSON; None when it cannot (no such option or program)."""
    try:
        shown = _show(argv)
    except OSError:
        return None
    return parse_json_nodes(shown.stdout) if shown.returncode == 0 else None


def read_nodes(scontrol: str = "scontrol") -> tuple[dict[str, SlurmNode], str]:
    """Slurm's nodes, and why they could not be read ('' when they were).

    JSON where Slurm gives it, so that the reason is a field and never text to split: ``scontrol --json``
    (23.02 and later), else ``sinfo --json`` beside that scontrol (21.08 to 22.05; every node, in a partition
    or not). A Slurm with neither (older, or built without its JSON serializer) is read from ``scontrol show
    node -o`` (:func:`parse_show_nodes`). A controller that does not answer in time is not asked again."""
    sinfo = _beside(scontrol, "sinfo")
    try:
        for argv in ([scontrol, "--json", "show", "node"], [sinfo, "--json"]):
            found = _json_nodes(argv)
            if found is not None:
                return found, ""
        shown = _show([scontrol, "show", "node", "-o"])
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {}, f"could not run {scontrol} show node: {exc}"
    if shown.returncode != 0:
        return {}, f"{scontrol} show node failed (exit {shown.returncode}): {shown.stderr.strip()}"
    try:
        return parse_show_nodes(shown.stdout), ""
    except ValueError as exc:
        return {}, str(exc)


def drain_codes(reason: str) -> list[str] | None:
    """The reason codes in a drain reason cluster-accept wrote; None when it was cut short (not all known)."""
    body = reason[len(REASON_PREFIX) :] if reason.startswith(REASON_PREFIX) else reason
    body = re.sub(r"\s*\(run [^)]*\)$", "", body.strip())
    if body.endswith("..."):
        return None
    return [code.strip() for code in body.split(",") if code.strip()]


def unchecked_codes(reason: str, judged: set[str]) -> list[str] | None:
    """The codes of ``reason`` whose check is not in ``judged``, the checks this run tested again; None when the
    reason was cut short. Empty: every code was looked at again. One rule for every check, ``ssh`` among them:
    SSH was tested again only where the caller says so (:data:`SSH_CHECK`: a run that reached the node over SSH),
    never by a node's own check, which reaches nothing; a drain that names no code (``not accepted``) names
    nothing tested again."""
    codes = drain_codes(reason)
    if codes is None:
        return None
    return [c for c in codes if c.split(":")[0] not in judged]


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
    hold: Mapping[str, HeldDrain] | None = None,
) -> SlurmPlan:
    """What to ask Slurm, per node; pure. ``names``: inventory name -> Slurm name (the same when absent).
    Nodes Slurm does not know are listed in ``unknown`` when there was something to do for them. ``judged``:
    node -> the checks this run tested again on it (:func:`unchecked_codes`); a node drained for a finding this
    run did not look at again (a preflight-only health check, a node drained for its all-reduce, a node's own
    check and a drain for SSH) stays drained, listed in ``kept``, and so does every node without ``judged``.
    ``hold``: node -> its drain held until its relative finding repeats (:mod:`ops.repeats`): listed in ``held``
    where it would be drained now, not drained."""
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
        held = (hold or {}).get(name)
        if drain and outcome in BAD and not known.drained and held is not None:
            result.held.append(held)
        elif drain and outcome in BAD and not known.drained:
            reason = drain_reason(verdict.reasons, run_id)
            action = SlurmAction(name, "drain", [*update, "state=drain", f"reason={reason}"], reason)
            result.actions.append(replace(action, slurm_node=slurm_name))
        elif resume_passing and outcome == Verdict.ACCEPTED and known.drained_by_us:
            left = unchecked_codes(known.reason, (judged or {}).get(name, set()))
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
    limits: DrainLimits | None = None,
    before_apply: Callable[[SlurmPlan], None] | None = None,
    hold: Mapping[str, HeldDrain] | None = None,
    unread: tuple[str, ...] = (),
) -> SlurmPlan:
    """Ask Slurm for its nodes, plan, hold the drains back where the breaker says so (:mod:`ops.breaker`), and
    (with ``apply``) run each command, after ``before_apply`` has recorded the plan; every outcome is data.
    ``hold``: the drains held until their relative findings repeat (:func:`plan`), ``unread`` the earlier runs
    their counts could not read (kept in the plan where a drain is held); the breaker counts only what is
    drained."""
    if not (drain or resume_passing):
        return SlurmPlan()
    known, error = read_nodes(scontrol)
    if error:
        return SlurmPlan(error=error)
    planned = plan(verdicts, known, run_id, drain, resume_passing, scontrol, names, judged, hold)
    planned.repeats_unread = unread if planned.held else ()
    result = held_back(planned, verdicts, limits)
    if apply and result.actions and before_apply is not None:
        before_apply(result)
    if apply:
        for action in result.actions:
            try:
                done = subprocess.run(action.argv, capture_output=True, text=True, timeout=60)
                action.exit_code, action.output = done.returncode, (done.stdout + done.stderr).strip()
            except (OSError, subprocess.TimeoutExpired) as exc:
                action.exit_code, action.output = None, str(exc)
            action.applied = action.exit_code == 0
    return result


def held_back(result: SlurmPlan, verdicts: Sequence[VerdictRow], limits: DrainLimits | None) -> SlurmPlan:
    """``result`` without its drains where the breaker holds them back as a whole (resumes go ahead)."""
    from cluster_accept.ops.breaker import DrainLimits, trip

    drains = [(a.node, a.reason) for a in result.actions if a.action == "drain"]
    tripped = trip(verdicts, drains, limits or DrainLimits())
    if tripped is None:
        return result
    return replace(result, actions=[a for a in result.actions if a.action != "drain"], breaker=tripped)


# A job is read by field, never out of ``scontrol show job -o``: its name (any text, spaces, ``Key=``, line
# breaks) comes before NodeList, and its comment, command and output paths after it, so a name and an output
# path can between them carry a whole forged record. ``scontrol --json`` (23.02 and later) gives each field
# apart; an older Slurm is asked through ``squeue --format`` for the fields the watch needs and no other, none of
# them text a job's user writes (the separator can be in none of them; the user's name comes last).
_JOB_ID = re.compile(r"([1-9][0-9]*)(?:_([0-9]+)|\+([0-9]+))?")
_SQUEUE_FIELDS = "%i|%A|%U|%T|%N|%u"  # id as shown (N, N_T, N+O), own id, uid, state, nodes, user name


@dataclass(frozen=True)
class SlurmJob:
    """A job as Slurm holds it: the id asked for, its nodes (Slurm's hostlist, '' while it has none), the
    user it runs as (the owner of every file its ranks write) and its state."""

    job_id: str
    nodes: str
    user_id: int
    user_name: str
    state: str = ""

    def nodes_to_watch(self) -> str:
        """Its nodes; ValueError while it has none (pending, or ended before it had any)."""
        if not self.nodes:
            said = f" (JobState={self.state})" if self.state else ""
            raise ValueError(f"Slurm job {self.job_id} has no nodes to watch{said}")
        return self.nodes


@dataclass(frozen=True)
class _Record:
    """One job record's fields that say which job it is, as Slurm gave them."""

    shown: str  # the id squeue shows (``N``, ``N_T``, ``N+O``); '' from JSON
    own: int
    array: int | None
    task: int | None
    het: int | None
    offset: int | None


def _asked(job_id: str) -> re.Match[str]:
    found = _JOB_ID.fullmatch(job_id)
    if found is None:
        raise ValueError(f"--slurm-job {job_id!r} is not a Slurm job id (N; N_T an array's task; N+O a component)")
    return found


def _is_asked(record: _Record, asked: re.Match[str]) -> bool:
    """Whether ``record`` is the job asked for: ``N`` its own id (an array task by its own id too) or a
    component of heterogeneous job N; ``N_T`` task T of array N; ``N+O`` component O of N."""
    job, task, offset = int(asked.group(1)), asked.group(2), asked.group(3)
    if task is not None:
        return record.shown == asked.group(0) or (record.array, record.task) == (job, int(task))
    if offset is not None:
        return record.shown == asked.group(0) or (record.het, record.offset) == (job, int(offset))
    return record.own == job or record.het == job or record.shown.startswith(f"{job}+")


def _job(job_id: str, found: list[tuple[_Record, str, int, str, str]]) -> SlurmJob:
    """The asked job from its records (one, or a heterogeneous job's components): one user, every node."""
    if not found:
        raise ValueError(f"Slurm does not know job {job_id}")
    users = {(uid, name) for _, _, uid, name, _ in found}
    if len(users) != 1:
        raise ValueError(f"Slurm gives job {job_id} more than one user: {sorted(users)}")
    (uid, name), nodes = users.pop(), [n for _, n, _, _, _ in found if n]
    states = dict.fromkeys(s for _, _, _, _, s in found)
    return SlurmJob(job_id, ",".join(nodes), uid, name, "+".join(states))


def _number(value: object) -> int | None:
    """A Slurm JSON number: plain (22.05) or ``{"set": true, "number": N}`` (23.02 and later); None unset.
    An id of 0 (no array, no heterogeneous job) never equals a job asked for: job ids start at 1."""
    if isinstance(value, dict):
        value = value.get("number") if value.get("set") else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def parse_json_job(text: str, job_id: str) -> SlurmJob:
    """``scontrol --json show job ID`` (or any Slurm JSON of ``jobs``): the asked job's records, each field
    its own; ValueError naming what is missing or not of its type."""
    asked = _asked(job_id)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"Slurm's JSON for job {job_id} cannot be read: {exc}") from None
    jobs = data.get("jobs") if isinstance(data, dict) else None
    if not isinstance(jobs, list) or not all(isinstance(j, dict) for j in jobs):
        raise ValueError(f"Slurm's JSON for job {job_id} has no list of jobs")
    found = []
    for job in jobs:
        own, uid = _number(job.get("job_id")), job.get("user_id")
        if own is None or not isinstance(uid, int) or isinstance(uid, bool):
            raise ValueError(f"Slurm's JSON for job {job_id} has a job without job_id or user_id: {str(job)[:200]}")
        get = job.get
        record = _Record("", own, _number(get("array_job_id")), _number(get("array_task_id")),
                         _number(get("het_job_id")), _number(get("het_job_offset")))  # fmt: skip
        if _is_asked(record, asked):
            state = get("job_state")
            state = "+".join(map(str, state)) if isinstance(state, list) else str(state or "")
            found.append((record, _text(get("nodes")), uid, _text(get("user_name")), state))
    return _job(job_id, found)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def parse_squeue_job(text: str, job_id: str) -> SlurmJob:
    """``squeue --noheader --jobs ID --format`` :data:`_SQUEUE_FIELDS`: one row per record, its fields apart
    (no job name, comment or path among them); rows of other jobs squeue adds are left out."""
    asked, found = _asked(job_id), []
    for line in text.splitlines():
        fields = line.split("|", 5)
        if len(fields) != 6 or not fields[1].isdigit() or not fields[2].isdigit():
            raise ValueError(f"squeue's row for job {job_id} is not {_SQUEUE_FIELDS}: {line[:200]!r}")
        shown, own, uid, state, nodes, user = fields
        record = _Record(shown, int(own), None, None, None, None)
        if _is_asked(record, asked):
            found.append((record, nodes, int(uid), user, state))
    return _job(job_id, found)


def read_job(job_id: str, scontrol: str = "scontrol") -> SlurmJob:
    """Job ``job_id`` as Slurm gives it now, by field: ``scontrol --json`` (23.02 and later), else ``squeue``
    beside that scontrol (:func:`parse_squeue_job`); ValueError naming why not. A controller that does not
    answer in time is not asked again."""
    _asked(job_id)
    try:
        shown = _show([scontrol, "--json", "show", "job", job_id])
        if shown.returncode == 0 and shown.stdout.lstrip().startswith("{"):
            return parse_json_job(shown.stdout, job_id)
    except OSError:
        pass  # no such scontrol: squeue says so
    except subprocess.TimeoutExpired as exc:
        raise ValueError(f"cannot ask Slurm for job {job_id}: {exc}") from None
    squeue = _beside(scontrol, "squeue")
    try:
        shown = _show([squeue, "--noheader", "--states=all", f"--jobs={job_id}", f"--format={_SQUEUE_FIELDS}"])
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"cannot ask Slurm for job {job_id}: {exc}") from None
    if shown.returncode != 0:
        raise ValueError(f"Slurm does not know job {job_id}: {(shown.stderr or shown.stdout).strip()[:200]}")
    return parse_squeue_job(shown.stdout, job_id)


def job_nodes(job_id: str, scontrol: str = "scontrol") -> str:
    """The Slurm hostlist of job ``job_id`` as Slurm gives it now (:func:`read_job`); ValueError naming why
    not, a job without nodes (pending, ended) among them."""
    return read_job(job_id, scontrol).nodes_to_watch()
