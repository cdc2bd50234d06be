"""Checkpoints in the run directory, so a run killed mid-way resumes without redoing finished work.

Each node's raw result (one :class:`~remote.result.NodeResult`, whichever stage; one codec) is saved the moment
its task finishes (``checkpoints/<stage>/<node>.json``, written atomically), before the controller even looks at
it; the multi-node stage, which the controller drives as
one sequence, is saved whole when it completes. On ``--resume`` the saved results are loaded instead of
running those nodes again, and every stage is evaluated over all of its nodes exactly as in a clean run, so
the final tables hold the same rows, once. Only raw outputs are saved: parsing is pure and redone on load.
A node's outputs are saved as its result holds them: masked where they entered the controller
(:func:`remote.batch.parse_batch`), so that a run that never finishes leaves no secret behind.

The checkpoints are removed when the run has finished and its tables, history and report are written.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cluster_accept.remote.result import CommandResult, NodeResult, NodeStatus, UnreachableCause

DIRECTORY = "checkpoints"


def _write_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, default=str))
    tmp.replace(path)


class Checkpoints:
    def __init__(self, run_dir: Path) -> None:
        self.root = run_dir / DIRECTORY

    def save_node(self, stage: str, result: NodeResult) -> None:
        """A node's result of ``stage``, as the remote boundary gave it (its outputs masked there)."""
        _write_atomic(self.root / stage / f"{result.node}.json", node_result_to_data(result))

    def load_nodes(self, stage: str) -> dict[str, NodeResult]:
        """Saved node results of ``stage`` by node; a file cut short by a crash, or not one of ours, counts as not
        saved (the node runs again)."""
        found: dict[str, NodeResult] = {}
        for path in sorted((self.root / stage).glob("*.json")):
            try:
                result = node_result_from_data(json.loads(path.read_text()))
            except (OSError, ValueError, KeyError, TypeError, RecursionError):
                continue
            if result.node == path.stem:  # another node's result under this name is not this node's
                found[path.stem] = result
        return found

    def save_stage(self, stage: str, data: dict[str, Any]) -> None:
        _write_atomic(self.root / f"{stage}.json", data)

    def load_stage(self, stage: str) -> dict[str, Any] | None:
        """The stage's saved outcome; None where none was saved, or what is there is no JSON object (the stage
        runs again; the stage holds the object's members to its own shape)."""
        try:
            loaded = json.loads((self.root / f"{stage}.json").read_text())
        except (OSError, ValueError, RecursionError):
            return None
        return loaded if isinstance(loaded, dict) else None

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def node_result_to_data(result: NodeResult) -> dict[str, Any]:
    return {
        "node": result.node,
        "status": result.status.value,
        "cause": result.cause.value if result.cause else None,
        "detail": result.detail,
        "commands": [asdict(c) for c in result.commands],
        "duration_s": result.duration_s,
    }


_COMMAND_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "exit_code": (int, type(None)),
    "stdout": (str,),
    "stderr": (str,),
    "timed_out": (bool,),
}


def _command_from_data(data: Any) -> CommandResult:
    """One saved command, held to the exact shape :func:`node_result_to_data` writes (a ``true`` is no exit
    status, a number no output): another shape raises ValueError rather than reach the parsers."""
    if not isinstance(data, dict) or set(data) != set(_COMMAND_TYPES):
        raise ValueError("a saved command of another shape")
    for key, kinds in _COMMAND_TYPES.items():
        if type(data[key]) not in kinds:
            raise ValueError(f"a saved command's {key} is a {type(data[key]).__name__}")
    return CommandResult(**data)


def node_result_from_data(data: Any) -> NodeResult:
    """A saved node result, held to the shape :func:`node_result_to_data` writes; another shape raises ValueError
    (the node counts as not saved and runs again)."""
    if not isinstance(data, dict) or type(data.get("node")) is not str or type(data.get("detail", "")) is not str:
        raise ValueError("a saved node result of another shape")
    commands, duration = data.get("commands", []), data.get("duration_s", 0.0)
    if type(commands) is not list or type(duration) not in (int, float):
        raise ValueError("a saved node result of another shape")
    return NodeResult(
        node=data["node"],
        status=NodeStatus(data["status"]),
        cause=UnreachableCause(data["cause"]) if data.get("cause") else None,
        detail=data.get("detail", ""),
        commands=[_command_from_data(c) for c in commands],
        duration_s=float(duration),
    )
