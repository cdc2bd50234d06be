"""A simulated transport, for scale work only: in-process nodes that answer the real check and probe commands
with outputs recorded from real (test-bed) nodes.

A :class:`Recording` holds, per *variant* (``healthy``, ``gpu_missing``, ...: a node as recorded with that fault
planted), what each command printed, keyed by the command's own text (the batch's nonce, the probe directory
and the node's name never enter the key). A :class:`SimulatedSession` is a node's session
(:class:`~remote.session.NodeSession`): it gets a node's batch as typed commands and answers each with its
recorded output, so everything above the session — checks, probes, rows, Parquet, the report — runs
unchanged; the shell's own framing is tested on its own (:mod:`remote.batch`). A node of variant ``slow``
answers as ``healthy`` with every measured figure scaled down; every node's figures get a small spread of
its own (seeded by its name), so stragglers are found as they would be.

A check's command, or a probe's node-side run, that the recording does not hold at all is answered on a healthy
(or slow) node with that plug-in's healthy sample (declared beside it, :mod:`checks.samples`), and said so: the
batch's ``detail`` names the commands answered from samples, and a warning is logged once a command. A node of a
faulty variant is never answered from a sample (its fault may be recorded under the command's old text, and
would vanish): it answers exit 127, as it does any other command the recording lacks, saying so: a simulated
node never passes a check by having nothing to say. Nothing here is reachable from an inventory by accident: only an
inventory's ``simulation`` block (which names the recording) selects it.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import random
import time
from collections.abc import Sequence
from pathlib import Path

from cluster_accept.inventory.simulation_settings import SLOW, SimulatedAs
from cluster_accept.remote.batch import taken_in
from cluster_accept.remote.result import (
    CommandResult,
    NoAnswer,
    NodeResult,
    NodeStatus,
    PollAnswer,
    RemoteCommand,
)
from cluster_accept.simulator.launch import LAUNCHES
from cluster_accept.simulator.recording import (
    NODE_TOKEN,
    UNKNOWN_EXIT,
    Answer,
    Recording,
    SimulatedNode,
    sample_answer,
    scale_figures,
)

LOG = logging.getLogger(__name__)
# Variants answered as a healthy node is, where the recording lacks a command: their figures only are changed.
_HEALTHY_AS = frozenset({"healthy", SLOW})
_warned: set[str] = set()


def spread(node: str, spread_pct: float) -> float:
    """The node's own factor on its figures: within ``spread_pct`` of 1, the same on every run."""
    seed = int.from_bytes(hashlib.sha256(node.encode()).digest()[:8], "big")
    return 1.0 + random.Random(seed).uniform(-spread_pct, spread_pct) / 100.0


class SimulatedSession:
    """A :class:`~remote.session.NodeSession` answered from a :class:`Recording`; a rank of a multi-node run
    from :data:`~simulator.launch.LAUNCHES`."""

    def __init__(self, node: SimulatedNode, recording: Recording):
        self.node = node
        self.recording = recording

    def _answer(self, script: str, name: str = "") -> tuple[Answer, bool]:
        """The recorded answer to ``script``; else, on a node answering as a healthy one, the healthy sample of
        the check or node-side run ``name`` (True: taken from a sample); else exit 127."""
        base = "healthy" if self.node.variant in _HEALTHY_AS else self.node.variant
        found, from_sample = self.recording.answer(base, script), False
        if found is None and base == "healthy":
            found = sample_answer(name)
            from_sample = found is not None
        if found is None:
            why = "" if base == "healthy" else f" (variant {base!r}: its fault may be recorded under other text)"
            return Answer(UNKNOWN_EXIT, "", f"simulated node: no recorded answer to {script[:200]!r}{why}"), False
        stdout = found.stdout.replace(NODE_TOKEN, self.node.name)
        stderr = found.stderr.replace(NODE_TOKEN, self.node.name)
        return Answer(found.exit_code, scale_figures(stdout, self.node.factor), stderr), from_sample

    def _round_trip(self) -> None:
        """The node's latency: every operation is one round trip on its session."""
        if self.node.latency_s:
            time.sleep(self.node.latency_s)

    def run_batch(self, commands: Sequence[RemoteCommand], default_timeout_s: float) -> NodeResult:
        """Each command answered as recorded."""
        self._round_trip()
        results, sampled = [], []
        for command in commands:
            answer, from_sample = self._answer(command.script, command.name)
            if from_sample:
                sampled.append(command.name)
            timed_out = answer.exit_code in (124, 137)
            out, err = taken_in(command, answer.stdout), taken_in(command, answer.stderr)  # as any session's output
            results.append(CommandResult(command.name, answer.exit_code, out, err, timed_out))
        return NodeResult(self.node.name, NodeStatus.OK, None, _said_sampled(sampled), results)

    def make_probe_dir(self, stale_min: int) -> str:
        self._round_trip()
        return LAUNCHES.make_dir()

    def put(self, local_path: str, remote_path: str) -> None:
        """Probe scripts need not travel: the recording answers for them."""

    def remove_dir(self, remote_dir: str, kill_tag: str | None = None) -> None:
        self._round_trip()
        LAUNCHES.remove(self.node.name, remote_dir)

    def free_port(self, python: str) -> int | NoAnswer:
        self._round_trip()
        return LAUNCHES.free_port()

    def start_detached(
        self, remote_dir: str, command: RemoteCommand, default_timeout_s: float, tag: str | None
    ) -> int | NoAnswer:
        self._round_trip()
        started = LAUNCHES.start(self.node, self.recording, remote_dir, command)
        return started if isinstance(started, int) else NoAnswer(started)

    def poll_detached(self, remote_dir: str, pid: int, kill_pattern: str | None) -> PollAnswer | NoAnswer:
        self._round_trip()
        return LAUNCHES.poll(self.node.name, remote_dir, pid, stop=kill_pattern is not None)

    def close(self) -> None:
        return None


def _said_sampled(names: list[str]) -> str:
    """The batch's detail naming the commands answered from a plug-in's sample (a warning logged once each)."""
    for name in sorted(set(names) - _warned):
        _warned.add(name)
        LOG.warning("simulated nodes: %s answered from its healthy sample (the recording holds no answer)", name)
    return f"answered from samples (not recorded): {', '.join(names)}" if names else ""


@functools.lru_cache(maxsize=8)
def load_recording(path: str) -> Recording:
    """One copy of a recording for every node that answers from it."""
    return Recording.load(Path(path))


def simulated_session(name: str, spec: SimulatedAs) -> SimulatedSession:
    """The session of node ``name`` of a simulated inventory."""
    factor = spread(f"{spec.seed}:{name}", spec.spread_pct) * (0.5 if spec.variant == SLOW else 1.0)
    draw = random.Random(f"{spec.seed}:{name}:latency")
    latency_s = draw.lognormvariate(0.0, 0.5) * spec.latency_ms / 1000.0 if spec.latency_ms else 0.0
    node = SimulatedNode(name, spec.variant, factor, latency_s, spec.latency_ms / 1000.0)
    return SimulatedSession(node, load_recording(spec.recording))
