"""The typed operations of a node's session (:class:`~remote.session.NodeSession`) carried out as POSIX shell
scripts: what an SSH session and the controller's own session share.

A session that runs scripts (:meth:`ShellSession.run_script`) and copies files (:meth:`ShellSession.put`) gets
every operation above it from here: a batch of commands (:mod:`remote.batch`), a probe directory made and
removed, a free port, a detached command started and polled (:mod:`remote.detached`). Each script's answer is
parsed here and nowhere else, so the layers above see typed answers only, and a session that answers them
without a shell (the scale simulator) never has its operations recognised from script text.
"""

from __future__ import annotations

import re
import shlex
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Sequence

from cluster_accept.remote.batch import (
    PROBE_OUTPUT_CHARS,
    batch_timeout,
    build_batch,
    frames_kept,
    new_nonce,
    parse_batch,
)
from cluster_accept.remote.channel import Keep
from cluster_accept.remote.detached import (
    POLL_ERROR_CHARS,
    POLL_TIMEOUT_S,
    START_ERROR_CHARS,
    START_TIMEOUT_S,
    WRAPPER,
    parse_poll,
    parse_started,
    poll_script,
    start_script,
    tag_pattern,
    wrapper_script,
)
from cluster_accept.remote.result import (
    NoAnswer,
    NodeResult,
    NodeStatus,
    PollAnswer,
    ProbeDirError,
    RemoteCommand,
    SessionLost,
    UnreachableCause,
)
from cluster_accept.vocabulary.secrets import masked_tail

ERROR_TAIL_CHARS = 500  # of a failed batch's stderr in its node's detail: masked whole, then cut (masked_tail)
PROBE_DIR_GLOB = "cluster-accept-probe.*"
_TMP_DIR = re.compile(r"^/[\w./-]*cluster-accept-probe\.\w+$")
PORT_SCRIPT = 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
Answer = tuple[int | None, str, str, bool]  # exit code or None, stdout, stderr, timed out on the client


def port_command(python: str) -> str:
    """The shell line that prints a free port: ``python`` isolated (``-I``: neither the working directory, where
    another user's ``socket.py`` may lie, nor ``PYTHON*`` variables nor the user's site are on its path), started
    in ``/`` all the same."""
    return f"cd / && {shlex.quote(python)} -I -c {shlex.quote(PORT_SCRIPT)}"


def make_dir_script(stale_min: int) -> str:
    """Sweep stale probe directories of dead runs (older than ``stale_min``), then create this run's (its path
    is the last line)."""
    return (
        f'find "${{TMPDIR:-/tmp}}" -maxdepth 1 -name "{PROBE_DIR_GLOB}" -user "$(id -u)" '
        f"-mmin +{int(stale_min)} -exec rm -rf {{}} + 2>/dev/null; "
        'mktemp -d "${TMPDIR:-/tmp}/cluster-accept-probe.XXXXXXXX"'
    )


def script_keep() -> Keep:
    """How much of each stream of a script outside a batch is kept as it arrives: as much as any reader of it
    keeps (a poll's, of a rank's output)."""
    return Keep(PROBE_OUTPUT_CHARS)


def batch_outcome(node: str, commands: Sequence[RemoteCommand], answer: Answer, nonce: str) -> NodeResult:
    """What a batch's script printed, as one result per command and the batch's own end."""
    exit_code, stdout, stderr, timed_out = answer
    results = parse_batch(commands, stdout, stderr, nonce)
    if timed_out:
        for result in results:
            if result.exit_code is None:
                result.timed_out = True
        return NodeResult(node, NodeStatus.OK, None, "the batch hit the client-side timeout", results)
    if exit_code != 0 or any(r.exit_code is None for r in results):
        said = masked_tail(stderr.strip(), ERROR_TAIL_CHARS)
        return NodeResult(node, NodeStatus.ERROR, None, f"batch exited {exit_code}: {said}", results)
    return NodeResult(node, NodeStatus.OK, None, "", results)


class ShellSession(ABC):
    """A session that runs POSIX sh scripts on its node; every typed operation is a script run here."""

    @abstractmethod
    def run_script(self, script: str, timeout_s: float) -> Answer:
        """Run ``script`` with ``sh -c``: (exit code or None, stdout, stderr, timed out on the client). Raises
        :class:`~remote.result.SessionLost` when the node went away under the session."""

    def run_kept(self, script: str, timeout_s: float, keep: Keep) -> Answer:
        """:meth:`run_script`, each stream kept as ``keep`` says while it arrives (:class:`~remote.channel.Kept`).
        A session that has its answer whole at once (a test's) keeps it whole."""
        return self.run_script(script, timeout_s)

    @abstractmethod
    def put(self, local_path: str, remote_path: str) -> None:
        """Copy a file to the node."""

    def close(self) -> None:
        return None

    @property
    def node_name(self) -> str:
        """The node's name, for its results."""
        return ""

    def run_batch(self, commands: Sequence[RemoteCommand], default_timeout_s: float) -> NodeResult:
        """Run ``commands`` as one script (:mod:`remote.batch`); a node lost mid-batch keeps what completed."""
        nonce = new_nonce()
        script = build_batch(commands, default_timeout_s, nonce)
        try:
            answer = self.run_kept(script, batch_timeout(commands, default_timeout_s), frames_kept(commands, nonce))
        except SessionLost as lost:
            results = parse_batch(commands, lost.stdout, lost.stderr, nonce)
            cause = UnreachableCause.SESSION_LOST
            return NodeResult(self.node_name, NodeStatus.UNREACHABLE, cause, lost.detail, results)
        return batch_outcome(self.node_name, commands, answer, nonce)

    def make_probe_dir(self, stale_min: int) -> str:
        """A fresh private directory on the node; raises :class:`~remote.result.ProbeDirError` when the node's
        answer is not one of ours."""
        code, out, err, _ = self.run_script(make_dir_script(stale_min), 60)
        remote_dir = out.strip().splitlines()[-1] if out.strip() else ""
        if code != 0 or not _TMP_DIR.match(remote_dir):
            raise ProbeDirError(f"mktemp failed on the node: {masked_tail(err.strip() or out, START_ERROR_CHARS)}")
        return remote_dir

    def remove_dir(self, remote_dir: str, kill_tag: str | None = None) -> None:
        """Remove a probe directory; with ``kill_tag``, first kill every process of that run on the node."""
        kill = f"pkill -KILL -f -- {shlex.quote(tag_pattern(kill_tag))}; " if kill_tag is not None else ""
        self.run_script(f"{kill}rm -rf {shlex.quote(remote_dir)}", 30)

    def free_port(self, python: str) -> int | NoAnswer:
        """A TCP port free on the node now, picked by its own kernel (for a run's rendezvous)."""
        code, out, err, timed_out = self.run_script(port_command(python), 60)
        text = out.strip().splitlines()[-1] if out.strip() else ""
        if code == 0 and text.isascii() and text.isdigit():
            return int(text)
        said = masked_tail(err.strip() or out.strip(), START_ERROR_CHARS) or f"exit {code}"
        return NoAnswer(f"could not pick a free port: {said}", timed_out or code is None)

    def start_detached(
        self, remote_dir: str, command: RemoteCommand, default_timeout_s: float, tag: str | None
    ) -> int | NoAnswer:
        """Ship the wrapper into ``remote_dir`` and start it (:mod:`remote.detached`): its pid, or why not."""
        self.put_text(wrapper_script(remote_dir, command, default_timeout_s), f"{remote_dir}/{WRAPPER}")
        code, out, err, timed_out = self.run_script(start_script(remote_dir, tag), START_TIMEOUT_S)
        pid = parse_started(code, out)
        if pid is not None:
            return pid
        return NoAnswer(masked_tail(err.strip() or out.strip(), START_ERROR_CHARS) or f"exit {code}", timed_out)

    def poll_detached(self, remote_dir: str, pid: int, kill_pattern: str | None) -> PollAnswer | NoAnswer:
        """One look at a detached command (stopping it first with ``kill_pattern``)."""
        code, out, err, timed_out = self.run_script(poll_script(remote_dir, pid, kill_pattern), POLL_TIMEOUT_S)
        parsed = parse_poll(code, out, err)
        if parsed is not None:
            return parsed
        if timed_out:
            return NoAnswer("no answer in time", timed_out=True)
        return NoAnswer(masked_tail(err.strip(), POLL_ERROR_CHARS) or f"the poll exited {code}", code is None)

    def put_text(self, text: str, remote_path: str) -> None:
        """Ship generated text as probe scripts go: as a file (SFTP, or a copy), never on a command line."""
        with tempfile.NamedTemporaryFile("w", prefix="cluster-accept-", suffix=".sh") as handle:
            handle.write(text)
            handle.flush()
            self.put(handle.name, remote_path)
