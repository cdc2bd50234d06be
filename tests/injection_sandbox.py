"""The sandbox the injection tests run node-side command lines in (test_injection*.py): a directory standing
in for a node, where ``python3``, ``nvidia-smi`` and ``timeout`` are harmless stand-ins that record their argv
and environment, and a fake Fabric connection whose commands ``bash -c`` runs there, as sshd would."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cluster_accept.inventory.model import DEFAULT_SSH, Node, ProbeSettings, Profile
from cluster_accept.remote.ssh import SshSession

HOSTILE = [
    "$(touch {m})",
    "`touch {m}`",
    "; touch {m}",
    "' ; touch {m} ; '",
    '" ; touch {m} ; "',
    "x\ntouch {m}",
    "x && touch {m}",
    "x | touch {m}",
]
STANDINS = {
    "timeout": '#!/bin/sh\nif [ "$1" = -k ]; then shift 2; fi\nshift\nexec "$@"\n',  # run it, no time limit
    "nvidia-smi": "#!/bin/sh\necho 'GPU 0: Stand-in (UUID: GPU-0)'\necho 'GPU 1: Stand-in (UUID: GPU-1)'\n",
}
ENV_SEEN = ("CUDA_VISIBLE_DEVICES", "GLOO_SOCKET_IFNAME", "CA_PROBE_DIR", "NCCL_DEBUG")


@dataclass
class Record:
    argv: list[str]
    env: dict[str, str]
    cwd: str


@dataclass
class Sandbox:
    """A directory standing in for a node: stand-ins first on PATH, a private TMPDIR, and the marker file that
    any injected ``touch`` would create."""

    root: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    answers: Callable[[str], tuple[int, str, str] | None] = lambda command_line: None
    command_lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("bin", "tmp", "home", "records", "marker"):
            (self.root / name).mkdir()
        for name, text in STANDINS.items():
            self.executable(str(self.root / "bin" / name), text)
        self.executable(str(self.root / "bin" / "python3"), self.recorder())

    @property
    def marker(self) -> Path:
        return self.root / "marker" / "pwned"

    def hostile(self, template: str) -> str:
        return template.format(m=self.marker)

    def recorder(self) -> str:
        """A program that writes its argv, environment and working directory to a record, then prints a port."""
        records = shlex.quote(str(self.root / "records"))
        seen = " ".join(f'"{name}=${{{name}-}}"' for name in ENV_SEEN)
        return (
            "#!/bin/sh\n"
            f"f=$(mktemp {records}/rec.XXXXXXXX)\n"
            "{ printf '%s\\0' \"$0\" \"$@\"; printf '\\036\\0'; "
            f'printf \'%s\\0\' {seen} "PWD=$(pwd)"; }} > "$f"\n'
            "echo 12345\n"
        )

    @staticmethod
    def executable(path: str, text: str) -> str:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Path(path).write_text(text)
        os.chmod(path, 0o755)
        return path

    def records(self) -> list[Record]:
        found = []
        for path in sorted((self.root / "records").iterdir()):
            parts = path.read_bytes().decode().split("\0")
            split = parts.index("\x1e")
            env = dict(p.split("=", 1) for p in parts[split + 1 :] if p)
            found.append(Record(parts[:split], env, env.pop("PWD")))
        return found

    def node_shell(self, command_line: str) -> tuple[int, bytes, bytes]:
        """What sshd does with the command line: the login shell runs it with ``-c``."""
        self.command_lines.append(command_line)
        answer = self.answers(command_line)
        if answer is not None:
            code, out, err = answer
            return code, out.encode(), err.encode()
        env = {
            "PATH": f"{self.root / 'bin'}:/usr/bin:/bin",
            "HOME": str(self.root / "home"),
            "TMPDIR": str(self.root / "tmp"),
            "LC_ALL": "C",
            **self.extra_env,
        }
        done = subprocess.run(
            ["bash", "-c", command_line], env=env, cwd=self.root / "home", capture_output=True, timeout=60
        )
        return done.returncode, done.stdout, done.stderr


class FakeChannel:
    """Just enough of a paramiko channel for :meth:`SshSession.run_script`; the command runs in the sandbox."""

    def __init__(self, sandbox: Sandbox):
        self.sandbox = sandbox
        self.out = self.err = b""
        self.code: int | None = None
        self.eof_received = True
        self.closed = False
        self.status_event = threading.Event()
        self._read, self._write = os.pipe()
        os.write(self._write, b".")  # always readable: select() returns at once

    def fileno(self) -> int:
        return self._read

    def exec_command(self, command_line: str) -> None:
        self.code, self.out, self.err = self.sandbox.node_shell(command_line)
        self.status_event.set()

    def shutdown_write(self) -> None:
        return None

    def recv_ready(self) -> bool:
        return bool(self.out)

    def recv(self, size: int) -> bytes:
        chunk, self.out = self.out[:size], self.out[size:]
        return chunk

    def recv_stderr_ready(self) -> bool:
        return bool(self.err)

    def recv_stderr(self, size: int) -> bytes:
        chunk, self.err = self.err[:size], self.err[size:]
        return chunk

    def exit_status_ready(self) -> bool:
        return self.status_event.is_set()

    def recv_exit_status(self) -> int | None:
        return self.code

    @property
    def exit_status(self) -> int:
        """paramiko's: -1 until an exit status came."""
        return -1 if self.code is None else self.code

    def close(self) -> None:
        if not self.closed:
            os.close(self._read)
            os.close(self._write)
            self.closed = True


class FakeTransport:
    def __init__(self, sandbox: Sandbox):
        self.sandbox = sandbox

    def is_active(self) -> bool:
        return True

    def open_session(self, timeout: float | None = None) -> FakeChannel:
        return FakeChannel(self.sandbox)


class FakeConnection:
    """A Fabric connection whose transport runs commands in the sandbox and whose SFTP put is a copy."""

    def __init__(self, sandbox: Sandbox):
        self.transport = FakeTransport(sandbox)

    def put(self, local: str, remote: str) -> None:
        shutil.copyfile(local, remote)

    def close(self) -> None:
        return None


def install_sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    """A sandbox in ``tmp_path``; the modules that open SSH sessions connect to it instead of a node."""
    box = Sandbox(tmp_path)

    def connect(node: Node) -> SshSession:
        return SshSession(node, FakeConnection(box))  # type: ignore[arg-type]

    for module in (
        "cluster_accept.remote.probe_dir",
        "cluster_accept.remote.ssh_launcher",
        "cluster_accept.remote.fanout",
    ):
        monkeypatch.setattr(f"{module}.connect", connect)
    return box


def node(name: str = "node01", address: str | None = None, **probes: Any) -> Node:
    nccl_env = probes.pop("nccl_env", {})
    profile = Profile(nccl_env=nccl_env, probes=ProbeSettings(**probes))
    return Node(name=name, ssh=DEFAULT_SSH, profile_name="p", profile=profile, address=address)
