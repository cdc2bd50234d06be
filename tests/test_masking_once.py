"""Node text is masked once, where it enters the controller (``remote/``), and says so in its type
(``vocabulary.secrets.MaskedText``): no module outside ``remote/`` masks it again or makes a ``MaskedText``.

Text the controller writes itself (an inventory's value, its own traceback) may be masked where it is written:
each such place is named below with why, and a name there that no longer masks is an error too, so the list stays
short and true."""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import get_type_hints

import cluster_accept
from cluster_accept.checks import infiniband
from cluster_accept.checks.base import error_row
from cluster_accept.remote import ssh
from cluster_accept.remote.fanout import tool_error_detail
from cluster_accept.remote.launch import GroupRun
from cluster_accept.remote.result import CommandResult, PollAnswer, RemoteCommand
from cluster_accept.simulator.nodes import SimulatedSession
from cluster_accept.simulator.recording import Answer, Recording, SimulatedNode
from cluster_accept.tasks.rows import node_row
from cluster_accept.vocabulary import secrets
from cluster_accept.vocabulary.secrets import MaskedText, mask_secrets
from tests.boundary import entered, framed_result

PACKAGE = Path(cluster_accept.__file__).parent
BOUNDARY = "remote/"  # where node text enters the controller
DEFINED_IN = "vocabulary/secrets.py"
# The masking functions of vocabulary/secrets.py; any name of the package starting ``mask_`` or ``masked_`` is
# read as one (a function added there is held by the prefix before this list names it).
MASKING = frozenset({"mask_secrets", "mask_shapes", "mask_value", "masked_cap", "masked_head", "masked_tail"})
MASKING_PREFIXES = ("mask_", "masked_")
# (module, name): why the controller masks text it writes itself there (never node text: that entered masked).
WRITTEN_BY_THE_CONTROLLER = {
    ("checks/nccl_env.py", "mask_secrets"): "a profile's pinned NCCL value (the inventory's text) is compared with "
    "the node's values in the form those take where they enter",
    ("checks/nccl_env.py", "mask_value"): "a profile's pinned NCCL value (the inventory's text) is shown in rows",
    ("flows/exits.py", "mask_secrets"): "the controller's own traceback, written to its error log: an exception's "
    "message may quote an inventory's value",
}


def _modules() -> list[tuple[str, ast.Module]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(BOUNDARY) or relative == DEFINED_IN:
            continue
        found.append((relative, ast.parse(path.read_text(), str(path))))
    return found


def _named(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _masking_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """Every use of a masking function (a call, or the function handed on), and every ``MaskedText`` made (called,
    or cast to), with its line."""
    uses = []
    for node in ast.walk(tree):
        name = _named(node)
        if name is not None and name.startswith(MASKING_PREFIXES) and isinstance(getattr(node, "ctx", None), ast.Load):
            uses.append((node.lineno, name))
        elif isinstance(node, ast.Call) and _named(node.func) == "MaskedText":
            uses.append((node.lineno, "MaskedText"))
        elif isinstance(node, ast.Call) and _named(node.func) == "cast" and node.args:
            target = node.args[0]
            said = target.value if isinstance(target, ast.Constant) else _named(target)
            if said == "MaskedText":
                uses.append((node.lineno, "cast to MaskedText"))
        elif isinstance(node, ast.ImportFrom) and node.module == "cluster_accept.vocabulary.secrets":
            uses += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith(MASKING_PREFIXES)]
    return uses


@functools.cache
def _found() -> dict[tuple[str, str], list[int]]:
    found: dict[tuple[str, str], list[int]] = {}
    for module, tree in _modules():
        for line, name in _masking_uses(tree):
            found.setdefault((module, name), []).append(line)
    return found


def test_no_module_outside_the_boundary_masks_node_text_again() -> None:
    again = {
        f"{module}:{lines[0]} {name}": "masks again"
        for (module, name), lines in _found().items()
        if (module, name) not in WRITTEN_BY_THE_CONTROLLER
    }
    assert not again, (
        "node text is masked once, where it enters the controller (remote/): cut it with vocabulary/text.py "
        f"instead; text the controller writes itself goes in WRITTEN_BY_THE_CONTROLLER, with why: {sorted(again)}"
    )


def test_every_place_the_controller_masks_its_own_text_still_does() -> None:
    found = _found()
    stale = [f"{module} {name}" for module, name in WRITTEN_BY_THE_CONTROLLER if (module, name) not in found]
    assert not stale, f"no longer masks there: take it off WRITTEN_BY_THE_CONTROLLER: {stale}"


def test_the_masking_names_are_every_masking_function_of_the_vocabulary() -> None:
    """A masking function added to vocabulary/secrets.py is held here too."""
    public = {
        name
        for name, value in vars(secrets).items()
        if callable(value) and not name.startswith("_") and value.__module__ == secrets.__name__
    }
    assert {name for name in public if name.startswith("mask")} == MASKING


def test_what_enters_from_a_node_is_typed_masked() -> None:
    for holder, fields in (
        (CommandResult, ("stdout", "stderr")),
        (PollAnswer, ("stdout", "stderr")),
        (GroupRun, ("stdout",)),
    ):
        hints = get_type_hints(holder)
        assert all(hints[name] is MaskedText for name in fields), holder


def test_the_check_finds_masking_again(tmp_path: Path) -> None:
    """The reading above sees each way a module could mask again: called, handed on, imported, made, cast to."""
    text = (
        "from cluster_accept.vocabulary.secrets import MaskedText, masked_head\n"
        "from cluster_accept.vocabulary import secrets\n"
        "from typing import cast\n"
        "a = masked_head(x, 3)\n"
        "b = list(map(secrets.mask_secrets, y))\n"
        "c = MaskedText(z)\n"
        "d = cast('MaskedText', z)\n"
    )
    uses = {name for _, name in _masking_uses(ast.parse(text))}
    assert uses == {"masked_head", "mask_secrets", "MaskedText", "cast to MaskedText"}


# Where node text enters, it is masked: each way in, end to end.

SECRET = "hunter2-S3KR1T"


def test_a_secret_a_node_printed_reaches_no_row_through_the_boundary() -> None:
    """A line a check cannot read is quoted in its error row, cut, never masked by the check: the secret in it was
    masked where the batch's output entered the controller."""
    result = framed_result(f"### ports\nDB_PASSWORD={SECRET} postgres://u:{SECRET}@db/x\n### end\n", name="ib")
    row = infiniband.parse(result.stdout).error
    assert row is not None and "unexpected" in row and SECRET not in row
    stored = node_row("r", "c", "preflight", "n1", error_row("ib", "unparsable_output", row), result.stdout)
    assert SECRET not in repr(stored) and "DB_PASSWORD=***" in stored.raw_output


def test_a_simulated_nodes_answers_enter_masked() -> None:
    answer = Answer(0, f"HF_TOKEN={SECRET}\n", f"curl -u bot:{SECRET} h\n")
    session = SimulatedSession(SimulatedNode("n1"), Recording({"healthy": {"show": answer}}))
    (result,) = session.run_batch([RemoteCommand("show", "show")], 60.0).commands
    assert (result.stdout, result.stderr) == ("HF_TOKEN=***\n", "curl -u bot:*** h\n")


def test_the_controllers_own_errors_are_masked_where_written() -> None:
    try:
        raise ValueError(f"inventory value API_KEY={SECRET}")
    except ValueError as exc:
        detail = tool_error_detail(exc)
    assert SECRET not in detail and "API_KEY=***" in detail


def test_what_ssh_said_is_masked_where_it_enters() -> None:
    text = ssh._text(EOFError(f"banner: SSH-2.0 token={SECRET}"))
    assert SECRET not in text and "token=***" in text


def test_nccl_logs_a_secret_named_variable_masked_where_the_log_enters() -> None:
    line = "[0] NCCL INFO {} set by environment to {}."
    said = entered(line.format("NCCL_IB_AUTH_TOKEN", SECRET) + "\n" + line.format("NCCL_ALGO", "Ring"))
    assert said == line.format("NCCL_IB_AUTH_TOKEN", "***") + "\n" + line.format("NCCL_ALGO", "Ring")
    assert mask_secrets(said) == said  # masking twice changes nothing


# (module, entry point): why a module outside remote/ takes node text in through remote/'s own masking entry point.
ENTERS_THROUGH_REMOTE = {
    ("simulator/nodes.py", "taken_in"): "a simulated node's answers enter as a batch's output enters",
    ("simulator/launch.py", "ended_answer"): "a simulated rank's answer enters as a polled rank's output enters",
}


def _remote_entry_points() -> frozenset[str]:
    """The public functions of remote/ that mask node text (call a masking function or make a MaskedText)."""
    found = set()
    for path in sorted((PACKAGE / BOUNDARY).rglob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and _masking_uses(node):
                found.add(node.name)
    return frozenset(found)


def _entries(tree: ast.Module, entry_points: frozenset[str]) -> list[tuple[int, str]]:
    """Every entry point imported from remote/, or reached through a remote/ module imported whole."""
    remote_modules, uses = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cluster_accept.remote"):
            uses += [(node.lineno, alias.name) for alias in node.names if alias.name in entry_points]
            remote_modules |= {alias.asname or alias.name for alias in node.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in entry_points and _named(node.value) in remote_modules:
            uses.append((node.lineno, node.attr))
    return uses


def test_no_module_outside_the_boundary_calls_remotes_masking_entry_points_but_the_simulator() -> None:
    """Node text enters through remote/ only: a module outside it that hands text to ``taken_in``,
    ``ended_answer`` or ``tool_error_detail`` (or another remote/ function that masks) is taking node text in
    itself; the simulator, a node's stand-in, is the one allowed, by name."""
    entry_points = _remote_entry_points()
    assert {"taken_in", "ended_answer", "tool_error_detail"} <= entry_points
    found = {(module, name) for module, tree in _modules() for _, name in _entries(tree, entry_points)}
    assert found - set(ENTERS_THROUGH_REMOTE) == set(), "node text enters through remote/ alone"
    assert set(ENTERS_THROUGH_REMOTE) <= found, "no longer enters there: take it off ENTERS_THROUGH_REMOTE"
