"""Straggler confirmation measures its suspects again in waves of the profile's ``probes.max_parallel_nodes``, as
the stage itself does: never more at once, and all of them at once where no profile bounds it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from cluster_accept.flows.progress import Silent
from cluster_accept.inventory.load import load_inventory
from cluster_accept.remote.result import NodeResult, NodeStatus
from cluster_accept.rundir.checkpoints import Checkpoints
from cluster_accept.rundir.outputs import RunDir
from cluster_accept.tasks import probe_stage
from cluster_accept.tasks.stage import RunState


def _state(tmp_path: Path, bound: str) -> RunState:
    path = tmp_path / "inventory.yaml"
    nodes = "nodes: [{hosts: 'n[1-6]'}]"
    path.write_text(f"cluster: c\ndefaults: {{profile: p}}\n{nodes}\nprofiles: {{p: {{{bound}}}}}\n")
    run_dir = RunDir(tmp_path / "runs", "r1")
    run_dir.path.mkdir(parents=True)
    return RunState(run_dir, load_inventory(path), Checkpoints(run_dir.path), Silent())


@pytest.mark.parametrize(("bound", "most"), [("probes: {max_parallel_nodes: 2}", 2), ("", 6)])
def test_suspects_are_measured_again_in_waves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bound: str, most: int
) -> None:
    running, seen, lock = [0], [0], threading.Lock()

    def measure(node, quick, probes):  # type: ignore[no-untyped-def]
        with lock:
            running[0] += 1
            seen[0] = max(seen[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1
        return NodeResult(node.name, NodeStatus.OK)

    monkeypatch.setattr(probe_stage, "run_probes_on_node", measure)
    names = [f"n{i}" for i in range(1, 7)]
    results = probe_stage.measure_again(_state(tmp_path, bound), names, [])
    assert [r.node for r in results] == names
    assert seen[0] == most
