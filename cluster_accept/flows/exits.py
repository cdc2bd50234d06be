"""The command line's exit codes, and what it does when the tool itself fails.

Automation reads the exit code, so each says one thing: 0 every tested node accepted; 1 a node not accepted
(rejected or unreachable); 2 a usage or inventory error, or no node to test (nothing was tested); 3 the tool
failed (an internal error, Prefect's API did not start, the run directory is in use by another controller, the
disk filled mid-run, or the controller failed on some node: those nodes are ``tool_error``, never rejected or
drained for it).

A run that tests no node (every selected node excluded in the inventory) exits 2 as well: it is refused
before it starts, and a run that ends with every node skipped says so, since 0 would read as "accepted" and
nothing was.

A failure of the tool prints one line on stderr and keeps the traceback in a log file (secrets masked, as
everywhere a run writes), so that a terminal or a cron mail says what happened and where to look, and a bug
report has the whole story. Without a run directory to hold it, the log goes to a directory of the user's own
in the temporary directory, never through a link another user planted there (:func:`log_failure`). Prefect logs
a failed flow's exception with its traceback on its own console handler first;
:func:`keep_run_tracebacks_off_the_console` keeps those records off the terminal.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from cluster_accept.vocabulary.own_files import append_own, own_dir
from cluster_accept.vocabulary.text import visible

if TYPE_CHECKING:
    from rich.console import Console

    from cluster_accept.inventory.load import InventoryError

ACCEPTED = 0
NOT_ACCEPTED = 1
USAGE_ERROR = 2
TOOL_FAILURE = 3
ERROR_LOG = "cluster-accept-errors.log"
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")  # where Prefect logs a failed run's exception


@functools.cache
def console(stderr: bool = False) -> Console:
    """The command line's rich console on stdout (or stderr), made at its first use: a node's own check that has
    nothing to say never loads rich."""
    from rich.console import Console

    return Console(stderr=stderr)


def say(line: str) -> None:
    """One line on stderr as it is: control characters shown as escapes, no rich markup, never wrapped."""
    console(stderr=True).print(visible(line), highlight=False, markup=False, soft_wrap=True)


def usage_error(message: str) -> typer.Exit:
    """``error: MESSAGE`` on stderr (``error:`` in red); exit 2."""
    console(stderr=True).print(f"[red]error:[/red] {message}", highlight=False, markup=True, soft_wrap=True)
    return typer.Exit(USAGE_ERROR)


def inventory_error(exc: InventoryError) -> typer.Exit:
    """One line per problem, each naming the file and the key; exit 2."""
    for problem in exc.problems:
        say(f"{exc.source}: {problem}")
    return typer.Exit(USAGE_ERROR)


def own_temp_dir() -> Path:
    """This user's own directory in the temporary directory, ``cluster-accept-UID`` (0700, checked: another
    user's directory or link of that name is refused, never written through)."""
    return Path(tempfile.gettempdir()) / f"cluster-accept-{os.geteuid()}"


def _log_folders(out_dir: Path | None) -> list[Callable[[], Path]]:
    """Where the error log may go, in order, each made when it is tried: ``out_dir``, this user's own temporary
    directory, a fresh private one (the temporary directory is shared: a name there may be another user's)."""

    def given(folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    tried: list[Callable[[], Path]] = [] if out_dir is None else [functools.partial(given, out_dir)]
    return [*tried, lambda: own_dir(own_temp_dir()), lambda: Path(tempfile.mkdtemp(prefix="cluster-accept-"))]


def log_failure(exc: BaseException, out_dir: Path | None) -> Path:
    """Append ``exc`` with its traceback to ``OUT/cluster-accept-errors.log``, else (no ``out_dir``, or one that
    cannot be written) to this user's own temporary directory (:func:`own_temp_dir`), else to a fresh private
    one; never through a link (:func:`~vocabulary.own_files.append_own`). The log's path."""
    from cluster_accept.vocabulary.secrets import mask_secrets

    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    # The controller's own text, masked where it is written: an exception's message quotes whatever the failing
    # code held (an inventory's value, a pydantic error echoing its input); node text in it is masked already.
    text = f"--- {stamp} pid {os.getpid()}\n" + mask_secrets("".join(traceback.format_exception(exc)))
    for folder in _log_folders(out_dir):
        try:
            path = folder() / ERROR_LOG
            append_own(path, text)
            return path
        except OSError:
            continue
    return own_temp_dir() / ERROR_LOG


def failure_line(exc: BaseException, log: Path) -> str:
    """The one line a tool failure prints: what failed, and where the traceback is."""
    said = " ".join(str(exc).split())[:300] or type(exc).__name__
    return f"error: cluster-accept failed ({type(exc).__name__}: {said}); traceback in {log}"


class _NoRunTracebacks(logging.Filter):
    """Drops a flow or task run's records that carry a traceback; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and record.name in RUN_LOGGERS)


def keep_run_tracebacks_off_the_console() -> None:
    """Prefect logs a failed run's exception with its traceback (``Encountered exception during execution``)
    on the console before the CLI can say its one line; the exception still reaches the CLI, which writes the
    traceback to the error log (:func:`log_failure`). Only Prefect's console handlers are filtered: its API
    handler, when logging to the API is on, keeps the records. Idempotent; needs Prefect's logging set up
    (``import prefect`` does it)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler) and not any(
            isinstance(f, _NoRunTracebacks) for f in handler.filters
        ):
            handler.addFilter(_NoRunTracebacks())
