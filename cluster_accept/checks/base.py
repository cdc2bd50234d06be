"""What every check shares: the closed status enum, the row a check produces, and check discovery.

A check is one module in ``checks/`` that defines:

- ``NAME``: the check's name as it appears in rows and verdict reasons (``driver``, ``gpu_count``…);
- ``COMMAND``: the shell snippet it runs on the node (one per check; all of a node's checks travel in one
  batch over one SSH session);
- ``parse(stdout: str, exit_code: int | None) -> model``: pure, never raises; malformed output becomes a
  model whose ``error`` says so, with the raw text kept;
- ``evaluate(model, profile, cluster) -> list[CheckRow]``: pure; judges the node against its profile and
  against the cluster's majority (:class:`ClusterView`);
- optionally ``cluster_values(model) -> dict[str, str]``: the values compared across nodes for drift;
- optionally ``counters(model) -> dict[str, int]``: error counters compared with the node's previous run
  (a counter that grew is flagged by scheduled checks);
- optionally ``command_for(profile) -> str``: the command for a node of that profile, where it depends on the
  profile (the probe interpreter's path); ``COMMAND`` is then only its shape;
- optionally ``JOB_VIEW = True``: the check describes what a job sees (its environment, NCCL and CUDA), so
  with ``probes.command_prefix`` set (``docker exec trainer``) it runs behind the prefix, as the probes do;
- ``REASONS``: every reason code its rows carry beyond the common ones, declared beside the code that emits
  them (:func:`cluster_accept.checks.reasons.declare`): what the code means, its severity, the action.

Adding a check is adding a module: :func:`discover` finds it by walking the package, there is no list to
edit (ClusterShell finds its workers the same way). A check module without ``REASONS`` is refused: the
report takes every explanation and action from the declarations.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType, ModuleType
from typing import Any

from cluster_accept.checks.reasons import Reason
from cluster_accept.inventory.model import Profile
from cluster_accept.vocabulary.secrets import masked_head
from cluster_accept.vocabulary.status import BAD_STATUSES as BAD_STATUSES
from cluster_accept.vocabulary.status import Status as Status

# An unreadable output row keeps this much of its message and the raw text, with a note where it was cut.
ERROR_DETAIL_CHARS = 4000


@dataclass(frozen=True)
class CheckRow:
    """One judged item: the measured value next to the expected one, and why it passed or not."""

    check: str
    item: str
    status: Status
    reason: str  # a stable code: 'ok', 'version_mismatch', 'count_low', 'nvidia_smi_failed', ...
    observed: str | None = None
    expected: str | None = None
    detail: str = ""
    gpu: int | None = None


@dataclass(frozen=True)
class NodeRow:
    """A judged row of one node in one run and stage, as ``checks.parquet`` holds it: typed from the stage
    that judged it to the Parquet edge (:meth:`record`), where it becomes a plain record once."""

    run_id: str
    cluster: str
    stage: str
    node: str
    check: str
    item: str
    status: Status
    reason: str
    observed: str | None = None
    expected: str | None = None
    detail: str = ""
    gpu: int | None = None
    raw_output: str = ""
    command: str = ""  # the node-side command whose output is the row's evidence (what reproduces it)

    @property
    def code(self) -> str:
        """``check:reason``, as verdicts list it."""
        return f"{self.check}:{self.reason}"

    def record(self) -> dict[str, Any]:
        """The Parquet row: the status as its value."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "status": self.status.value}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> NodeRow:
        """A row read back from ``checks.parquet`` (or any record of its columns); other keys are ignored."""
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in record.items() if key in known}
        return cls(**{**values, "status": Status(str(record["status"]))})


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


@dataclass(frozen=True)
class Check:
    """A discovered check module, typed."""

    name: str
    command: str
    timeout_s: float | None
    parse: Callable[[str, int | None], Any]
    evaluate: Callable[[Any, Profile, ClusterView], list[CheckRow]]
    cluster_values: Callable[[Any], dict[str, str]] | None
    module: ModuleType
    counters: Callable[[Any], dict[str, int]] | None = None
    job_view: bool = False  # describes a job's environment: runs behind the profile's probes.command_prefix
    reasons: Mapping[str, Reason] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    command_for: Callable[[Profile], str] | None = None

    def command_on(self, profile: Profile | None) -> str:
        """What this check runs on a node of ``profile`` (its generic ``COMMAND`` without one)."""
        return self.command_for(profile) if self.command_for is not None and profile is not None else self.command


def _declared_reasons(module: ModuleType) -> Mapping[str, Reason]:
    from cluster_accept.checks.reasons import Reason  # not at the top: checks.reasons imports this module

    reasons = getattr(module, "REASONS", None)
    if not isinstance(reasons, Mapping):
        raise TypeError(
            f"check module {module.__name__} declares no REASONS: add REASONS = declare(Reason(...), ...) "
            "with every reason code its rows carry (cluster_accept.checks.reasons)"
        )
    wrong = [code for code, reason in reasons.items() if not isinstance(reason, Reason) or reason.code != code]
    if wrong:
        raise TypeError(f"check module {module.__name__}: REASONS entries {wrong} are not Reasons under their code")
    return reasons


def _as_check(module: ModuleType) -> Check | None:
    name = getattr(module, "NAME", None)
    if not isinstance(name, str) or not all(hasattr(module, a) for a in ("COMMAND", "parse", "evaluate")):
        return None
    return Check(
        name=name,
        command=module.COMMAND,
        timeout_s=getattr(module, "TIMEOUT_S", None),
        parse=module.parse,
        evaluate=module.evaluate,
        cluster_values=getattr(module, "cluster_values", None),
        module=module,
        counters=getattr(module, "counters", None),
        job_view=bool(getattr(module, "JOB_VIEW", False)),
        reasons=_declared_reasons(module),
        command_for=getattr(module, "command_for", None),
    )


def discover(package: str = "cluster_accept.checks") -> list[Check]:
    """Every check module in ``package``, sorted by name; a check module without ``REASONS`` raises
    :class:`TypeError` naming it."""
    root = importlib.import_module(package)
    found: list[Check] = []
    for info in pkgutil.iter_modules(root.__path__):
        if info.name.startswith("_") or info.name in {"base", "reasons", "sections"}:
            continue
        check = _as_check(importlib.import_module(f"{package}.{info.name}"))
        if check is not None:
            found.append(check)
    return sorted(found, key=lambda c: c.name)


def error_row(check: str, reason: str, detail: str, raw: str = "") -> CheckRow:
    """A row for output we could not understand: status ``error``, the raw text kept as evidence (masked before
    it is cut, so that no secret is cut in two)."""
    detail = masked_head(detail + "\n" + raw, ERROR_DETAIL_CHARS)
    return CheckRow(check=check, item="output", status=Status.ERROR, reason=reason, detail=detail)
