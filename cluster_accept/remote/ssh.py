"""SSH sessions to nodes through Fabric/paramiko — the only module of the project that imports them.

What this module guarantees, whatever the inventory says:
- never interactive: no password, passphrase or host-key prompt, ever (paramiko never prompts; a key that
  needs a passphrase is an ``auth`` failure);
- host keys: ``strict`` loads the inventory's known_hosts and refuses unknown or changed keys (Fabric
  alone would trust any key: fabric #2071); ``accept-new`` trusts a key seen for the first time and
  appends it to known_hosts under a process-wide lock (concurrent rewrites would lose entries);
- one fresh :class:`fabric.Config` per connection (a shared one breaks across threads) built over one
  ssh_config parsed once (re-reading ~/.ssh/config per host is slow at 1,000 nodes);
- failures to connect come back as an :class:`~remote.result.UnreachableCause`; a failure on the controller's
  side (its key file gone, no file descriptors, a bug of ours) is raised: no fact about the node;
- a node that goes away under an open session (crash, reboot, sshd killed, network cut) raises
  :class:`~remote.result.SessionLost` with what arrived until then;
- new connections through one jump host are throttled: a bastion's sshd drops bursts (MaxStartups).
"""

from __future__ import annotations

import errno
import random
import shlex
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
from fabric import Config, Connection

from cluster_accept.inventory.model import Node, SshSettings, parse_jump
from cluster_accept.remote.channel import Keep, Kept, follow
from cluster_accept.remote.result import NodeRefused, SessionLost, Unreachable, UnreachableCause
from cluster_accept.remote.shell import ShellSession, script_keep
from cluster_accept.vocabulary.secrets import mask_secrets

JUMP_CONNECTS_IN_FLIGHT = 8
RETRIES_ON_PROTOCOL_ERROR = 3
AUTH_TIMEOUT_MIN_S = 30.0
AUTH_TIMED_OUT = "authentication did not finish in time"
KEEPALIVE_S = 30
SESSION_ENDED = "transport shut down or saw eof"  # paramiko: the connection closed during authentication
# Errors of the controller itself, not of the network or the node: raised, never reported as the node's.
_CONTROLLER_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.ENOSPC})
_NETWORK_ERRNOS = frozenset(
    {errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH}
)

# Worth another try: a dropped handshake (MaxStartups), a session that closed while it opened (a node that
# rebooted comes back refused or timing out on the next try, which then says so).
_TRANSIENT = frozenset({UnreachableCause.PROTOCOL, UnreachableCause.SESSION_LOST})

_known_hosts_lock = threading.Lock()
_jump_slots_lock = threading.Lock()
_jump_slots: dict[str, threading.BoundedSemaphore] = {}
_ssh_config_lock = threading.Lock()
_ssh_config: paramiko.SSHConfig | None = None


def _user_ssh_config() -> paramiko.SSHConfig:
    """~/.ssh/config (and /etc/ssh/ssh_config), parsed once per process."""
    global _ssh_config
    with _ssh_config_lock:
        if _ssh_config is None:
            config = paramiko.SSHConfig()
            for path in (Path("/etc/ssh/ssh_config"), Path("~/.ssh/config").expanduser()):
                if path.is_file():
                    try:
                        with path.open() as handle:
                            config.parse(handle)
                    except (OSError, paramiko.SSHException):
                        continue
            _ssh_config = config
        return _ssh_config


class _AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """Trust on first use: remember an unknown key in known_hosts. A *changed* key still fails."""

    def __init__(self, known_hosts: Path | None):
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        if self.known_hosts is None:
            return
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with _known_hosts_lock:
            self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
            with self.known_hosts.open("a") as handle:
                handle.write(line)


def _connect_kwargs(ssh: SshSettings) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "banner_timeout": ssh.connect_timeout_s,
        # The node answered; key exchange and authentication are CPU work on both ends, slow on a loaded
        # node or controller (hundreds of sessions at once): give them longer than the TCP connect.
        "auth_timeout": max(AUTH_TIMEOUT_MIN_S, 3 * (ssh.connect_timeout_s or 0)),
        "password": None,
        "passphrase": None,
    }
    if ssh.identity_file:
        kwargs["key_filename"] = [str(Path(ssh.identity_file).expanduser())]
    return kwargs


def _harden(connection: Connection, ssh: SshSettings) -> None:
    """Replace Fabric's trust-everything host key handling with the inventory's policy."""
    known_hosts = Path(ssh.known_hosts).expanduser() if ssh.known_hosts else None
    client: paramiko.SSHClient = connection.client
    if known_hosts is not None and known_hosts.is_file():
        client.load_host_keys(str(known_hosts))
    elif known_hosts is None:
        client.load_system_host_keys()
    if ssh.host_key_policy == "accept-new":
        client.set_missing_host_key_policy(_AcceptNewPolicy(known_hosts))
    else:
        client.set_missing_host_key_policy(paramiko.RejectPolicy())


def _connection(host: str, ssh: SshSettings, gateway: Connection | None = None) -> Connection:
    config = Config(ssh_config=_user_ssh_config())  # one Config per Connection: shared ones break
    connection = Connection(
        host,
        user=ssh.user,
        port=ssh.port,
        config=config,
        gateway=gateway,
        connect_timeout=max(1, int(round(ssh.connect_timeout_s or 10))),
        connect_kwargs=_connect_kwargs(ssh),
    )
    _harden(connection, ssh)
    return connection


def _controller_side(exc: BaseException) -> bool:
    """A failure of the controller, not of the node: its key file missing or unreadable, no file descriptors or
    memory left, or a Python error of ours (not a network or SSH error)."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, MemoryError)):
        return True
    if isinstance(exc, OSError):
        return exc.errno in _CONTROLLER_ERRNOS
    if isinstance(exc, ValueError):  # paramiko reads a key it cannot use as a ValueError naming the key
        return "key" not in _text(exc).lower()
    return not isinstance(exc, (paramiko.SSHException, EOFError))


def classify(exc: BaseException) -> Unreachable:
    """Map whatever paramiko/socket raised into a cause an operator can act on. A failure on the controller's
    side is no cause of the node's: it is raised again (the caller reports the tool's error)."""
    if isinstance(exc, Unreachable):
        return exc
    if _controller_side(exc):
        raise exc
    text = _text(exc)
    if isinstance(exc, socket.gaierror):
        return Unreachable(UnreachableCause.DNS, text)
    if isinstance(exc, paramiko.BadHostKeyException):
        return Unreachable(
            UnreachableCause.HOST_KEY,
            f"host key changed (got {exc.key.get_fingerprint().hex()}): possible impersonation or re-install",
        )
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        codes = {getattr(e, "errno", None) for e in exc.errors.values()}
        if codes & {errno.ECONNREFUSED}:
            return Unreachable(UnreachableCause.REFUSED, text)
        if codes & {errno.EHOSTUNREACH, errno.ENETUNREACH}:
            return Unreachable(UnreachableCause.NO_ROUTE, text)
        if codes & {errno.ETIMEDOUT}:
            return Unreachable(UnreachableCause.TIMEOUT, text)
        return Unreachable(UnreachableCause.ERROR, text)
    if isinstance(exc, ConnectionRefusedError):
        return Unreachable(UnreachableCause.REFUSED, text)
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return Unreachable(UnreachableCause.TIMEOUT, f"no answer within the connect timeout ({text})")
    if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return Unreachable(UnreachableCause.NO_ROUTE, text)
    if isinstance(exc, paramiko.SSHException) and SESSION_ENDED in text.lower():
        # The connection closed while the session opened: the node (or its sshd) went away, not a refused key.
        return Unreachable(
            UnreachableCause.SESSION_LOST, f"the connection closed while the session was opening ({text})"
        )
    if isinstance(exc, paramiko.AuthenticationException) and "timeout" in text.lower():
        # Not a refused key: the node was too slow to answer (load); retried, then reported as a timeout.
        return Unreachable(UnreachableCause.TIMEOUT, f"{AUTH_TIMED_OUT} ({text})")
    if isinstance(exc, (paramiko.AuthenticationException, paramiko.PasswordRequiredException)):
        return Unreachable(UnreachableCause.AUTH, text)
    if isinstance(exc, paramiko.SSHException):
        if "not found in known_hosts" in text:
            return Unreachable(UnreachableCause.HOST_KEY, f"unknown host key under 'strict' policy: {text}")
        if "banner" in text.lower() or "reset" in text.lower() or "closed" in text.lower():
            return Unreachable(UnreachableCause.PROTOCOL, text)
        if "authentication" in text.lower() or "no authentication methods" in text.lower():
            return Unreachable(UnreachableCause.AUTH, text)
        return Unreachable(UnreachableCause.PROTOCOL, text)
    if isinstance(exc, (ConnectionResetError, EOFError)):
        return Unreachable(UnreachableCause.PROTOCOL, text)
    if isinstance(exc, OSError) and exc.errno in _NETWORK_ERRNOS:
        return Unreachable(
            UnreachableCause.SESSION_LOST, f"the connection broke while the session was opening ({text})"
        )
    if isinstance(exc, ValueError):
        return Unreachable(UnreachableCause.AUTH, text)
    return Unreachable(UnreachableCause.ERROR, f"{type(exc).__name__}: {text}")


def _text(exc: BaseException) -> str:
    """What paramiko or the socket said, masked: it may quote the node (its banner, its disconnect message, an
    SFTP server's error), and it enters the controller here."""
    return mask_secrets((str(exc) or type(exc).__name__).replace("[Errno None] ", ""))


def _decoded(out: Kept, err: Kept) -> tuple[str, str]:
    return out.text(), err.text()


def _jump_slot(jump: str) -> threading.BoundedSemaphore:
    with _jump_slots_lock:
        if jump not in _jump_slots:
            _jump_slots[jump] = threading.BoundedSemaphore(JUMP_CONNECTS_IN_FLIGHT)
        return _jump_slots[jump]


@dataclass
class SshSession(ShellSession):
    """An open session to one node, reused for all of that node's operations (each a shell script)."""

    node: Node
    connection: Connection

    @property
    def node_name(self) -> str:
        return self.node.name

    def run_script(self, script: str, timeout_s: float) -> tuple[int | None, str, str, bool]:
        return self.run_kept(script, timeout_s, script_keep())

    def run_kept(self, script: str, timeout_s: float, keep: Keep) -> tuple[int | None, str, str, bool]:
        """Run a POSIX sh script (as ``sh -c '<script>'``, whatever the login shell is), its streams kept as
        ``keep`` says while they arrive.

        Returns (exit code or None, stdout, stderr, timed out on the client). Reads the channel directly:
        when a node dies mid-command its channel closes without an exit status, and waiting for one (as
        Fabric's runner does) would block until the client-side timeout. Raises :class:`SessionLost` when the
        connection closes, is reset, or stops answering before the exit status comes (a node that lost power
        sends nothing at all: after :data:`SILENCE_CHECK_S` without output, and at the client-side timeout, a
        channel is opened beside the command to see whether the node is still there).
        """
        command_line = "sh -c " + shlex.quote(script)
        transport = self.connection.transport
        if transport is None or not transport.is_active():
            raise SessionLost("the SSH session had closed before the command was sent")
        out, err = keep.streams()
        try:
            channel = transport.open_session(timeout=min(30.0, timeout_s))
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise SessionLost(f"the node did not open a channel on its session: {_text(exc)}") from exc
        try:
            code, timed_out = follow(channel, transport, command_line, timeout_s, (out, err))
        except SessionLost as lost:
            raise SessionLost(lost.detail, *_decoded(out, err)) from lost
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise SessionLost(f"the session broke mid-command: {_text(exc)}", *_decoded(out, err)) from exc
        finally:
            channel.close()
        if code is None and not timed_out and not transport.is_active():
            raise SessionLost(
                "the connection closed before the command's exit status came: the node crashed or rebooted, or "
                "its sshd was killed",
                *_decoded(out, err),
            )
        stdout, stderr = _decoded(out, err)
        return code, stdout, stderr, timed_out

    def put(self, local_path: str, remote_path: str) -> None:
        """Copy a file to the node (SFTP). A session that broke raises :class:`SessionLost`; a node that
        refused the copy (full disk, a path it cannot write) :class:`NodeRefused`."""
        try:
            self.connection.put(local_path, remote=remote_path)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if not Path(local_path).is_file():
                raise  # our own file is missing: the controller's failure
            if self.connection.transport is None or not self.connection.transport.is_active():
                raise SessionLost(f"the session broke while copying {Path(local_path).name}: {_text(exc)}") from exc
            raise NodeRefused(
                f"the node refused the copy of {Path(local_path).name} to {remote_path}: {_text(exc)}"
            ) from exc

    def close(self) -> None:
        try:
            self.connection.close()
        except Exception:  # noqa: BLE001 - closing a dead session must not hide the real result
            pass


def _after_loss(lost: Unreachable | None, failure: Unreachable) -> Unreachable:
    """The last try's failure; but a node that went away while a session opened (it answered, then closed)
    and is refused or silent on the next tries is named for that: it died or rebooted under us."""
    gone = {UnreachableCause.REFUSED, UnreachableCause.TIMEOUT, UnreachableCause.NO_ROUTE}
    if lost is None or failure.cause not in gone:
        return failure
    return Unreachable(UnreachableCause.SESSION_LOST, f"{lost.detail}; then {failure.cause.value}: {failure.detail}")


def open_session(node: Node) -> SshSession | Unreachable:
    """Connect and authenticate to ``node``; an unreachable node comes back as data."""
    ssh = node.ssh
    if ssh.known_hosts and ssh.host_key_policy != "accept-new":
        known_hosts = Path(ssh.known_hosts).expanduser()
        if not known_hosts.is_file():
            return Unreachable(
                UnreachableCause.HOST_KEY, f"known_hosts file {known_hosts} does not exist (policy 'strict')"
            )
    gateway = None
    jump = ssh.jump
    if jump:
        user, host, port = parse_jump(jump)
        jump_ssh = ssh.model_copy(update={"user": user or ssh.user, "port": port or 22})
        gateway = _connection(host, jump_ssh)
    connection = _connection(node.connect_host, ssh, gateway=gateway)
    attempt = 0
    lost: Unreachable | None = None  # the session closed under us on an earlier try
    while True:
        attempt += 1
        try:
            if jump:
                with _jump_slot(jump):
                    connection.open()
            else:
                connection.open()
            if connection.transport is not None:
                connection.transport.set_keepalive(KEEPALIVE_S)
            return SshSession(node, connection)
        except Exception as exc:  # noqa: BLE001 - every failure of the node's becomes data
            try:
                connection.close()
            except Exception:  # noqa: BLE001
                pass
            failure = classify(exc)  # raises again what failed on the controller's side
            if gateway is not None and not gateway.is_connected:
                failure = Unreachable(UnreachableCause.JUMP, f"jump host {jump}: {failure}")
            transient = failure.cause in _TRANSIENT or failure.detail.startswith(AUTH_TIMED_OUT)
            if transient and attempt <= RETRIES_ON_PROTOCOL_ERROR:
                lost = failure if failure.cause is UnreachableCause.SESSION_LOST else lost
                time.sleep(random.uniform(0.2, 0.6) * attempt)  # noqa: S311 - jitter, not crypto
                continue
            return _after_loss(lost, failure)
