"""Node-side: the job's state as NCCL's RAS service tells it, as one JSON line.

NCCL (2.24 on, ``NCCL_RAS_ENABLE=1`` by default) listens in every process of a job for RAS clients on
``localhost:28028`` (``NCCL_RAS_ADDR``); the answer covers the whole job, gathered over the RAS network. This
speaks the text protocol of NCCL's own ``ncclras`` client (``src/ras/client.cc``), one command a line:

    -> CLIENT PROTOCOL 2            <- SERVER PROTOCOL <n>
    -> TIMEOUT <seconds>            <- OK
    -> SET FORMAT json              <- OK  (2.28.7 on; older: "ERROR: Unknown command ...": text then)
    -> STATUS | VERBOSE STATUS      <- the report, then NCCL closes the connection
    -> DIAGNOSTICS                  <- (2.31 on, ``--diagnostics``, text only) the diagnostics report, then closes

``localhost`` is tried as ``ncclras`` tries it, every address it resolves to (NCCL listens on the first). The
line printed is ``{"ras": "ok", "format": "json"|"text", "protocol": n, "body": "<the report>", ...}``, or
``{"ras": "unavailable", "detail": ...}`` when nothing listens, the connection times out or the answer is not
RAS's; the exit status is 0 either way. Only the standard library is needed.

Any local user can listen on the port when no NCCL job holds it: the report is read up to
:data:`MAX_REPORT_BYTES` and within its timeout however slowly it comes, and with ``--user`` (the job's user)
nothing is asked of a listener of another user (its owner read from ``/proc/net/tcp``).
"""

from __future__ import annotations

import argparse
import json
import pwd
import socket
import sys
import time
from typing import BinaryIO

CLIENT_PROTOCOL = 2  # NCCL_RAS_CLIENT_PROTOCOL, unchanged from 2.24 to 2.30
DEFAULT_PORT = 28028  # NCCL_RAS_CLIENT_PORT
CONNECT_TIMEOUT_S = 1.0  # ncclras starts with 1 s, to pass over an unresponsive process quickly
EXTRA_TIMEOUT_S = 5.0  # ncclras waits the RAS timeout plus this (RAS_COLLECTIVE_EXTRA_TIMEOUT_SEC) for the report
MAX_REPORT_BYTES = 64 << 20  # a verbose JSON status lists every rank, a few hundred bytes each


class RasProtocolError(Exception):
    """The peer answered, but not as NCCL's RAS does."""


def _send(sock: socket.socket, line: str) -> None:
    sock.sendall(line.encode() + b"\n")


def _answer(reader: BinaryIO, expect: str) -> str:
    line = reader.readline(4096).decode("utf-8", "replace").strip()
    if not line:
        raise RasProtocolError(f"NCCL closed the connection where {expect!r} was due")
    return line


def _expect_ok(reader: BinaryIO, command: str) -> None:
    line = _answer(reader, "OK")
    if line.upper() != "OK":
        raise RasProtocolError(f"{command}: unexpected answer {line!r}")


def _hello(sock: socket.socket, reader: BinaryIO, timeout_s: int) -> int | str:
    """The protocol's greeting and the RAS timeout; the server's protocol version."""
    _send(sock, f"CLIENT PROTOCOL {CLIENT_PROTOCOL}")
    hello = _answer(reader, "SERVER PROTOCOL")
    if not hello.upper().startswith("SERVER PROTOCOL "):
        raise RasProtocolError(f"unexpected greeting {hello!r}")
    protocol = hello.split()[-1]
    _send(sock, f"TIMEOUT {timeout_s}")
    _expect_ok(reader, "TIMEOUT")
    return int(protocol) if protocol.isdigit() else protocol


def diagnose(sock: socket.socket, timeout_s: int) -> dict[str, object]:
    """RAS diagnostics on demand (NCCL 2.31 on: ``ncclras -D``), text only: every communicator's ranks compared
    (GPU inventory, CUDA driver, ECC, NVLink, ``NCCL_*`` environment, …), a ``<host>:<pid> NCCL DIAG`` line each.
    An NCCL without them answers ``ERROR: Unknown command``, one with a report under way ``BUSY``: no report then."""
    reader = sock.makefile("rb")
    protocol = _hello(sock, reader, timeout_s)
    until = _report_deadline(timeout_s)
    _send(sock, "DIAGNOSTICS")
    sock.settimeout(until - time.monotonic())  # nothing comes until RAS has gathered every process's data
    first = _answer(reader, "the diagnostics report")
    if first.upper().startswith(("ERROR", "BUSY")):
        return {"ras": "unavailable", "detail": f"RAS diagnostics not run: {first[:200]}", "protocol": protocol}
    body = _report(reader, sock, until)
    return {"ras": "ok", "format": "diagnostics", "protocol": protocol, "body": f"{first}\n{body}"}


def converse(sock: socket.socket, timeout_s: int, want_json: bool, verbose: bool) -> dict[str, object]:
    """The exchange over a connected socket, as ``ncclras`` makes it; the report read to the end."""
    reader = sock.makefile("rb")
    protocol = _hello(sock, reader, timeout_s)
    form = "text"
    if want_json:
        _send(sock, "SET FORMAT json")
        answer = _answer(reader, "OK")
        if answer.upper() == "OK":
            form = "json"
        elif not answer.upper().startswith("ERROR"):
            raise RasProtocolError(f"SET FORMAT: unexpected answer {answer!r}")
    _send(sock, "VERBOSE STATUS" if verbose else "STATUS")
    body = _report(reader, sock, _report_deadline(timeout_s))
    return {"ras": "ok", "format": form, "protocol": protocol, "body": body}


def _report_deadline(timeout_s: int) -> float:
    """When a report asked now must have ended (monotonic): as ``ncclras`` waits, RAS's timeout and a margin."""
    return time.monotonic() + CONNECT_TIMEOUT_S + (timeout_s or 5) + EXTRA_TIMEOUT_S


def _report(reader: BinaryIO, sock: socket.socket, until: float) -> str:
    """The report to the end, by ``until`` (monotonic) and at most :data:`MAX_REPORT_BYTES`, however slowly it
    comes; TimeoutError or :class:`RasProtocolError` past either."""
    chunks: list[bytes] = []
    size = 0
    while (left := until - time.monotonic()) > 0:
        sock.settimeout(left)
        chunk = reader.read1(1 << 16)  # type: ignore[attr-defined]
        if not chunk:
            return b"".join(chunks).decode("utf-8", "replace")
        size += len(chunk)
        if size > MAX_REPORT_BYTES:
            raise RasProtocolError(f"a report over {MAX_REPORT_BYTES} bytes is not RAS's")
        chunks.append(chunk)
    raise TimeoutError("the report did not end in time")


def _proc_address(host: str, port: int) -> str:
    """``host:port`` as ``/proc/net/tcp`` writes it: each 32-bit word of the address in host order, in hex."""
    packed = socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    words = "".join(f"{int.from_bytes(packed[i : i + 4], sys.byteorder):08X}" for i in range(0, len(packed), 4))
    return f"{words}:{port:04X}"


def listener_uid(sock: socket.socket) -> int | None:
    """The uid owning the other end of a local TCP connection (the listener's accepted socket), from the
    kernel's table; None where it is not found."""
    ours = _proc_address(*sock.getsockname()[:2])
    theirs = _proc_address(*sock.getpeername()[:2])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                rows = [line.split() for line in handle.readlines()[1:]]
        except OSError:
            continue
        for row in rows:
            if len(row) > 7 and row[1] == theirs and row[2] == ours:
                return int(row[7])
    return None


def read_status(
    host: str,
    port: int,
    timeout_s: int,
    want_json: bool,
    verbose: bool,
    uid: int | None = None,
    diagnostics: bool = False,
) -> dict[str, object]:
    """The report (the status, or with ``diagnostics`` RAS's diagnostics), or why there is none; with ``uid``, only
    from a listener of that user."""
    began = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S) as sock:
            owner = listener_uid(sock) if uid is not None else None
            if uid is not None and owner != uid:
                detail = f"{host}:{port} is uid {owner}'s, not the job's user {uid}: not asked"
                return {"ras": "unavailable", "detail": detail}
            answer = diagnose(sock, timeout_s) if diagnostics else converse(sock, timeout_s, want_json, verbose)
    except ConnectionRefusedError:
        detail = f"nothing listens on {host}:{port}: no NCCL job with RAS on this node, or another NCCL_RAS_ADDR"
        return {"ras": "unavailable", "detail": detail}
    except TimeoutError:
        return {"ras": "unavailable", "detail": f"{host}:{port} timed out"}
    except (OSError, RasProtocolError) as exc:
        return {"ras": "unavailable", "detail": f"{host}:{port}: {type(exc).__name__}: {exc}"}
    return {**answer, "host": host, "port": port, "read_s": round(time.monotonic() - began, 3)}


def user_uid(user: str | None) -> int | None:
    """The uid of the job's user given as a name or a uid; None for none. A name the node does not know is
    refused (SystemExit naming it): asking any listener in its stead would trust a stranger."""
    if user is None:
        return None
    if user.isdigit():
        return int(user)
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise SystemExit(f"no user {user!r} on this node") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="localhost")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--timeout-s", type=int, default=5, help="how long RAS waits for the job's other processes")
    parser.add_argument(
        "--format", choices=("auto", "json", "text"), default="auto", help="auto: JSON where NCCL has it"
    )
    parser.add_argument("--verbose", action="store_true", help="VERBOSE STATUS: list more of the outlying ranks")
    parser.add_argument("--user", help="the job's user (name or uid): a listener of another user is not asked")
    parser.add_argument("--diagnostics", action="store_true", help="RAS diagnostics (NCCL 2.31 on) for the status")
    args = parser.parse_args(argv)
    uid = user_uid(args.user)
    want_json = args.format != "text"
    answer = read_status(args.host, args.port, args.timeout_s, want_json, args.verbose, uid, args.diagnostics)
    if args.format == "json" and answer.get("format") == "text":
        answer = {"ras": "unavailable", "detail": "this NCCL has no JSON status (2.28.7 on)", "body": answer["body"]}
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
