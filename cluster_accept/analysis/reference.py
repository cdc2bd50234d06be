"""What a slow run changed against a known-good reference: the suspects of a failing figure. Pure.

Every setting a failing run had that is not the library's default is not a suspect: a container sets tens of
them, and most were in effect, too, when the same node passed. The suspects are the *difference* between the
failing run's settings and a reference that is known good, chosen in this order:

1. the node's own last accepted run, from the history's ``settings`` table (what it ran with when it passed);
2. a node of this run, of the same profile, whose same figures passed: the one that differs least;
3. the libraries' defaults (nothing set).

A difference is a key added (set now, not in the reference), changed (another value), or removed (set in the
reference, not now); an arm reverts it to the reference: unset (or neutral, where an NCCL file sets it), or set
to the reference's value. What can never be a suspect (the tool's own keys, those the profile pins or keeps,
descriptive ones, masked values, the library's defaults) is left out by :func:`analysis.suspects.suspects`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from cluster_accept.analysis.suspects import VARIABLE, JobSetting, masked, suspicious
from cluster_accept.inventory.model import Profile

DEFAULTS = "the libraries' defaults (no reference run: nothing set)"


@dataclass(frozen=True)
class Reference:
    """A known-good set of settings and what it is, in words (``its last accepted run 2026…``)."""

    settings: tuple[JobSetting, ...]
    said: str


@dataclass(frozen=True)
class Change:
    """One difference against the reference: ``now`` in effect in the failing run (None: the reference had the
    key and this run does not), ``was`` the reference's (None: the key is new)."""

    key: str
    now: JobSetting | None
    was: JobSetting | None

    def revert(self) -> str | None:
        """How an arm goes back to the reference: the reference's value set in the environment (which wins over
        NCCL's files), or the key removed (unset, or neutral where a file sets it: :meth:`JobSetting.removal`)."""
        if self.was is not None:
            return self.was.value
        assert self.now is not None
        return self.now.removal()

    @property
    def said(self) -> str:
        """``K=V`` (``K unset`` where the reference set it and this run did not), with the reference's value."""
        now = self.now.said if self.now is not None else f"{self.key} unset"
        was = "unset" if self.was is None else repr(self.was.value)
        return f"{now} (reference: {was})"

    @property
    def short(self) -> str:
        """``K=V``, or ``K unset``."""
        return self.now.said if self.now is not None else f"{self.key} unset"

    @property
    def where(self) -> str:
        if self.now is not None:
            return f"set {self.now.where}"
        assert self.was is not None
        return f"no longer set (the reference had it {self.was.where})"

    def fix(self) -> str:
        """What to do where it is set: unset it, or set it back to the reference's value."""
        if self.was is None:
            return "unset"
        return f"{self.key}={self.was.value}"


def difference(now: Sequence[JobSetting], reference: Iterable[JobSetting]) -> list[Change]:
    """The keys whose value differs between ``now`` and ``reference``, in ``now``'s order then the reference's
    keys gone since."""
    was = {s.key: s for s in reference}
    found = [Change(s.key, s, was.get(s.key)) for s in now if s.key not in was or was[s.key].value != s.value]
    present = {s.key for s in now}
    return found + [Change(k, None, s) for k, s in was.items() if k not in present]


def changeable(change: Change) -> bool:
    """Whether an arm can revert ``change``: a value it can set back (never a masked one), a key it can name."""
    values = [s.value for s in (change.now, change.was) if s is not None]
    if any(masked(v) for v in values):
        return False
    if change.now is not None:
        return change.now.removable
    return VARIABLE.fullmatch(change.key) is not None


def closest(now: Sequence[JobSetting], peers: Mapping[str, Sequence[JobSetting]]) -> Reference | None:
    """The peer (by name) whose settings differ least from ``now``; None without peers."""
    if not peers:
        return None
    name = min(sorted(peers), key=lambda n: len(difference(now, peers[n])))
    return Reference(tuple(peers[name]), f"{name}, whose same figures passed in this run")


def suspected(
    changes: Sequence[Change], profile: Profile, tool_keys: frozenset[str], healthy: Iterable[Iterable[JobSetting]]
) -> list[Change]:
    """The changes that can have slowed the run: an arm can revert them, the value in effect is one that can
    matter (:func:`analysis.suspects.suspicious`), and no node whose same figures passed ran with it
    (``healthy``); a key gone since the reference, only where the reference's value was not the default."""
    exonerated = {(s.key, s.value) for node in healthy for s in node}
    found = []
    for change in changes:
        value = change.now.value if change.now is not None else None
        if not changeable(change) or not suspicious(change.key, value, profile, tool_keys):
            continue
        if value is not None and (change.key, value) in exonerated:
            continue
        if (
            change.now is None
            and change.was is not None
            and not suspicious(change.key, change.was.value, profile, tool_keys)
        ):
            continue
        found.append(change)
    return found


def shared_changes(now: Mapping[str, Mapping[str, str]], reference: Mapping[str, Mapping[str, str]]) -> list[str]:
    """The setting changes (``K: was -> now``) at least half the nodes of ``now`` (node -> settings) share against
    their own ``reference``: what changed for the cluster between the runs, where most nodes moved together."""
    counts: dict[str, int] = {}
    for node, mine in now.items():
        was = reference.get(node)
        if was is None:
            continue
        for key in sorted(set(mine) | set(was)):
            if mine.get(key) != was.get(key):
                said = f"{key}: {was.get(key, 'unset')} -> {mine.get(key, 'unset')}"
                counts[said] = counts.get(said, 0) + 1
    return sorted(said for said, count in counts.items() if 2 * count >= len(now))
