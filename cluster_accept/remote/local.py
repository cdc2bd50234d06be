"""The local transport: the same batch run on the controller itself, for ``address: local`` nodes.

Used to accept the machine cluster-accept runs on, and GPU machines without sshd. The batch runs in its own
process group so that a timeout kills everything it started, as the node-side ``timeout`` does over SSH.
"""

from __future__ import annotations

import os
import signal
import subprocess


def run_local(command_line: list[str], timeout_s: float) -> tuple[int | None, str, str, bool]:
    """Run argv locally; returns (exit code or None, stdout, stderr, timed out)."""
    process = subprocess.Popen(  # noqa: S603 - argv built by remote.batch, values quoted there
        command_line,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        stdout, stderr = process.communicate()
        return None, stdout or "", stderr or "", True
    return process.returncode, stdout, stderr, False
