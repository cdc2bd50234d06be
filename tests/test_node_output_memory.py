"""Node output is bounded while it arrives, not after: a command printing 200 MB keeps its cap, with the cut's note
counting the whole, and the controller never holds the 200 MB (over SSH, on a node checking itself, and from an
srun step's tasks). The caps themselves are pinned in tests/test_node_output_caps.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster_accept.inventory.model import DEFAULT_SSH, Node, Profile
from cluster_accept.remote.result import RemoteCommand

CHECK_CAP = 4 * 1024 * 1024
BIG = 200_000_000
CHUNK = b"a" * 65536
ROOM_BYTES = 150 * 1024 * 1024  # the most the controller may grow by reading 200 MB (it kept 4 MiB)
REPOSITORY = Path(__file__).resolve().parent.parent


def _note(limit: int, total: int) -> str:
    return f"\n… [truncated: kept the first {limit:,} of {total:,} characters]"


class _Channel:
    """An SSH channel whose command prints ``BIG`` characters in a check's frame, then a second command's."""

    def __init__(self) -> None:
        self.closed = False
        self.eof_received = False
        self.status_event = threading.Event()
        self.exit_status = -1
        self._read, write = os.pipe()
        os.write(write, b"x")  # always readable: select returns at once
        os.close(write)
        self._out: Iterator[bytes] = iter(())
        self._err: Iterator[bytes] = iter(())
        self._next: dict[str, bytes | None] = {"out": None, "err": None}

    def exec_command(self, command: str) -> None:
        found = re.search(r"@@CA:([0-9a-f]{16}):0:out", command)
        assert found is not None, command
        mark = f"@@CA:{found.group(1)}:"
        head = f"{mark}0:out\n".encode()
        tail = f"\n{mark}0:end:0\n{mark}1:out\nsecond\n{mark}1:end:0\n".encode()
        self._out = iter([head, *(CHUNK for _ in range(BIG // len(CHUNK))), CHUNK[: BIG % len(CHUNK)], tail])
        self._err = iter([f"{mark}0:err\n\n{mark}0:errend\n{mark}1:err\n\n{mark}1:errend\n".encode()])

    def shutdown_write(self) -> None:
        return None

    def _ready(self, name: str, chunks: Iterator[bytes]) -> bool:
        if self._next[name] is None:
            self._next[name] = next(chunks, None)
        if self._next["out"] is None and self._next["err"] is None and not self.eof_received:
            self.eof_received = True
            self.exit_status = 0
            self.status_event.set()
        return self._next[name] is not None

    def _take(self, name: str) -> bytes:
        data = self._next[name]
        assert data is not None
        self._next[name] = None
        return data

    def recv_ready(self) -> bool:
        return self._ready("out", self._out)

    def recv_stderr_ready(self) -> bool:
        return self._ready("err", self._err)

    def recv(self, nbytes: int) -> bytes:
        return self._take("out")

    def recv_stderr(self, nbytes: int) -> bytes:
        return self._take("err")

    def fileno(self) -> int:
        return self._read

    def close(self) -> None:
        os.close(self._read)


class _Transport:
    def __init__(self) -> None:
        self.channel = _Channel()

    def is_active(self) -> bool:
        return True

    def open_session(self, timeout: float | None = None) -> Any:
        return self.channel


class _Connection:
    def __init__(self) -> None:
        self.transport = _Transport()

    def close(self) -> None:
        return None


def _node() -> Node:
    return Node(name="n1", ssh=DEFAULT_SSH, profile_name="p", profile=Profile(), address="10.0.0.1")


def test_a_check_printing_200_mb_over_ssh_costs_its_cap_not_200_mb() -> None:
    from cluster_accept.remote.ssh import SshSession

    session = SshSession(_node(), _Connection())  # type: ignore[arg-type]
    commands = [RemoteCommand("pcie", "cat /sys/big", reads_only=True), RemoteCommand("after", "echo second")]
    tracemalloc.start()
    try:
        result = session.run_batch(commands, 60.0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    first, second = result.commands
    assert first.stdout == "a" * CHECK_CAP + _note(CHECK_CAP, BIG) and first.exit_code == 0
    assert (second.stdout, second.exit_code) == ("second", 0)  # the frames after the cut are all there
    assert peak < ROOM_BYTES, f"the controller held {peak / 2**20:.0f} MiB reading 200 MB"


# The peak of the measuring process's own memory: VmHWM is its address space's, new at exec (ru_maxrss starts at
# the parent's size: pytest's, after other tests)
HIGH_WATER = """
def high_water():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
"""

MEASURE = (
    HIGH_WATER
    + """
import json, sys
sys.path.insert(0, {root!r})
from cluster_accept.remote.result import RemoteCommand
from cluster_accept.remote.session import LocalSession
from cluster_accept.inventory.model import DEFAULT_SSH, Node, Profile
node = Node(name="n1", ssh=DEFAULT_SSH, profile_name="p", profile=Profile(), address="local")
big = RemoteCommand("pcie", "head -c {big} /dev/zero | tr '\\\\0' a", reads_only=True)
before = high_water()
if sys.argv[1] == "alone":
    results = [LocalSession._read(big, 60.0)]
else:
    results = LocalSession(node).run_batch([big, RemoteCommand("after", "echo second")], 60.0).commands
grew = high_water() - before
print(json.dumps({{"grew": grew, "out": [[r.stdout[:8], r.stdout[-80:], r.exit_code] for r in results]}}))
"""
)


@pytest.mark.integration
@pytest.mark.parametrize("way", ["alone", "in a batch"])
def test_a_node_checking_itself_reads_200_mb_within_its_cap(way: str) -> None:
    script = MEASURE.format(root=str(REPOSITORY), big=BIG)
    done = subprocess.run(
        [sys.executable, "-c", script, way], capture_output=True, text=True, timeout=300, check=False, cwd="/"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    said = json.loads(done.stdout)
    assert said["out"][0] == ["aaaaaaaa", ("a" * 80 + _note(CHECK_CAP, BIG))[-80:], 0]
    if way == "in a batch":
        assert said["out"][1] == ["second\n", "second\n", 0]
    assert said["grew"] < ROOM_BYTES, f"the controller grew by {said['grew'] / 2**20:.0f} MiB reading 200 MB"


FAKE_SRUN = """#!/bin/sh
# srun stood in for: the port step runs its command; the run's step runs the script from stdin once per node of
# --nodelist, each task's lines labelled as --label labels them
nodes=
for a in "$@"; do case "$a" in --nodelist=*) nodes=${a#--nodelist=} ;; esac; last=$a; done
if [ "$last" != "-s" ]; then exec /bin/sh -c "$last"; fi
script=$(mktemp); cat > "$script"; i=0
for n in $(echo "$nodes" | tr ',' ' '); do
  SLURMD_NODENAME=$n sh "$script" | sed "s/^/$i: /"; i=$((i + 1))
done
rm -f "$script"
"""

STEP = (
    HIGH_WATER
    + """
import json, sys
sys.path.insert(0, {root!r})
from cluster_accept.inventory.model import DEFAULT_SSH, Node, Profile
from cluster_accept.remote import batch, srun
from cluster_accept.remote.launch import GroupJob, GroupRun
from cluster_accept.remote.result import RemoteCommand
batch.PROBE_OUTPUT_CHARS = 1 << 20  # a rank's cap, small here: what the controller holds follows it
node = Node(name="n1", ssh=DEFAULT_SSH, profile_name="p", profile=Profile(), address="10.0.0.1")
line = "head -c {big} /dev/zero | tr '\\\\0' a | fold -w 100; echo; echo done"
job = GroupJob("big", (), lambda *_: RemoteCommand("rank", line, timeout_s=120))
run = GroupRun(("n1",), "tag")
before = high_water()
srun._step(job, [node], run, "7")
grew = high_water() - before
rank = run.ranks["n1"]
out = rank.result.stdout if rank.result is not None else ""
print(json.dumps({{"grew": grew, "detail": rank.detail, "code": rank.result and rank.result.exit_code,
                  "head": out[:101], "tail": out[-100:]}}))
"""
)


@pytest.mark.integration
def test_an_srun_task_printing_200_mb_costs_its_cap(tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "srun"
    fake.parent.mkdir()
    fake.write_text(FAKE_SRUN)
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    script = STEP.format(root=str(REPOSITORY), big=BIG)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False, env=env, cwd="/"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    said = json.loads(done.stdout)
    lines = BIG // 100  # of 100 characters each, then "done" and the empty line before the exit marker
    total = lines * 101 + len("done\n") + len("\n")
    assert (said["detail"], said["code"]) == ("", 0)
    assert said["head"] == "a" * 100 + "\n"
    assert said["tail"].endswith("a" + _note(1 << 20, total))  # the note counts every character the task printed
    assert said["grew"] < ROOM_BYTES, f"the controller grew by {said['grew'] / 2**20:.0f} MiB reading 200 MB"
