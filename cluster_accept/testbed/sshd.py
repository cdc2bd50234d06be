"""One real OpenSSH ``sshd`` per simulated node, each in its own network and mount namespace.

Keys are made in-process (ed25519 through ``cryptography``, which paramiko already needs) instead of by
``ssh-keygen``: 64+ processes fewer at ``up``. Each sshd starts from a small shell script kept in the node
dir, inside ``ip netns exec NS unshare --mount --propagation private``: the script mounts a tmpfs on
``/proc/driver`` with the node's driver files and bind-mounts the node's ``nccl.conf`` on
``/etc/nccl.conf``, then execs sshd. Those mounts exist only in that namespace, so every node can show
its own driver version and NCCL configuration while sharing this machine's filesystem.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import time
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

SSHD = Path("/usr/sbin/sshd")
PRIVSEP_DIR = Path("/run/sshd")
ETC_NCCL_CONF = Path("/etc/nccl.conf")
LOGIN_RC = "/root/.bashrc"
# Set when a test-bed created the empty /etc/nccl.conf mount point; the last test-bed down removes both.
NCCL_CONF_MARKER = Path("/run/cluster-accept-testbed.etc-nccl-conf")
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SshdError(RuntimeError):
    """sshd could not be started; the message holds its log."""


def ensure_sshd() -> Path:
    """The sshd binary; installs Debian's openssh-server when it is missing."""
    if not SSHD.exists():
        subprocess.run(["apt-get", "install", "-y", "openssh-server"], check=True, capture_output=True)
    PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    return SSHD


def write_keypair(path: Path, comment: str) -> str:
    """An ed25519 key in OpenSSH format at ``path`` (0600) and ``path.pub``; returns the public line."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    line = f"{public.decode()} {comment}"
    path.with_name(path.name + ".pub").write_text(line + "\n", encoding="ascii")
    return line


def setenv_arg(key: str, value: str) -> str:
    """One ``SetEnv`` argument, quoted so spaces, quotes and backslashes reach the session unchanged."""
    text = f"{key}={value}".replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def sshd_config(node_dir: Path, ip: str, host_key: Path, authorized_keys: Path, env: dict[str, str]) -> str:
    setenv = " ".join(setenv_arg(k, v) for k, v in env.items())
    return "\n".join(
        [
            "# cluster-accept test-bed node; written by testbed.sshd",
            f"ListenAddress {ip}:22",
            f"HostKey {host_key}",
            f"PidFile {node_dir / 'sshd.pid'}",
            f"AuthorizedKeysFile {authorized_keys}",
            "AllowUsers root",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "AuthenticationMethods publickey",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "HostbasedAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            "MaxStartups 200:30:400",
            "MaxSessions 64",
            "MaxAuthTries 10",
            "LoginGraceTime 30",
            "LogLevel ERROR",
            "Subsystem sftp internal-sftp",
            f"SetEnv {setenv}",
            "",
        ]
    )


def start_script(node_dir: Path, data_dir: Path) -> str:
    """The shell run inside the node's private mount namespace: node mounts, then exec sshd."""
    q = shlex.quote
    return "\n".join(
        [
            "set -e",
            "mount -t tmpfs -o size=1m,mode=0755 cluster-accept-testbed /proc/driver",
            "mkdir /proc/driver/nvidia",
            f"cp {q(str(data_dir / 'proc-driver-version.txt'))} /proc/driver/nvidia/version",
            f"cp {q(str(data_dir / 'proc-driver-params.txt'))} /proc/driver/nvidia/params",
            "mount -o remount,ro /proc/driver",
            f"mount --bind {q(str(data_dir / 'nccl.conf'))} {ETC_NCCL_CONF}",
            # The node's own ~/.bashrc: the controller's (pyenv, cargo, ...) is not a GPU node's login shell.
            f"if [ -f {LOGIN_RC} ]; then mount --bind {q(str(node_dir / 'bashrc'))} {LOGIN_RC}; fi",
            f"exec {SSHD} -f {q(str(node_dir / 'sshd_config'))} -E {q(str(node_dir / 'sshd.log'))}",
            "",
        ]
    )


def start(netns: str, node_dir: Path) -> None:
    """Start the node's sshd (it daemonizes once listening); raise :class:`SshdError` with its log."""
    (node_dir / "sshd.pid").unlink(missing_ok=True)
    (node_dir / "bashrc").write_text("# ~/.bashrc of a simulated GPU node (cluster-accept test-bed)\n")
    cmd = ["ip", "netns", "exec", netns, "unshare", "--mount", "--propagation", "private"]
    cmd += ["/bin/sh", str(node_dir / "start.sh")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        log = node_dir / "sshd.log"
        detail = (proc.stderr + (log.read_text() if log.exists() else "")).strip()
        raise SshdError(f"sshd of {netns} did not start (exit {proc.returncode}): {detail}")
    _wait_pid_file(netns, node_dir)


def _wait_pid_file(netns: str, node_dir: Path, timeout_s: float = 15.0) -> None:
    """sshd listens before it daemonizes and writes its pid file after: a caller that enters the node's
    namespaces through that pid (its slurmd) right after start would find none, or the one it had before
    (removed above), and start nothing. Wait for the file, bounded."""
    deadline = time.monotonic() + timeout_s
    while read_pid(node_dir) is None:
        if time.monotonic() > deadline:
            raise SshdError(f"sshd of {netns} wrote no pid file in {timeout_s:.0f} s ({node_dir / 'sshd.pid'})")
        time.sleep(0.02)


def wait_listening(ip: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((ip, 22), timeout=1.0):
                return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise SshdError(f"nothing listens on {ip}:22 after {timeout_s:.0f} s: {exc}") from exc
            time.sleep(0.05)


def read_pid(node_dir: Path) -> int | None:
    try:
        return int((node_dir / "sshd.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def ensure_nccl_mountpoint() -> bool:
    """Make sure ``/etc/nccl.conf`` exists to bind-mount onto; True when this call created it."""
    if ETC_NCCL_CONF.exists():
        return False
    ETC_NCCL_CONF.touch()
    NCCL_CONF_MARKER.write_text("created empty by the cluster-accept test-bed as a bind-mount point\n")
    return True


def _mounted_anywhere(path: Path) -> bool:
    """Is ``path`` a mount point in any process's mount namespace (another test-bed's nodes)?"""
    seen: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ns = os.stat(entry / "ns" / "mnt").st_ino
            if ns in seen:
                continue
            seen.add(ns)
            mounts = (entry / "mountinfo").read_text()
        except OSError:
            continue
        if any(line.split()[4] == str(path) for line in mounts.splitlines() if len(line.split()) > 4):
            return True
    return False


def release_nccl_mountpoint() -> None:
    """Remove the ``/etc/nccl.conf`` a test-bed created, once no node of any test-bed mounts on it."""
    if not NCCL_CONF_MARKER.exists():
        return
    try:
        if ETC_NCCL_CONF.exists() and ETC_NCCL_CONF.stat().st_size > 0:
            NCCL_CONF_MARKER.unlink(missing_ok=True)  # someone wrote a real one since: not ours any more
        elif not ETC_NCCL_CONF.exists() or not _mounted_anywhere(ETC_NCCL_CONF):
            ETC_NCCL_CONF.unlink(missing_ok=True)
            NCCL_CONF_MARKER.unlink(missing_ok=True)
    except OSError:
        pass
