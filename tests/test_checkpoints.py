"""Checkpoints read back on ``--resume``: what is there is held to the shape written, and a file of another shape
(cut, edited, another version's) counts as not saved, so that the node or stage runs again instead of its
parser or the resumed run stopping on it; a ``run.json`` that is no object is refused naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster_accept.analysis.isolation import IsolationRow
from cluster_accept.analysis.scaling import ScalingRow, TrainingScalingRow
from cluster_accept.remote.result import CommandResult, NodeResult, NodeStatus
from cluster_accept.rundir.checkpoints import Checkpoints
from cluster_accept.rundir.outputs import ResumeError, resumable_info
from cluster_accept.tasks.multi_node.group_stage import MultiNodeOutcome
from cluster_accept.tasks.multi_node.stage import SavedOutcome
from cluster_accept.vocabulary.figures import Figure
from cluster_accept.vocabulary.rows import Measurement, NcclFact, NodeRow
from cluster_accept.vocabulary.status import Status

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
    assert checkpoints.load_stage("multi-node", SavedOutcome) is None


def test_a_saved_multi_node_outcome_of_another_shape_runs_the_stage_again(tmp_path: Path) -> None:
    def _saved_outcome(data: object) -> MultiNodeOutcome | None:
        """The stage's outcome as a resumed run reads it back from ``data`` saved as its checkpoint."""
        (tmp_path / "checkpoints").mkdir(exist_ok=True)
        (tmp_path / "checkpoints" / "multi-node.json").write_text(json.dumps(data))
        saved = Checkpoints(tmp_path).load_stage("multi-node", SavedOutcome)
        return None if saved is None else saved.outcome()

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


def test_a_saved_multi_node_outcome_loads_as_written_and_a_wrong_member_type_counts_as_not_saved(
    tmp_path: Path,
) -> None:
    """Every table of the stage's outcome comes back typed as it was; a number where a string belongs, in any
    table, is another shape."""
    row = NodeRow("r1", "c", "multi-node", "n1", "scaling", "2 nodes", Status.PASS, "ok", "95.6%")
    said = Figure("allreduce_busbw_gbps", 41.5, probe="allreduce", size=1 << 30)
    figure = Measurement.of(said, "r1", "c", "multi-node", "n1", None)
    isolation = IsolationRow(0, "screen", 0, "screen", "n[1-2]", 2, 41.5, False, 30.0, "allreduce", "r1", "c")
    scaling = ScalingRow(2, 16, 41.5, 22.1, 177.1, 0.5, 1.0, False, "r1", "c")
    training = TrainingScalingRow(
        2, 16, "n[1-2]", 1e6, 62500.0, 310.0, None, None, 0.96, False, "NET/IB", "gpt", "r1", "c"
    )
    fact = NcclFact("r1", "c", "multi-node", "n1", "allreduce", "version", "version", "2.28.9", "n[1-2]", 0)
    outcome = MultiNodeOutcome([row], [figure], [isolation], [scaling], [training], nccl=[fact])
    checkpoints = Checkpoints(tmp_path)
    checkpoints.save_stage("multi-node", SavedOutcome.of(outcome))
    saved = checkpoints.load_stage("multi-node", SavedOutcome)
    assert saved is not None and saved.outcome() == outcome
    path = tmp_path / "checkpoints" / "multi-node.json"
    data = json.loads(path.read_text())
    wrong = {
        "isolation": ("nodes", 2),
        "scaling": ("gpus", "16"),
        "training_scaling": ("model", 7),
        "nccl": ("rank", "0"),
    }
    for table, (key, value) in wrong.items():
        path.write_text(json.dumps({**data, table: [{**data[table][0], key: value}]}))
        assert checkpoints.load_stage("multi-node", SavedOutcome) is None, table
