"""The smallest set of settings whose removal restores a slow figure, found arm by arm. Pure.

Removing every suspect at once and watching the figure recover proves only that *one of them* matters: a real node
carries tens of settings (an NGC container, a site's own), and naming them all "together" blames the harmless ones
beside the culprit. Delta debugging (Zeller's ddmin) finds the culprit in about log₂ of the number of suspects:
each *arm* measures the failing figures again with some of the suspects reverted to the known-good reference, and
the figure is judged ``restored``, ``low``, or ``void`` (the arm did not run with the settings asked, or measured
nothing).

The search, over the suspects in a fixed order:

1. every suspect reverted: the figure must be restored, or none of them is the cause (``cleared``);
2. one culprit at a time, by halving: keep half the suspects still in question in effect and revert all the rest
   (the culprits already found too); ``low`` means that half alone slows the figure, so the search goes on in it,
   ``restored`` that it does not, so the culprit is in the other half (taken without measuring it, and proved at
   the end by an arm that keeps the single setting alone);
3. after each culprit, an arm reverting the culprits found so far: ``restored`` ends the search (each culprit
   named was proved to slow the figure by itself, and reverting them all restores it); ``low`` means another
   setting costs too, searched among the rest;
4. where no single setting slows the figure alone (a pair that hurts only together), ddmin over the rest finds
   the 1-minimal set whose reverting restores it, and the partners it needs are found the same way: the pair
   is named as a pair.

Every arm is counted against a bound that grows with what is found (:func:`arm_bound`): when it is reached first,
the finding says so and names what is still in question. The caller runs the arms (one per round and node, in
waves across nodes) and judges each; nothing here measures or knows a node.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Literal

Outcome = Literal["restored", "low", "void"]
Kind = Literal["named", "cleared", "unfinished", "void"]
Ask = Generator[frozenset[str], Outcome, Outcome]


def arm_bound(suspects: int, found: int = 0, extra: int = 2, interactions: int = 0) -> int:
    """The most arms a search over ``suspects`` may measure: 2⌈log₂ k⌉ + ``extra`` for the first culprit,
    ⌈log₂ k⌉ + 2 more for each culprit ``found`` (each further one costs a halving and the arm that shows it), and
    2⌈log₂ k⌉ + 2 for each set that slows the figure only together (a halving for a member, another for its
    partner, and an arm per member kept alone)."""
    depth = math.ceil(math.log2(suspects)) if suspects > 1 else 0
    return 2 * depth + extra + found * (depth + 2) + interactions * (2 * depth + 2)


@dataclass(frozen=True)
class Arm:
    """One re-measurement: the suspects it reverted, how the figures came out, and what it measured (words)."""

    reverted: frozenset[str]
    outcome: Outcome
    said: str = ""


@dataclass(frozen=True)
class Finding:
    """What the search proved. ``alone``: settings each proved to slow the figure by itself (kept alone in
    effect, the figure stayed low); ``together``: a set that slows it only together (each member's reverting
    restores it, none alone slows it); ``left``: what is still in question when the bound or a void arm stopped
    the search; ``arms``: every arm measured, in order."""

    kind: Kind
    alone: tuple[str, ...] = ()
    together: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    arms: tuple[Arm, ...] = ()
    bound: int = 0
    note: str = ""

    @property
    def named(self) -> tuple[str, ...]:
        return self.alone + self.together


class _Stopped(Exception):
    """The search ran out of arms or met a void one it cannot go round."""


@dataclass
class Search:
    """One node's search over its ``suspects`` (in order): ask :meth:`next_arm`, measure it, :meth:`record` the
    outcome, until ``finding`` is set. ``extra``: the bound's constant (:func:`arm_bound`)."""

    suspects: Sequence[str]
    extra: int = 2
    arms: list[Arm] = field(default_factory=list)
    finding: Finding | None = None
    _found: list[str] = field(default_factory=list)
    _pending: frozenset[str] | None = None
    _interactions: int = 0  # searches that found no single culprit: each grows the bound as a culprit does

    def __post_init__(self) -> None:
        self.suspects = tuple(dict.fromkeys(self.suspects))
        self._steps = self._search()
        self._advance(lambda: next(self._steps))

    @property
    def bound(self) -> int:
        return arm_bound(len(self.suspects), len(self._found), self.extra, self._interactions)

    def next_arm(self) -> frozenset[str] | None:
        """The suspects the next arm reverts; None once the search is over."""
        if self.finding is None and len(self.arms) >= self.bound:
            self._stop(f"the bound of {self.bound} re-measurements was reached before the set was proved minimal")
        return None if self.finding is not None else self._pending

    def record(self, outcome: Outcome, said: str = "") -> None:
        """The outcome of the arm :meth:`next_arm` gave."""
        if self._pending is None or self.finding is not None:
            raise ValueError("no arm is waiting for an outcome")
        self.arms.append(Arm(self._pending, outcome, said))
        self._advance(lambda: self._steps.send(outcome))

    def _advance(self, step: Callable[[], frozenset[str]]) -> None:
        try:
            self._pending = step()
        except StopIteration as done:
            self.finding = done.value
            self._pending = None
        except _Stopped as stopped:
            self._stop(str(stopped))

    def _stop(self, why: str) -> None:
        left = tuple(s for s in self.suspects if s not in self._found)
        self.finding = Finding("unfinished", tuple(self._found), (), left, tuple(self.arms), self.bound, why)
        self._pending = None

    def _done(self, kind: Kind, together: Sequence[str] = (), note: str = "") -> Finding:
        alone = tuple(s for s in self.suspects if s in self._found)
        ordered = tuple(s for s in self.suspects if s in together)
        return Finding(kind, alone, ordered, (), tuple(self.arms), self.bound, note)

    def _ask(self, reverted: frozenset[str]) -> Ask:
        """An arm's outcome: from an arm already measured with the same suspects reverted, else measured.
        Nothing reverted is the failing run itself: low."""
        if not reverted:
            return "low"
        for arm in self.arms:
            if arm.reverted == reverted:
                return arm.outcome
        if len(self.arms) >= self.bound:
            raise _Stopped(f"the bound of {self.bound} re-measurements was reached before the set was proved minimal")
        return (yield reverted)

    def _decided(self, reverted: frozenset[str]) -> Ask:
        """An arm's outcome where the search cannot go round a void one: it stops there, unfinished."""
        outcome = yield from self._ask(reverted)
        if outcome == "void":
            raise _Stopped(f"the arm reverting {len(reverted)} of the suspects did not run as asked (void)")
        return outcome

    def _search(self) -> Generator[frozenset[str], Outcome, Finding]:
        everything = frozenset(self.suspects)
        first = yield from self._ask(everything)
        if first == "void":
            return Finding("void", arms=tuple(self.arms), bound=self.bound, note="the arm with every suspect "
                           "reverted did not run as asked")  # fmt: skip
        if first == "low":
            return self._done("cleared")
        while True:
            pool = [s for s in self.suspects if s not in self._found]
            culprit = yield from self._one_alone(pool)
            if culprit is None:
                return (yield from self._interaction(pool))
            self._found.append(culprit)
            if (yield from self._decided(frozenset(self._found))) == "restored":
                return self._done("named")

    def _kept(self, kept: Sequence[str]) -> frozenset[str]:
        """The arm that keeps ``kept`` in effect: every other suspect reverted."""
        return frozenset(self.suspects) - frozenset(kept)

    def _one_alone(self, pool: Sequence[str]) -> Generator[frozenset[str], Outcome, str | None]:
        """A setting of ``pool`` that slows the figure by itself (the pool as a whole is known to: the failing
        run, or the last arm); None when no single one does."""
        return (yield from self._halve(pool, self._kept, "low"))

    def _halve(
        self, pool: Sequence[str], arm_of: Callable[[Sequence[str]], frozenset[str]], wanted: Outcome
    ) -> Generator[frozenset[str], Outcome, str | None]:
        """One member of ``pool`` whose arm alone (``arm_of([member])``) comes out ``wanted``, ``pool`` as a whole
        known to: halving, the half not measured taken when the measured one is not ``wanted`` (where that one is
        void, the other measured instead), and the last one proved by its own arm; None when the halving finds none
        (the outcome needs two or more members)."""
        group, proved = list(pool), True
        while len(group) > 1:
            first, second = group[: len(group) // 2], group[len(group) // 2 :]
            outcome = yield from self._ask(arm_of(first))
            if outcome == wanted:
                group, proved = first, True
            elif outcome != "void":
                group, proved = second, False
            elif (yield from self._decided(arm_of(second))) == wanted:
                group, proved = second, True
            else:
                raise _Stopped("an arm of the halving did not run as asked (void), and the other half does not decide")
        if not group or (not proved and (yield from self._decided(arm_of(group))) != wanted):
            return None
        return group[0]

    def _interaction(self, pool: Sequence[str]) -> Generator[frozenset[str], Outcome, Finding]:
        """No single setting of ``pool`` slows the figure alone: the 1-minimal set whose reverting (with the
        culprits found) restores it (one member by halving where one suffices, else ddmin), then for each member
        the partners it needs to slow the figure, searched with the other members reverted (each member breaks
        one set that slows it); each member of the sets named is proved harmless kept alone."""
        self._interactions += 1
        found = frozenset(self._found)

        def reverting(part: Sequence[str]) -> frozenset[str]:
            return found | frozenset(part)

        first = yield from self._halve(pool, reverting, "restored")
        core = [first] if first is not None else (yield from self._ddmin(pool, reverting, "restored"))
        rest = [s for s in pool if s not in core]
        members: list[str] = []
        for member in core:
            group = [member]
            while (yield from self._decided(self._kept(group))) != "low":
                more = yield from self._partners(rest, group)
                if not more:
                    raise _Stopped(f"no partner found that {member} needs to slow the figure")
                group += more
            members += [s for s in group if s not in members]
        for member in members:  # proved harmless alone: kept alone in effect, the figure is restored
            if (yield from self._decided(self._kept([member]))) == "low":
                raise _Stopped(f"{member} slows the figure alone, yet no arm found it so before: the figure is noisy")
        return self._done("named", members)

    def _partners(self, pool: Sequence[str], members: Sequence[str]) -> Generator[frozenset[str], Outcome, list[str]]:
        """What else of ``pool`` ``members`` need to slow the figure (kept in effect with them, the rest
        reverted, it stays low): one setting by halving, else the 1-minimal set by ddmin."""
        rest = [s for s in pool if s not in members]

        def keeping(part: Sequence[str]) -> frozenset[str]:
            return self._kept([*members, *part])

        partner = yield from self._halve(rest, keeping, "low")
        return [partner] if partner is not None else (yield from self._ddmin(rest, keeping, "low"))

    def _ddmin(
        self, items: Sequence[str], arm_of: Callable[[Sequence[str]], frozenset[str]], wanted: Outcome
    ) -> Generator[frozenset[str], Outcome, list[str]]:
        """Zeller's ddmin: the 1-minimal part of ``items`` whose arm (``arm_of``) comes out ``wanted``, ``items``
        as a whole known to; the empty part first (nothing needed)."""
        if (yield from self._ask(arm_of([]))) == wanted:
            return []
        part, n = list(items), 2
        while len(part) > 1:
            chunks = _chunks(part, n)
            smaller = None
            for chunk in chunks:
                if (yield from self._ask(arm_of(chunk))) == wanted:
                    smaller, n = chunk, 2
                    break
            if smaller is None and n > 2:
                for chunk in chunks:
                    rest = [s for s in part if s not in chunk]
                    if (yield from self._ask(arm_of(rest))) == wanted:
                        smaller, n = rest, max(n - 1, 2)
                        break
            if smaller is not None:
                part = smaller
            elif n >= len(part):
                break
            else:
                n = min(2 * n, len(part))
        return part


def _chunks(items: Sequence[str], n: int) -> list[list[str]]:
    """``items`` cut into ``n`` parts of nearly equal size, in order."""
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(list(items[start:end]))
        start = end
    return [c for c in out if c]
