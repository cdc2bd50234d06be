"""Files in directories other users can write: the error log never follows a link or enters a directory another
user planted in the temporary directory; it goes to a directory of the user's own instead."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from cluster_accept.analysis.verdicts import Verdict, VerdictRow
from cluster_accept.flows.exits import ERROR_LOG, log_failure
from cluster_accept.ops.after_run import Operations, after_run


@pytest.fixture
def shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary directory as /tmp is: sticky, anyone may write."""
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim"
    path.write_text("untouched\n")
    return path


def _fail() -> RuntimeError:
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        return exc


def _assert_private_log(log: Path, shared: Path) -> None:
    assert log.name == ERROR_LOG and log.parent.parent == shared
    st = os.lstat(log.parent)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700
    assert "RuntimeError: boom" in log.read_text()


def test_without_out_the_log_does_not_follow_a_planted_link(shared: Path, victim: Path, tmp_path: Path) -> None:
    (shared / ERROR_LOG).symlink_to(victim)  # where the log used to go
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (shared / f"cluster-accept-{os.geteuid()}").symlink_to(theirs)  # where it goes now, taken first
    log = log_failure(_fail(), None)
    assert victim.read_text() == "untouched\n"
    assert list(theirs.iterdir()) == []
    _assert_private_log(log, shared)
    assert log.parent.name.startswith("cluster-accept-") and log.parent.name != f"cluster-accept-{os.geteuid()}"


def test_without_out_the_log_goes_to_the_users_own_directory(shared: Path, victim: Path) -> None:
    (shared / ERROR_LOG).symlink_to(victim)
    log = log_failure(_fail(), None)
    assert log == shared / f"cluster-accept-{os.geteuid()}" / ERROR_LOG
    assert victim.read_text() == "untouched\n"
    _assert_private_log(log, shared)
    log_failure(_fail(), None)
    assert log.read_text().count("RuntimeError: boom") == 2  # appended, one run after another


def test_a_link_planted_in_the_run_directory_is_not_followed(shared: Path, victim: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    out.mkdir()
    (out / ERROR_LOG).symlink_to(victim)
    log = log_failure(_fail(), out)
    assert victim.read_text() == "untouched\n"
    _assert_private_log(log, shared)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_another_users_directory_is_refused(tmp_path: Path) -> None:
    from cluster_accept.vocabulary.own_files import own_dir

    theirs = tmp_path / "cluster-accept-0"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 54321, 54321)
    with pytest.raises(PermissionError, match=r"belongs to uid 54321, not to uid 0"):
        own_dir(theirs)


def test_a_directory_others_can_write_and_a_hard_link_are_refused(tmp_path: Path) -> None:
    from cluster_accept.vocabulary.own_files import append_own, check_own_dir, own_dir

    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(PermissionError, match=r"others can write to it \(mode 777\)"):
        check_own_dir(open_dir)
    target = tmp_path / "target"
    target.write_text("x")
    os.link(target, tmp_path / "alias")
    with pytest.raises(PermissionError, match=r"it has 2 names \(a hard link\)"):
        append_own(tmp_path / "alias", "y")
    assert target.read_text() == "x"
    made = own_dir(tmp_path / "mine")
    assert stat.S_IMODE(os.lstat(made).st_mode) == 0o700


def test_a_testbeds_default_state_dir_planted_as_a_link_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cluster_accept.testbed import bed, claim

    monkeypatch.setattr(claim, "STATE_DIR_BASE", str(tmp_path / "cluster-accept-testbed"))
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (tmp_path / "cluster-accept-testbed-ca").symlink_to(theirs)
    with pytest.raises(claim.TestbedError, match=r"cluster-accept-testbed-ca is not safe to write: it is a symbolic"):
        bed.own_state_dir(None, "ca")
    assert bed.own_state_dir(None, "cb") == tmp_path / "cluster-accept-testbed-cb"  # absent: made later, as before


def _verdict() -> VerdictRow:
    return VerdictRow("r1", "c", "n1", "p", Verdict.ACCEPTED)


def test_a_nodes_prometheus_file_is_not_written_through_a_planted_link(tmp_path: Path, victim: Path) -> None:
    from cluster_accept.flows.node_check import NodeCheck, write_prometheus

    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    (textfiles / f".ca.prom.{os.getpid()}.tmp").symlink_to(victim)  # the name it used to write first
    write_prometheus(textfiles / "ca.prom", NodeCheck("n1", [], _verdict()), "c", "r1")
    assert victim.read_text() == "untouched\n"
    assert 'node="n1"' in (textfiles / "ca.prom").read_text()


def test_a_runs_prometheus_file_is_not_written_through_a_planted_link(tmp_path: Path, victim: Path) -> None:
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    (textfiles / ".ca.prom.tmp").symlink_to(victim)  # the name it used to write first
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    info = {"run_id": "r1", "cluster": "c", "started": "2026-01-01T00:00:00+00:00", "ended": "2026-01-01T01:00:00"}
    after_run(run_dir, info, [_verdict()], [], [], Operations(prometheus=str(textfiles / "ca.prom")))
    assert victim.read_text() == "untouched\n"
    assert 'node="n1"' in (textfiles / "ca.prom").read_text()
    assert sorted(p.name for p in textfiles.iterdir()) == [".ca.prom.tmp", "ca.prom"]  # no temporary file left
