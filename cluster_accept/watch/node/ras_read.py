"""Node-side: the job's state as NCCL's RAS service tells it, as one JSON line.

NCCL (2.24 on, ``NCCL_RAS_ENABLE=1`` by default) listens in every process of a job for RAS clients on
``localhost:28028`` (``NCCL_RAS_ADDR``); the answer covers the whole job, gathered over the RAS network. This
speaks the text protocol of NCCL's own ``ncclras`` client (``src/ras/client.cc``), one command a line:

    -> CLIENT PROTOCOL 2            <- SERVER PROTOCOL <n>
    -> TIMEOUT <seconds>            <- OK
    -> SET FORMAT json              <- OK  (2.28.7 on; older: "ERROR: Unknown command ...": text then)
    -> STATUS | VERBOSE STATUS      <- the report, then NCCL closes the connection

``localhost`` is tried as ``ncclras`` tries it, every address it resolves to (NCCL listens on the first). The
line printed is ``{"ras": "ok", "format": "json"|"text", "protocol": n, "body": "<the report>", ...}``, or
``{"ras": "unavailable", "detail": ...}`` when nothing listens, the connection times out or the answer is not
RAS's; the exit status is 0 either way. Only the standard library is needed.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from typing import BinaryIO

CLIENT_PROTOCOL = 2  # NCCL_RAS_CLIENT_PROTOCOL, unchanged from 2.24 to 2.30
DEFAULT_PORT = 28028  # NCCL_RAS_CLIENT_PORT
CONNECT_TIMEOUT_S = 1.0  # ncclras starts with 1 s, to pass over an unresponsive process quickly
EXTRA_TIMEOUT_S = 5.0  # ncclras waits the RAS timeout plus this (RAS_COLLECTIVE_EXTRA_TIMEOUT_SEC) for the report
MAX_REPORT_BYTES = 64 << 20


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


def converse(sock: socket.socket, timeout_s: int, want_json: bool, verbose: bool) -> dict[str, object]:
    """The exchange over a connected socket, as ``ncclras`` makes it; the report read to the end."""
    reader = sock.makefile("rb")
    _send(sock, f"CLIENT PROTOCOL {CLIENT_PROTOCOL}")
    hello = _answer(reader, "SERVER PROTOCOL")
    if not hello.upper().startswith("SERVER PROTOCOL "):
        raise RasProtocolError(f"unexpected greeting {hello!r}")
    protocol = hello.split()[-1]
    _send(sock, f"TIMEOUT {timeout_s}")
    _expect_ok(reader, "TIMEOUT")
    form = "text"
    if want_json:
        _send(sock, "SET FORMAT json")
        answer = _answer(reader, "OK")
        if answer.upper() == "OK":
            form = "json"
        elif not answer.upper().startswith("ERROR"):
            raise RasProtocolError(f"SET FORMAT: unexpected answer {answer!r}")
    sock.settimeout(CONNECT_TIMEOUT_S + (timeout_s or 5) + EXTRA_TIMEOUT_S)
    _send(sock, "VERBOSE STATUS" if verbose else "STATUS")
    body = reader.read(MAX_REPORT_BYTES).decode("utf-8", "replace")
    return {"ras": "ok", "format": form, "protocol": int(protocol) if protocol.isdigit() else protocol, "body": body}


def read_status(host: str, port: int, timeout_s: int, want_json: bool, verbose: bool) -> dict[str, object]:
    """The report, or why there is none."""
    began = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S) as sock:
            answer = converse(sock, timeout_s, want_json, verbose)
    except ConnectionRefusedError:
        detail = f"nothing listens on {host}:{port}: no NCCL job with RAS on this node, or another NCCL_RAS_ADDR"
        return {"ras": "unavailable", "detail": detail}
    except TimeoutError:
        return {"ras": "unavailable", "detail": f"{host}:{port} timed out"}
    except (OSError, RasProtocolError) as exc:
        return {"ras": "unavailable", "detail": f"{host}:{port}: {type(exc).__name__}: {exc}"}
    return {**answer, "host": host, "port": port, "read_s": round(time.monotonic() - began, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="localhost")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--timeout-s", type=int, default=5, help="how long RAS waits for the job's other processes")
    parser.add_argument(
        "--format", choices=("auto", "json", "text"), default="auto", help="auto: JSON where NCCL has it"
    )
    parser.add_argument("--verbose", action="store_true", help="VERBOSE STATUS: list more of the outlying ranks")
    args = parser.parse_args(argv)
    answer = read_status(args.host, args.port, args.timeout_s, args.format != "text", args.verbose)
    if args.format == "json" and answer.get("format") == "text":
        answer = {"ras": "unavailable", "detail": "this NCCL has no JSON status (2.28.7 on)", "body": answer["body"]}
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
