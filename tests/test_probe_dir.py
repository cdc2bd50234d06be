"""The node-side script that makes a run's probe directory, run by bash here: stale directories of dead
runs are swept, a live run's are kept, and the new directory is private (mktemp -d, mode 0700)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from cluster_accept.remote.probe_dir import STALE_MARGIN_MIN, stale_minutes
from cluster_accept.remote.result import RemoteCommand
from cluster_accept.remote.shell import make_dir_script

pytestmark = pytest.mark.integration


def test_stale_probe_directories_are_swept_and_the_new_one_is_private(tmp_path: Path) -> None:
    commands = [RemoteCommand("gpu_bench", "true", timeout_s=900), RemoteCommand("allreduce", "true", timeout_s=900)]
    stale_after_s = (1800 // 60 + STALE_MARGIN_MIN) * 60
    dead = tmp_path / "cluster-accept-probe.deadrun1"
    live = tmp_path / "cluster-accept-probe.liverun1"
    other = tmp_path / "unrelated.dir"
    for path in (dead, live, other):
        path.mkdir()
        (path / "gpu_bench.py").write_text("")
    old = time.time() - stale_after_s - 120
    for path in (dead, other):
        os.utime(path, (old, old))
    done = subprocess.run(
        ["bash", "-c", make_dir_script(stale_minutes(commands))],
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    created = Path(done.stdout.strip().splitlines()[-1])
    assert created.parent == tmp_path and created.name.startswith("cluster-accept-probe.")
    assert created.is_dir() and (created.stat().st_mode & 0o777) == 0o700
    assert not dead.exists()  # older than any run could last: its controller died
    assert live.exists() and other.exists()  # a run that may still be going, and what is not ours
