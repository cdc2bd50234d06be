"""The node-side reader's judgement of a rank's process, on this machine's own /proc: running, a pid reused by
another process, gone with or without its exit mark, and a rank in another pid namespace (never ``dead``)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

READER = Path(__file__).resolve().parent.parent / "cluster_accept" / "watch" / "node" / "job_read.py"


def _reader() -> ModuleType:
    spec = importlib.util.spec_from_file_location("job_read", READER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _own_start_ticks() -> int:
    return int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])


def test_states_of_a_rank_process(tmp_path: Path) -> None:
    reader, exit_mark = _reader(), tmp_path / "rank0.exit"
    own = reader.pid_namespace()
    assert reader.process_state(os.getpid(), _own_start_ticks(), str(exit_mark), own) == "running"
    assert reader.process_state(os.getpid(), _own_start_ticks() + 1, str(exit_mark), own) == "dead"  # pid reused
    assert reader.process_state(2**22 + 7, 1, str(exit_mark), own) == "dead"
    exit_mark.write_text("{}")
    assert reader.process_state(2**22 + 7, 1, str(exit_mark), own) == "exited"


def test_a_rank_in_another_pid_namespace_is_unknown_not_dead(tmp_path: Path) -> None:
    reader = _reader()
    elsewhere = "pid:[4026531999]"
    assert reader.pid_namespace() and reader.pid_namespace() != elsewhere
    assert reader.process_state(2**22 + 7, 1, str(tmp_path / "rank0.exit"), elsewhere) == "unknown"
    (tmp_path / "rank0.exit").write_text("0")  # its exit mark: it ended, wherever it ran
    assert reader.process_state(2**22 + 7, 1, str(tmp_path / "rank0.exit"), elsewhere) == "exited"
