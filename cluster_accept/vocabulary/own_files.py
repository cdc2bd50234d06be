"""Files written where other users can write too (the temporary directory), so that nothing another user planted
there is followed. Standard library only.

A name in ``/tmp`` is anyone's to take first: a link planted there makes a program that opens the name write
through it to the link's target (root appending to ``/etc/…``), and a directory planted there holds whatever
its owner put in it. So a program keeps its files in a directory of its user's own (:func:`own_dir`: created
0700, and refused when it is a link, another user's, or writable by others) and opens them without following a
link (:func:`append_own`: ``O_NOFOLLOW``, and refused when the file is not a plain file of its own with one
name). A file rewritten whole in such a directory goes through a new file of a random name, created exclusively
(:func:`replace_whole`, :func:`copy_whole`), never a fixed temporary name another user could take first.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
from pathlib import Path
from typing import BinaryIO


def _refusal(path: Path, why: str) -> PermissionError:
    return PermissionError(f"{path} is not safe to write: {why}")


def check_own_dir(path: Path) -> Path:
    """``path`` when it is a directory of this user's own that no one else can write to; PermissionError naming
    why not (a link, not a directory, another user's, writable by its group or others)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise _refusal(path, "it is a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise _refusal(path, "it is not a directory")
    if st.st_uid != os.geteuid():
        raise _refusal(path, f"it belongs to uid {st.st_uid}, not to uid {os.geteuid()}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise _refusal(path, f"others can write to it (mode {stat.S_IMODE(st.st_mode):o})")
    return path


def own_dir(path: Path) -> Path:
    """``path`` as a directory of this user's own: created 0700 when absent (its parent must exist), then held
    to :func:`check_own_dir`."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    return check_own_dir(path)


def append_own(path: Path, text: str) -> None:
    """Append ``text`` to ``path`` without following a link: created 0600 when absent; PermissionError when it is
    not a plain file of this user's own with one name (a hard link to another file), OSError (ELOOP) on a link.
    A FIFO planted in its place is not waited on."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as handle:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refusal(path, "it is not a plain file")
        if st.st_uid != os.geteuid():
            raise _refusal(path, f"it belongs to uid {st.st_uid}, not to uid {os.geteuid()}")
        if st.st_nlink != 1:
            raise _refusal(path, f"it has {st.st_nlink} names (a hard link)")
        handle.write(text)


def replace_whole(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` as ``path``, whole (a reader sees the old file or the new one): into a new file of a random
    name beside it, created exclusively and without following a link, then renamed over ``path`` (which replaces
    a link there, never writes through it). For a file in a directory another user may write to (a
    node_exporter textfile directory)."""
    _write_whole(path, text.encode("utf-8"), None, mode)


def copy_whole(source: Path, path: Path, mode: int = 0o644) -> None:
    """Copy ``source`` as ``path`` the way :func:`replace_whole` writes (a directory that may be shared: the
    history), streamed rather than held whole."""
    with source.open("rb") as read:
        _write_whole(path, b"", read, mode)


def _write_whole(path: Path, data: bytes, stream: BinaryIO | None, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if stream is not None:
                shutil.copyfileobj(stream, handle)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
