"""A simulated transport, for scale work only: in-process nodes that answer the real check and probe commands
with outputs recorded from real (test-bed) nodes.

A :class:`Recording` holds, per *variant* (``healthy``, ``gpu_missing``, ...: a node as recorded with that fault
planted), what each command printed, keyed by the command's own text (the batch's nonce, the probe directory
and the node's name never enter the key). A :class:`SimulatedSession` gets a node's batch script exactly as
SSH would carry it, finds each command in it, and answers with the recorded output framed as the node's shell
frames it, so everything above the session — batch parsing, checks, probes, rows, Parquet, the report — runs
unchanged. A node of variant ``slow`` answers as ``healthy`` with every measured figure scaled down; every
node's figures get a small spread of its own (seeded by its name), so stragglers are found as they would be.

A command the recording does not hold is answered with exit 127 and says so: a simulated node never passes
a check by having nothing to say. Nothing here is reachable from an inventory by accident: only an
inventory's ``simulation`` block (which names the recording) selects it.
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
import shlex
import time
from collections.abc import Sequence
from pathlib import Path

from cluster_accept.inventory.simulation_settings import SLOW, SimulatedAs
from cluster_accept.simulator.launch import answer_operation, put_file
from cluster_accept.simulator.recording import NODE_TOKEN, UNKNOWN_EXIT, Answer, Recording, SimulatedNode, scale_figures

_NONCE = re.compile(r"@@CA:([0-9a-f]+):0:out")
_COMMAND_AT = '"$ca_t" sh -c '


def batch_commands(script: str) -> tuple[str, list[str]] | None:
    """(nonce, each command's own text) of a batch built by :func:`remote.batch.build_batch`; None when
    ``script`` is not a batch (a probe directory's creation or removal)."""
    found = _NONCE.search(script)
    if found is None:
        return None
    nonce = found.group(1)
    # Batches differ by their nonce only: each node's batch is split once per stage, not once per node.
    commands = _commands_of(script.replace(nonce, _NONCE_HOLDER))
    return nonce, [command.replace(_NONCE_HOLDER, nonce) for command in commands]


_NONCE_HOLDER = "\x00"


@functools.lru_cache(maxsize=256)
def _commands_of(script: str) -> tuple[str, ...]:
    commands: list[str] = []
    at = script.find(_COMMAND_AT)
    while at >= 0:
        lexer = shlex.shlex(script[at + len(_COMMAND_AT) :], posix=True)
        lexer.whitespace_split = True
        commands.append(next(iter(lexer)))
        at = script.find(_COMMAND_AT, at + 1)
    return tuple(commands)


def frame(nonce: str, answers: Sequence[Answer]) -> tuple[str, str]:
    """The two streams a node's shell prints for a batch whose commands answered ``answers``."""
    out: list[str] = []
    err: list[str] = []
    for index, answer in enumerate(answers):
        out.append(f"@@CA:{nonce}:{index}:out\n{answer.stdout}\n@@CA:{nonce}:{index}:end:{answer.exit_code}\n")
        err.append(f"@@CA:{nonce}:{index}:err\n{answer.stderr}\n@@CA:{nonce}:{index}:errend\n")
    return "".join(out), "".join(err)


def spread(node: str, spread_pct: float) -> float:
    """The node's own factor on its figures: within ``spread_pct`` of 1, the same on every run."""
    seed = int.from_bytes(hashlib.sha256(node.encode()).digest()[:8], "big")
    return 1.0 + random.Random(seed).uniform(-spread_pct, spread_pct) / 100.0


class SimulatedSession:
    """A :class:`~remote.fanout.NodeSession` answered from a :class:`Recording`."""

    def __init__(self, node: SimulatedNode, recording: Recording):
        self.node = node
        self.recording = recording

    def _answer(self, script: str) -> Answer:
        base = "healthy" if self.node.variant == "slow" else self.node.variant
        found = self.recording.answer(base, script)
        if found is None:
            return Answer(UNKNOWN_EXIT, "", f"simulated node: no recorded answer to {script[:200]!r}")
        stdout = found.stdout.replace(NODE_TOKEN, self.node.name)
        return Answer(
            found.exit_code, scale_figures(stdout, self.node.factor), found.stderr.replace(NODE_TOKEN, self.node.name)
        )

    def run_script(self, script: str, timeout_s: float) -> tuple[int | None, str, str, bool]:
        if self.node.latency_s:
            time.sleep(self.node.latency_s)
        batch = batch_commands(script)
        if batch is None:  # a probe directory, a multi-node rank's start or poll (simulator.launch)
            return answer_operation(self.node, self.recording, script)
        nonce, commands = batch
        stdout, stderr = frame(nonce, [self._answer(c) for c in commands])
        return 0, stdout, stderr, False

    def put(self, local_path: str, remote_path: str) -> None:
        put_file(self.node.name, local_path, remote_path)

    def close(self) -> None:
        return None


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
