"""Settings in effect for a slow run, named as suspects and proved or cleared by measuring again without them.

A list of known-harmful settings (:mod:`checks.nccl_harmful`) finds what someone thought of; a tuning leftover
nobody listed (an instruction-set cap for oneDNN, a channel count for NCCL) only shows as a slow figure. So every
setting a probe's job ran with (the node-side ``job_settings.py`` prints them with where each is set) that is
neither the library's default, nor what the profile pins, nor one the tool sets for its own runs, is a
*suspect* for a figure that failed on that node. The stage measures the failing figures once more with the
suspects removed (:mod:`tasks.prove_causes`); this module judges that second measurement:

- the figures recover: the suspects are the **confirmed** cause, named with where they are set and both
  numbers, and the action is to fix that setting, not the hardware;
- they stay low: the suspects are **cleared** (the row says so) and the figure's own reason points at the
  hardware path;
- no second figure (the run failed, or proving is off): they stay **suspects**, named as such.

Pure functions over typed rows; the frame of figures is the stage's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from cluster_accept.analysis import nccl_mechanism
from cluster_accept.checks.base import CheckRow, NodeRow, Status
from cluster_accept.checks.declarations import Link
from cluster_accept.checks.reasons import Action, Reason, declare
from cluster_accept.inventory.model import Profile

NAME = "job_settings"
ENV_SOURCE = "env"
# What NCCL does when the key is unset (its documented defaults): such a value changes nothing.
LIBRARY_DEFAULTS = {
    "NCCL_P2P_DISABLE": "0",
    "NCCL_SHM_DISABLE": "0",
    "NCCL_IB_DISABLE": "0",
    "NCCL_NET_GDR_LEVEL": "",
    "NCCL_ALGO": "",
    "NCCL_PROTO": "",
}
# What an image or a login sets to describe itself, read by no library at run time: never a suspect.
DESCRIPTIVE = frozenset(
    {"CUDA_HOME", "CUDA_PATH", "CUDA_VERSION", "NCCL_VERSION", "CUDNN_VERSION", "TORCH_CUDA_ARCH_LIST"}
)
# Figures' findings a setting can explain: far below a minimum, or far below the node's peers.
FIGURE_FAILURES = frozenset({"below_threshold", "straggler", "efficiency_low"})
REASONS = declare(
    Reason(
        "confirmed",
        Status.FAIL,
        "a setting in effect for the job slowed a figure: measured again without it, the figure recovered (both "
        "numbers in the detail): unset it where it is set, or set it right for this node",
        Action.FIX_CONFIG,
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
        """How the run goes without it: unset (None), or, for an NCCL key a config file sets, set empty (NCCL
        reads empty as unset, and its files never overwrite a key the environment has)."""
        in_file = self.source != ENV_SOURCE or bool(self.also)
        return "" if in_file and self.key.startswith("NCCL_") else None


def read_settings(text: str) -> list[JobSetting]:
    """The settings line ``job_settings.py`` printed (on the run's stderr); none when absent or unreadable."""
    for line in text.splitlines():
        if '"info": "settings"' not in line:
            continue
        try:
            record = json.loads(line[line.index("{") :])
        except ValueError:
            continue
        entries = record.get("settings") if isinstance(record, dict) else None
        if isinstance(entries, list):
            return [_setting(e) for e in entries if isinstance(e, dict) and isinstance(e.get("name"), str)]
    return []


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
    pinned, kept = profile.nccl_env, frozenset(profile.probes.kept_settings)
    exonerated = {(s.key, s.value) for node in healthy for s in node}
    found = []
    for setting in settings:
        if setting.key in tool_keys | kept | DESCRIPTIVE or (setting.key, setting.value) in exonerated:
            continue
        if pinned.get(setting.key) == setting.value or _masked(setting.value):
            continue
        if LIBRARY_DEFAULTS.get(setting.key) == setting.value.strip():
            continue
        if setting.key == "CUDA_VISIBLE_DEVICES" and profile.probes.cuda_visible_devices is not None:
            continue
        found.append(setting)
    return found


def _masked(value: str) -> bool:
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
    return row.item.removesuffix("_vs_cluster")


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
        Link(NAME, symptoms, stage, frozenset({"confirmed"})),
        Link(NAME, symptoms, stage, frozenset({"suspect"})),
    )


# The probes whose figures come from NCCL's runs: what NCCL's own account can explain.
NCCL_SYMPTOMS = frozenset({"allreduce", "collectives", "training"})


def probe_stage_causes(checks: frozenset[str], stage: str) -> tuple[Link, ...]:
    """What a probe stage declares before its probes' own links: the mechanism NCCL's log shows (fewer channels,
    another protocol) explains the collectives' figures, and a setting in effect, confirmed by measuring again or
    still a suspect, explains both. The mechanism is listed first: a verdict's sentence reads "figure: mechanism
    because setting"."""
    return (Link(nccl_mechanism.NAME, checks & NCCL_SYMPTOMS, stage),) + causes(checks | {nccl_mechanism.NAME}, stage)


@dataclass(frozen=True)
class Retest:
    """One failing figure row and what it measured without the suspects (None: no figure came back)."""

    row: NodeRow
    again: str | None  # the figure measured again, as the row writes a figure
    recovered: bool


def _figures(retests: Sequence[Retest], recovered: bool) -> str:
    return "; ".join(
        f"{_named(r.row)} {r.row.observed} -> {r.again}" for r in retests if r.recovered is recovered and r.again
    )


def _named(row: NodeRow) -> str:
    return figure_of(row) + ("" if row.gpu is None else f" gpu {row.gpu}")


def proof_rows(suspected: Sequence[JobSetting], retests: Sequence[Retest]) -> list[CheckRow]:
    """A row per suspect: confirmed when a failing figure recovered without the suspects, cleared when every
    one came back as low, suspect when none came back. Several suspects are removed together: each row names
    the others (one or more of them is the cause)."""
    rows = []
    back = [r for r in retests if r.again is not None]
    for setting in suspected:
        others = [s.said for s in suspected if s is not setting]
        together = f" (removed together with {', '.join(others)})" if others else ""
        where = f"set {setting.where}{together}"
        if not back:
            said = f"{where}; measured again without it: no figure came back"
            rows.append(CheckRow(NAME, setting.key, Status.WARN, "suspect", setting.said, "unset", said))
        elif any(r.recovered for r in back):
            stayed = _figures(back, False)
            said = f"{where}; measured again without it: {_figures(back, True)}: confirmed"
            said += f"; still low: {stayed}" if stayed else ""
            rows.append(CheckRow(NAME, setting.key, Status.FAIL, "confirmed", setting.said, "unset", said))
        else:
            said = f"{where}; measured again without it: {_figures(back, False)}: still low, not the cause"
            rows.append(CheckRow(NAME, setting.key, Status.PASS, "cleared", setting.said, "unset", said))
    return rows


def unproved_rows(suspected: Sequence[JobSetting], why: str) -> list[CheckRow]:
    """The suspects named without a second measurement (``why``: proving is off, or not possible)."""
    return [CheckRow(NAME, s.key, Status.WARN, "suspect", s.said, "unset", f"set {s.where}; {why}") for s in suspected]


def retest_note(retest: Retest, suspected: Sequence[JobSetting]) -> str:
    """What a failing figure's row adds: the figure without the suspects, and what that proves."""
    names = ", ".join(f"{s.said} ({s.where.removeprefix('in ')})" for s in suspected)
    if retest.again is None:
        return f"measured again without {names}: no figure"
    verdict = "recovered: the setting is the cause" if retest.recovered else "still low: not the setting"
    return f"measured again without {names}: {retest.again}, {verdict}"
