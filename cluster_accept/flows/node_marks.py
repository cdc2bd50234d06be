"""Where a node's own check (``cluster-accept check --local``) keeps its checks' marks from one check to the next:
what a run keeps in the history as ``mark:`` keys (:attr:`checks.base.Check.marks`), kept on the node itself, so
that a kernel-log event is judged by one check and passes as seen before in the next. A Slurm prolog checks the
node before every job: without marks, one XID would be judged again before every job until the node reboots.

The file is ``<state dir>/marks-<node>.json`` (the inventory's name of the node). The state dir is
``--state-dir``, else ``$CLUSTER_ACCEPT_STATE_DIR``, else ``/var/lib/cluster-accept`` for root, and
``$XDG_STATE_HOME/cluster-accept`` (``~/.local/state/cluster-accept``) for any other user. Marks decide what
passes, so they are used only where no one but the checking user could have written them: the directory and the
file are owned by the effective user, writable by no group and no other user, and neither is a symbolic link
(each is opened without following one, the file through the directory's descriptor). A file that breaks these
rules or does not hold marks in their shape is named, not trusted (every event since boot is then judged as new,
as on the first check) and replaced by this check's marks; a directory that breaks them is named and left alone,
and nothing is kept.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path

STATE_DIR_ENV = "CLUSTER_ACCEPT_STATE_DIR"
ROOT_STATE_DIR = Path("/var/lib/cluster-accept")
FORMAT = 1
MAX_FILE_BYTES = 256 * 1024  # a node's marks are a few hundred bytes: more is not a marks file
MAX_CHECKS = 64
MAX_MARKS = 4096  # per check (ib_counters keeps two per port)
MAX_TEXT = 256  # a check name, a mark's name or value
_SAFE_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class MarksError(Exception):
    """The state dir or the marks file cannot be trusted or used: the message says which and why."""


@dataclass
class KeptMarks:
    """What the node's previous check left: check -> {mark: value}; ``note`` says why nothing usable was found
    when there was something (empty on the first check)."""

    marks: dict[str, dict[str, str]] = field(default_factory=dict)
    note: str | None = None


def state_dir(option: Path | None, environ: Mapping[str, str]) -> Path:
    """``--state-dir``, else ``$CLUSTER_ACCEPT_STATE_DIR``, else root's ``/var/lib/cluster-accept`` or the
    user's own ``$XDG_STATE_HOME/cluster-accept``."""
    if option is not None:
        return option
    if environ.get(STATE_DIR_ENV):
        return Path(environ[STATE_DIR_ENV])
    if os.geteuid() == 0:
        return ROOT_STATE_DIR
    base = environ.get("XDG_STATE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".local" / "state")
    return Path(base) / "cluster-accept"


def file_name(node: str) -> str:
    """``marks-<node>.json``; a node name that is no plain file name is replaced by its digest."""
    safe = node if _SAFE_NODE.fullmatch(node) else sha256(node.encode()).hexdigest()[:32]
    return f"marks-{safe}.json"


def _owned(info: os.stat_result, what: str, path: Path) -> None:
    if info.st_uid != os.geteuid():
        raise MarksError(f"{what} {path} is owned by uid {info.st_uid}, not this user ({os.geteuid()})")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise MarksError(f"{what} {path} is writable by others (mode {stat.S_IMODE(info.st_mode):o})")


def _open_dir(directory: Path, create: bool) -> int:
    """The state dir's descriptor, opened without following a link and held to :func:`_owned`; created (with
    its parents, the user's own) when ``create``."""
    if create and not os.path.lexists(directory):
        directory.parent.mkdir(mode=0o755 if os.geteuid() == 0 else 0o700, parents=True, exist_ok=True)
        try:
            directory.mkdir(mode=0o755 if os.geteuid() == 0 else 0o700)
        except FileExistsError:
            pass  # another check made it meanwhile: held to the same rules below
    try:
        fd = os.open(directory, _OPEN_DIR)
    except OSError as exc:
        why = "is a symbolic link" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else exc.strerror
        raise MarksError(f"state dir {directory} {why}: not used") from None
    try:
        _owned(os.fstat(fd), "state dir", directory)
    except MarksError as exc:
        os.close(fd)
        raise MarksError(f"{exc}: not used") from None
    return fd


def _marks_of(data: object, node: str) -> dict[str, dict[str, str]]:
    """The marks ``data`` holds, in their shape (format, node, check -> {mark: value}, strings all, bounded)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("node") != node:
        raise MarksError(f"holds no marks of format {FORMAT} for node {node!r}")
    checks = data.get("checks")
    if not isinstance(checks, dict) or len(checks) > MAX_CHECKS:
        raise MarksError(f"its 'checks' is not a mapping of at most {MAX_CHECKS} checks")
    found: dict[str, dict[str, str]] = {}
    for check, marks in checks.items():
        if not isinstance(marks, dict) or len(marks) > MAX_MARKS or len(check) > MAX_TEXT:
            raise MarksError(f"its marks of check {check[:MAX_TEXT]!r} are not a mapping of names to values")
        if not all(isinstance(v, str) and len(k) <= MAX_TEXT and len(v) <= MAX_TEXT for k, v in marks.items()):
            raise MarksError(f"its marks of check {check[:MAX_TEXT]!r} are not short strings")
        found[check] = dict(marks)
    return found


def _read(fd: int, path: Path, node: str) -> dict[str, dict[str, str]]:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise MarksError(f"marks file {path} is not a regular file")
    _owned(info, "marks file", path)
    with os.fdopen(os.dup(fd), "rb") as stream:
        raw = stream.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise MarksError(f"marks file {path} is over {MAX_FILE_BYTES} bytes")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise MarksError(f"marks file {path} is not JSON ({exc})") from None
    try:
        return _marks_of(data, node)
    except MarksError as exc:
        raise MarksError(f"marks file {path} {exc}") from None


def read_marks(directory: Path, node: str) -> KeptMarks:
    """The marks the node's previous check kept, where they can be trusted; none (with a note saying why)
    otherwise. Never raises: marks that cannot be read are marks not used."""
    name = file_name(node)
    try:
        dir_fd = _open_dir(directory, create=False)
    except MarksError as exc:
        return KeptMarks(note=None if not os.path.lexists(directory) else str(exc))
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            return KeptMarks()
        except OSError as exc:
            why = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot be read ({exc.strerror})"
            return KeptMarks(note=f"marks file {directory / name} {why}: not used, replaced")
        try:
            return KeptMarks(_read(fd, directory / name, node))
        except (MarksError, OSError) as exc:
            return KeptMarks(note=f"{exc}: not used, replaced")
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)


def write_marks(directory: Path, node: str, marks: Mapping[str, Mapping[str, str]]) -> str | None:
    """Keep ``marks`` (check -> {mark: value}) as the node's marks file, written whole and renamed into place
    (a check reading meanwhile sees the old file or the new one; a link or a stranger's file in its place is
    replaced, never written through). Returns why nothing was kept, or None."""
    name = file_name(node)
    text = json.dumps({"format": FORMAT, "node": node, "checks": {c: dict(m) for c, m in marks.items()}}, indent=1)
    try:
        dir_fd = _open_dir(directory, create=True)
    except (MarksError, OSError) as exc:
        return f"marks not kept: {exc}"
    tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text + "\n")
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        return f"marks not kept in {directory / name}: {exc.strerror or exc}"
    finally:
        os.close(dir_fd)
    return None
