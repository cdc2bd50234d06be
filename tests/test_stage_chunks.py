"""A stage's fan-out: nodes worked on in Prefect task runs over chunks of nodes, so that Prefect's cost per task
run (its states, events and records) is paid per chunk, not per node, while the same number of nodes is in
flight and every node's outcome comes back in order."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from cluster_accept.inventory.load import load_inventory
from cluster_accept.inventory.model import Node
from cluster_accept.rundir.checkpoints import Checkpoints
from cluster_accept.rundir.outputs import RunDir
from cluster_accept.tasks.stage import CHUNKS_PER_WORKER, RunState, chunks


def _nodes(tmp_path: Path, count: int) -> list[Node]:
    path = tmp_path / "inv.yaml"
    path.write_text(
        f"cluster: c\ndefaults: {{profile: p}}\nnodes: [{{hosts: 'gpu[0001-{count:04d}]'}}]\nprofiles: {{p: {{}}}}\n"
    )
    return load_inventory(path).tested


CUTS = [(5, 64, [1] * 5), (128, 64, [1] * 128), (1024, 64, [8] * 128), (1000, 64, [8] * 125), (39, 4, [5] * 7 + [4]),
        (0, 64, [])]  # fmt: skip


@pytest.mark.parametrize(("count", "workers", "sizes"), CUTS)
def test_nodes_are_cut_into_at_most_two_chunks_per_worker_in_order(
    tmp_path: Path, count: int, workers: int, sizes: list[int]
) -> None:
    nodes = _nodes(tmp_path, max(count, 1))[:count]
    parts = chunks(nodes, workers)
    assert [len(p) for p in parts] == sizes
    assert [n.name for p in parts for n in p] == [n.name for n in nodes]
    assert len(parts) <= CHUNKS_PER_WORKER * workers


class _Counted:
    """Progress that counts what the stage said of each stage (advanced from Prefect's worker threads)."""

    def __init__(self) -> None:
        self.total: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self.lock = threading.Lock()

    def start(self, stage: str, total: int) -> None:
        self.total[stage] = total

    def advance(self, stage: str, done: int = 1) -> None:
        with self.lock:
            self.done[stage] = self.done.get(stage, 0) + done

    def finish(self, stage: str) -> None:
        pass


@pytest.mark.integration
@pytest.mark.parametrize(("wave", "task_runs", "in_flight"), [(None, 8, 4), (10, 20, 4)])
def test_a_stage_runs_its_nodes_in_chunked_task_runs_keeping_order_saved_outcomes_and_its_bounds(
    tmp_path: Path, wave: int | None, task_runs: int, in_flight: int
) -> None:
    """40 nodes, one resumed from its checkpoint, 4 workers: ``work`` runs once for each of the other 39, in
    ``task_runs`` Prefect task runs (2 per worker, in each wave), never more than ``in_flight`` nodes at once;
    outcomes come back in the nodes' order and progress reaches every node."""
    from prefect import flow
    from prefect.context import TaskRunContext
    from prefect.task_runners import ThreadPoolTaskRunner

    from cluster_accept.tasks.stage import per_node

    nodes = _nodes(tmp_path, 40)
    run_dir = RunDir(tmp_path / "runs", "r1")
    run_dir.path.mkdir(parents=True)
    progress = _Counted()
    state = RunState(run_dir, load_inventory(tmp_path / "inv.yaml"), Checkpoints(run_dir.path), progress, concurrency=4)
    seen: list[tuple[str, object]] = []
    running = [0, 0]  # now, most
    lock = threading.Lock()

    def work(node: Node) -> str:
        context = TaskRunContext.get()
        assert context is not None
        with lock:
            seen.append((node.name, context.task_run.id))
            running[0] += 1
            running[1] = max(running)
        time.sleep(0.01)
        with lock:
            running[0] -= 1
        return node.name.upper()

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=4))
    def stage() -> list[str]:
        return per_node(state, "probe", nodes, {"gpu0005": "saved", "elsewhere": "x"}, work, wave=wave)

    outcomes = stage()

    assert outcomes == [("saved" if n.name == "gpu0005" else n.name.upper()) for n in nodes]
    assert sorted(name for name, _ in seen) == sorted(n.name for n in nodes if n.name != "gpu0005")
    assert len({run for _, run in seen}) == task_runs
    assert running[1] <= in_flight
    assert (progress.total["probe"], progress.done["probe"]) == (40, 40)
