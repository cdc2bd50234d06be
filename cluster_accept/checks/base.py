"""What every check shares: the closed status enum, the row a check produces, and check discovery.

A check is one module in ``checks/`` that ends with ``CHECK = Check(...)`` (:class:`Check`), naming:

- ``name``: the check's name as it appears in rows and verdict reasons (``driver``, ``gpu_count``…);
- ``command``: the shell snippet it runs on the node (one per check; all of a node's checks travel in one
  batch over one SSH session); ``command_for(profile)`` where it depends on the profile (the probe
  interpreter's path), ``command`` being then only its shape;
- ``parse(stdout, exit_code) -> model``: pure, never raises; malformed output becomes a model whose ``error``
  says so, with the raw text kept;
- ``evaluate(model, profile, cluster) -> list[CheckRow]``: pure; judges the node against its profile and
  against the cluster's majority (:class:`ClusterView`);
- ``reasons``: every reason code its rows carry beyond the common ones, declared beside the code that emits
  them (:func:`cluster_accept.checks.reasons.declare`): what the code means, its severity, the action;
- optionally ``cluster_values(model)``: the values compared across nodes for drift; ``counters(model)``: error
  counters compared with the node's previous run (a counter that grew is flagged by scheduled checks);
- optionally ``marks(model)`` and ``since(model, marks)``: where this reading of the node ended (the boot and
  the time of a kernel log read), kept for the node's next run (in the history, or on the node for its own
  check), and the model cut to what happened after the previous run's marks (XIDs new since the last run, not
  since boot). ``since`` never raises and never trusts a mark it cannot check (:func:`read_mark`): an
  impossible or future mark is named in a row and the reading is judged as without marks, so a mark can never
  turn a finding into a pass; a row that passes only because an earlier reading judged it carries the reason
  :data:`SEEN_BEFORE`, and such a check has not looked at that finding again (:func:`retested`); nor has one
  whose finding is a change since the previous reading and that had none (a row :data:`FIRST_READING`);
- optionally ``job_view``: the check describes what a job sees (its environment, NCCL and CUDA), so with
  ``probes.command_prefix`` set (``docker exec trainer``) it runs behind the prefix, as the probes do;
  ``environment``: it judges a job's settings, not the hardware, so its findings do not stop the node from
  being measured;
- optionally ``causes``: the findings of other checks that can explain its own (:class:`Link`, cause first:
  a stopped Fabric Manager explains NVLink peers missing);
- ``expectations``: the keys of a profile its rows judge (:class:`~cluster_accept.checks.declarations.Expectation`),
  so that a node it left without a row is rejected, not passed;
- ``samples``: what its command prints on a healthy node, on a faulty one and with its tool missing or dead,
  each with the reasons its rows must carry (:class:`~cluster_accept.checks.samples.Sample`): the tests judge
  them, the fuzzing starts from them, the scale simulator answers from the healthy one.

``Check`` is generic in the model ``parse`` returns, so the type checker holds ``evaluate`` and the optional
callables to the model ``parse`` makes.

Adding a check is adding a module: :func:`discover` finds it by walking the package, there is no list to
edit (ClusterShell finds its workers the same way).
"""

from __future__ import annotations

import importlib
import math
import pkgutil
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from cluster_accept.checks.declarations import Expectation, Link
from cluster_accept.checks.reasons import Reason
from cluster_accept.checks.samples import Sample, missing_kinds
from cluster_accept.inventory.model import Profile
from cluster_accept.vocabulary.rows import CheckRow as CheckRow
from cluster_accept.vocabulary.rows import NodeRow as NodeRow
from cluster_accept.vocabulary.status import BAD_STATUSES as BAD_STATUSES
from cluster_accept.vocabulary.status import Status as Status
from cluster_accept.vocabulary.text import keep_head, quote

# An unreadable output row keeps this much of its message and the raw text, with a note where it was cut.
ERROR_DETAIL_CHARS = 4000
# The reason of a row that passes only because an earlier reading of the node judged what it shows.
SEEN_BEFORE = "seen_before"
# The reason of a row saying a finding that rests on a comparison with an earlier reading (a counter's growth) had
# none to compare with: the node's first reading, or its marks missing or replaced.
FIRST_READING = "first_reading"
# The reason of a row saying the check took an answer kept from an earlier check instead of asking again.
KEPT_ANSWER = "kept_answer"
# Rows of these reasons say their check did not look at its findings again this time (:func:`retested`).
NOT_RETESTED = frozenset({SEEN_BEFORE, FIRST_READING, KEPT_ANSWER})
_MARK_SHOWN_CHARS = 40  # an impossible mark is quoted this far in its row


@dataclass(frozen=True)
class ClusterView:
    """What the rest of the cluster looks like: the majority value of every compared key."""

    majority: Mapping[str, str]
    nodes_compared: int

    def majority_of(self, key: str) -> str | None:
        return self.majority.get(key)


def majority_values(per_node: Mapping[str, Mapping[str, str]]) -> ClusterView:
    """Majority of each key over the nodes that report it; a tie has no majority (no drift verdict)."""
    counts: dict[str, Counter[str]] = {}
    for values in per_node.values():
        for key, value in values.items():
            counts.setdefault(key, Counter())[value] += 1
    majority: dict[str, str] = {}
    for key, counter in counts.items():
        winner = plurality(counter)
        if winner is not None:
            majority[key] = winner
    return ClusterView(majority=majority, nodes_compared=len(per_node))


def plurality(counter: Counter[str]) -> str | None:
    """The most common value; None when the two most common tie, or there is none."""
    ranked = counter.most_common(2)
    if ranked and (len(ranked) == 1 or ranked[0][1] > ranked[1][1]):
        return ranked[0][0]
    return None


ModelT = TypeVar("ModelT")
# ``profile suggest``: a node's parsed outputs by check name, and the profile keys one check reads off them.
NodeModels = Mapping[str, Any]
SuggestedValues = dict[str, "str | None"]
NOT_FOUND = "<not found>"  # a value a check looked for on the node and did not find


def readable(model: object) -> bool:
    """A parsed output a check could read (not missing, no ``failure`` or ``error`` of its own)."""
    return model is not None and not getattr(model, "failure", None) and not getattr(model, "error", None)


def one_value(values: Iterable[object]) -> str | None:
    """A node's one value as text; GPUs of the node that differ give ``mixed a/b`` (never a valid value)."""
    found = sorted({str(v) for v in values if v is not None})
    if not found:
        return None
    return found[0] if len(found) == 1 else "mixed " + "/".join(found)


@dataclass(frozen=True, eq=False)  # one object per check: compared and hashed by identity
class Check(Generic[ModelT]):
    """A check, declared once in its module as ``CHECK = Check(...)``: what it runs, how its output is read and
    judged, its reasons, and what it answers of a profile."""

    name: str
    command: str  # the shell snippet run on the node (the shape only, where ``command_for`` gives it per profile)
    parse: Callable[[str, int | None], ModelT]
    evaluate: Callable[[ModelT, Profile, ClusterView], list[CheckRow]]
    reasons: Mapping[str, Reason]
    cluster_values: Callable[[ModelT], dict[str, str]] | None = None
    counters: Callable[[ModelT], dict[str, int]] | None = None
    # Where this reading ended, kept for the node's next run; and the model as of what is new since those marks.
    marks: Callable[[ModelT], dict[str, str]] | None = None
    since: Callable[[ModelT, Mapping[str, str]], ModelT] | None = None
    timeout_s: float | None = None
    job_view: bool = False  # describes a job's environment: runs behind the profile's probes.command_prefix
    command_for: Callable[[Profile], str] | None = None
    expectations: tuple[Expectation, ...] = ()  # the profile's keys its rows judge (no silent pass)
    causes: tuple[Link, ...] = ()  # findings of other checks that explain its own (cause first)
    # Judges the environment a job runs in (a setting a fix-config repairs), not the hardware: a finding of it
    # does not stop the node from being measured, so the report shows what the setting costs.
    environment: bool = False
    # What its command prints on a healthy node, a faulty one and with its tool missing or dead (its reasons).
    samples: tuple[Sample, ...] = ()
    # The profile keys ``profile suggest`` reads off a node's parsed output (the node's other checks' outputs by
    # name beside it): a check declaring it is read by ``profile suggest``, with no list to edit.
    suggest: Callable[[ModelT, NodeModels], SuggestedValues] | None = None
    # Its own profile keys, given under ``plugins: {name: {...}}`` and checked against this model when the
    # inventory loads (:func:`own_settings` reads them): a new check's keys need no edit of the profile's model.
    settings: type[BaseModel] | None = None

    def __post_init__(self) -> None:
        wrong = [code for code, reason in self.reasons.items() if not isinstance(reason, Reason) or reason.code != code]
        if wrong:
            raise TypeError(f"check {self.name}: REASONS entries {wrong} are not Reasons under their code")
        strays = [e.name for e in self.expectations if e.check != self.name]
        if strays:
            raise TypeError(f"check {self.name}: expectations {strays} are judged by another check's rows")

    @property
    def module(self) -> ModuleType:
        """The module that declares this check (its constants, for tests and fixtures)."""
        return sys.modules[self.parse.__module__]

    def command_on(self, profile: Profile | None) -> str:
        """What this check runs on a node of ``profile`` (its generic ``COMMAND`` without one)."""
        return self.command_for(profile) if self.command_for is not None and profile is not None else self.command


SettingsT = TypeVar("SettingsT", bound=BaseModel)


def own_settings(name: str, model: type[SettingsT], profile: Profile) -> SettingsT:
    """Plug-in ``name``'s settings for a node of ``profile`` (a check's or a probe's): its ``plugins: {name: …}``
    keys read by its ``model`` (the defaults where the profile gives none); checked when the inventory loads, so
    valid here."""
    return model.model_validate(profile.plugins.get(name, {}))


NOT_CHECKS = frozenset({"base", "contract", "reasons", "sections", "declarations", "samples"})


def discover(package: str = "cluster_accept.checks") -> list[Check[Any]]:
    """Every check in ``package`` (each module's ``CHECK``), sorted by name; a module of the package that
    declares no ``CHECK``, or a check without its samples (healthy, a fault, its tool dead), raises
    :class:`TypeError` naming it."""
    root = importlib.import_module(package)
    found: list[Check[Any]] = []
    for info in pkgutil.iter_modules(root.__path__):
        if info.name.startswith("_") or info.name in NOT_CHECKS:
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        check = getattr(module, "CHECK", None)
        if not isinstance(check, Check):
            raise TypeError(
                f"check module {module.__name__} declares no CHECK: end it with CHECK = Check(name=…, command=…, "
                "parse=…, evaluate=…, reasons=REASONS) (cluster_accept.checks.base)"
            )
        lacking = missing_kinds(check.samples)
        if lacking:
            raise TypeError(
                f"check {check.name} ({module.__name__}) declares no {', '.join(lacking)} sample: give it "
                "samples=(healthy(…), fault(…), dead(…)) (cluster_accept.checks.samples)"
            )
        found.append(check)
    return sorted(found, key=lambda c: c.name)


def error_row(check: str, reason: str, detail: str, raw: str = "") -> CheckRow:
    """A row for output we could not understand: status ``error``, the raw text kept as evidence, cut (masked
    where it entered the controller, so that no secret is cut in two)."""
    detail = keep_head(detail + "\n" + raw, ERROR_DETAIL_CHARS)
    return CheckRow(check=check, item="output", status=Status.ERROR, reason=reason, detail=detail)


@dataclass(frozen=True)
class MarkRead:
    """A time the node's previous reading kept as a mark: its ``value`` where it can be used, else ``problem``
    (why it cannot: impossible, from the future), never both; neither when no mark was kept."""

    value: float | None = None
    problem: str | None = None


def read_mark(previous: Mapping[str, str], key: str, now: float | None) -> MarkRead:
    """The mark ``key`` of ``previous``, checked against ``now``, this reading's time on the same clock (the
    uptime, the node's epoch): a mark that is no number, not finite, negative or after ``now`` is impossible,
    and so is any mark when ``now`` is unknown (it cannot be checked). A mark is kept by the node or the history,
    and either can be wrong or edited: what cannot be checked is named, never trusted."""
    text = previous.get(key)
    if text is None:
        return MarkRead()
    shown = quote(text[:_MARK_SHOWN_CHARS] + ("..." if len(text) > _MARK_SHOWN_CHARS else ""))
    try:
        value = float(text)
    except ValueError:
        return MarkRead(problem=f"{key}={shown} is not a number")
    if not math.isfinite(value) or value < 0:
        return MarkRead(problem=f"{key}={shown} is impossible")
    if now is None or not math.isfinite(now):
        return MarkRead(problem=f"{key}={shown} cannot be checked: this reading has no {key} of its own")
    if value > now:
        return MarkRead(problem=f"{key}={shown} is after this reading ({now:.3f}): from the future")
    return MarkRead(value)


def retested(rows: Iterable[CheckRow | NodeRow]) -> set[str]:
    """The checks whose rows looked at their findings again. A check with a row of :data:`NOT_RETESTED` did not:
    it passed an event only because an earlier reading judged it (:data:`SEEN_BEFORE`), it had no earlier reading
    to compare with where its finding is a change since one (:data:`FIRST_READING`: a flap is a ``link_downed``
    that grew), or it took an answer kept from an earlier check (:data:`KEPT_ANSWER`). Whether the node was
    repaired since is then not known, so a drain for that check's findings is not lifted on its word (a later
    check that looks again, or a person, lifts it)."""
    rows = list(rows)
    stale = {row.check for row in rows if row.reason in NOT_RETESTED}
    return {row.check for row in rows} - stale
