"""The records of a multi-node run and the :class:`Launcher` protocol every launcher answers.

A group run starts one rank per node of a group at once (all ranks must run at the same moment), records each
node's part (:class:`RankRun`: its end as data, never an exception) and keeps the first rank's output for the
job's own parser. Two launchers implement it: ``torchrun`` over SSH, each rank started detached and polled
(:mod:`remote.ssh_launcher`, which the scale simulator answers through the node's typed session), and ``srun``
in a Slurm allocation (:mod:`remote.srun`). Which one runs is the profile's ``probes.launcher``
(:func:`remote.launchers.launcher_for`). What the ranks run (the job's commands) and what their outputs mean
are decided above.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from cluster_accept.inventory.model import Node
from cluster_accept.remote.rank_end import rank_done, rank_end
from cluster_accept.remote.result import CommandResult, NodeStatus, RemoteCommand
from cluster_accept.vocabulary.figures import Figure
from cluster_accept.vocabulary.secrets import MaskedText
from cluster_accept.vocabulary.text import run_output

# A rank that failed has peers that fail seconds later, of the lost connection: both launchers give them this long
# to end of themselves before the run is stopped, so that the failed rank's own end (its signal, its last lines)
# is read rather than cut short by the stop, and its peers' ends show them as its victims (remote.rank_end).
FAILURE_GRACE_S = 15


def killed_at_timeout(exit_code: int | None, ran_s: float, limit_s: float) -> bool:
    """Whether a rank's status is the node-side timeout's: 124 (its TERM), or 137 (its KILL) once the rank's time
    was up — a 137 sooner is a kill on the node (the OOM killer, an operator), the rank's own failure."""
    return exit_code == 124 or (exit_code == 137 and ran_s >= limit_s)


@dataclass
class RankRun:
    """One node's part of a group run. ``stopped``: ended (or never started) because the run was stopped for
    another rank's failure, so its own end says nothing about its node."""

    node: str
    status: NodeStatus
    cause: str | None = None
    detail: str = ""
    result: CommandResult | None = None
    stopped: bool = False

    @property
    def completed(self) -> bool:
        """Every process of the node printed that it finished the run (``rank_done``), whatever came after."""
        return self.result is not None and rank_done(self.result.stdout)

    @property
    def ok(self) -> bool:
        """The node did its part: exit 0, or it finished its work before a teardown error (:attr:`teardown_error`)."""
        return self.status is NodeStatus.OK and self.result is not None and (self.result.ok or self.completed)

    @property
    def said(self) -> str:
        """How this rank ended, in a few words: never a bare missing exit status."""
        result = self.result
        if self.cause is not None:
            return f"unreachable ({self.cause})"
        if self.ok:
            return "finished its part" + (" (then a teardown error)" if self.teardown_error else "")
        if result is None or self.stopped:
            return self.detail or "stopped with the run"
        if result.timed_out:
            return "killed at the probe timeout"
        return rank_end(result.exit_code, run_output(result.stdout, result.stderr)).why

    @property
    def teardown_error(self) -> bool:
        """Finished its work, then did not exit cleanly: a warning, never a failure of the run."""
        return self.completed and self.result is not None and not self.result.ok


@dataclass
class GroupRun:
    nodes: tuple[str, ...]
    tag: str
    ranks: dict[str, RankRun] = field(default_factory=dict)
    measurements: list[Figure] = field(default_factory=list)
    transports: dict[str, int] = field(default_factory=dict)
    stdout: MaskedText = MaskedText("")  # the first rank's output, for the job's own parser
    detail: str = ""
    # the first rank's lines that gave no figure (a key no node script declares, a value of another type, an
    # error the job printed): each is a row of its own, whatever the run's outcome, never dropped
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.ranks) and all(r.ok for r in self.ranks.values()) and bool(self.measurements)

    @property
    def busbw_gbps(self) -> float | None:
        """All-reduce bus bandwidth at the largest message size; None when the run did not complete."""
        return self.busbw_of("allreduce_busbw_gbps")

    def busbw_of(self, metric: str) -> float | None:
        """``metric`` (a collective's bus bandwidth) at its largest size; None when the run did not complete or
        did not measure it."""
        figures = [m for m in self.measurements if m.metric == metric]
        if not self.ok or not figures:
            return None
        return max(figures, key=lambda m: m.size or 0).value


RankCommand = Callable[[Node, int, int, str, int, str], RemoteCommand]


@dataclass(frozen=True)
class GroupJob:
    """What a group run starts on each node: the probe files it ships, each rank's command (node, node rank,
    nodes, rendezvous address, port, tag) and the fewest nodes it runs on."""

    name: str
    files: tuple[str, ...]
    command: RankCommand
    min_nodes: int = 2
    collective: bool = False  # runs the collectives script: the stage records its figures and transports
    check: str = "allreduce"  # the check its rows are under (a failed run, a rank's teardown warning)


def rendezvous_address(master: Node) -> str:
    return "127.0.0.1" if master.is_local else master.connect_host


def refused(nodes: Sequence[Node], job: GroupJob) -> str:
    """Why a group cannot be launched at all; empty when it can."""
    if len(nodes) < job.min_nodes:
        return f"a multi-node run needs at least {job.min_nodes} nodes" if job.min_nodes > 1 else "no node to run on"
    return ""


class Launcher(Protocol):
    """Starts one run of ``job`` on each group (disjoint; rank order = list order) at once and records every
    rank's end in its run; never raises for a node's failure, and leaves nothing of a run behind on its nodes."""

    def launch(self, groups: Sequence[Sequence[Node]], runs: Sequence[GroupRun], job: GroupJob) -> None: ...
