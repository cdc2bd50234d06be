"""A node's own check keeps its marks on the node (``flows/node_marks.py``), so that a kernel-log event is judged
by one check: the file is used only where nobody but the checking user could have written it, never through a
link, and a bad one is named and replaced, never trusted (``tests/test_node_check.py`` runs the real
``check --local`` over it)."""

from __future__ import annotations

import json
import os
from hashlib import sha256
from pathlib import Path

import pytest

from cluster_accept.flows.node_marks import file_name, read_marks, state_dir, write_marks

MARKS = {
    "xid": {"boot_id": "6c1f0c4e-5b7a-4a53-9d1e-0f0e4b2f3a10", "uptime_s": "745.750"},
    "ib_counters": {"now_s": "1"},
}


def test_marks_written_are_read_back_from_a_file_only_this_user_can_write(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    assert read_marks(folder, "node01").marks == {} and read_marks(folder, "node01").note is None  # first check
    assert write_marks(folder, "node01", MARKS) is None
    kept = read_marks(folder, "node01")
    assert (kept.marks, kept.note) == (MARKS, None)
    info = (folder / "marks-node01.json").stat()
    assert info.st_uid == os.geteuid() and info.st_mode & 0o022 == 0 and folder.stat().st_mode & 0o022 == 0
    assert sorted(p.name for p in folder.iterdir()) == ["marks-node01.json"]  # no temporary file left
    assert read_marks(folder, "node02").marks == {}  # keyed by the node
    assert file_name("gpu/../../etc") == f"marks-{sha256(b'gpu/../../etc').hexdigest()[:32]}.json"  # no path


def test_the_state_dir_is_the_option_then_the_environment_then_roots_or_the_users_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert state_dir(tmp_path / "opt", {"CLUSTER_ACCEPT_STATE_DIR": "/x"}) == tmp_path / "opt"
    assert state_dir(None, {"CLUSTER_ACCEPT_STATE_DIR": "/x"}) == Path("/x")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert state_dir(None, {"HOME": "/home/u"}) == Path("/var/lib/cluster-accept")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert state_dir(None, {"HOME": "/home/u"}) == Path("/home/u/.local/state/cluster-accept")
    assert state_dir(None, {"HOME": "/home/u", "XDG_STATE_HOME": "/s"}) == Path("/s/cluster-accept")


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"garbage", "is not JSON"),
        (b"", "is not JSON"),
        (b"null", "holds no marks of format 1 for node 'node01'"),
        (b"[]", "holds no marks of format 1 for node 'node01'"),
        (b'{"format": 1, "node": "node02", "checks": {}}', "holds no marks of format 1 for node 'node01'"),
        (b'{"format": 2, "node": "node01", "checks": {}}', "holds no marks of format 1 for node 'node01'"),
        (b'{"format": 1, "node": "node01", "checks": []}', "its 'checks' is not a mapping of at most 64 checks"),
        (b'{"format": 1, "node": "node01", "checks": {"xid": {"uptime_s": 5}}}', "are not short strings"),
        (b'{"format": 1, "node": "node01", "checks": {"xid": "x"}}', "are not a mapping of names to values"),
        (b"\xff\xfe", "is not JSON"),
        (b" " * (300 * 1024), "is over 262144 bytes"),
    ],
)
def test_a_bad_marks_file_is_named_never_trusted_and_replaced(tmp_path: Path, content: bytes, said: str) -> None:
    assert write_marks(tmp_path, "node01", MARKS) is None
    path = tmp_path / "marks-node01.json"
    path.write_bytes(content)
    kept = read_marks(tmp_path, "node01")
    assert kept.marks == {} and kept.note is not None
    assert (
        kept.note.startswith(f"marks file {path} ") and said in kept.note and kept.note.endswith("not used, replaced")
    )
    assert write_marks(tmp_path, "node01", MARKS) is None  # healed by the next check's marks
    assert read_marks(tmp_path, "node01").marks == MARKS


def test_a_marks_file_that_is_a_link_or_writable_by_others_is_not_trusted(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"format": 1, "node": "node01", "checks": MARKS}))
    folder = tmp_path / "state"
    folder.mkdir(mode=0o755)
    (folder / "marks-node01.json").symlink_to(target)
    kept = read_marks(folder, "node01")
    assert (kept.marks, kept.note) == (
        {},
        f"marks file {folder / 'marks-node01.json'} is a symbolic link: not used, replaced",
    )
    assert write_marks(folder, "node01", {"xid": {"uptime_s": "1.000"}}) is None
    assert not (folder / "marks-node01.json").is_symlink() and json.loads(target.read_text())["checks"] == MARKS

    (folder / "marks-node01.json").chmod(0o666)
    kept = read_marks(folder, "node01")
    assert kept.marks == {} and kept.note is not None and "is writable by others (mode 666)" in kept.note


def test_a_state_dir_that_is_a_link_or_writable_by_others_is_left_alone(tmp_path: Path) -> None:
    real = tmp_path / "real"
    assert write_marks(real, "node01", MARKS) is None
    link = tmp_path / "link"
    link.symlink_to(real)
    assert read_marks(link, "node01").note == f"state dir {link} is a symbolic link: not used"
    assert write_marks(link, "node01", MARKS) == f"marks not kept: state dir {link} is a symbolic link: not used"

    real.chmod(0o777)
    assert read_marks(real, "node01").note == f"state dir {real} is writable by others (mode 777): not used"
    assert write_marks(real, "node01", {}) is not None and read_marks(real, "node01").marks == {}
    real.chmod(0o755)
    assert read_marks(real, "node01").marks == MARKS  # left as it was


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user takes root")
def test_a_marks_file_or_dir_of_another_user_is_not_trusted(tmp_path: Path) -> None:
    assert write_marks(tmp_path / "state", "node01", MARKS) is None
    os.chown(tmp_path / "state" / "marks-node01.json", 65534, 65534)
    kept = read_marks(tmp_path / "state", "node01")
    assert kept.marks == {} and kept.note is not None and "is owned by uid 65534, not this user (0)" in kept.note
    os.chown(tmp_path / "state", 65534, 65534)
    assert write_marks(tmp_path / "state", "node01", MARKS) == (
        f"marks not kept: state dir {tmp_path / 'state'} is owned by uid 65534, not this user (0): not used"
    )
