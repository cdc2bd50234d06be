"""Checkpoints read back on ``--resume``: what is there is held to the shape written, and a file of another shape
(cut, edited, another version's) counts as not saved, so that the node or stage runs again instead of its
parser or the resumed run stopping on it; a ``run.json`` that is no object is refused naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster_accept.remote.result import CommandResult, NodeResult, NodeStatus
from cluster_accept.rundir.checkpoints import Checkpoints
from cluster_accept.rundir.outputs import ResumeError, resumable_info
from cluster_accept.tasks.multi_node.stage import _saved_outcome

GOOD = NodeResult(
    node="node01",
    status=NodeStatus.OK,
    commands=[CommandResult("driver", 0, "580.95.05\n", "")],
    duration_s=1.5,
)


def _saved(tmp_path: Path, edit: str) -> dict[str, NodeResult]:
    checkpoints = Checkpoints(tmp_path)
    checkpoints.save_node("preflight", GOOD)
    path = tmp_path / "checkpoints" / "preflight" / "node01.json"
    data = json.loads(path.read_text())
    if edit == "stdout a number":
        data["commands"][0]["stdout"] = 580
    elif edit == "exit code true":
        data["commands"][0]["exit_code"] = True
    elif edit == "a command's extra key":
        data["commands"][0]["pid"] = 7
    elif edit == "commands an object":
        data["commands"] = {"driver": "580.95.05"}
    elif edit == "another node's result":
        data["node"] = "node02"
    elif edit == "null":
        data = None
    path.write_text(json.dumps(data))
    return checkpoints.load_nodes("preflight")


def test_a_saved_node_result_loads_as_written(tmp_path: Path) -> None:
    assert _saved(tmp_path, "none") == {"node01": GOOD}


@pytest.mark.parametrize(
    "edit",
    [
        "stdout a number",
        "exit code true",
        "a command's extra key",
        "commands an object",
        "another node's result",
        "null",
    ],
)
def test_a_saved_node_result_of_another_shape_counts_as_not_saved(tmp_path: Path, edit: str) -> None:
    assert _saved(tmp_path, edit) == {}


@pytest.mark.parametrize("text", ["null", "[]", '"multi-node"', "{cut"])
def test_a_saved_stage_that_is_no_object_counts_as_not_saved(tmp_path: Path, text: str) -> None:
    checkpoints = Checkpoints(tmp_path)
    checkpoints.save_stage("multi-node", {"rows": []})
    (tmp_path / "checkpoints" / "multi-node.json").write_text(text)
    assert checkpoints.load_stage("multi-node") is None


def test_a_saved_multi_node_outcome_of_another_shape_runs_the_stage_again() -> None:
    whole = {"rows": [], "measurements": [], "isolation": [], "scaling": [], "training_scaling": []}
    outcome = _saved_outcome(whole)
    assert outcome is not None and (outcome.rows, outcome.measurements, outcome.scaling) == ([], [], [])
    assert _saved_outcome({**whole, "rows": [{"node": "node01"}]}) is None  # a row without its status
    assert _saved_outcome({**whole, "measurements": [{"value": "fast"}]}) is None
    assert _saved_outcome({k: v for k, v in whole.items() if k != "scaling"}) is None
    assert _saved_outcome({**whole, "isolation": "node03"}) is None
    assert _saved_outcome(None) is None


@pytest.mark.parametrize("text", ["null", "[]", "7"])
def test_a_run_json_that_is_no_object_is_refused_naming_it(tmp_path: Path, text: str) -> None:
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "run.json").write_text(text)
    with pytest.raises(ResumeError) as info:
        resumable_info(tmp_path, "r1")
    kind = type(json.loads(text)).__name__
    assert str(info.value) == f"cannot resume r1: {tmp_path / 'r1' / 'run.json'} holds a JSON {kind}, not an object"
