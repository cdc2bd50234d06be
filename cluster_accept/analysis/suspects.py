"""Settings in effect for a slow run, named as suspects and proved or cleared by measuring again without them.

A list of known-harmful settings (:mod:`checks.nccl_harmful`) finds what someone thought of; a tuning leftover
nobody listed (an instruction-set cap for oneDNN, a channel count for NCCL) only shows as a slow figure. So every
setting a probe's job ran with (the node-side ``job_settings.py`` prints them with where each is set) that is
neither the library's default, nor what the profile pins, nor one the tool sets for its own runs, is a
*suspect* for a figure that failed on that node. The stage measures the failing figures again, arm by arm, with
some suspects reverted (:mod:`tasks.prove_causes` inside a node, :mod:`tasks.multi_node.prove` between nodes);
the search is :mod:`analysis.minimal_cause`'s and its rows :mod:`analysis.proof`'s. This module names the suspects,
reads the settings a run said it had, and judges whether a figure measured again came back (:func:`recovered`);
without a second measurement (proving is off, or no floor to prove a slow figure against) they stay **suspects**.

Pure functions over typed rows; the frame of figures is the stage's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from cluster_accept.analysis import nccl_mechanism
from cluster_accept.checks.base import CheckRow, NodeRow, Status
from cluster_accept.checks.declarations import Link
from cluster_accept.checks.reasons import Action, FindingKind, Reason, declare
from cluster_accept.inventory.model import Profile
from cluster_accept.vocabulary.text import SETTINGS_LINE_START

NAME = "job_settings"
ENV_SOURCE = "env"
NCCL_LOG = "NCCL's log (set by environment)"  # where a setting only NCCL's own account named was set
# What NCCL does when the key is unset (its documented defaults): such a value changes nothing.
LIBRARY_DEFAULTS = {"NCCL_P2P_DISABLE": "0", "NCCL_SHM_DISABLE": "0", "NCCL_IB_DISABLE": "0"}
# How a key NCCL reads from a config file is neutralised for the second run (the environment's value wins over the
# file's): empty for most, NCCL's integer and level parameters taking it as unset; "^" (exclude nothing) for the
# lists, since an empty NCCL_ALGO/NCCL_PROTO disables every algorithm/protocol in NCCL <= 2.23.
NEUTRAL = {"NCCL_ALGO": "^", "NCCL_PROTO": "^"}
# Keys NCCL reads from a file that no value neutralises (an empty NCCL_NET loads no network at all): never removed.
NOT_NEUTRALISED = frozenset({"NCCL_NET"})
# A variable's name as a shell may set it: anything else (``NCCL_X = 1``, ``export NCCL_X``) is no setting.
VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What an image or a login sets to describe itself, read by no library at run time: never a suspect (and any
# ``*_VERSION``: CUBLAS_VERSION, CUDA_DRIVER_VERSION, NCCL_VERSION …).
DESCRIPTIVE = frozenset({"CUDA_HOME", "CUDA_PATH", "TORCH_CUDA_ARCH_LIST", "NVIDIA_REQUIRE_CUDA"})


def descriptive(key: str) -> bool:
    return key in DESCRIPTIVE or key.endswith("_VERSION")


# Figures' findings a setting can explain: far below a minimum, the node's peers or its own history, a training
# efficiency (data-parallel, scaling), a rank slower than the others.
FIGURE_FAILURES = frozenset(
    {"below_threshold", "straggler", "efficiency_low", "dp_efficiency_low", "regression", "slow_rank"}
)
REASONS = declare(
    Reason(
        "confirmed",
        Status.FAIL,
        "a setting that differs from the node's known-good reference slows a figure by itself, proved arm by arm: "
        "kept alone in effect the figure stayed low, reverted (with any other culprit) it recovered (the arms' "
        "numbers in the detail): unset it where it is set, or set it back to the reference's value",
        Action.FIX_CONFIG,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "confirmed_together",
        Status.FAIL,
        "settings that slow a figure only together, proved arm by arm: each kept alone is harmless, kept together "
        "the figure stays low, reverting either restores it: change one of them where it is set",
        Action.FIX_CONFIG,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "unresolved",
        Status.WARN,
        "the search for the smallest set of settings that explains a slow figure stopped before it was proved "
        "(its bound of re-measurements reached, or an arm that did not run as asked): the detail names what is "
        "still in question; revert those one at a time and measure again",
        Action.FIX_CONFIG,
        kind=FindingKind.RELATIVE,
    ),
    Reason(
        "cleared",
        Status.PASS,
        "measured again without this setting, the figure stayed as low: the setting is not the cause; the "
        "figure's own row says what to inspect",
    ),
    Reason(
        "suspect",
        Status.WARN,
        "a setting in effect for the job while a figure failed, not measured again without it (see the detail): "
        "unset it and measure again to tell whether it is the cause",
        Action.FIX_CONFIG,
        kind=FindingKind.RELATIVE,
    ),
)


@dataclass(frozen=True)
class JobSetting:
    """One setting a probe's job ran with: ``source`` is ``env`` or the config file that set it; ``also``: a
    config file that sets it too (the environment won)."""

    key: str
    value: str
    source: str
    also: str = ""

    @property
    def where(self) -> str:
        where = "in the job environment" if self.source == ENV_SOURCE else f"in {self.source}"
        return f"{where} and {self.also}" if self.also else where

    @property
    def said(self) -> str:
        return f"{self.key}={self.value}"

    def removal(self) -> str | None:
        """How the run goes without it: unset (None), or, for a key only a config file sets, or an NCCL key a file
        sets too (NCCL reads its files at its start and never overwrites a key the environment has), set to its
        neutral value (:data:`NEUTRAL`, else empty). Another library's key the environment sets is unset: that
        library read it at its own start, before NCCL's files."""
        nccl_reads = self.source != ENV_SOURCE or (bool(self.also) and self.key.startswith("NCCL_"))
        return NEUTRAL.get(self.key, "") if nccl_reads else None

    @property
    def removable(self) -> bool:
        """Whether a second run can go without it: a shell variable's name, and not a key NCCL reads from a file
        with no neutral value."""
        in_file = self.source != ENV_SOURCE or bool(self.also)
        return VARIABLE.fullmatch(self.key) is not None and not (in_file and self.key in NOT_NEUTRALISED)


def read_settings(text: str) -> list[JobSetting]:
    """The settings ``job_settings.py`` printed, one line each (on the run's stderr); a line masked or cut on its
    way is left out, the others kept."""
    found = []
    for line in text.splitlines():
        if not line.startswith(SETTINGS_LINE_START):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        entry = record.get("setting") if isinstance(record, dict) else None
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            found.append(_setting(entry))
    return found


def _setting(entry: Mapping[str, object]) -> JobSetting:
    return JobSetting(str(entry["name"]), str(entry.get("value", "")), str(entry.get("source", ENV_SOURCE)),
                      str(entry.get("also", "")))  # fmt: skip


def suspects(
    settings: Iterable[JobSetting],
    profile: Profile,
    tool_keys: frozenset[str],
    healthy: Iterable[Iterable[JobSetting]] = (),
) -> list[JobSetting]:
    """The settings that can have made the run slow: not the tool's own, not pinned by the profile to the value
    in effect nor kept by it (``probes.kept_settings``), not the library's default, not descriptive, and not one
    a node whose same figures passed ran with too (``healthy``: those nodes' settings); never a masked value
    (it cannot be set back)."""
    exonerated = {(s.key, s.value) for node in healthy for s in node}
    return [
        s
        for s in settings
        if (s.key, s.value) not in exonerated and s.removable and suspicious(s.key, s.value, profile, tool_keys)
    ]


def suspicious(key: str, value: str | None, profile: Profile, tool_keys: frozenset[str]) -> bool:
    """Whether ``key`` at ``value`` (None: unset) can be what slowed a run: not the tool's own key nor one the
    profile keeps, not descriptive, not pinned by the profile to that value, not a masked value, not the
    library's default, not the GPU partition the profile sets."""
    if key in tool_keys | frozenset(profile.probes.kept_settings) or descriptive(key):
        return False
    if value is not None and (profile.nccl_env.get(key) == value or masked(value)):
        return False
    if value is not None and LIBRARY_DEFAULTS.get(key) == value.strip():
        return False
    return not (key == "CUDA_VISIBLE_DEVICES" and profile.probes.cuda_visible_devices is not None)


def masked(value: str) -> bool:
    """A value hidden before it reached the controller (``****``, ``***``): it cannot be set back or shown."""
    return len(value) >= 3 and set(value) == {"*"}


def failing_figures(rows: Sequence[NodeRow], metrics: Iterable[str]) -> dict[str, list[NodeRow]]:
    """By node: the rows of figures (``metrics``, or their ``_vs_cluster`` comparison) that failed."""
    known = frozenset(metrics)
    found: dict[str, list[NodeRow]] = {}
    for row in rows:
        if row.status == Status.FAIL and row.reason in FIGURE_FAILURES and figure_of(row) in known:
            found.setdefault(row.node, []).append(row)
    return found


def figure_of(row: NodeRow) -> str:
    """The metric a row judges: its item, less the comparison it makes (``_vs_cluster``, ``_vs_history``)."""
    return row.item.removesuffix("_vs_cluster").removesuffix("_vs_history")


# Between nodes, the all-reduce's failing rows: what a second all-reduce without the suspects proves
# (:mod:`tasks.multi_node.prove`): slow (a node isolation pulled, nodes slow together), or not completing at all
# (a setting ranks must agree on, set on one node only, fails the run: NCCL_MAX_NCHANNELS on one of two nodes
# ends in "Message truncated").
BETWEEN_NODES_FAILURES = frozenset(
    {
        ("isolation", "slow_node"),
        ("scaling", "below_floor_together"),
        ("allreduce", "below_threshold"),
        ("allreduce", "collective_failed"),
        ("allreduce", "collective_timeout"),
    }
)
BETWEEN_NODES_SYMPTOMS = frozenset(check for check, _ in BETWEEN_NODES_FAILURES)


def causes(symptoms: frozenset[str], stage: str) -> tuple[Link, ...]:
    """A confirmed setting explains the figures of ``symptoms`` (checks) it slowed; a suspect, until cleared."""
    return (
        Link(NAME, symptoms, stage, frozenset({"confirmed", "confirmed_together"})),
        Link(NAME, symptoms, stage, frozenset({"unresolved", "suspect"})),
    )


# The probes whose figures come from NCCL's runs: what NCCL's own account can explain.
NCCL_SYMPTOMS = frozenset({"allreduce", "collectives", "training"})


def probe_stage_causes(checks: frozenset[str], stage: str) -> tuple[Link, ...]:
    """What a probe stage declares before its probes' own links: the mechanism NCCL's log shows (fewer channels,
    another protocol) explains the collectives' figures, and a setting in effect, confirmed by measuring again or
    still a suspect, explains both. The mechanism is listed first: a verdict's sentence reads "figure: mechanism
    because setting"."""
    return (Link(nccl_mechanism.NAME, checks & NCCL_SYMPTOMS, stage),) + causes(checks | {nccl_mechanism.NAME}, stage)


def recovered(before: float | None, again: float, margin_pct: float) -> bool:
    """Whether a figure measured again without the suspects came back for real: beyond ``margin_pct`` over what it
    was (a node just under its floor passing the second time is noise, not a cause)."""
    return before is None or again >= before * (1 + margin_pct / 100)


def stated_minimum(expected: str | None) -> float | None:
    """The minimum a row's expected column states (``>= 0.80 of …``, ``>= 287.0 GB/s``); None without one."""
    match = re.match(r">=\s*([0-9][0-9,]*\.?[0-9]*)", (expected or "").strip())
    return float(match.group(1).replace(",", "")) if match else None


def figure_value(text: str | None) -> float | None:
    """A row's figure as a number (``24.3``, ``3.64 GB/s``); None when it holds none."""
    try:
        return float((text or "").split()[0].replace(",", ""))
    except (ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Retest:
    """One failing figure row and what it measured without the suspects (None: no figure came back)."""

    row: NodeRow
    again: str | None  # the figure measured again, as the row writes a figure
    recovered: bool


def retest_said(retests: Sequence[Retest]) -> str:
    """Each figure measured again, in words: ``gemm_fp32_gflops 12.1 -> 60.3``."""
    return "; ".join(f"{_named(r.row)} {r.row.observed} -> {r.again or 'no figure'}" for r in retests)


def _named(row: NodeRow) -> str:
    return figure_of(row) + ("" if row.gpu is None else f" gpu {row.gpu}")


def unproved_rows(suspected: Sequence[JobSetting], why: str) -> list[CheckRow]:
    """The suspects named without a second measurement (``why``: proving is off, or not possible)."""
    return [CheckRow(NAME, s.key, Status.WARN, "suspect", s.said, "unset", f"set {s.where}; {why}") for s in suspected]
