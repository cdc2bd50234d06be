"""Name the node(s) behind a slow multi-node all-reduce in few rounds: adaptive group testing. Pure.

Every node can pass alone and the cluster still crawl together: one bad NIC, cable or switch port, a node
whose NCCL fell back to sockets. Testing every pair costs N - 1 rounds; what costs time is rounds (one set
of disjoint groups run in parallel, one multi-node launch each), so the search is adaptive:

1. *screen*: every node in a disjoint group of ``group_size``; all groups in one round;
2. *bisect*: a slow group's unknown nodes are split in two halves, each padded with known-good nodes back
   to the group's size (busbw depends on the node count, so only equal sizes compare); halves of every slow
   group run in the same round while known-good nodes last (a node is in one group per round);
3. *confirm*: a lone suspect is named only once it is slow in a pair with a known-good node. With the
   default pairs (``group_size`` 2) a bisected half *is* that pair, so one bad node takes two rounds.

A group is slow when it failed (busbw ``None``), is under the profile's floor, or is more than
``straggler_pct`` under the median of comparable groups. In the screen round those are the round's groups
of the same size — nothing is known yet and most groups are assumed healthy. A round of a single group has
no peers, so only the floor and failures count there (N = 2, 3: the first pair); when half the groups or
more are slow the median is slow too. Both need the profile's floor. Later rounds are made of suspects, so
their own median is biased low: they are judged against groups of that size already found good, or against
a *control* group of known-good nodes run beside them when there is none yet (a test waits until one fits;
a figure left with no reference, its control failed and no floor set, is measured again, never trusted).

Two nodes slow together while each is fine with a known-good node is a path, not a node: a ``bad_pair``
(seen only if the two shared a group). With no known-good node to pad with (everything slow; N = 2), the
suspects stay ``unresolved``: nothing to compare with. Deterministic: inputs sorted, padding taken in name
order, no randomness.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from cluster_accept.inventory.hostlist import fold
from cluster_accept.vocabulary.rows import Record


@dataclass(frozen=True)
class GroupResult:
    nodes: tuple[str, ...]
    busbw_gbps: float | None  # None: the run failed or timed out (counts as slow)


@dataclass(frozen=True)
class IsolationPolicy:
    group_size: int = 2  # nodes per screening group: pairs make a slow half already a confirming pair test
    min_busbw_gbps: float | None = None  # the profile's allreduce_inter_busbw_gbps_min
    straggler_pct: float = 5.0  # this much under the median of comparable groups is slow
    max_rounds: int = 64

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError(
                f"group_size must be >= 2 (a one-node all-reduce is not inter-node), not {self.group_size}"
            )
        if not 0 <= self.straggler_pct < 100:
            raise ValueError(f"straggler_pct must be in [0, 100), not {self.straggler_pct}")
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, not {self.max_rounds}")


@dataclass
class Round:
    index: int
    phase: str  # screen | bisect | confirm
    groups: list[tuple[str, ...]]
    results: list[GroupResult] = field(default_factory=list)  # filled by record(), in the order of groups
    kinds: list[str] = field(default_factory=list)  # per group: screen | bisect | confirm | search | control
    thresholds: list[float | None] = field(default_factory=list)  # filled by record()
    bad: list[bool] = field(default_factory=list)  # filled by record()


@dataclass(frozen=True)
class IsolationVerdict:
    bad_nodes: list[str]  # confirmed: slow in a pair with a known-good node
    bad_pairs: list[tuple[str, str]]  # slow together, each fine with known-good nodes: a link or path
    unresolved: list[str]  # could not be decided (no known-good node to pad with, round limit...)
    good_nodes: list[str]  # no finding (known-good nodes passed in included)
    rounds_used: int
    detail: str  # one sentence for the report


def budget(n: int) -> int:
    """Rounds allowed to isolate one bad node among ``n``: ceil(log2 n) + 3 (screen, bisect, confirm)."""
    return math.ceil(math.log2(n)) + 3 if n > 1 else 3


def threshold_for(
    results: Sequence[GroupResult], policy: IsolationPolicy, trusted: Sequence[GroupResult] = ()
) -> float | None:
    """The busbw under which a group counts as slow; ``None`` when nothing bounds it.

    ``results`` and ``trusted`` must be comparable (same node count). The relative bound is the median of
    both minus ``straggler_pct``; it needs two figures, or one from ``trusted`` (known-good nodes), since a
    lone untrusted figure is its own median. The floor applies on its own; the higher bound wins.
    """
    figures = [r.busbw_gbps for r in (*results, *trusted) if r.busbw_gbps is not None]
    has_trusted = any(r.busbw_gbps is not None for r in trusted)
    bounds = [policy.min_busbw_gbps] if policy.min_busbw_gbps is not None else []
    if len(figures) >= 2 or has_trusted:
        bounds.append(statistics.median(figures) * (1 - policy.straggler_pct / 100))
    return max(bounds) if bounds else None


def is_slow(busbw_gbps: float | None, threshold: float | None) -> bool:
    return busbw_gbps is None or (threshold is not None and busbw_gbps < threshold)


@dataclass(frozen=True)
class _Test:
    """One group to run: ``members`` under test, padded with known-good nodes (``pad``) up to ``size``."""

    kind: str  # screen | bisect | confirm | search | control
    members: tuple[str, ...]
    size: int
    task: int = -1  # the bisection or pair search it answers
    half: int = 0
    pad: tuple[str, ...] = ()


@dataclass
class _Bisection:
    halves: tuple[tuple[str, ...], tuple[str, ...]]
    slow: list[bool | None]  # per half, None until measured


@dataclass
class _PairSearch:
    """Two halves each fine with known-good nodes, slow together: ``fixed`` stays in every test while
    ``searched`` is halved (a slow test keeps the half tested, a fine one the other: one culprit pair
    assumed), then the roles swap, until one node is left on each side: the pair."""

    nodes: tuple[str, ...]
    fixed: tuple[str, ...]
    searched: tuple[str, ...]
    size: int


class Isolator:
    """Plans rounds of disjoint groups and narrows slow groups down to nodes, pairs or unresolved sets."""

    def __init__(self, nodes: Sequence[str], policy: IsolationPolicy, known_good: Iterable[str] = ()) -> None:
        self.policy = policy
        self._good: set[str] = set(known_good)
        self._universe = sorted(set(nodes) | self._good)
        self._bad: set[str] = set()
        self._pairs: set[tuple[str, str]] = set()
        self._unresolved: dict[str, str] = {}
        self._held: set[str] = set()  # fine alone but in a slow pair (or a search): never used as padding
        self._bisections: dict[int, _Bisection] = {}
        self._searches: dict[int, _PairSearch] = {}
        self._rounds: list[Round] = []
        self._planned: list[_Test] = []  # tests of the round planned and not yet recorded
        self._done = False
        self._keys = itertools.count()
        self._queue = self._screen(sorted(set(nodes) - self._good))

    def _screen(self, todo: list[str]) -> list[_Test]:
        """Groups of ``group_size``; a remainder is padded with known-good nodes if there are enough, or else
        screened next round padded with nodes found good (merged into a group, it would have no peer of its
        size and escape the straggler rule); fewer nodes than a group make one group."""
        g = self.policy.group_size
        full, rest = divmod(len(todo), g)
        tests = [_Test("screen", tuple(todo[i : i + g]), g) for i in range(0, full * g, g)]
        if rest:
            padded = full >= 1 or len(self._good) >= g - rest
            tests.append(_Test("screen", tuple(todo[full * g :]), g if padded else max(rest, 2)))
        return tests

    @property
    def rounds(self) -> list[Round]:
        return list(self._rounds)

    def next_round(self) -> list[tuple[str, ...]]:
        """Disjoint groups to run now (the same ones again until they are recorded); [] when finished."""
        if self._planned:
            return list(self._rounds[-1].groups)
        if self._done:
            return []
        if self._queue and len(self._rounds) >= self.policy.max_rounds:
            self._give_up(f"round limit ({self.policy.max_rounds}) reached")
        tests = self._plan() if self._queue else []
        if not tests:
            self._done = True
            return []
        groups = [tuple(sorted(t.members + t.pad)) for t in tests]
        self._planned = tests
        self._rounds.append(
            Round(len(self._rounds), _phase(len(self._rounds), tests), groups, kinds=[t.kind for t in tests])
        )
        return list(groups)

    def _plan(self) -> list[_Test]:
        """Tests of the queue, in order, while known-good padding lasts; the rest wait for the next round.

        After the screen, a size never yet seen good runs only next to a control group of known-good nodes
        (its reference); in the screen, known-good nodes passed in make a control when some are spare.
        """
        pool = [n for n in sorted(self._good) if n not in self._held]
        used: set[str] = set()
        planned: list[_Test] = []
        waiting: list[_Test] = []
        controls: dict[int, _Test] = {}
        trusted_sizes = {len(r.nodes) for r in self._found_good(self._rounds)}
        for test in self._queue:
            free = [n for n in pool if n not in used]
            need = test.size - len(test.members)
            control = bool(self._rounds) and test.size not in trusted_sizes | set(controls)
            if need + (test.size if control else 0) > len(free):
                waiting.append(test)
                continue
            planned.append(replace(test, pad=tuple(free[:need])))
            if control:
                controls[test.size] = _Test("control", (), test.size, pad=tuple(free[need : need + test.size]))
            used.update(test.members, free[: need + (test.size if control else 0)])
        if not planned:
            self._give_up("no known-good node to pair with" if not pool else "too few known-good nodes to pad with")
            return []
        self._queue = waiting
        for size in sorted({t.size for t in planned} - trusted_sizes - set(controls)):
            free = [n for n in pool if n not in used]
            if len(free) >= size:
                controls[size] = _Test("control", (), size, pad=tuple(free[:size]))
                used.update(free[:size])
        return planned + [controls[size] for size in sorted(controls)]

    def _give_up(self, reason: str) -> None:
        for test in self._queue:
            search = self._searches.pop(test.task, None) if test.kind == "search" else None
            for node in search.nodes if search else test.members:
                self._unresolved[node] = reason
        self._queue = []

    def record(self, results: Sequence[GroupResult]) -> None:
        """Results for the groups of the round just planned (any order, node order within a group free)."""
        if not self._planned:
            raise ValueError("record() needs a round planned by next_round() and not yet recorded")
        rnd = self._rounds[-1]
        by_group = {tuple(sorted(r.nodes)): r.busbw_gbps for r in results}
        if len(by_group) != len(results) or set(by_group) != set(rnd.groups):
            raise ValueError(f"results must cover exactly the planned groups {rnd.groups}")
        rnd.results = [GroupResult(g, by_group[g]) for g in rnd.groups]
        by_size = {size: self._threshold(rnd, size) for size in {len(g) for g in rnd.groups}}  # not per group: G²
        rnd.thresholds = [by_size[len(g)] for g in rnd.groups]
        rnd.bad = [is_slow(r.busbw_gbps, t) for r, t in zip(rnd.results, rnd.thresholds, strict=True)]
        tests, self._planned = self._planned, []
        retry = []
        for test, result, threshold, bad in zip(tests, rnd.results, rnd.thresholds, rnd.bad, strict=True):
            if rnd.index and threshold is None and result.busbw_gbps is not None and test.kind != "control":
                retry.append(test)  # its control failed and there is no floor: nothing to judge it by
            else:
                self._settle(test, bad)
        self._queue = retry + self._queue

    def _threshold(self, rnd: Round, size: int) -> float | None:
        """Screen: the round's groups of that size. Later rounds hold suspects (their median is biased low), so
        only groups of known-good nodes are the reference: earlier groups found good, this round's control."""
        same = [(r, k == "control") for r, k in zip(rnd.results, rnd.kinds, strict=True) if len(r.nodes) == size]
        controls = [r for r, control in same if control]
        if rnd.index == 0:
            return threshold_for([r for r, control in same if not control], self.policy, controls)
        return threshold_for(
            (), self.policy, [r for r in self._found_good(self._rounds[:-1]) if len(r.nodes) == size] + controls
        )

    @staticmethod
    def _found_good(rounds: Sequence[Round]) -> list[GroupResult]:
        """Groups judged good; after the screen, a figure with no threshold was not judged (it is re-run)."""
        return [
            r
            for past in rounds
            for r, t, bad in zip(past.results, past.thresholds, past.bad, strict=True)
            if not bad and (t is not None or past.index == 0)
        ]

    def _settle(self, test: _Test, slow: bool) -> None:
        if test.kind == "control":
            return
        if test.kind == "search":
            search = self._searches[test.task]
            cut = (len(search.searched) + 1) // 2
            search.searched = search.searched[:cut] if slow else search.searched[cut:]
            self._search_step(test.task)
            return
        if test.kind == "confirm":
            if slow:
                self._bad.add(test.members[0])
            else:
                self._unresolved[test.members[0]] = "slow with known-good nodes in a larger group, fine in a pair"
            return
        if slow:
            self._suspect(test.members, test.size)
        else:
            self._good.update(test.members)
        bisection = self._bisections.get(test.task) if test.kind == "bisect" else None
        if bisection is None:
            return
        bisection.slow[test.half] = slow
        if bisection.slow == [False, False]:
            del self._bisections[test.task]
            a, b = bisection.halves
            if len(a) == len(b) == 1:
                self._pair(a[0], b[0])
            else:
                key = next(self._keys)
                self._searches[key] = _PairSearch(a + b, a, b, test.size)
                self._held.update(a + b)
                self._search_step(key)

    def _suspect(self, nodes: tuple[str, ...], size: int) -> None:
        """``nodes`` were slow with known-good padding up to ``size``: name, confirm, or split them."""
        if len(nodes) == 1 and size == 2:
            self._bad.add(nodes[0])
        elif len(nodes) == 1:
            self._queue.append(_Test("confirm", nodes, 2))
        else:
            key = next(self._keys)
            cut = (len(nodes) + 1) // 2
            self._bisections[key] = _Bisection((nodes[:cut], nodes[cut:]), [None, None])
            self._queue += [_Test("bisect", nodes[:cut], size, key, 0), _Test("bisect", nodes[cut:], size, key, 1)]

    def _pair(self, a: str, b: str) -> None:
        self._pairs.add((min(a, b), max(a, b)))
        self._held.update((a, b))

    def _search_step(self, key: int) -> None:
        search = self._searches[key]
        if len(search.fixed) == len(search.searched) == 1:
            del self._searches[key]
            self._pair(search.fixed[0], search.searched[0])
            self._held.difference_update(set(search.nodes) - {search.fixed[0], search.searched[0]})
            return
        if len(search.searched) == 1:
            search.fixed, search.searched = search.searched, search.fixed
        half = search.searched[: (len(search.searched) + 1) // 2]
        self._queue.append(_Test("search", search.fixed + half, search.size, key))

    def verdict(self) -> IsolationVerdict:
        """What is known now; nodes still being narrowed down count as unresolved."""
        pending = [n for t in (*self._queue, *self._planned) for n in t.members]
        pending += [n for s in self._searches.values() for n in s.nodes]
        in_pairs = {n for pair in self._pairs for n in pair}
        reasons = {**dict.fromkeys(pending, "not decided yet"), **self._unresolved}
        reasons = {n: r for n, r in reasons.items() if n not in self._bad and n not in in_pairs}
        bad, pairs = sorted(self._bad), sorted(self._pairs)
        good = [n for n in self._universe if n not in self._bad and n not in in_pairs and n not in reasons]
        rounds = sum(1 for r in self._rounds if r.results)
        parts = [f"{fold(bad)} slow in a pair with a known-good node"] if bad else []
        if pairs:
            joined = ", ".join(f"{a}+{b}" for a, b in pairs)
            parts.append(f"slow only together (a link or path, each node fine with known-good ones): {joined}")
        if reasons:
            why = "; ".join(sorted(set(reasons.values())))
            parts.append(f"{fold(reasons)} unresolved ({why})")
        if not parts:
            parts.append(f"no slow node among {len(self._universe)}")
        detail = f"{', '.join(parts)}; {rounds} round{'s' if rounds != 1 else ''}."
        return IsolationVerdict(bad, pairs, sorted(reasons), good, rounds, detail)


def _phase(index: int, tests: list[_Test]) -> str:
    probes = [t for t in tests if t.kind != "control"]
    if index == 0 or all(t.kind == "screen" for t in probes):
        return "screen"
    if all(t.size == 2 and len(t.members) == 1 for t in probes):
        return "confirm"
    return "bisect"


def drive(isolator: Isolator, run_round: Callable[[list[tuple[str, ...]]], Sequence[GroupResult]]) -> IsolationVerdict:
    """Plan, run and record rounds until the isolator is done; ``run_round`` launches one round's groups."""
    while groups := isolator.next_round():
        isolator.record(run_round(groups))
    return isolator.verdict()


@dataclass(frozen=True)
class IsolationRow(Record):
    """One group of one isolation round, as ``isolation.parquet`` holds it (the run it is of placed by the
    stage)."""

    round: int
    phase: str  # screen / bisect / confirm
    group_index: int
    kind: str  # what the group tests (screen group, half, pair with a known-good node ...)
    nodes: str  # the group's nodes, folded
    size: int
    busbw_gbps: float | None  # the group's figure (whatever the signal); None: the run failed or timed out
    bad: bool
    threshold_gbps: float | None
    signal: str = "allreduce"  # what the groups ran: allreduce (bus bandwidth) or training (tokens/s per GPU)
    run_id: str = ""
    cluster: str = ""


def to_rows(rounds: Sequence[Round]) -> list[IsolationRow]:
    """One row per (round, group) recorded, for ``isolation.parquet`` and the report."""
    return [
        IsolationRow(
            round=rnd.index,
            phase=rnd.phase,
            group_index=i,
            kind=rnd.kinds[i],
            nodes=fold(result.nodes),
            size=len(result.nodes),
            busbw_gbps=result.busbw_gbps,
            bad=rnd.bad[i],
            threshold_gbps=rnd.thresholds[i],
        )
        for rnd in rounds
        for i, result in enumerate(rnd.results)
    ]
