"""Node text as the controller holds it: taken in where it enters (a batch's frames, read by
:func:`cluster_accept.remote.batch.parse_batch`), masked and capped there, once. A test of a parser that must hold
no secret feeds it what this gives, as a node's session would."""

from __future__ import annotations

from cluster_accept.remote.batch import parse_batch
from cluster_accept.remote.result import CommandResult, RemoteCommand

NONCE = "0123456789abcdef"


def framed_result(stdout: str, stderr: str = "", code: int = 0, name: str = "c") -> CommandResult:
    """One command's result as the boundary reads it from a batch that printed ``stdout`` and ``stderr``."""
    mark = f"@@CA:{NONCE}:0:"
    out = f"{mark}out\n{stdout}\n{mark}end:{code}\n"
    err = f"{mark}err\n{stderr}\n{mark}errend\n"
    (result,) = parse_batch([RemoteCommand(name, "true")], out, err, NONCE)
    return result


def entered(text: str) -> str:
    """``text`` printed by a node, as the controller holds it once it entered."""
    return framed_result(text).stdout
