"""What ``launcher: slurm`` tells Slurm, and how it reads the answer back; pure (no Slurm here).

One ``srun`` step per group: one task per node (``--ntasks-per-node=1``), each running the same shell script
read from srun's standard input (``--input=all``). The script makes a private probe directory, writes the
probe files into it (base64, so the step needs no shared filesystem and no copy over SSH), prints a marker
naming its Slurm node, runs *that node's* command — the very ``torchrun`` line the SSH launcher runs, with
the node rank of the inventory's order — under ``timeout``, and prints its exit status. ``srun --label``
prefixes every line with the task number; the markers turn task numbers back into nodes, so a task that
never started, one stopped with the step and one that failed are told apart.
"""

from __future__ import annotations

import base64
import codecs
import re
import shlex
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cluster_accept.inventory.slurm_settings import SrunSettings
from cluster_accept.remote.launch import FAILURE_GRACE_S
from cluster_accept.vocabulary.secrets import CAP_MARGIN_CHARS
from cluster_accept.vocabulary.text import cut_mark

NODE_MARK = "@@cluster-accept-node "
EXIT_MARK = "@@cluster-accept-exit "
KILL_GRACE_S = 10
# Every step starts in ``/``: Slurm would start it in the controller's directory, or in ``/tmp`` where the node
# lacks that one, and a Python started there finds any user's ``socket.py`` first on its path.
CHDIR = "--chdir=/"
_LABELED = re.compile(r"^\s*(\d+): ?(.*)$")
_GRANTED = re.compile(r"Granted job allocation (\d+)")


def probe_script(files: Mapping[str, bytes], commands: Mapping[str, tuple[str, float | None]]) -> str:
    """The script every task runs: ``files`` (name -> content) in a fresh directory, then the command of its own
    Slurm node (``commands``: Slurm name -> (shell command, timeout in seconds))."""
    lines = [
        'd=$(mktemp -d "${TMPDIR:-/tmp}/cluster-accept-probe.XXXXXXXX") || exit 96',
        "trap 'rm -rf \"$d\"' EXIT",
    ]
    for name, content in files.items():
        encoded = base64.b64encode(content).decode()
        lines += [f"base64 -d > \"$d/{Path(name).name}\" <<'CA_FILE_END'", encoded, "CA_FILE_END"]
    lines += [f'echo "{NODE_MARK}$SLURMD_NODENAME"', 'export CA_PROBE_DIR="$d"', 'case "$SLURMD_NODENAME" in']
    for slurm_name, (command, timeout_s) in commands.items():
        limit = f"timeout -k {KILL_GRACE_S} {int(timeout_s)} " if timeout_s else ""
        lines.append(f"  {shlex.quote(slurm_name)}) {limit}sh -c {shlex.quote(command)}; code=$? ;;")
    lines += [
        '  *) echo "cluster-accept: $SLURMD_NODENAME is not in this run"; code=97 ;;',
        "esac",
        f"printf '\\n%s%s\\n' '{EXIT_MARK}' \"$code\"",  # on a line of its own, whatever came before
        # srun kills the step at a task's bad exit (--kill-on-bad-exit): a failed task waits first, so that its
        # peers, failing of the lost connection, end of themselves and say so (remote.rank_end)
        f'[ "$code" = 0 ] || sleep {FAILURE_GRACE_S}',
        'exit "$code"',
    ]
    return "\n".join(lines) + "\n"


@dataclass
class TaskOutput:
    """One task of the step, read back from srun's labelled output."""

    task: int
    slurm_node: str = ""
    lines: list[str] = field(default_factory=list)
    exit_code: int | None = None


def split_tasks(stdout: str) -> dict[str, TaskOutput]:
    """srun ``--label`` output -> Slurm node name -> what its task printed (markers removed) and its exit
    status; tasks that never printed their node marker are left out (they never started)."""
    tasks: dict[int, TaskOutput] = {}
    for line in stdout.split("\n"):  # only newlines end lines: a probe's carriage returns stay in its line
        found = _LABELED.match(line)
        if not found:
            continue
        task = tasks.setdefault(int(found.group(1)), TaskOutput(int(found.group(1))))
        text = found.group(2)
        if text.startswith(NODE_MARK) and not task.slurm_node:
            task.slurm_node = text[len(NODE_MARK) :].strip()
        elif text.startswith(EXIT_MARK):
            value = text[len(EXIT_MARK) :].strip()
            task.exit_code = int(value) if value.lstrip("-").isdigit() else None
        else:
            task.lines.append(text)
    return {t.slurm_node: t for t in tasks.values() if t.slurm_node}


LABEL_CHARS = 24  # a line's task label (``  12: ``) lies within its first characters
MARK_LINE_CHARS = 256  # of a marker line, what is kept: a node's name, an exit status
STRAY_CHARS = 64 * 1024  # of srun's own lines between the tasks' (none, as a rule)
_LABEL_START = re.compile(r"\s*(\d+):( ?)")


@dataclass
class _Room:
    left: int  # characters of the task's output still kept
    dropped: int = 0  # characters of it read and not kept, as split_tasks would have joined them
    named: bool = False  # its node marker was seen (a second one is the task's own output)


@dataclass
class _Line:
    kind: str  # "keep", "drop", "mark" or "stray"
    room: _Room | None
    shown: bool = False  # some of it is in what is kept
    mark: str = ""  # a marker line's text, as far as it is kept


class TaskKept:
    """srun ``--label`` output kept per task while it arrives (the :class:`~remote.local.Sink` of a step's
    stdout): each task's first ``limit`` characters and the masking margin, its markers whatever its output, and
    the count of the rest on a last line of the task's own (:func:`~vocabulary.text.cut_mark`), so that
    :func:`split_tasks` reads the same tasks and the cap says each task's whole length. A task printing 400 MB
    costs the controller its cap, not 400 MB."""

    def __init__(self, limit: int) -> None:
        self.each = limit + CAP_MARGIN_CHARS + 1
        self.received = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._out: list[str] = []
        self._start = ""  # the current line's start, until what it is is known
        self._line: _Line | None = None
        self._rooms: dict[str, _Room] = {}
        self._stray = STRAY_CHARS
        self._text: str | None = None

    def feed(self, data: bytes) -> None:
        self.received += len(data)
        self._take(self._decoder.decode(data))

    def text(self) -> str:
        """What was kept, a cut line closing each task that printed more than its limit."""
        if self._text is None:
            self._take(self._decoder.decode(b"", final=True))
            if self._start or self._line is not None:
                self._piece("", ended=True)  # a last line without its newline
            for label, room in self._rooms.items():
                if room.dropped:
                    self._out.append(f"{label}: {cut_mark(room.dropped)}\n")
            self._text, self._out = "".join(self._out), []
        return self._text

    def _take(self, text: str) -> None:
        *lines, rest = text.split("\n")
        for line in lines:
            if self._line is not None or self._start or not self._whole(line):
                self._piece(line, ended=True)
        if rest:
            self._piece(rest, ended=False)

    def _whole(self, line: str) -> bool:
        """A whole line of a task's output (no marker) kept or counted at once; False for any other line."""
        found = _LABEL_START.match(line)
        room = self._rooms.get(found.group(1)) if found is not None else None
        if found is None or room is None or line.startswith(EXIT_MARK, found.end()):
            return False
        if not room.named and line.startswith(NODE_MARK, found.end()):
            return False
        size = len(line) - found.end() + 1  # with its newline, as split_tasks joins it
        if room.left <= 0:
            room.dropped += size
        elif room.left >= size:
            self._out.append(line + "\n")
            room.left -= size
        else:
            return False
        return True

    def _piece(self, piece: str, ended: bool) -> None:
        if self._line is None:
            self._start += piece
            if not self._known(ended):
                return
            piece, self._start = self._start, ""
        line = self._line
        assert line is not None
        self._emit(line, piece)
        if ended:
            self._end(line)

    def _known(self, ended: bool) -> bool:
        """Whether the current line's start tells what it is (then :attr:`_line` says, its label kept aside)."""
        start = self._start
        found = _LABEL_START.match(start)
        if found is None:
            if ended or len(start) > LABEL_CHARS:
                self._line = _Line("stray", None)
                return True
            return False
        content = start[found.end() :]
        mark = content.startswith(EXIT_MARK) or content.startswith(NODE_MARK)
        if not ended and (not content and not found.group(2) or not mark and _may_be_mark(content)):
            return False  # the space after the label, or a marker, may still be arriving
        room = self._rooms.setdefault(found.group(1), _Room(self.each))
        if content.startswith(EXIT_MARK) or (content.startswith(NODE_MARK) and not room.named):
            self._line = _Line("mark", room)
        else:
            self._line = _Line("keep" if room.left > 0 else "drop", room)
        if self._line.kind != "drop":  # the label is kept with the line; a dropped line is counted, not kept
            self._out.append(start[: found.end()])
            self._line.shown = True
        self._start = content
        return True

    def _emit(self, line: _Line, text: str) -> None:
        if line.kind == "stray":
            take = min(len(text), self._stray)
            self._stray -= take
        elif line.kind == "mark":
            take = min(len(text), MARK_LINE_CHARS - len(line.mark))
            line.mark += text[:take]
        else:
            assert line.room is not None
            take = min(len(text), line.room.left) if line.kind == "keep" else 0
            line.room.left -= take
            line.room.dropped += len(text) - take
        if take:
            self._out.append(text[:take])
            line.shown = True

    def _end(self, line: _Line) -> None:
        if line.shown:
            self._out.append("\n")
        if line.room is not None and line.mark.startswith(NODE_MARK) and line.mark[len(NODE_MARK) :].strip():
            line.room.named = True  # as split_tasks names a task: by its first marker naming a node
        if line.room is not None and line.kind == "keep":
            line.room.left = max(0, line.room.left - 1)
        elif line.room is not None and line.kind == "drop":
            line.room.dropped += 1
        self._line = None


class EndsKept:
    """srun's own stderr kept while it arrives: its first ``head`` and its last ``tail`` characters (what went
    wrong first, and srun's last words on each task), with how much between them was not kept."""

    def __init__(self, head: int, tail: int) -> None:
        self.received = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._head: list[str] = []
        self._head_left = head
        self._tail: deque[str] = deque()
        self._tail_chars = 0
        self._tail_max = tail
        self._dropped = 0
        self._text: str | None = None

    def feed(self, data: bytes) -> None:
        self.received += len(data)
        self._add(self._decoder.decode(data))

    def text(self) -> str:
        if self._text is None:
            self._add(self._decoder.decode(b"", final=True))
            tail = "".join(self._tail)
            over = max(0, len(tail) - self._tail_max)
            dropped = self._dropped + over
            between = f"\n… [{dropped:,} characters not kept here] …\n" if dropped else ""
            self._text = "".join(self._head) + between + tail[over:]
        return self._text

    def _add(self, text: str) -> None:
        take = min(len(text), self._head_left)
        if take:
            self._head.append(text[:take])
            self._head_left -= take
        if len(text) > take:
            self._tail.append(text[take:])
            self._tail_chars += len(text) - take
        while self._tail and self._tail_chars - len(self._tail[0]) >= self._tail_max:
            first = self._tail.popleft()
            self._tail_chars -= len(first)
            self._dropped += len(first)


def _may_be_mark(content: str) -> bool:
    """Whether a line starting with ``content`` could still turn out to be a marker."""
    return len(content) < len(NODE_MARK) and (NODE_MARK.startswith(content) or EXIT_MARK.startswith(content))


def srun_errors_for(stderr: str, slurm_node: str) -> str:
    """srun's own error lines that name ``slurm_node`` (a task launch that failed there)."""
    named = re.compile(rf"(?<![\w.-]){re.escape(slurm_node)}(?![\w.-])")
    return "; ".join(
        line.strip() for line in stderr.splitlines() if line.lstrip().startswith("srun:") and named.search(line)
    )


def salloc_argv(
    nodelist: Sequence[str], settings: SrunSettings, name: str, gpus_per_node: int | None, salloc: str = "salloc"
) -> list[str]:
    """``salloc --no-shell`` for exactly these Slurm nodes, failing after ``allocation_wait_s``."""
    argv = [
        salloc, "--no-shell", f"--nodes={len(nodelist)}", f"--nodelist={','.join(nodelist)}",
        f"--job-name={name}", f"--time={settings.time_limit_min}", f"--immediate={settings.allocation_wait_s}",
    ]  # fmt: skip
    argv += ["--exclusive"] if settings.exclusive else []
    for option, value in (
        ("partition", settings.partition),
        ("account", settings.account),
        ("qos", settings.qos),
        ("reservation", settings.reservation),
    ):
        if value:
            argv.append(f"--{option}={value}")
    if gpus_per_node and settings.gpus_per_node:
        argv.append(f"--gpus-per-node={gpus_per_node}")
    return argv


def granted_job(salloc_stderr: str) -> str | None:
    """The job id salloc was granted, from its ``Granted job allocation N`` line."""
    found = _GRANTED.search(salloc_stderr)
    return found.group(1) if found else None


def srun_argv(
    job_id: str,
    nodelist: Sequence[str],
    settings: SrunSettings,
    time_limit_min: int | None,
    srun: str = "srun",
    job_name: str = "cluster-accept",
) -> list[str]:
    """One task per node of ``nodelist`` in job ``job_id``, the script on standard input, output labelled; the
    step is killed as soon as any task fails (its peers would wait for it until their own timeout)."""
    argv = [
        srun, f"--jobid={job_id}", f"--nodes={len(nodelist)}", f"--ntasks={len(nodelist)}", "--ntasks-per-node=1",
        f"--nodelist={','.join(nodelist)}", "--overlap", "--label", "--input=all", "--kill-on-bad-exit=1",
        "--export=ALL", "--quit-on-interrupt", f"--job-name={job_name}", CHDIR,
    ]  # fmt: skip
    if time_limit_min:
        argv.append(f"--time={time_limit_min}")
    return [*argv, *settings.srun_args, "/bin/sh", "-s"]
