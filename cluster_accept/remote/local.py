"""The local transport: the same batch run on the controller itself, for ``address: local`` nodes.

Used to accept the machine cluster-accept runs on, and GPU machines without sshd. The batch runs in its own
process group so that a timeout kills everything it started, as the node-side ``timeout`` does over SSH. Its
streams are read as they come, each kept as its :class:`~remote.channel.Keep` says (:func:`pump`), never read
whole first: a command printing 400 MB costs the controller what its cap keeps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import IO, Protocol

from cluster_accept.remote.channel import Keep

CHUNK_BYTES = 1 << 16


class Sink(Protocol):
    """Where a stream's bytes go as they are read (:class:`~remote.channel.Kept`)."""

    def feed(self, data: bytes) -> None: ...


def pump(stream: IO[bytes], sink: Sink) -> threading.Thread:
    """A started thread feeding ``stream`` into ``sink`` as it arrives, until its end (then it is closed)."""

    def run() -> None:
        with stream:
            while chunk := os.read(stream.fileno(), CHUNK_BYTES):
                sink.feed(chunk)

    thread = threading.Thread(target=run, name="ca-pump", daemon=True)
    thread.start()
    return thread


def finished(process: subprocess.Popen[bytes], readers: Sequence[threading.Thread], timeout_s: float) -> bool:
    """Whether ``process`` exited and its streams ended within ``timeout_s`` (a child of its own that holds a
    stream open past its exit counts as not finished)."""
    deadline = time.monotonic() + timeout_s
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False
    for reader in readers:
        reader.join(max(0.0, deadline - time.monotonic()))
    return not any(reader.is_alive() for reader in readers)


def run_local(command_line: list[str], timeout_s: float, keep: Keep) -> tuple[int | None, str, str, bool]:
    """Run argv locally; returns (exit code or None, stdout, stderr, timed out), each stream kept as ``keep``
    says while it arrives."""
    process = subprocess.Popen(  # noqa: S603 - argv built by remote.batch, values quoted there
        command_line,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert process.stdout is not None and process.stderr is not None
    out, err = keep.streams()
    readers = [pump(process.stdout, out), pump(process.stderr, err)]
    if finished(process, readers, timeout_s):
        return process.returncode, out.text(), err.text(), False
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
    for reader in readers:
        reader.join()
    return None, out.text(), err.text(), True
