"""A checkpoint becomes a node's rows on ``--resume`` without the node being measured again, so it is written
only where its own name says (never through a link planted beside it) and read back only when it is a plain
file of the resuming user's own: a link, another user's file or one others can write is named, and its node
runs again."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from cluster_accept.remote.result import CommandResult, NodeResult, NodeStatus
from cluster_accept.rundir.checkpoints import Checkpoints
from cluster_accept.tasks.multi_node.group_stage import MultiNodeOutcome
from cluster_accept.tasks.multi_node.stage import SavedOutcome

GOOD = NodeResult(
    node="node01",
    status=NodeStatus.OK,
    commands=[CommandResult("driver", 0, "580.95.05\n", "")],
    duration_s=1.5,
)
NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user takes root")


def _stage_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "checkpoints" / "preflight"
    directory.mkdir(parents=True)
    return directory


def test_a_link_planted_at_the_temporary_name_is_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim.conf"
    victim.write_text("the victim's own text\n")
    (_stage_dir(tmp_path) / "node01.json.tmp").symlink_to(victim)
    checkpoints = Checkpoints(tmp_path)
    checkpoints.save_node("preflight", GOOD)
    assert victim.read_text() == "the victim's own text\n"
    assert checkpoints.load_nodes("preflight") == {"node01": GOOD}


def test_a_saved_checkpoint_is_private_and_loads(tmp_path: Path) -> None:
    checkpoints = Checkpoints(tmp_path)
    checkpoints.save_node("preflight", GOOD)
    path = tmp_path / "checkpoints" / "preflight" / "node01.json"
    assert path.stat().st_mode & 0o077 == 0
    assert checkpoints.load_nodes("preflight") == {"node01": GOOD} and checkpoints.refused == []


@as_root
def test_another_users_checkpoint_is_named_and_its_node_runs_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoints = Checkpoints(tmp_path)
    checkpoints.save_node("preflight", GOOD)
    path = tmp_path / "checkpoints" / "preflight" / "node01.json"
    os.chown(path, NOBODY, NOBODY)
    with caplog.at_level(logging.WARNING):
        assert checkpoints.load_nodes("preflight") == {}
    assert checkpoints.refused == [f"{path} belongs to uid {NOBODY}, not to uid 0"]
    assert str(path) in caplog.text and "done again" in caplog.text


def test_a_checkpoint_that_is_a_link_or_writable_by_others_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    Checkpoints(elsewhere).save_node("preflight", GOOD)
    linked = _stage_dir(tmp_path) / "node01.json"
    linked.symlink_to(elsewhere / "checkpoints" / "preflight" / "node01.json")
    writable = linked.with_name("node02.json")
    Checkpoints(tmp_path / "w").save_node("preflight", NodeResult("node02", NodeStatus.OK, None, "", []))
    writable.write_bytes((tmp_path / "w" / "checkpoints" / "preflight" / "node02.json").read_bytes())
    writable.chmod(0o666)
    checkpoints = Checkpoints(tmp_path)
    assert checkpoints.load_nodes("preflight") == {}
    assert checkpoints.refused == [f"{linked} is a symbolic link", f"others can write to {writable} (mode 666)"]


@as_root
def test_another_users_stage_outcome_is_refused_and_the_stage_runs_again(tmp_path: Path) -> None:
    checkpoints = Checkpoints(tmp_path)
    checkpoints.save_stage("multi-node", SavedOutcome.of(MultiNodeOutcome()))
    assert checkpoints.load_stage("multi-node", SavedOutcome) is not None
    path = tmp_path / "checkpoints" / "multi-node.json"
    os.chown(path, NOBODY, NOBODY)
    assert checkpoints.load_stage("multi-node", SavedOutcome) is None
    assert checkpoints.refused == [f"{path} belongs to uid {NOBODY}, not to uid 0"]
