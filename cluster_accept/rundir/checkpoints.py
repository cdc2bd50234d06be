"""Checkpoints in the run directory, so a run killed mid-way resumes without redoing finished work.

Each node's raw result (one :class:`~remote.result.NodeResult`, whichever stage) is saved the moment its task
finishes (``checkpoints/<stage>/<node>.json``, written atomically), before the controller even looks at it; the
multi-node stage, which the controller drives as one sequence, is saved whole when it completes. Both are
written and read back by one codec (:mod:`vocabulary.codec`), derived from their classes' fields: what is read
back is held to the shape written, and another shape counts as not saved. On ``--resume`` the saved results are
loaded instead of running those nodes again, and every stage is evaluated over all of its nodes exactly as in a
clean run, so the final tables hold the same rows, once. Only raw outputs are saved: parsing is pure and redone on load.
A node's outputs are saved as its result holds them: masked where they entered the controller
(:func:`remote.batch.parse_batch`), so that a run that never finishes leaves no secret behind.

A checkpoint is written through a new file of a random name (:func:`vocabulary.own_files.replace_whole`), never
through a link planted at a fixed name, and read back only when it is a plain file of the user resuming that no
one else can write to: a link, another user's file or a group- or world-writable one is named in the log and its
node (or stage) runs again, since what is saved there becomes that node's rows without being measured again.

The checkpoints are removed when the run has finished and its tables, history and report are written.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import stat
from pathlib import Path
from typing import Any, TypeVar

from cluster_accept.remote.result import NodeResult
from cluster_accept.vocabulary.codec import from_data, to_data
from cluster_accept.vocabulary.own_files import replace_whole

DIRECTORY = "checkpoints"
_T = TypeVar("_T")
log = logging.getLogger(__name__)


class RefusedCheckpoint(ValueError):
    """A checkpoint that is not this user's own plain file: it is not trusted, and its work is done again."""


def _write_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_whole(path, json.dumps(data, default=str), mode=0o600)


def _read_own(path: Path) -> Any:
    """The JSON in ``path``, opened without following a link (nor waiting on a FIFO), when it is a plain file of
    this user's own that neither its group nor others can write; :class:`RefusedCheckpoint` naming why not."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RefusedCheckpoint(f"{path} is a symbolic link") from exc
        raise
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RefusedCheckpoint(f"{path} is not a plain file")
        if st.st_uid != os.geteuid():
            raise RefusedCheckpoint(f"{path} belongs to uid {st.st_uid}, not to uid {os.geteuid()}")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise RefusedCheckpoint(f"others can write to {path} (mode {stat.S_IMODE(st.st_mode):o})")
        return json.loads(handle.read())


class Checkpoints:
    def __init__(self, run_dir: Path) -> None:
        self.root = run_dir / DIRECTORY
        self.refused: list[str] = []  # the checkpoints not trusted, each with why: their work was done again

    def _refuse(self, refusal: RefusedCheckpoint) -> None:
        self.refused.append(str(refusal))
        log.warning("checkpoint not used, its work is done again: %s", refusal)

    def save_node(self, stage: str, result: NodeResult) -> None:
        """A node's result of ``stage``, as the remote boundary gave it (its outputs masked there)."""
        _write_atomic(self.root / stage / f"{result.node}.json", node_result_to_data(result))

    def load_nodes(self, stage: str) -> dict[str, NodeResult]:
        """Saved node results of ``stage`` by node; a file cut short by a crash, or not one of ours (another
        shape, another node's, a link, another user's file), counts as not saved (the node runs again)."""
        found: dict[str, NodeResult] = {}
        for path in sorted((self.root / stage).glob("*.json")):
            try:
                result = node_result_from_data(_read_own(path))
            except RefusedCheckpoint as refusal:
                self._refuse(refusal)
                continue
            except (OSError, ValueError, RecursionError):  # ShapeError is a ValueError
                continue
            if result.node == path.stem:  # another node's result under this name is not this node's
                found[path.stem] = result
        return found

    def save_stage(self, stage: str, outcome: Any) -> None:
        """A stage's whole outcome (a dataclass), through the codec."""
        _write_atomic(self.root / f"{stage}.json", to_data(outcome))

    def load_stage(self, stage: str, kind: type[_T]) -> _T | None:
        """The stage's saved outcome as ``kind``; None where none was saved, or what is there is not of its shape
        (cut, edited, another version's): the stage runs again rather than the resumed run stopping on it."""
        try:
            return from_data(kind, _read_own(self.root / f"{stage}.json"))
        except RefusedCheckpoint as refusal:
            self._refuse(refusal)
            return None
        except (OSError, ValueError, RecursionError):  # ShapeError is a ValueError
            return None

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def node_result_to_data(result: NodeResult) -> dict[str, Any]:
    data: dict[str, Any] = to_data(result)
    return data


def node_result_from_data(data: Any) -> NodeResult:
    """A saved node result, held to the shape :func:`node_result_to_data` writes (the codec's, from its fields: a
    ``true`` is no exit status, a number no output, an extra key no command); another shape raises
    :class:`~cluster_accept.vocabulary.codec.ShapeError`, a ValueError (the node counts as not saved and runs
    again)."""
    return from_data(NodeResult, data)
