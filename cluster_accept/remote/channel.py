"""Following one command on an open SSH channel to its end, and telling a node that went away from one that
is slow. No SSH library here: the channel and transport are whatever :mod:`remote.ssh` opened (paramiko's),
seen through the few methods used.

A node that crashed or rebooted closes its connection (the transport goes inactive); a node that lost power
or whose network was cut sends nothing at all, and TCP can take a quarter of an hour to notice. So after
:data:`SILENCE_CHECK_S` without output, and at the client-side timeout, a second channel is opened beside the
command: a node that cannot open one within :data:`LIVENESS_TIMEOUT_S` is gone.

What a node prints is kept only as far as the controller will use it, while it arrives (:class:`Kept`): a
check printing 400 MB costs the controller its 4 MiB cap, not 400 MB read first and cut afterwards. The rest is
read and counted, so that the note where it is cut still says how much there was.
"""

from __future__ import annotations

import codecs
import select
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from cluster_accept.remote.result import SessionLost
from cluster_accept.vocabulary.secrets import CAP_MARGIN_CHARS
from cluster_accept.vocabulary.text import cut_mark

SILENCE_CHECK_S = 60.0  # after this long without output, check that the node still answers
LIVENESS_TIMEOUT_S = 20.0  # a node that cannot open a channel in this long is gone
CLOSE_GRACE_S = 2.0  # a channel closed without a status: how long the transport is given to show it is gone


MARK_CHARS = 80  # the longest frame line a stream is split at (the markers of remote.batch)


@dataclass(frozen=True)
class Keep:
    """What of a stream the controller keeps as it arrives: ``limit`` characters (and the masking margin, so a
    secret the cap cuts is still masked whole); in a stream of frames, a line starting with ``token`` ends the
    part before it, and ``opens`` gives the frame that line opens its own limit (a line it does not name opens
    a part of ``limit``)."""

    limit: int
    token: str = ""  # e.g. ``\n@@CA:<nonce>:``: the start of every frame line, a newline first
    opens: Mapping[str, int] = field(default_factory=dict)

    def streams(self) -> tuple[Kept, Kept]:
        """A stdout and a stderr kept this way."""
        return Kept(self), Kept(self)


class Kept:
    """One stream of node output, decoded (UTF-8, bad bytes replaced, as a whole read decodes them) and kept as
    :class:`Keep` says while it arrives. Of a part longer than its limit the head is kept and the rest counted,
    the count on a line of its own where the part ends (:func:`~vocabulary.text.cut_mark`), so that the cap
    applied where it enters the controller (:func:`~vocabulary.secrets.masked_cap`) says the whole's length;
    frame lines are always kept. Nothing here blocks: the caller feeds what it read."""

    def __init__(self, keep: Keep) -> None:
        self.keep = keep
        self.received = 0  # bytes fed, kept or not
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending = "\n"  # as if after a line's end: a frame line at the very start is found too
        self._pieces: list[str] = []
        self._room = keep.limit + CAP_MARGIN_CHARS + 1  # a part's own newline first
        self._dropped = 0
        self._text: str | None = None

    def feed(self, data: bytes) -> None:
        self.received += len(data)
        self._scan(self._decoder.decode(data), final=False)

    def text(self) -> str:
        """What was kept, the cut lines in it; the stream counts as ended (what comes later is not read)."""
        if self._text is None:
            self._scan(self._decoder.decode(b"", final=True), final=True)
            self._close()
            self._text = "".join(self._pieces)[1:]
            self._pieces = []
        return self._text

    def _scan(self, text: str, final: bool) -> None:
        buf, pos, token = self._pending + text, 0, self.keep.token
        while token:
            at = buf.find(token, pos)
            if at < 0:
                break
            end = buf.find("\n", at + 1)
            if end < 0 and not final and len(buf) - at <= MARK_CHARS:
                break  # a frame line may be arriving: wait for its end
            line = buf[at + 1 : end] if 0 <= end - at <= MARK_CHARS else None
            if line is None:  # too long to be a frame line, or cut short with the stream: the part's own text
                self._content(buf[pos : at + 1])
                pos = at + 1
                continue
            self._content(buf[pos:at])
            self._close()
            self._pieces.append("\n" + line)
            self._room = self.keep.opens.get(line, self.keep.limit) + CAP_MARGIN_CHARS + 1
            pos = end
        at = buf.find(token, pos) if token and not final else -1
        stop = len(buf) if final else (at if at >= 0 else max(pos, len(buf) - len(token)))
        self._content(buf[pos:stop])
        self._pending = buf[stop:]

    def _content(self, text: str) -> None:
        take = min(len(text), self._room)
        if take:
            self._pieces.append(text[:take])
            self._room -= take
        self._dropped += len(text) - take

    def _close(self) -> None:
        """The part ends: how much of it was not kept, on a line of its own."""
        if self._dropped:
            self._pieces.append("\n" + cut_mark(self._dropped))
            self._dropped = 0


class Channel(Protocol):
    closed: bool
    eof_received: bool
    status_event: Any
    exit_status: int

    def exec_command(self, command: str) -> None: ...

    def shutdown_write(self) -> None: ...

    def recv_ready(self) -> bool: ...

    def recv_stderr_ready(self) -> bool: ...

    def recv(self, nbytes: int) -> bytes: ...

    def recv_stderr(self, nbytes: int) -> bytes: ...

    def fileno(self) -> int: ...

    def close(self) -> None: ...


class Transport(Protocol):
    def is_active(self) -> bool: ...

    def open_session(self, timeout: float | None = None) -> Any: ...


def _wait_inactive(transport: Transport, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while transport.is_active() and time.monotonic() < deadline:
        time.sleep(0.05)


def answers(transport: Transport) -> bool:
    """Whether the node still answers on ``transport``: a second channel opens (and is closed at once)."""
    try:
        probe = transport.open_session(timeout=LIVENESS_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - whatever the SSH library says, the node did not answer
        return False
    probe.close()
    return True


def follow(
    channel: Channel,
    transport: Transport,
    command_line: str,
    timeout_s: float,
    streams: tuple[Kept, Kept],
) -> tuple[int | None, bool]:
    """Read ``channel`` until its exit status and EOF (code, False), the client-side timeout (None, True), or
    the session's end (None, False); its stdout and stderr go into ``streams``, kept as they say."""
    out, err = streams
    deadline = time.monotonic() + timeout_s
    heard = time.monotonic()
    channel.exec_command(command_line)
    channel.shutdown_write()  # never interactive: no stdin
    while True:
        select.select([channel], [], [], 0.2)
        before = out.received + err.received
        while channel.recv_ready():
            out.feed(channel.recv(1 << 16))
        while channel.recv_stderr_ready():
            err.feed(channel.recv_stderr(1 << 16))
        now = time.monotonic()
        heard = now if out.received + err.received > before else heard
        # Done when both the output (EOF) and the exit status are in: sshd may send the status first. paramiko
        # also sets the status event when the channel closes, leaving ``exit_status`` at -1: no status came.
        pending = channel.recv_ready() or channel.recv_stderr_ready()
        if channel.status_event.is_set() and (channel.eof_received or channel.closed) and not pending:
            if channel.exit_status >= 0:
                return channel.exit_status, False
            # Closed without a status: the connection is going (the transport notices within moments), or the
            # command died of a signal.
            _wait_inactive(transport, CLOSE_GRACE_S)
            return None, False
        if not transport.is_active():
            return None, False
        if now > deadline:
            if not answers(transport):
                raise SessionLost("the node stopped answering (no reply to a liveness check at the timeout)")
            return None, True
        if now - heard > SILENCE_CHECK_S:
            if not answers(transport):
                raise SessionLost(
                    f"the node stopped answering (silent for {now - heard:.0f} s, no reply to a liveness check)"
                )
            heard = time.monotonic()
