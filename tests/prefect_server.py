"""A real Prefect server for tests that need one (deployments, workers): started in a fresh ``PREFECT_HOME`` on
a free port, waited for, and stopped with everything it started; helpers for processes started against it."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(proc: subprocess.Popen[str] | subprocess.Popen[bytes] | None) -> None:
    """End ``proc`` and its session (it was started with ``start_new_session``): TERM, then KILL."""
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, 15)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait(timeout=10)


def prefect(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "prefect", *args], env=env, capture_output=True, text=True)


@contextmanager
def prefect_server(home: Path, extra: dict[str, str] | None = None) -> Iterator[dict[str, str]]:
    """The environment that reaches a Prefect server running for the ``with`` block."""
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {
        **{k: v for k, v in os.environ.items() if k != "CLUSTER_ACCEPT_CONTROLLER"},  # not a controller's server
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": api,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        **(extra or {}),
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        health = [sys.executable, "-c", "import httpx,sys; httpx.get(sys.argv[1] + '/health').raise_for_status()", api]
        deadline = time.monotonic() + 120
        while subprocess.run(health, capture_output=True).returncode != 0:
            assert server.poll() is None, f"the Prefect server exited ({server.returncode})"
            assert time.monotonic() < deadline, "Prefect server did not come up"
            time.sleep(1)
        yield env
    finally:
        stop(server)


def start_worker(env: dict[str, str], pool: str, queue: str, hostname: str, log: Path) -> subprocess.Popen[bytes]:
    """A process worker of ``pool`` polling ``queue``, on a "host" of its own: a UTS namespace with
    ``hostname`` (the runs it starts record it as their controller)."""
    argv: Sequence[str] = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--work-queue", queue]
    command = f"hostname {hostname} && exec " + " ".join(f"'{a}'" for a in argv)
    with log.open("wb") as sink:
        return subprocess.Popen(
            ["unshare", "--uts", "sh", "-c", command],
            env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


@functools.cache
def session_api() -> str:
    """The URL of one Prefect server shared by the test session's CLI runs, started on first use and stopped
    at exit. A CLI run in ephemeral mode starts its own API server first (~10–25 s of a 2-core machine, most
    of a short run); the suite runs the CLI some sixty times. Tests of the ephemeral mode itself (a killed
    controller's orphaned server, the README's first command) keep it."""
    home = Path(tempfile.mkdtemp(prefix="ca-prefect-"))
    stack = ExitStack()
    env = stack.enter_context(prefect_server(home))
    atexit.register(shutil.rmtree, home, True)
    atexit.register(stack.close)
    return env["PREFECT_API_URL"]
