"""A listener that answers RAS clients as NCCL's RAS does (``src/ras/client_support.cc``: the greeting, ``OK`` to
each setting, then the report and the connection closed), with a report recorded from a real job: a stand-in for
a job's NCCL on a test-bed node, whose gloo ranks have no RAS. ``python3 tests/ras_replay.py --port P --body FILE``
serves until killed; :func:`answer` serves one connection (the in-process tests)."""

from __future__ import annotations

import argparse
import socket
import time


def answer(conn: socket.socket, body: str, diagnostics: str | None = None, delay_s: float = 0.0) -> None:
    """One client, each command answered in turn as NCCL's RAS does: ``CLIENT PROTOCOL``, ``TIMEOUT``, ``SET
    FORMAT``, then the status command (``body``) or ``DIAGNOSTICS`` (``diagnostics``; None: an NCCL before 2.31,
    which does not know the command), ``delay_s`` after the command: RAS gathering every process's data."""
    with conn, conn.makefile("rwb") as stream:
        while line := stream.readline().decode().strip().upper():
            if line.startswith("CLIENT PROTOCOL"):
                stream.write(b"SERVER PROTOCOL 2\n")
            elif line.startswith(("TIMEOUT", "SET FORMAT")):
                stream.write(b"OK\n")
            elif line == "DIAGNOSTICS":
                time.sleep(delay_s)
                stream.write((diagnostics or "ERROR: Unknown command DIAGNOSTICS\n").encode())
                stream.flush()
                if diagnostics is None:
                    continue
                return
            else:
                stream.write(body.encode())
                stream.flush()
                return
            stream.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=28028)
    parser.add_argument("--body", required=True, help="the report to give, as NCCL's RAS wrote it")
    args = parser.parse_args()
    body = open(args.body).read()
    with socket.create_server(("127.0.0.1", args.port)) as listener:
        while True:
            conn, _ = listener.accept()
            try:
                answer(conn, body)
            except OSError:
                continue  # a client that went away


if __name__ == "__main__":
    main()
