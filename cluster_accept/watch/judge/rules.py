"""What the watcher holds a running job to, and the stable reason codes of its findings.

Every threshold says its unit in its name. The defaults are set so that one noisy sample cannot name a node: a
compute straggler must arrive last at most of a window's collectives *and* in a streak *and* by a lag beyond three
floors (an absolute one, a share of the job's own cadence, and the clocks' uncertainty); a hang must outlast
``hang_after_s`` as measured between reads; a slow communicator is judged on its median over the window."""

from __future__ import annotations

from dataclasses import dataclass

from cluster_accept.checks.reasons import Action, Reason, declare
from cluster_accept.checks.reasons import FindingKind as ReasonKind
from cluster_accept.vocabulary.status import Status


@dataclass(frozen=True)
class WatchRules:
    """Thresholds of :func:`cluster_accept.watch.judge.localize`."""

    # The rows judged for stragglers: collectives entered (watcher's clock) this long before ``now_ns``.
    window_s: float = 120.0
    # Consecutive collectives (in order of arrival) a node must be last at: a run of bad luck among healthy nodes
    # is short (with two nodes, the longest run among 100 fair draws is about 7).
    streak_collectives: int = 8
    # Share of the judged collectives its rank arrives last at; a healthy node of N is last at about 1/N.
    last_share_min: float = 0.8
    # ... over at least this long: a node's share of one busy moment (its host's other work for a few seconds)
    # is not a straggler, however many collectives that moment held. A healthy two-node gloo job on the test-bed,
    # one node's core shared with the watch's own work, had a node last at 44 of 52 collectives by 16 ms: about
    # 11 s at that job's 4.6 collectives a second: one burst of other work, not a node to drain.
    persist_min_s: float = 20.0
    # Its median arrival lag must reach this ...
    lag_min_ms: float = 5.0
    # ... and this share of the median interval between consecutive collectives of a communicator (a lag is
    # small or large against the job's own cadence), and the clocks' uncertainty where peers are on other nodes.
    lag_min_share_of_interval: float = 0.05
    # Judged at the collectives the job waited at (its last rank the lag floor or more behind the median), a node is
    # named only where its peers spent this share of the window waiting for it (its lag summed where it was last).
    held_share_min: float = 0.02
    # A rank named by enqueue on a backend whose enqueue waits for the collective before it (gloo) is a compute
    # straggler only where its threads waited for a CPU this share of their runnable time more than its peers'
    # largest share (its cores shared with other work: on the test-bed a rank held to one core beside a busy loop
    # waited 85 %, its peer, held to one core alone, 51 %); otherwise its lateness may be carried over from a late
    # completion (a slow link) and the finding says it cannot tell (late_unresolved).
    cpu_wait_share_min: float = 0.2
    # Under this many complete collectives (every rank of the communicator has a record) stragglers are not judged.
    min_collectives: int = 16
    # A change point needs this many collectives before it: the lag "before" is a figure, not one sample.
    change_min_before: int = 4
    # No collective completed by any rank for this long (between the last progress and the latest read): a hang.
    hang_after_s: float = 120.0
    # A communicator this many times slower (median execution time, or bus bandwidth inverted) than the median of
    # the other communicators of the same operation, size and shape (how many nodes, how many ranks) is slow.
    comm_slow_factor: float = 1.5
    # A communicator is compared only with this many collectives (distinct sequence numbers) in the window.
    comm_min_collectives: int = 5
    # Reads of different nodes closer than this are one round: the order of deaths inside a round is not known.
    same_read_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.last_share_min <= 1:
            raise ValueError(f"last_share_min is a share in (0, 1], not {self.last_share_min}")
        if not 0 < self.cpu_wait_share_min <= 1:
            raise ValueError(f"cpu_wait_share_min is a share in (0, 1], not {self.cpu_wait_share_min}")
        if not 0 <= self.held_share_min <= 1:
            raise ValueError(f"held_share_min is a share in [0, 1], not {self.held_share_min}")
        if self.streak_collectives < 1 or self.min_collectives < 1 or self.comm_min_collectives < 1:
            raise ValueError("streak_collectives, min_collectives and comm_min_collectives count at least 1")
        if self.comm_slow_factor <= 1:
            raise ValueError(f"comm_slow_factor must exceed 1, not {self.comm_slow_factor}")
        if min(self.window_s, self.hang_after_s, self.same_read_s) <= 0:
            raise ValueError("window_s, hang_after_s and same_read_s are positive durations")
        if self.window_s <= self.persist_min_s:
            raise ValueError(
                f"a window of {self.window_s:g} s can never hold a straggler, which must persist "
                f"{self.persist_min_s:g} s: judge a longer window (--window)"
            )


# The reason codes of the watch's findings, each with the status its row carries, what it means and what to do
# (a straggler's is relative: judged against the job's other nodes). Stable strings: reports, drains and tests
# key on them.
REASONS = declare(
    Reason(
        "ok",
        Status.PASS,
        "The expectation holds on this node; the figure is in `observed`. Nothing to do.",
        Action.NONE,
    ),
    Reason(
        "rank_dead",
        Status.FAIL,
        "A rank on this node died (its process is gone, or a zombie) first, while the others ran: the job failed "
        "because of it. Exclude the node and look at its kernel log (Xid, OOM killer) and the rank's stderr.",
        Action.CHECK_NODE,
    ),
    Reason(
        "torn_down",
        Status.PASS,
        "A rank on this node died after another rank had already died: the launcher tore the job down. A "
        "consequence, not a cause: nothing to do on this node.",
        Action.NONE,
    ),
    Reason(
        "rank_missing",
        Status.FAIL,
        "A rank on this node is no longer listed by its node while its peers entered collectives it did not: its "
        "process vanished without being seen dead. Exclude the node and read the node's logs.",
        Action.CHECK_NODE,
    ),
    Reason(
        "ras_dead",
        Status.FAIL,
        "NCCL's RAS, asked on a peer node, considers a rank of this node dead (its process has not answered over "
        "the RAS network for 60 s) and the watcher can no longer read the node: the node is down or cut off. "
        "Exclude it; check its power, kernel log and network.",
        Action.CHECK_NODE,
    ),
    Reason(
        "node_unread",
        Status.NOT_JUDGED,
        "No read of this node listed any rank of the job: whether its ranks live cannot be told. Check the "
        "watcher's access to the node.",
        Action.CHECK_NODE,
    ),
    Reason(
        "hang_wavefront",
        Status.FAIL,
        "No collective completed for `hang_after_s`; the other ranks entered a collective this node's rank never "
        "reached (or its Flight Recorder did not answer). Dump its Python stack (py-spy) before killing the job, "
        "then exclude the node.",
        Action.CHECK_NODE,
    ),
    Reason(
        "rank_stopped",
        Status.FAIL,
        "No collective completed for `hang_after_s` and a rank on this node is stopped (state T: SIGSTOP or a "
        "debugger): the job waits for it. Resume or kill it; find who stopped it.",
        Action.RESTART_JOB,
    ),
    Reason(
        "waiting",
        Status.PASS,
        "The job hangs, but this node's ranks entered the newest collective: they wait for another node.",
        Action.NONE,
    ),
    Reason(
        "ras_unresponsive",
        Status.FAIL,
        "No collective completed for `hang_after_s`; every rank entered the same collective, and NCCL's RAS finds "
        "this node's rank's process not answering (unresponsive or dead): the job waits for it. Dump its stack "
        "(py-spy, cuda-gdb) before killing the job, then exclude the node.",
        Action.CHECK_NODE,
    ),
    Reason(
        "hang_unlocalized",
        Status.WARN,
        "No collective completed for `hang_after_s`, yet every rank entered the same collective and none is "
        "stopped: the wait is inside the collective (network, NCCL). Run the fabric probes on the job's nodes; no "
        "node is named.",
        Action.CHECK_NODE,
    ),
    Reason(
        "after_death",
        Status.NOT_JUDGED,
        "A rank died, so the job cannot go on; `dead_rank` names it. A hang is not judged apart from it.",
        Action.NONE,
    ),
    Reason(
        "no_progress_signal",
        Status.NOT_JUDGED,
        "Neither a completion time, a completed flag nor a rank's completed sequence number reached the watcher: "
        "whether collectives still complete cannot be told. Arm the Flight Recorder.",
        Action.FIX_CONFIG,
    ),
    Reason(
        "arrives_last",
        Status.FAIL,
        "A rank on this node arrives last at most collectives, in a streak, by a lag beyond the floors: its "
        "compute (GPU, CPU, data loading) is slower than its peers'. Exclude the node or re-test its GPU.",
        Action.CHECK_NODE,
        kind=ReasonKind.RELATIVE,
    ),
    Reason(
        "late_unresolved",
        Status.FAIL,
        "A rank on this node arrives last at most collectives, in a streak, by a lag beyond the floors, but its "
        "collectives block its host (gloo) and its host shows no wait for a CPU: its compute may be slow in a way "
        "the host does not show, or its previous collective ended late over a slow link (its own, or that of a "
        "ring neighbour it receives from or sends to, named in the evidence). Re-test the node's compute and the "
        "links of it and those neighbours before excluding any.",
        Action.CHECK_NODE,
        kind=ReasonKind.RELATIVE,
    ),
    Reason(
        "late_by_neighbour",
        Status.PASS,
        "A rank on this node arrived last (`late_unresolved`), and its re-test accepted this node and rejected a "
        "ring neighbour of it: the lateness was that neighbour's link, named on the neighbour's row. Keep this node.",
        Action.NONE,
        kind=ReasonKind.RELATIVE,
    ),
    Reason(
        "slow_link_neighbour",
        Status.FAIL,
        "The rank of a ring neighbour of this node arrived last at the job's collectives, its host waiting for no "
        "CPU, and the re-test of their compute and links beside a node the finding did not involve rejected this "
        "node and accepted the late one: this node's link (NIC, cable, its network settings) made the neighbour's "
        "collectives end late. Exclude it; run the fabric probes on it.",
        Action.CHECK_NODE,
        kind=ReasonKind.RELATIVE,
    ),
    Reason(
        "below_clock_error",
        Status.NOT_JUDGED,
        "A rank on this node arrives last at most collectives, but by less than the clocks of the nodes can tell "
        "apart: a node cannot be named. Tighten the clock sync (chrony) or watch longer.",
        Action.FIX_CONFIG,
        kind=ReasonKind.RELATIVE,
    ),
    Reason(
        "no_device_time",
        Status.NOT_JUDGED,
        "The job's collectives run on GPUs (NCCL) without their execution times: enqueue times show a slow host "
        "(CPU, data loading), not a slow GPU, which queues its launches on time and runs them late. Arm NCCL "
        "timing (cluster-accept arm; its cost is in docs/watch-signals.md) to judge GPU stragglers.",
        Action.FIX_CONFIG,
    ),
    Reason(
        "too_few_collectives",
        Status.NOT_JUDGED,
        "Too few collectives in the window had a record from every rank of their communicator: stragglers cannot "
        "be judged yet. Watch longer or arm the Flight Recorder on every rank.",
        Action.NONE,
    ),
    Reason(
        "slow_communicators",
        Status.FAIL,
        "Every communicator slower than `comm_slow_factor` times its peers includes this node, and no fast one of "
        "the same reach (within a node, or across nodes) does: its NVLink, links or NICs slow the collectives. "
        "Run the fabric probes on it; exclude it.",
        Action.CHECK_NODE,
        kind=ReasonKind.RELATIVE,
    ),
    Reason(
        "slow_nic",
        Status.FAIL,
        "Every slow communicator runs through one GPU of this node and its network path (the NIC paired with it), "
        "and no fast one across nodes does, while the node's other GPUs talk across nodes at full speed: that "
        "NIC, its cable or its PCIe path. Run the pair and rail probes on the node; exclude it until the NIC is "
        "fixed.",
        Action.RESEAT_CABLE,
        kind=ReasonKind.RELATIVE,
    ),
    Reason(
        "slow_rail",
        Status.NOT_JUDGED,
        "Every slow communicator runs between the same GPU index of several nodes (one rail, where GPUs and NICs "
        "pair by index) and no fast one across nodes entirely on that index does: the rail's switch or cabling, "
        "or one of its NICs, not one node. Run the rail probes on the rail's nodes; no node is named.",
        Action.CHECK_NODE,
        kind=ReasonKind.RELATIVE,
    ),
    Reason(
        "slow_unlocalized",
        Status.NOT_JUDGED,
        "Some communicators with this node are slow, but no single node is common to every slow one and absent "
        "from the fast: the fabric between several nodes is suspect. Run the fabric probes.",
        Action.CHECK_NODE,
        kind=ReasonKind.RELATIVE,
    ),
    Reason(
        "one_communicator",
        Status.NOT_JUDGED,
        "The job has no two communicators of the same operation, size and shape (nodes and ranks) with enough "
        "collectives: a slow communicator has nothing to be compared with. Communication stragglers are not "
        "judged.",
        Action.NONE,
    ),
    Reason(
        "not_compared",
        Status.NOT_JUDGED,
        "No communicator this node belongs to could be compared with another of its operation, size and shape: "
        "communication stragglers are not judged here.",
        Action.NONE,
    ),
    Reason(
        "no_exec_time",
        Status.NOT_JUDGED,
        "No collective carried its own execution time or bus bandwidth: NCCL timing (or the Inspector) is off. "
        "Set TORCH_NCCL_ENABLE_TIMING=1 to judge communication stragglers.",
        Action.FIX_CONFIG,
    ),
)
